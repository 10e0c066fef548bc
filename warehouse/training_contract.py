"""OpenEnv's training contract (RFC 012, `export_training_contract`'s shape): a row to a record and back.

A record is one episode, `schema_version` 1: task_id, task_name, dataset (the suite), harness ('flywheel'), sandbox,
trial_name and session_id (the trajectory id), purpose ('eval' for a held-out row, else 'train'), rollout_type (the
row's stage), capture_level 'tokens', reward, rewards (the reward terms), reward_key, n_trainable_tokens,
`trace_entries` (one per assistant turn: request {messages, tools}, response {choices: [{message, finish_reason}]},
prompt_token_ids, completion_token_ids, per_token_logps, loss_mask, metadata) and `turns` (the same ids, logps and
mask per turn, with turn, node_id, finish_reason, discarded, trainable, sampling_params,
requested_sampling_params). The loss mask covers prompt then completion: 0 on the prompt, 1 on the completion.
flywheel's own labels travel in `metadata.flywheel` (verdict, hack flags, verifier and strength, policy, run,
round, split).

RFC 012 forbids zero-filled logprobs: `contract_problem` names why a row cannot be a record (no engine token ids,
no logprobs, a turn whose logprobs do not align with its ids or are not finite log-probabilities <= 0), and the
export refuses such rows by name (warehouse/export.py). `record_to_demo` reads a record back as a demo record for
curate/demos.py, which judges it like every imported episode. This module reads and writes no file.
"""

from __future__ import annotations

import json
import math
from typing import Any

from warehouse.record import Message

SCHEMA_VERSION = 1
HARNESS = "flywheel"


def _assistant_positions(messages: list[dict[str, Any]]) -> list[int]:
    return [i for i, m in enumerate(messages) if m.get("role") == "assistant"]


def contract_problem(row: dict[str, Any]) -> str | None:
    """Why this row (a dict as read from the lake) cannot be a training-contract record, or None."""
    turns = len(_assistant_positions(row["messages"]))
    ids, lps, prompts = row.get("completion_token_ids"), row.get("completion_logprobs"), row.get("prompt_token_ids")
    if not ids or not lps:
        return "no engine token ids and logprobs (its policy returned none)"
    if not prompts:
        return "no prompt token ids (its policy did not return the prompt it rendered)"
    if not len(ids) == len(lps) == len(prompts) == turns:
        return (f"{turns} assistant turns but token ids for {len(ids)}, logprobs for {len(lps)}, prompt ids for "
                f"{len(prompts)}")
    for k, (c, lp, p) in enumerate(zip(ids, lps, prompts, strict=True)):
        if not c or not p:
            return f"turn {k} has no completion or prompt token ids"
        if len(c) != len(lp):
            return f"turn {k}: {len(lp)} logprobs for {len(c)} completion tokens"
        if not all(math.isfinite(x) and x <= 0 for x in lp):
            return f"turn {k}: a logprob that is not a finite log-probability <= 0"
    return None


def to_contract(row: dict[str, Any]) -> dict[str, Any]:
    """One row (contract_problem(row) is None) -> one RFC 012 record."""
    msgs = [{**m.to_openai(), **({"reasoning": m.reasoning} if m.reasoning else {})}  # vLLM's reasoning field
            for m in (Message.model_validate(d) for d in row["messages"])]
    tools = json.loads(row.get("tools_json") or "[]")
    sampling = json.loads(row.get("sampling_json") or "{}")
    entries, turns = [], []
    for k, pos in enumerate(_assistant_positions(row["messages"])):
        p, c, lp = row["prompt_token_ids"][k], row["completion_token_ids"][k], row["completion_logprobs"][k]
        reply = msgs[pos]
        finish = "tool_calls" if reply.get("tool_calls") else "stop"
        mask = [0] * len(p) + [1] * len(c)
        meta = {"turn": k, "node_id": k, "sampling_params": sampling, "requested_sampling_params": sampling,
                "n_tools": len(tools), "finish_reason": finish}
        entries.append({"request": {"messages": msgs[:pos], "tools": tools},
                        "response": {"choices": [{"message": reply, "finish_reason": finish}]},
                        "prompt_token_ids": list(p), "completion_token_ids": list(c), "per_token_logps": list(lp),
                        "loss_mask": mask, "metadata": meta})
        turns.append({"turn": k, "node_id": k, "prompt_token_ids": list(p), "completion_token_ids": list(c),
                      "per_token_logps": list(lp), "loss_mask": mask, "finish_reason": finish, "discarded": False,
                      "trainable": True, "sampling_params": sampling, "requested_sampling_params": sampling})
    terms = json.loads(row.get("reward_terms_json") or "{}")
    return {
        "schema_version": SCHEMA_VERSION, "task_id": row["task_id"], "task_name": row["task_id"],
        "dataset": row["suite"], "harness": HARNESS, "sandbox": row.get("sandbox_backend"),
        "trial_name": row["trajectory_id"], "session_id": row["trajectory_id"],
        "purpose": "eval" if row.get("split") == "heldout" else "train", "rollout_type": row.get("stage", "rollout"),
        "capture_level": "tokens", "reward": row["reward"], "rewards": terms or {"outcome": row["reward"]},
        "reward_key": "reward", "n_trainable_tokens": sum(len(t["completion_token_ids"]) for t in turns),
        "trace_entries": entries, "turns": turns,
        "metadata": {"flywheel": {k: row.get(k) for k in (
            "verdict", "hack_flags", "verifier", "verifier_strength", "policy", "source", "run_id", "round", "split",
            "difficulty", "task_version")}},
    }


def is_contract(rec: Any) -> bool:
    return isinstance(rec, dict) and rec.get("schema_version") == SCHEMA_VERSION and "trace_entries" in rec


def record_to_demo(rec: dict[str, Any]) -> dict[str, Any]:
    """An RFC 012 record -> a demo record (curate/demos.py): the conversation of its last trace entry plus that
    entry's reply, the tools, provenance, and per turn the engine's token ids and logprobs."""
    entries = rec.get("trace_entries") or []
    if not entries:
        raise ValueError("has no trace_entries")
    last = entries[-1]
    reply = ((last.get("response") or {}).get("choices") or [{}])[0].get("message")
    if not isinstance(reply, dict):
        raise TypeError("its last trace entry has no response message")
    prov = (rec.get("metadata") or {}).get("flywheel") or {}
    out: dict[str, Any] = {
        "messages": [*(last.get("request") or {}).get("messages", []), reply],
        "tools": (last.get("request") or {}).get("tools") or [],
        "task_id": rec.get("task_id"), "suite": rec.get("dataset"),
        "split": "heldout" if rec.get("purpose") == "eval" else "train",
        "contract": {"prompt_token_ids": [e["prompt_token_ids"] for e in entries],
                     "completion_token_ids": [e["completion_token_ids"] for e in entries],
                     "logprobs": [e["per_token_logps"] for e in entries],
                     "reward": rec.get("reward"), "harness": rec.get("harness"),
                     "session_id": rec.get("session_id"), "policy": prov.get("policy")},
    }
    if prov.get("difficulty") is not None:
        out["difficulty"] = prov["difficulty"]
    return out
