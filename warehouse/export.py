"""Exporting trajectories for training: a Hugging Face datasets folder, or JSONL in TRL's messages-plus-tools format,
or DPO / KTO preference JSONL, or OpenEnv's training contract (RFC 012 records: engine token ids, aligned logprobs,
loss masks; warehouse/training_contract.py); and for tracing tools, a folder of ATIF v1.8 files, one per episode
(warehouse/atif.py).

Both exports select de-duplicated trajectories with an optional SQL WHERE clause and/or simple filters (verdict,
suite, split, source, run_id, round), in a stable order (run_id, round, created_at, trajectory_id).

- JSONL: one object per line, {"messages": [...], "tools": [...]} (TRL's conversational format with tools;
  `metadata=True` adds trajectory_id, run_id, round, source, policy, task_id, suite, split, verdict, reward).
  Messages go through the one conversation codec (warehouse.chat), so an export shows what SFT renders:
  arguments_as="string" is `chat.to_openai` (role, content, and tool_calls / tool_call_id / name only when
  present; arguments the JSON string the model produced); arguments_as="object" is `chat.to_template` (content ""
  for None, arguments decoded to objects, as chat templates that do `arguments | tojson` need), and refuses a row
  with a malformed call or non-object arguments (ExportError), as SFT drops it.
- datasets folder (`datasets.load_from_disk(path)` works): columns messages (list of structs, absent fields
  null), tools (a JSON string: TRL's SFTTrainer json-decodes a string `tools` column), plus the metadata columns.

Preference data (`export_preferences`, JSONL): `dpo` pairs each passing episode with one hacked or failed episode
of the same run, round, task and policy (hacks first) as TRL's conversational preference format (prompt, chosen,
rejected; tool-call arguments as objects through chat.to_template; tools as a JSON string), `kto` writes the same
episodes unpaired (prompt, completion, label); both carry reason codes (`hack:<flags>` or the verdict), ids,
verdicts and rewards as columns. A conversation no chat template can render (a malformed call) is left out, counted.

`export_snapshot` exports exactly a curated snapshot's rows (its manifest joined to the trajectories, in manifest
order) with their weights; that is what training should read. Filters over the raw lake bypass curation (no
dedup, decontamination or hack filter), and the CLI says so.

All write atomically (temp name, then rename) to a local path (a URL output is refused: the lake root may be an
object store, the export is a local file or folder) and refuse to overwrite unless overwrite=True. This module does
not curate or mix (curate/ does); it only selects and formats.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import duckdb
import pyarrow as pa

from warehouse import chat
from warehouse.query import QueryError, iter_trajectories, query
from warehouse.record import Message

METADATA_COLUMNS = ("trajectory_id", "run_id", "round", "source", "policy", "task_id", "suite", "split", "verdict",
                    "reward")
ArgumentsAs = Literal["string", "object"]


class ExportError(Exception):
    """An export was refused: existing output, bad filter, unparseable tool arguments in object mode."""


@dataclass(frozen=True)
class ExportResult:
    path: str
    n_rows: int
    fmt: str
    skipped: int = 0  # preference exports: candidates left out (no partner, or a conversation a template can't render)


def build_where(
    where: str | None = None,
    *,
    verdict: str | Sequence[str] | None = None,
    suite: str | Sequence[str] | None = None,
    split: str | Sequence[str] | None = None,
    source: str | Sequence[str] | None = None,
    run_id: str | Sequence[str] | None = None,
    round: int | Sequence[int] | None = None,
) -> tuple[str | None, list[object]]:
    """Combine a raw SQL WHERE clause with equality/IN filters into one clause with `?` placeholders and the
    values that fill them ((None, []) when there is no filter)."""
    clauses = [f"({where})"] if where and where.strip() else []
    params: list[object] = []
    for col, val in (("verdict", verdict), ("suite", suite), ("split", split), ("source", source),
                     ("run_id", run_id)):
        if val is None:
            continue
        vals = [val] if isinstance(val, str) else list(val)
        if vals:
            clauses.append(f'"{col}" IN ({", ".join("?" for _ in vals)})')
            params.extend(str(v) for v in vals)
    if round is not None:
        rounds = [round] if isinstance(round, int) else list(round)
        if not all(isinstance(r, int) for r in rounds):
            raise ExportError(f"round filter {round!r} must be integers")
        if rounds:
            clauses.append(f"round IN ({', '.join('?' for _ in rounds)})")
            params.extend(rounds)
    return (" AND ".join(clauses) if clauses else None), params


def _messages(messages: list[dict[str, Any]], arguments_as: ArgumentsAs, tid: str) -> list[dict[str, Any]]:
    """A row's messages through the conversation codec: chat.to_openai (string) or chat.to_template (object)."""
    msgs = [Message.model_validate(m) for m in messages]
    if arguments_as == "string":
        return chat.to_openai(msgs)
    try:
        return chat.to_template(msgs)
    except chat.ConversationError as e:
        raise ExportError(f"trajectory {tid}: {e}; export with arguments_as='string' or filter it out") from e


