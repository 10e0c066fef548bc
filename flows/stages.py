"""The stage ledger of a flywheel run: which stages finished, and what they produced.

Each finished stage writes one small JSON file, ROOT/runs/RUN_ID/stages/RRR-NAME.json, atomically (temp name,
rename) and only after its outputs are durable. `flywheel run --resume RUN_ID` reads the ledger and skips the
stages it lists; an interrupted stage has no entry and runs again (its rollouts skip rows already written, its
training restarts into a fresh folder). This module does not run stages.
"""

from __future__ import annotations

import json
import os
from typing import Any

import fsspec


class Ledger:
    def __init__(self, root: str, run_id: str):
        self.fs, base = fsspec.core.url_to_fs(str(root))
        self.folder = f"{base.rstrip('/')}/runs/{run_id}/stages"
        self.fs.makedirs(self.folder, exist_ok=True)

    def _path(self, round: int, name: str) -> str:
        return f"{self.folder}/{round:03d}-{name}.json"

    def get(self, round: int, name: str) -> dict[str, Any] | None:
        p = self._path(round, name)
        if not self.fs.exists(p):
            return None
        with self.fs.open(p, "r") as f:
            return json.load(f)

    def done(self, round: int, name: str, outputs: dict[str, Any]) -> dict[str, Any]:
        p = self._path(round, name)
        tmp = f"{p}.{os.getpid()}.tmp"
        with self.fs.open(tmp, "w") as f:
            json.dump(outputs, f, default=str, indent=1)
        self.fs.mv(tmp, p)
        return outputs

    def entries(self) -> list[str]:
        return sorted(os.path.basename(p) for p in self.fs.ls(self.folder, detail=False) if p.endswith(".json"))
