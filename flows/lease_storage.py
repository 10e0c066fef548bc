"""Prefect server lease storage for flywheel's local servers: Prefect's filesystem lease storage, one folder per
CLI command that took the leases, so that leases outlive a killed command on disk and the next command (or the
shared server's watchdog) can release the slots they held (flows/lease_reaper.py's reap_dead_leases).

- A command's own temporary server: every lease goes to FLYWHEEL_LEASE_DIR (the command's folder).
- The shared server: a lease goes to FLYWHEEL_LEASE_ROOT/PID-STARTTIME of the command that asked for it (the
  X-Flywheel-Client header, put into `CLIENT` by the server's middleware), or FLYWHEEL_LEASE_ROOT/shared without
  one. Reads, renewals and revocations find a lease in whichever folder holds it, and the server's repossessor sees
  the expired leases of every folder.
Loaded by the Prefect server process through PREFECT_SERVER_CONCURRENCY_LEASE_STORAGE=flows.lease_storage; nothing
else imports it.
"""

from __future__ import annotations

import os
from contextvars import ContextVar
from datetime import timedelta
from pathlib import Path
from uuid import UUID

from prefect.server.concurrency.lease_storage import filesystem

CLIENT: ContextVar[str | None] = ContextVar("flywheel_client", default=None)


class ConcurrencyLeaseStorage(filesystem.ConcurrencyLeaseStorage):
    def __init__(self, storage_path: Path | None = None):
        fixed = storage_path or os.environ.get("FLYWHEEL_LEASE_DIR")
        self.root = None if fixed else Path(os.environ["FLYWHEEL_LEASE_ROOT"]) if os.environ.get(
            "FLYWHEEL_LEASE_ROOT") else None
        folder = fixed or (self.root / (CLIENT.get() or "shared") if self.root else None)
        super().__init__(Path(folder) if folder else None)

    def _folders(self) -> list[filesystem.ConcurrencyLeaseStorage]:
        """The storage of every command folder (just this one on a command's own server)."""
        if self.root is None or not self.root.is_dir():
            return []
        return [filesystem.ConcurrencyLeaseStorage(d) for d in sorted(self.root.iterdir())
                if d.is_dir() and not d.name.startswith(".")]

    def _holding(self, lease_id: UUID) -> filesystem.ConcurrencyLeaseStorage:
        if self.root is None or self._lease_file_path(lease_id).exists():
            return self
        found = next(self.root.glob(f"*/{lease_id}.json"), None)
        return filesystem.ConcurrencyLeaseStorage(found.parent) if found else self

    async def read_lease(self, lease_id: UUID):
        h = self._holding(lease_id)
        return await (super().read_lease(lease_id) if h is self else h.read_lease(lease_id))

    async def renew_lease(self, lease_id: UUID, ttl: timedelta) -> bool:
        h = self._holding(lease_id)
        return await (super().renew_lease(lease_id, ttl) if h is self else h.renew_lease(lease_id, ttl))

    async def revoke_lease(self, lease_id: UUID) -> None:
        h = self._holding(lease_id)
        await (super().revoke_lease(lease_id) if h is self else h.revoke_lease(lease_id))

    async def read_active_lease_ids(self, limit: int = 100, offset: int = 0) -> list[UUID]:
        if self.root is None:
            return await super().read_active_lease_ids(limit, offset)
        ids: list[UUID] = []
        for s in self._folders():
            ids += await s.read_active_lease_ids(limit=10**9)
        return ids[offset:offset + limit]

    async def read_expired_lease_ids(self, limit: int = 100) -> list[UUID]:
        if self.root is None:
            return await super().read_expired_lease_ids(limit)
        ids: list[UUID] = []
        for s in self._folders():
            ids += await s.read_expired_lease_ids(limit=limit - len(ids))
            if len(ids) >= limit:
                break
        return ids