def to_trl_example(row: dict[str, Any], arguments_as: ArgumentsAs = "string",
                   metadata: bool = False) -> dict[str, Any]:
    """One trajectory (a dict as read from the lake, or Trajectory.model_dump()) -> {"messages", "tools"}."""
    tid = row.get("trajectory_id", "?")
    ex: dict[str, Any] = {
        "messages": _messages(row["messages"], arguments_as, tid),
        "tools": json.loads(row.get("tools_json") or "[]"),
    }
    if metadata:
        ex.update({k: row.get(k) for k in METADATA_COLUMNS})
    return ex


def _check_out(path: str, overwrite: bool) -> None:
    if "://" in path:  # os calls would make a local folder named after the scheme ("s3:/bucket/...")
        raise ExportError(f"output {path!r} is a URL; exports write a local file or folder (the lake root may be a "
                          "URL): export to a local path, then copy it to object storage")
    if os.path.exists(path) and not overwrite:
        raise ExportError(f"{path} already exists: choose another output path or pass overwrite=True")


def _write_jsonl(out_path: str, examples: Iterable[dict[str, Any]]) -> int:
    """Write examples as JSON lines atomically (temp name, fsync, rename); returns how many."""
    folder = os.path.dirname(os.path.abspath(out_path))
    os.makedirs(folder, exist_ok=True)
    tmp = os.path.join(folder, f".{os.path.basename(out_path)}.{uuid.uuid4().hex[:8]}.tmp")
    n = 0
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            for ex in examples:
                f.write(json.dumps(ex, ensure_ascii=False, default=str))
                f.write("\n")
                n += 1
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, out_path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return n


def _iter_rows(root: str, where: str | None, params: list[object]) -> Iterable[dict[str, Any]]:
    try:
        for batch in iter_trajectories(root, where, params):
            yield from batch.to_pylist()
    except QueryError as e:
        raise ExportError(f"cannot select trajectories WHERE {where!r}: {e}") from e


def export_jsonl(root: str, out_path: str, where: str | None = None, *, arguments_as: ArgumentsAs = "string",
                 metadata: bool = False, overwrite: bool = False, **filters: Any) -> ExportResult:
    """Write the selected trajectories to out_path as JSONL in TRL's messages-plus-tools format.
    filters: verdict, suite, split, source, run_id, round (see build_where)."""
    _check_out(out_path, overwrite)
    clause, params = build_where(where, **filters)
    n = _write_jsonl(out_path, (to_trl_example(row, arguments_as, metadata)
                                for row in _iter_rows(root, clause, params)))
    return ExportResult(path=out_path, n_rows=n, fmt="jsonl")


