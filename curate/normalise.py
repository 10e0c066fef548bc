"""Text normalisation shared by de-duplication and decontamination.

`normalise` folds what differs between copies of one text without changing its problem: Unicode compatibility
forms, case, whitespace runs, and number formats (`178.0` == `178`, `1,000` == `1000`, `2.50` == `2.5`).
`tokens` splits normalised text into words, numbers, operators, quoted literals (`'-'`, `''`) and code
identifiers; `constants` keeps the tokens that define a problem (numbers, quoted literals, identifiers with an
underscore or in backticks), which a paraphrase keeps and an honest look-alike of the same template changes.
This module holds no thresholds and reads no files.
"""

from __future__ import annotations

import re
import unicodedata
from collections import Counter

_WS = re.compile(r"\s+")
# a number with thousands separators or a decimal part; the lookarounds keep "1,2,3" lists and dotted names intact
_NUMBER = re.compile(r"(?<![\w.,])(\d{1,3}(?:,\d{3})+|\d+)(?:\.(\d+))?(?!\w|[.,]\d)")
_TOKEN = re.compile(r"'[^'\s]{0,16}'|\"[^\"\s]{0,16}\"|`[^`\s]{1,40}`|[a-z_][a-z0-9_]*|\d+(?:\.\d+)?|[+\-*/=<>%^]")
_IDENT = re.compile(r"^[a-z_][a-z0-9_]*$")


def _number(m: re.Match[str]) -> str:
    whole, frac = m.group(1).replace(",", ""), (m.group(2) or "").rstrip("0")
    whole = whole.lstrip("0") or "0"
    return f"{whole}.{frac}" if frac else whole


def normalise(text: str) -> str:
    """NFKC, lower case, one space for every whitespace run, numbers in one format (no separators, no '.0')."""
    text = unicodedata.normalize("NFKC", text or "").lower()
    text = _NUMBER.sub(_number, text)
    return _WS.sub(" ", text).strip()


def tokens(text: str) -> list[str]:
    """Tokens of the normalised text: words, numbers, operators, quoted literals, backticked identifiers
    (backticks dropped); other punctuation is dropped."""
    out = []
    for t in _TOKEN.findall(normalise(text)):
        out.append(t[1:-1] if t.startswith("`") else t)
    return out


def is_constant(tok: str) -> bool:
    """Numbers, quoted literals, identifiers with an underscore and paths (a backticked literal with a `/`, e.g.
    `/app/out/totals.json`): the tokens a problem is defined by."""
    return (tok[0].isdigit() or tok[0] in "'\"" or ("_" in tok and _IDENT.match(tok) is not None)
            or (len(tok) > 1 and "/" in tok))


def constants(toks: list[str]) -> Counter[str]:
    """The multiset of defining tokens (numbers, quoted literals, identifiers) among toks."""
    return Counter(t for t in toks if is_constant(t))


def constants_in_context(toks: list[str]) -> list[tuple[str, str, str]]:
    """(left neighbour, constant, right neighbour) for every defining token: which role a number plays."""
    return [(toks[i - 1] if i else "", t, toks[i + 1] if i + 1 < len(toks) else "")
            for i, t in enumerate(toks) if is_constant(t)]


def held_in_context(have: list[tuple[str, str, str]], want: list[tuple[str, str, str]]) -> bool:
    """Every wanted constant occurs in have, each occurrence used once, with its left or its right neighbour: a
    word swap next to a number keeps the other neighbour, a look-alike that swaps two numbers' roles keeps neither."""
    free = list(have)
    for lw, c, rw in want:
        i = next((k for k, (l2, c2, r2) in enumerate(free) if c2 == c and (l2 == lw or r2 == rw)), None)
        if i is None:
            return False
        free.pop(i)
    return True


def numbers(toks: list[str]) -> Counter[str]:
    return Counter(t for t in toks if t[0].isdigit())


def contains(big: Counter[str], small: Counter[str]) -> bool:
    """Multiset inclusion: every token of small occurs in big at least as often."""
    return all(big[k] >= n for k, n in small.items())


def grams(toks: list[str], n: int) -> set[tuple[str, ...]]:
    """Token n-grams; a sequence shorter than n is one gram of its own length."""
    if len(toks) < n:
        return {tuple(toks)} if toks else set()
    return {tuple(toks[i : i + n]) for i in range(len(toks) - n + 1)}
