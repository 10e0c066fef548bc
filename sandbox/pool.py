"""The warm pool of sandboxes, one implementation for both drivers (sandbox/docker.py, sandbox/local.py).

`WarmPool(driver, settings)` keeps `settings.size` sandboxes started ahead by `settings.fillers` background threads,
so that `take()` hands one out at once. It bounds the sandboxes in use (`max_in_use`; `take()` waits at most
`acquire_timeout_s` for a slot, then raises SandboxError), and with `reuse` takes back the sandboxes whose episode
ended (`put_back`): the same threads reset them (or the closing thread, when there are none) and hand them out
again; one whose reset fails is discarded. When none is ready, `take()` resets a used one itself (a few ms) rather
than start one. A failed start is logged as a warning and retried with a doubling backoff (BACKOFF_S up to
BACKOFF_MAX_S); the first failed reset is a warning (when every reset fails, the sandboxes run at fresh speed) and
later ones are info lines. `stats` counts sandboxes started, episodes handed a reset sandbox, and resets that failed.

The driver says how to start, reset, check and discard one of its sandboxes (`PoolDriver`); this module starts no
process and knows nothing of containers or namespaces.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from sandbox.result import SandboxError

log = logging.getLogger(__name__)

T = TypeVar("T")
BACKOFF_S = 0.1  # after a failed start the filler waits this long, doubling up to BACKOFF_MAX_S
BACKOFF_MAX_S = 5.0
IDLE_WAKE_S = 1.0  # an idle filler looks again at least this often


@dataclass(frozen=True)
class PoolDriver(Generic[T]):
    """What the pool needs of a driver, for one of its sandboxes."""

    start: Callable[[bool], T]  # start one (True: by a filler, ahead of use); raises on failure
    reset: Callable[[T], str | None]  # make a used one as good as new: None when it passed, else why not
    alive: Callable[[T], bool]  # whether a ready one still runs
    discard: Callable[[T], None]  # end one for good
    reused: Callable[[T], bool]  # whether one served an episode before (handing it out counts a reuse)
    name: Callable[[T], str]  # for log lines


@dataclass(frozen=True)
class PoolSettings:
    """How many sandboxes, and how fast, the pool keeps ahead."""

    label: str  # "docker sandbox", "local sandbox": the start of its log lines
    size: int = 2  # sandboxes kept ready (0: no filler thread, every take() starts or resets one)
    fillers: int = 1  # threads that start and reset sandboxes in the background
    reset_threads: int = 0  # with size 0 and reuse: threads that only reset (0: the closer resets, synchronously)
    reuse: bool = False
    spare: int | None = None  # with reuse: at most this many beyond those in use (None: no such limit)
    max_in_use: int = 64
    acquire_timeout_s: float = 120.0


class WarmPool(Generic[T]):
    """Sandboxes started ahead, handed out, and with reuse taken back, reset and handed out again."""

    def __init__(self, driver: PoolDriver[T], settings: PoolSettings) -> None:
        self.driver = driver
        self.settings = settings
        self.stats = {"started": 0, "reused": 0, "reset_failed": 0}
        self._ready: deque[T] = deque()
        self._dirty: deque[T] = deque()  # closed by their episode, waiting for a reset (reuse only)
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._slots = threading.BoundedSemaphore(settings.max_in_use)
        self._in_use = 0
        self._in_flight = 0  # starts under way in the fillers
        self._fillers: list[threading.Thread] = []

    @property
    def closed(self) -> bool:
        return self._stop.is_set()

    def start_fillers(self) -> None:
        """Start the background threads (call once the driver is ready to start sandboxes)."""
        s = self.settings
        n = max(1, s.fillers) if s.size else (s.reset_threads if s.reuse else 0)
        if n:
            self._fillers = [threading.Thread(target=self._fill_loop, name=f"{s.label}-pool-{i}", daemon=True)
                             for i in range(n)]
            for t in self._fillers:
                t.start()

    def count_started(self) -> None:
        """One more sandbox started (the driver calls it, whoever asked for the start)."""
        with self._lock:
            self.stats["started"] += 1

    def ready(self) -> int:
        """How many sandboxes wait ready for take() (fresh, or reset for reuse)."""
        with self._lock:
            return len(self._ready)

    def trim(self, keep: int) -> int:
        """Discard the ready sandboxes beyond the `keep` most recently readied; how many went."""
        with self._lock:
            extra = [self._ready.popleft() for _ in range(max(0, len(self._ready) - keep))]
        for item in extra:
            self.driver.discard(item)
        return len(extra)

    # -- handing out -------------------------------------------------------------------------------------------
    def take(self) -> T:
        """A sandbox for one episode, counted against max_in_use until `release()`. Raises SandboxError when the
        pool is shut down, no slot frees up in time, or a sandbox cannot start."""
        if not self._slots.acquire(timeout=self.settings.acquire_timeout_s):
            raise SandboxError(f"sandbox pool exhausted: {self.settings.max_in_use} sandboxes in use for "
                               f"{self.settings.acquire_timeout_s:g}s; close finished episodes or raise max_sandboxes")
        try:
            item = self.get()
        except BaseException:
            self._slots.release()
            raise
        with self._lock:
            self._in_use += 1
            if self.driver.reused(item):
                self.stats["reused"] += 1
        return item

    def get(self) -> T:
        """A started sandbox outside the count of those in use (a driver swapping one mid-episode): a ready one,
        else with reuse a used one reset here, else one started now."""
        while True:
            if self.closed:
                raise SandboxError(f"the {self.settings.label} pool is shut down")
            with self._lock:
                item = self._ready.popleft() if self._ready else None
                dirty = self._dirty.popleft() if item is None and self._dirty else None
            self._wake.set()
            if item is not None:
                if self.driver.alive(item):
                    return item
                self.driver.discard(item)
            elif dirty is not None:
                if self._reset_one(dirty, keep=True):
                    return dirty
            else:
                return self.driver.start(False)

    def release(self) -> None:
        """One sandbox that take() handed out is no longer in use."""
        with self._lock:
            self._in_use -= 1
        self._slots.release()

    def put_back(self, item: T) -> None:
        """Take back a sandbox whose episode ended, to be reset and handed out again (reuse)."""
        if not self._fillers:
            self._reset_one(item)
            return
        with self._lock:
            if not self.closed:
                self._dirty.append(item)
                self._wake.set()
                return
        self.driver.discard(item)

    # -- background ---------------------------------------------------------------------------------------------
    def _reset_one(self, item: T, *, keep: bool = False) -> bool:
        """Reset item; True when it passed. It goes to the ready list, or with `keep` to the caller; one that fails
        is discarded and counted in stats["reset_failed"]."""
        why = self.driver.reset(item)
        if why is None:
            with self._lock:
                if not self.closed:
                    if not keep:
                        self._ready.append(item)
                    return True
        else:
            with self._lock:
                self.stats["reset_failed"] += 1
                first = self.stats["reset_failed"] == 1
            log.log(logging.WARNING if first else logging.INFO, "%s %s: not reused, its reset failed: %s",
                    self.settings.label, self.driver.name(item), why)
        self.driver.discard(item)
        return False

    def _short(self) -> bool:
        """Whether the fillers should start one more sandbox (called under the lock)."""
        s = self.settings
        coming = len(self._ready) + len(self._dirty) + self._in_flight
        if s.reuse and s.spare is not None:  # those in use come back after their episode
            return coming < s.size and coming + self._in_use < s.size + s.spare
        return coming < s.size

    def _fill_loop(self) -> None:
        backoff = BACKOFF_S
        while not self.closed:
            with self._lock:
                dirty = self._dirty.popleft() if self._dirty else None
                need = dirty is None and self._short()
                if need:
                    self._in_flight += 1
            if dirty is not None:
                self._reset_one(dirty)
                continue
            if not need:
                self._wake.wait(IDLE_WAKE_S)
                self._wake.clear()
                continue
            try:
                item = self.driver.start(True)
            except Exception as e:  # noqa: BLE001 - the loop retries; logged
                with self._lock:
                    self._in_flight -= 1
                log.warning("%s pool: starting a sandbox failed (%s); retrying in %.1f s", self.settings.label, e,
                            backoff)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, BACKOFF_MAX_S)
                continue
            backoff = BACKOFF_S
            with self._lock:
                self._in_flight -= 1
                if not self.closed:
                    self._ready.append(item)
                    continue
            self.driver.discard(item)

    def shutdown(self, join_s: float = 60.0) -> None:
        """Stop the fillers (waiting at most join_s for each) and discard every sandbox waiting in the pool; those in
        use are the driver's to close. Later take() raises SandboxError."""
        with self._lock:
            self._stop.set()
        self._wake.set()
        for t in self._fillers:
            if t is not threading.current_thread():
                t.join(timeout=join_s)
        with self._lock:
            left = [*self._ready, *self._dirty]
            self._ready.clear()
            self._dirty.clear()
        for item in left:
            self.driver.discard(item)