def export_datasets(root: str, out_dir: str, where: str | None = None, *, overwrite: bool = False,
                    **filters: Any) -> ExportResult:
    """Write the selected trajectories as a datasets folder (datasets.load_from_disk(out_dir) reads it back).
    Columns: messages, tools (JSON string), trajectory_id, run_id, round, source, policy, task_id, suite, split,
    verdict, reward. filters: verdict, suite, split, source, run_id, round."""
    import datasets  # heavy import, only here

    _check_out(out_dir, overwrite)
    clause, params = build_where(where, **filters)
    meta = ", ".join(f'"{c}"' for c in METADATA_COLUMNS)
    sql = f"SELECT messages, tools_json AS tools, {meta} FROM trajectories"
    if clause:
        sql += f" WHERE {clause}"
    sql += " ORDER BY run_id, round, created_at, trajectory_id"
    try:
        table: pa.Table = query(root, sql, params)
    except QueryError as e:
        raise ExportError(f"cannot select trajectories WHERE {clause!r}: {e}") from e
    _save_dataset(datasets.Dataset(datasets.table.InMemoryTable(table)), out_dir)
    return ExportResult(path=out_dir, n_rows=table.num_rows, fmt="datasets")


def export_atif(root: str, out_dir: str, where: str | None = None, *, overwrite: bool = False,
                **filters: Any) -> ExportResult:
    """Write the selected trajectories to out_dir as ATIF v1.8, one `<trajectory_id>.json` per episode, with the
    row's provenance in `extra.flywheel` (warehouse/atif.py). The folder appears whole (temp name, then rename)."""
    from warehouse.atif import row_to_atif
    from warehouse.record import Trajectory

    _check_out(out_dir, overwrite)
    clause, params = build_where(where, **filters)
    n = 0

    def write(tmp: str) -> None:
        nonlocal n
        os.makedirs(tmp)
        for row in _iter_rows(root, clause, params):
            doc = row_to_atif(Trajectory.model_validate(row))
            with open(os.path.join(tmp, f"{doc['trajectory_id']}.json"), "w", encoding="utf-8") as f:
                json.dump(doc, f, indent=1)
            n += 1

    _save_folder(write, out_dir)
    return ExportResult(path=out_dir, n_rows=n, fmt="atif")


def _snapshot_rows(root: str, snapshot_id: str) -> list[dict[str, Any]]:
    """The snapshot's trajectories with their manifest weight, in manifest order (ExportError when the snapshot is
    unknown or the lake lost some of its rows)."""
    from warehouse.query import connect

    con = connect(root)
    try:
        try:
            known = con.execute("SELECT n_rows FROM datasets WHERE snapshot_id = ?", [snapshot_id]).fetchall()
        except duckdb.Error as e:  # no datasets view: no snapshot was ever made
            raise ExportError(f"no snapshots under {root!r} ({e.__class__.__name__}); run `flywheel curate` "
                              "first") from e
        if not known:
            raise ExportError(f"snapshot {snapshot_id!r} is not in the datasets table of {root!r}; list them with "
                              f"flywheel sql --root {root} \"SELECT snapshot_id, run_id, round, n_rows FROM datasets\"")
        rows = con.sql(
            "SELECT t.*, m.weight AS weight FROM (SELECT *, row_number() OVER () AS _pos FROM manifests "
            "WHERE snapshot_id = ?) m JOIN trajectories t USING (trajectory_id) ORDER BY m._pos",
            params=[snapshot_id]).to_arrow_table().to_pylist()
    finally:
        con.close()
    if len(rows) != known[0][0]:
        raise ExportError(f"snapshot {snapshot_id!r} lists {known[0][0]} rows but the lake holds {len(rows)} of them: "
                          "trajectories were deleted or quarantined after the snapshot was made")
    return rows


