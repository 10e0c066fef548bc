"""Final answers in assistant text: the `Answer: N` pattern, its extraction, and numeric matching.

One definition shared by the numeric verifier, the reward's answer-format term, the reference teacher, the episode
loop and the demo importer. `Answer: 42`, `answer = $1,234.5`, `**Answer:** 270` and `Answer: **270**` all carry an
answer; the last one in the last assistant message counts. This module judges nothing by itself.
"""

from __future__ import annotations

import math
import re

from warehouse.record import Message

ANSWER_RE = re.compile(r"answer[*_]*\s*[:=][*_\s]*\$?\s*(-?[\d,]*\.?\d+(?:[eE][-+]?\d+)?)", re.IGNORECASE)


def extract_answer(messages: list[Message]) -> str | None:
    """The number after 'Answer:' in the last assistant message, else None."""
    for m in reversed(messages):
        if m.role == "assistant" and m.content:
            found = ANSWER_RE.findall(m.content)
            return found[-1].replace(",", "") if found else None
    return None


def numbers_match(got: str, expected: str, tolerance: float) -> bool:
    """Both parse as finite numbers within `tolerance` (absolute below 1, relative above)."""
    try:
        g, e = float(got), float(expected)
    except ValueError:
        return False
    if not (math.isfinite(g) and math.isfinite(e)):
        return False
    return abs(g - e) <= tolerance * max(1.0, abs(e))
