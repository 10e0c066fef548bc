"""Perturbed oracles, inside a task's sandbox: what the oracle wrote, spoiled one way (agents/audit.py's mutants of
a Harbor task; tasks/factory/perturb.py ships this file as /tmp/fw_perturb.py).

`python3 perturb.py snapshot DIR` records the sha256 of every file under DIR in /tmp/fw_perturb.json; after the
oracle ran, `python3 perturb.py save DIR` copies DIR to /tmp/fw_after, and `python3 perturb.py MODE DIR` first puts
DIR back as it was saved (when saved: several perturbations are judged from one oracle run), then changes the
files under DIR that are new or changed since the snapshot:
- wrong_value: the first number of each file changed (a JSON object: its first numeric value plus 1; else the
  first digit d becomes (d+1) mod 10; a file without a digit gets "0" appended);
- missing_file: each of them removed;
- partial_work: each of them cut short (a JSON object loses its last key; a file of several lines its last
  non-empty line; else its second half).
Exit 3 when the oracle changed no file (nothing to perturb). Standard library only."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import sys

STATE = "/tmp/fw_perturb.json"
SAVED = "/tmp/fw_after"


def _files(root: str) -> dict[str, str]:
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames):
            p = os.path.join(dirpath, name)
            if os.path.isfile(p) and not os.path.islink(p):
                with open(p, "rb") as f:
                    out[p] = hashlib.sha256(f.read()).hexdigest()
    return out


def wrong_value(text: str) -> str:
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if isinstance(data, dict):
        for k, v in data.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                data[k] = v + 1
                return json.dumps(data, indent=2) + "\n"
    m = re.search(r"\d", text)
    if m is None:
        return text + "0"
    return text[: m.start()] + str((int(m.group()) + 1) % 10) + text[m.end():]


def partial_work(text: str) -> str:
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if isinstance(data, dict) and len(data) > 1:
        data.pop(list(data)[-1])
        return json.dumps(data, indent=2) + "\n"
    lines = text.splitlines(keepends=True)
    full = [i for i, line in enumerate(lines) if line.strip()]
    if len(full) > 1:
        del lines[full[-1]]
        return "".join(lines)
    return text[: len(text) // 2]


def main(argv: list[str]) -> int:
    mode, root = argv[1], argv[2]
    if mode == "snapshot":
        with open(STATE, "w") as f:
            json.dump(_files(root), f)
        return 0
    if mode == "save":
        shutil.rmtree(SAVED, ignore_errors=True)
        shutil.copytree(root, SAVED, symlinks=True)
        return 0
    if os.path.isdir(SAVED):
        for name in os.listdir(root):
            p = os.path.join(root, name)
            shutil.rmtree(p) if os.path.isdir(p) and not os.path.islink(p) else os.remove(p)
        shutil.copytree(SAVED, root, symlinks=True, dirs_exist_ok=True)
    with open(STATE) as f:
        before = json.load(f)
    changed = [p for p, h in _files(root).items() if before.get(p) != h]
    if not changed:
        print("the oracle changed no file")
        return 3
    for p in changed:
        if mode == "missing_file":
            os.remove(p)
            continue
        with open(p, encoding="utf-8", errors="surrogateescape") as f:
            text = f.read()
        new = wrong_value(text) if mode == "wrong_value" else partial_work(text)
        with open(p, "w", encoding="utf-8", errors="surrogateescape") as f:
            f.write(new)
    print(f"{mode}: {len(changed)} file(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