def export_snapshot(root: str, snapshot_id: str, out: str, fmt: Literal["jsonl", "datasets"] = "jsonl", *,
                    arguments_as: ArgumentsAs = "object", metadata: bool = False,
                    overwrite: bool = False) -> ExportResult:
    """Exactly the rows of a curated snapshot, each with its manifest weight (a `weight` field / column).

    JSONL rows are {"messages", "tools", "weight"} (+ metadata), tool-call arguments as objects by default so that
    `tokenizer.apply_chat_template(messages, tools=tools)` renders them as chat templates expect; a datasets
    folder keeps them as JSON strings (Arrow needs one type per column) with tools as a JSON string."""
    _check_out(out, overwrite)
    rows = _snapshot_rows(root, snapshot_id)
    if fmt == "jsonl":
        def examples() -> Iterable[dict[str, Any]]:
            for row in rows:
                yield {**to_trl_example(row, arguments_as, metadata), "weight": float(row["weight"])}
        return ExportResult(path=out, n_rows=_write_jsonl(out, examples()), fmt="jsonl")
    if fmt != "datasets":
        raise ExportError(f"unknown export format {fmt!r}: choose jsonl or datasets")
    if arguments_as != "string":
        raise ExportError("a datasets folder keeps tool arguments as JSON strings (Arrow needs one type per column); "
                          "use --format jsonl for arguments as objects, or --arguments string")
    import datasets  # heavy import, only here

    cols = {"messages": [r["messages"] for r in rows], "tools": [r.get("tools_json") or "[]" for r in rows],
            "weight": [float(r["weight"]) for r in rows]}
    cols.update({c: [r.get(c) for r in rows] for c in METADATA_COLUMNS})
    ds = datasets.Dataset.from_dict(cols)
    _save_dataset(ds, out)
    return ExportResult(path=out, n_rows=len(rows), fmt="datasets")


def _save_dataset(ds: Any, out_dir: str) -> None:
    _save_folder(ds.save_to_disk, out_dir)


