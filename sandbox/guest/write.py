"""Write files under the sandbox's working folder, INSIDE the sandbox, as the sandbox user: the one writer every
backend runs (sandbox/files.py starts it through the backend's own exec, so with the call's limits).

Reads {relative path: text} as JSON from stdin, exactly as many bytes as its one argument says (a Docker exec's
stdin may stay open). Refuses a path outside the working folder and a path whose parent folder goes through a
symlink (the sandbox's code may have planted one) with exit status 2 and a line on stderr; creates parents; replaces
a file or symlink at the path itself instead of writing through it (O_NOFOLLOW | O_EXCL after an unlink).
Standard library only.
"""

from __future__ import annotations

import json
import os
import sys


def main(args: list[str]) -> None:
    """Write the files read from stdin; args[0] is the payload's length in bytes."""
    files = json.loads(sys.stdin.buffer.read(int(args[0])))
    root = os.path.realpath(os.getcwd())
    for rel, text in files.items():
        path = os.path.normpath(os.path.join(root, rel))
        if not path.startswith(root + os.sep):
            print(f"refusing path outside the workspace: {rel!r}", file=sys.stderr)
            sys.exit(2)
        parent = os.path.dirname(path)
        if os.path.realpath(parent) != parent:
            print(f"refusing path through a symlink: {rel!r}", file=sys.stderr)
            sys.exit(2)
        os.makedirs(parent, exist_ok=True)
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)


if __name__ == "__main__":  # run as `python3 -c SOURCE ARG...` (sandbox/programs.py)
    main(sys.argv[1:])
