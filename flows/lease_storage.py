"""Prefect server lease storage for the CLI's own temporary server: Prefect's filesystem lease storage, in the
folder that FLYWHEEL_LEASE_DIR names (one folder per CLI command, see flows/localserver.py).

Leases then outlive a killed command on disk, so the next command can release the slots they held. Loaded by the
Prefect server process through PREFECT_SERVER_CONCURRENCY_LEASE_STORAGE=flows.lease_storage; nothing else
imports it.
"""

from __future__ import annotations

import os
from pathlib import Path

from prefect.server.concurrency.lease_storage import filesystem


class ConcurrencyLeaseStorage(filesystem.ConcurrencyLeaseStorage):
    def __init__(self, storage_path: Path | None = None):
        folder = storage_path or os.environ.get("FLYWHEEL_LEASE_DIR")
        super().__init__(Path(folder) if folder else None)
