"""A mixture of policies (several teachers in one run), each (task, sample) assigned to one of them by weight.

The assignment is a pure function of (seed, task id, sample index): a uniform number from a SHA-256 hash picks the
policy whose cumulative weight interval contains it. The same episode always goes to the same policy, so trajectory
ids (which include the policy name) are stable and a resumed run skips exactly what was written, whatever the order
or chunking of tasks. Over many episodes each policy's share converges to weight / sum(weights).
This module runs no episode; agents/rollout.py reports yield per policy.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence

from agents.config import MixtureConfig, build_policies
from agents.policy import Policy
from tasks.spec import Task


class Mixture:
    """Weighted policies. `assign(task, sample_index)` -> the policy that runs that episode."""

    def __init__(self, policies: Sequence[Policy], weights: Sequence[float] | None = None, *, seed: int = 0) -> None:
        if not policies:
            raise ValueError("a mixture needs at least one policy")
        weights = list(weights) if weights is not None else [1.0] * len(policies)
        if len(weights) != len(policies):
            raise ValueError(f"{len(policies)} policies but {len(weights)} weights; give one weight per policy")
        if any(w <= 0 for w in weights):
            raise ValueError(f"mixture weights must be > 0, got {weights}")
        names = [p.name for p in policies]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"policy names in a mixture must be unique, {dup} repeat; give each policy a name")
        self.policies = list(policies)
        total = float(sum(weights))
        self.weights = [w / total for w in weights]
        self.seed = seed
        acc, self._cum = 0.0, []
        for w in self.weights:
            acc += w
            self._cum.append(acc)
        self._cum[-1] = 1.0

    def uniform(self, task_id: str, sample_index: int) -> float:
        key = json.dumps([self.seed, task_id, sample_index]).encode()
        return int(hashlib.sha256(key).hexdigest()[:15], 16) / float(16 ** 15)

    def assign(self, task: Task, sample_index: int) -> Policy:
        u = self.uniform(task.id, sample_index)
        for policy, c in zip(self.policies, self._cum):
            if u < c:
                return policy
        return self.policies[-1]

    def shares(self) -> dict[str, float]:
        """Expected share of episodes per policy name."""
        return {p.name: w for p, w in zip(self.policies, self.weights)}


def mixture_from_config(cfg: MixtureConfig) -> Mixture:
    """Build every policy of a MixtureConfig and the mixture over them (weights from each PolicyConfig)."""
    policies = build_policies(cfg.policies)
    return Mixture(policies, [c.weight for c in cfg.policies], seed=cfg.seed)
