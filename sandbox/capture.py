"""The output capture rule of an `exec` call, the same on every backend.

stdout and stderr are kept up to `output_limit_bytes` each; past that the rest is counted and dropped and the
result says `truncated`. A call whose output (both streams together) passes the flood limit, max(32 MiB, 8 x the
cap), is killed (verdict resource_limit, see sandbox/verdicts.py): an infinite print costs the host a bounded amount
of reading, never memory. Bytes are decoded as UTF-8 with replacement. The sandbox's own `[sandbox]` notes go after
the program's stderr, one per line (`with_notes`). The persistent interpreter applies the same cap inside the
sandbox (sandbox/guest/kernel.py). This module reads no stream itself: the backends feed it what they read.
"""

from __future__ import annotations

MIN_FLOOD_BYTES = 32 * 1024 * 1024  # output beyond max(this, 8 x the cap) kills the call (resource_limit)
STDOUT, STDERR = 1, 2


class Capture:
    """stdout/stderr of one call: a per-stream cap, the truncated flag, and the flood limit."""

    def __init__(self, limit: int):
        self.limit = limit
        self.flood = max(MIN_FLOOD_BYTES, 8 * limit)
        self.out = bytearray()
        self.err = bytearray()
        self.total = 0
        self.truncated = False

    def add(self, stream: int, data: bytes) -> None:
        """Take what the program wrote on `stream` (STDOUT or STDERR)."""
        self.total += len(data)
        target = self.err if stream == STDERR else self.out
        room = self.limit - len(target)
        if len(data) > room:
            self.truncated = True
            data = data[: max(room, 0)]
        target += data

    @property
    def flooded(self) -> bool:
        return self.total > self.flood

    def stdout(self) -> str:
        return text(self.out)

    def stderr(self, notes: list[str] | tuple[str, ...] = ()) -> str:
        return with_notes(text(self.err), notes)


def text(b: bytes | bytearray) -> str:
    return bytes(b).decode("utf-8", errors="replace")


def with_notes(stderr: str, notes: list[str] | tuple[str, ...]) -> str:
    """The program's stderr followed by the sandbox's notes, one per line."""
    notes = [n for n in notes if n]
    if not notes:
        return stderr
    return stderr + ("\n" if stderr else "") + "\n".join(notes)