def _save_folder(write: Callable[[str], Any], out_dir: str) -> None:
    """`write(tmp)` fills a temp folder beside out_dir, which then replaces out_dir whole (or is removed)."""
    parent = os.path.dirname(os.path.abspath(out_dir))
    os.makedirs(parent, exist_ok=True)
    tmp = os.path.join(parent, f".{os.path.basename(out_dir)}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        write(tmp)
        if os.path.isdir(out_dir):  # overwrite=True (checked by the caller)
            shutil.rmtree(out_dir)
        elif os.path.exists(out_dir):
            os.unlink(out_dir)
        os.replace(tmp, out_dir)
    finally:
        if os.path.exists(tmp):
            shutil.rmtree(tmp)


# The order in which failed episodes are taken as a pass's rejected partner: labelled hacks first.
REJECT_ORDER = ("hack", "fail", "model_error", "timeout")
PAIR_KEY = ("run_id", "round", "task_id", "policy")


def reason_code(row: dict[str, Any]) -> str:
    """Why an episode is a negative: `hack:<flag>,<flag>` for a hack, else its verdict (pass for a positive)."""
    flags = list(row.get("hack_flags") or [])
    if row["verdict"] == "hack" or flags:
        return "hack:" + ",".join(sorted(flags)) if flags else "hack"
    return str(row["verdict"])


def _split_prompt(row: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(prompt, completion) of a row as chat-template messages: the prompt is every message before the first
    assistant turn. chat.ConversationError when a message cannot be rendered for a template."""
    msgs = chat.to_template([Message.model_validate(m) for m in row["messages"]])
    first = next((i for i, m in enumerate(msgs) if m["role"] == "assistant"), len(msgs))
    return msgs[:first], msgs[first:]


def preference_pairs(rows: Iterable[dict[str, Any]]) -> tuple[list[dict[str, Any]], int]:
    """Pair each passing episode with one failed episode of the same run, round, task and policy (hacks first, then
    fail, model_error, timeout; each episode in at most one pair; infra_error never). Returns the pairs (prompt,
    chosen, rejected, tools and the metadata: ids, verdicts, rewards, hack flags, reason codes) and how many
    candidates were left out (no partner, an empty completion, a prompt that differs, or a conversation a chat
    template cannot render: a malformed call)."""
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for r in rows:
        if r["verdict"] == "pass" or r["verdict"] in REJECT_ORDER:
            groups.setdefault(tuple(r[k] for k in PAIR_KEY), []).append(r)
    pairs, skipped = [], 0
    for key in sorted(groups, key=lambda k: tuple(str(x) for x in k)):
        rendered: dict[str, tuple[list, list]] = {}
        for r in groups[key]:
            try:
                prompt, completion = _split_prompt(r)
            except chat.ConversationError:
                skipped += 1
                continue
            if completion:
                rendered[r["trajectory_id"]] = (prompt, completion)
            else:
                skipped += 1
        ok = [r for r in groups[key] if r["trajectory_id"] in rendered]
        chosen = [r for r in ok if r["verdict"] == "pass" and not r.get("hack_flags")]
        chosen_ids = {r["trajectory_id"] for r in chosen}
        rejected = sorted((r for r in ok if r["trajectory_id"] not in chosen_ids and r["verdict"] in REJECT_ORDER),
                          key=lambda r: REJECT_ORDER.index(r["verdict"]))
        used = 0
        for c, j in zip(chosen, rejected):
            (cp, cc), (rp, rc) = rendered[c["trajectory_id"]], rendered[j["trajectory_id"]]
            if cp != rp:  # a different prompt (system message, earlier turns): not a preference over one prompt
                continue
            used += 2
            pairs.append({
                "prompt": cp, "chosen": cc, "rejected": rc, "tools": c.get("tools_json") or "[]",
                "run_id": c["run_id"], "round": int(c["round"]), "task_id": c["task_id"], "policy": c["policy"],
                "suite": c["suite"], "stage": c.get("stage") or "rollout",
                "chosen_id": c["trajectory_id"], "rejected_id": j["trajectory_id"],
                "chosen_verdict": c["verdict"], "rejected_verdict": j["verdict"],
                "chosen_reward": float(c["reward"]), "rejected_reward": float(j["reward"]),
                "rejected_hack_flags": list(j.get("hack_flags") or []), "reason": reason_code(j)})
        skipped += len(ok) - used
    return pairs, skipped


def kto_examples(pairs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """TRL's unpaired preference format from the pairs: each pair's chosen (label True) and rejected (label False)
    as {prompt, completion, label, tools} with the episode's id, verdict, reward, hack flags and reason code."""
    out = []
    for p in pairs:
        common = {k: p[k] for k in ("prompt", "tools", "run_id", "round", "task_id", "policy", "suite", "stage")}
        out.append({**common, "completion": p["chosen"], "label": True, "trajectory_id": p["chosen_id"],
                    "verdict": p["chosen_verdict"], "reward": p["chosen_reward"], "hack_flags": [],
                    "reason": "pass"})
        out.append({**common, "completion": p["rejected"], "label": False, "trajectory_id": p["rejected_id"],
                    "verdict": p["rejected_verdict"], "reward": p["rejected_reward"],
                    "hack_flags": p["rejected_hack_flags"], "reason": p["reason"]})
    return out


def export_preferences(root: str, out_path: str, fmt: Literal["dpo", "kto"], where: str | None = None, *,
                       overwrite: bool = False, **filters: Any) -> ExportResult:
    """Write preference data from the selected trajectories as JSONL: `dpo` is TRL's conversational preference
    format (prompt, chosen, rejected: lists of messages, tool-call arguments as objects; tools a JSON string, as
    TRL's DPOTrainer reads it), `kto` its unpaired format (prompt, completion, label), both with the reason codes
    as metadata columns (see preference_pairs). filters: verdict, suite, split, source, run_id, round."""
    if fmt not in ("dpo", "kto"):
        raise ExportError(f"unknown preference format {fmt!r}: choose dpo or kto")
    _check_out(out_path, overwrite)
    clause, params = build_where(where, **filters)
    pairs, skipped = preference_pairs(_iter_rows(root, clause, params))
    if not pairs:
        raise ExportError(f"no preference pairs in the selection of {root!r} ({skipped} candidate episodes, none "
                          "with a passing and a failed episode of the same run, round, task and policy); widen the "
                          "selection (drop --verdict, or export a run with student rollouts or GRPO rows)")
    examples = pairs if fmt == "dpo" else kto_examples(pairs)
    return ExportResult(path=out_path, n_rows=_write_jsonl(out_path, examples), fmt=fmt, skipped=skipped)


def export_openenv(root: str, out_path: str, where: str | None = None, *, overwrite: bool = False,
                   **filters: Any) -> ExportResult:
    """Write the selected trajectories as JSONL records of OpenEnv's training contract (RFC 012,
    warehouse/training_contract.py). Every selected row must carry the engine's token ids and logprobs: otherwise
    nothing is written and ExportError names the rows and why (RFC 012 never zero-fills a logprob)."""
    from warehouse.training_contract import contract_problem, to_contract

    _check_out(out_path, overwrite)
    clause, params = build_where(where, **filters)
    refused: list[tuple[str, str]] = []

    def records() -> Iterable[dict[str, Any]]:
        for row in _iter_rows(root, clause, params):
            problem = contract_problem(row)
            if problem is not None:
                refused.append((row["trajectory_id"], problem))
            elif not refused:
                yield to_contract(row)
        if refused:
            named = "; ".join(f"{tid}: {why}" for tid, why in refused[:5])
            raise ExportError(f"{len(refused)} selected row(s) cannot be OpenEnv training records ({named}"
                              f"{'; ...' if len(refused) > 5 else ''}); select rows whose policy returned token ids "
                              "and logprobs, e.g. --where 'completion_logprobs IS NOT NULL'")

    n = _write_jsonl(out_path, records())
    return ExportResult(path=out_path, n_rows=n, fmt="openenv")


def export_command(root: str, out: str, fmt: Literal["jsonl", "datasets", "atif", "dpo", "kto", "openenv"] = "jsonl",
                   where: str | None = None,
                   verdict: list[str] | None = None, suite: list[str] | None = None, split: list[str] | None = None,
                   source: list[str] | None = None, run_id: list[str] | None = None, round: list[int] | None = None,
                   arguments_as: ArgumentsAs = "string", metadata: bool = False,
                   overwrite: bool = False) -> ExportResult:
    """`flywheel export`: one entry point for both formats; prints nothing, returns what it wrote."""
    filters = {"verdict": verdict or None, "suite": suite or None, "split": split or None,
               "source": source or None, "run_id": run_id or None, "round": round or None}
    if fmt == "jsonl":
        return export_jsonl(root, out, where, arguments_as=arguments_as, metadata=metadata, overwrite=overwrite,
                            **filters)
    if fmt == "datasets":
        if arguments_as != "string":
            raise ExportError("a datasets folder keeps tool arguments as JSON strings (Arrow needs one type per "
                              "column); use --format jsonl for arguments as objects")
        return export_datasets(root, out, where, overwrite=overwrite, **filters)
    if fmt == "atif":
        return export_atif(root, out, where, overwrite=overwrite, **filters)
    if fmt == "openenv":
        return export_openenv(root, out, where, overwrite=overwrite, **filters)
    if fmt in ("dpo", "kto"):
        if arguments_as != "object":
            raise ExportError(f"--format {fmt} renders conversations for chat templates (tool-call arguments as "
                              "objects); drop --arguments string")
        return export_preferences(root, out, fmt, where, overwrite=overwrite, **filters)  # type: ignore[arg-type]
    raise ExportError(f"unknown export format {fmt!r}: choose jsonl, datasets, atif, dpo, kto or openenv")
