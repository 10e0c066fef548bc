"""Human demonstrations: load chat-format conversations with tools, validate them, store them as trajectories.

Accepted inputs: a JSONL file (one record per line), a Parquet file (one record per row), a folder written by
`datasets.Dataset.save_to_disk` / `DatasetDict.save_to_disk`, or ATIF trajectories (a .json file, or with
format="atif" a folder of them: warehouse/atif.py maps steps to messages; the row's verifier details name the
evidence the file lacks: token ids, logprobs, tool timings). A record is an object with
  messages         list of {role, content, tool_calls?, tool_call_id?, name?} (OpenAI / TRL chat format;
                   tool-call arguments may be a JSON string or an object)
  tools            OpenAI function schemas, a JSON string of them, or tool names known to tasks.tools
                   (optional when the importer is given default tools)
  task_id, suite, difficulty, split, author      optional provenance
  expected_answer  optional: when present the demo is judged as an episode is (tasks.judge.verify.verify: the numeric
                   verifier on its final 'Answer: N', then forensics), so verdict pass, fail or hack;
                   without it the demo is accepted unchecked (verifier_details_json says so) unless forensics
                   flag it (verdict hack)
  requires_tool    optional: the tool the demo's task requires (forensics' no_tool_use); default: what the tasks of
                   the named built-in suite require (arithmetic, math-word: python), else none
One judge for every row: a demo the judge would call a hack (a tool-free answer on a tool suite, an answer no tool
call produced) is stored with verdict hack and its reason codes, and never enters SFT as a pass.
Validation (curate.filters.conversation_problems) names the record: file, line (JSONL, 1-based) or row
(Parquet/datasets, 0-based), and the field. Tool calls without ids answered by tool messages without
tool_call_id are paired in order and given ids; a half-labelled pairing is an error.
Rows get source "human" and deterministic ids (hash of run, round and normalised content), so importing the same
file again writes nothing. OpenEnv rollouts (JSONL of RFC 012 training-contract records, format "openenv";
warehouse/training_contract.py) import the same way with source "env", policy `openenv:<their policy>`, their
engine token ids and logprobs, and the environment's reward as the verdict's source (pass when it is > 0,
verifier strength 'env'), forensics on top. This module does not curate or mix.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from typing import Any

from curate.dedup import normalised
from curate.filters import conversation_problems, tool_names
from tasks.judge.api import extract_answer, hack_flags, inspect_episode, verify
from tasks.spec import ReferenceSolution, Task, VerifierSpec
from tasks.tools import TOOLS
from warehouse.record import Message, Trajectory

HUMAN_VERIFIER = "human"
HUMAN_VERIFIER_VERSION = "2"  # 2: judged by the episode verifier and forensics


@dataclass(frozen=True)
class DemoError:
    """One problem of one demo record."""

    file: str
    where: str  # "line 3" (JSONL) or "row 3" (Parquet, datasets)
    field: str
    problem: str

    def __str__(self) -> str:
        return f"{self.file} {self.where}: {self.field}: {self.problem}"


class DemoImportError(ValueError):
    """Demos could not be imported (unreadable file, or invalid records in strict mode); lists every problem."""

    def __init__(self, errors: list[DemoError] | str):
        self.errors = errors if isinstance(errors, list) else []
        text = errors if isinstance(errors, str) else "\n".join(str(e) for e in errors)
        super().__init__(text)


@dataclass
class DemoImportResult:
    """What an import did: rows accepted (written now or already present), records rejected and why."""

    rows: list[Trajectory] = field(default_factory=list)
    written: int = 0
    skipped: int = 0
    errors: list[DemoError] = field(default_factory=list)

    @property
    def rejected_records(self) -> int:
        return len({(e.file, e.where) for e in self.errors})


def _atif_record(path: str) -> tuple[str, Any]:
    """One ATIF file as a demo record: its messages and tools, and the evidence it lacks (warehouse/atif.py)."""
    from warehouse.atif import atif_messages

    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        return "file", _Unparsable(f"is not a readable JSON file ({e})")
    if not isinstance(doc, dict) or not str(doc.get("schema_version", "")).startswith("ATIF-"):
        return "file", _Unparsable("is not an ATIF trajectory (no schema_version 'ATIF-v1.x')")
    try:
        msgs, _ids, _lps, missing = atif_messages(doc)
    except (KeyError, TypeError, ValueError) as e:
        return "file", _Unparsable(f"has an ATIF step this reader cannot map ({type(e).__name__}: {e})")
    prov = (doc.get("extra") or {}).get("flywheel") or {}
    rec = {"messages": [{**m.to_openai(), **({"reasoning": m.reasoning} if m.reasoning else {})} for m in msgs],
           "tools": (doc.get("agent") or {}).get("tool_definitions"),
           "missing_evidence": missing}
    for k in ("task_id", "suite", "split", "difficulty"):
        if prov.get(k) is not None:
            rec[k] = prov[k]
    return "file", rec


def read_records(path: str, format: str = "auto") -> list[tuple[str, Any]]:
    """(where, record) pairs of one input; raises DemoImportError when the input cannot be read at all.

    format "atif": an ATIF file, or a folder of them (*.json); "auto" also reads a .json file as ATIF. format
    "openenv": JSONL of OpenEnv training-contract records (RFC 012, warehouse/training_contract.py); "auto" also
    reads such a record on a JSONL line as one."""
    if format not in ("auto", "atif", "openenv"):
        raise DemoImportError(f"unknown demo format {format!r}; choose auto, atif or openenv")
    if format == "atif" or (path.endswith(".json") and os.path.isfile(path)):
        if os.path.isdir(path):
            files = sorted(os.path.join(path, f) for f in os.listdir(path) if f.endswith(".json"))
            if not files:
                raise DemoImportError(f"{path}: holds no .json ATIF files")
            return [(f"file {os.path.basename(f)}", _atif_record(f)[1]) for f in files]
        if not os.path.isfile(path):
            raise DemoImportError(f"{path}: no such file or folder")
        return [_atif_record(path)]
    if os.path.isdir(path):
        try:
            import datasets
        except ImportError as e:  # pragma: no cover - datasets is a project dependency
            raise DemoImportError(f"{path}: reading a datasets folder needs the 'datasets' package ({e})") from e
        try:
            ds = datasets.load_from_disk(path)
        except (FileNotFoundError, ValueError) as e:
            raise DemoImportError(f"{path}: not a folder written by datasets' save_to_disk ({e}); "
                                  f"pass a .jsonl or .parquet file or such a folder") from e
        if isinstance(ds, datasets.DatasetDict):
            return [(f"{split} row {i}", rec) for split in sorted(ds) for i, rec in enumerate(ds[split])]
        return [(f"row {i}", rec) for i, rec in enumerate(ds)]
    if not os.path.exists(path):
        raise DemoImportError(f"{path}: no such file or folder")
    if path.endswith(".parquet"):
        import pyarrow.parquet as pq

        try:
            recs = pq.read_table(path).to_pylist()
        except Exception as e:  # pyarrow raises several unrelated types for a bad file
            raise DemoImportError(f"{path}: not a readable Parquet file ({e})") from e
        return [(f"row {i}", rec) for i, rec in enumerate(recs)]
    if path.endswith(".jsonl"):
        out: list[tuple[str, Any]] = []
        with open(path, encoding="utf-8") as f:
            for n, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    out.append((f"line {n}", _contract_record(json.loads(line), format)))
                except json.JSONDecodeError as e:
                    out.append((f"line {n}", _Unparsable(f"is not valid JSON ({e.msg} at column {e.colno})")))
        return out
    raise DemoImportError(f"{path}: unknown demo format; use a .jsonl or .parquet file or a datasets folder")


def _contract_record(obj: Any, format: str) -> Any:
    """A JSONL line's object; an OpenEnv training-contract record as the demo record it holds."""
    from warehouse.training_contract import is_contract, record_to_demo

    if not is_contract(obj):
        return _Unparsable("is not an OpenEnv training-contract record (schema_version 1 with trace_entries)") \
            if format == "openenv" else obj
    try:
        return record_to_demo(obj)
    except (KeyError, TypeError, ValueError, IndexError) as e:
        return _Unparsable(f"is a training-contract record this reader cannot map ({type(e).__name__}: {e})")


@dataclass(frozen=True)
class _Unparsable:
    problem: str


def _content(v: Any) -> Any:
    # content parts: [{"type": "text", "text": ...}]
    if isinstance(v, list) and all(
        isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in v
    ):
        return "".join(p["text"] for p in v)
    return v


def _prepare_messages(raw: list[Any]) -> list[Any]:
    """Copy messages into plain OpenAI form: argument objects as JSON strings, text parts joined, and ids
    given to calls that have none when their tool replies carry none either (paired in order)."""
    msgs: list[Any] = []
    for m in raw:
        if not isinstance(m, dict):
            msgs.append(m)
            continue
        m = {k: v for k, v in m.items() if v is not None or k == "content"}
        m["content"] = _content(m.get("content"))
        calls = m.get("tool_calls")
        if isinstance(calls, list):
            fixed = []
            for c in calls:
                if isinstance(c, dict):
                    c = {k: v for k, v in c.items() if v is not None}
                    fn = dict(c.get("function") or {}) if isinstance(c.get("function"), dict) else c.get("function")
                    if isinstance(fn, dict) and isinstance(fn.get("arguments"), dict):
                        # Arrow-backed inputs give every argument object the union of keys, absent ones null.
                        fn["arguments"] = json.dumps({k: v for k, v in fn["arguments"].items() if v is not None})
                    c["function"] = fn
                    c.setdefault("type", "function")
                fixed.append(c)
            m["tool_calls"] = fixed or None
            if not fixed:
                m.pop("tool_calls")
        msgs.append(m)
    # pair id-less calls with id-less tool replies, in order
    for i, m in enumerate(msgs):
        calls = m.get("tool_calls") if isinstance(m, dict) and m.get("role") == "assistant" else None
        if not calls or any(isinstance(c, dict) and c.get("id") for c in calls):
            continue
        replies = []
        for r in msgs[i + 1 :]:
            if not isinstance(r, dict) or r.get("role") != "tool":
                break
            replies.append(r)
        if len(replies) == len(calls) and not any(r.get("tool_call_id") for r in replies):
            for j, (c, r) in enumerate(zip(calls, replies)):
                if isinstance(c, dict):
                    c["id"] = r["tool_call_id"] = f"call_{i}_{j}"
    return msgs


def _tools(rec: dict[str, Any], default_tools: list[str] | None) -> tuple[list[dict[str, Any]] | None, str | None]:
    tools = rec.get("tools")
    if tools is None:
        if default_tools is None:
            return None, "is missing (declare the tools the demo may call, or pass default tools to the importer)"
        tools = default_tools
    if isinstance(tools, str):
        try:
            tools = json.loads(tools)
        except json.JSONDecodeError as e:
            return None, f"is a string but not JSON ({e.msg})"
    if not isinstance(tools, list):
        return None, "must be a list of tool schemas or tool names"
    out = []
    for t in tools:
        if isinstance(t, str):
            if t not in TOOLS:
                return None, f"names unknown tool {t!r}; known: {sorted(TOOLS)} (or give its full schema)"
            out.append(TOOLS[t])
        else:
            out.append(t)
    try:
        tool_names(out)
    except ValueError as e:
        return None, str(e)
    return out, None


def record_to_row(
    rec: Any, *, file: str, where: str, run_id: str, round: int, suite: str, default_tools: list[str] | None
) -> tuple[Trajectory | None, list[DemoError]]:
    """One record -> (a Trajectory with source human, []) or (None, its problems)."""
    def err(fld: str, problem: str) -> DemoError:
        return DemoError(file, where, fld, problem)

    if isinstance(rec, _Unparsable):
        return None, [err("record", rec.problem)]
    if not isinstance(rec, dict):
        return None, [err("record", f"must be an object, got {type(rec).__name__}")]
    raw = rec.get("messages")
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError as e:
            return None, [err("messages", f"is a string but not JSON ({e.msg})")]
    if not isinstance(raw, list):
        return None, [err("messages", "is missing or not a list")]
    tools, tools_problem = _tools(rec, default_tools)
    if tools_problem is not None:
        return None, [err("tools", tools_problem)]
    assert tools is not None
    msgs = _prepare_messages(raw)
    problems = conversation_problems(msgs, tool_names(tools))
    if problems:
        return None, [err(f, p) for f, p in problems]
    try:
        messages = [Message.model_validate({k: v for k, v in m.items() if k in Message.model_fields}) for m in msgs]
    except ValueError as e:
        return None, [err("messages", f"does not fit the chat message schema: {e}")]

    first_user = next((m.content or "" for m in messages if m.role == "user"), "")
    task_id = rec.get("task_id") or "human-" + hashlib.sha256(" ".join(first_user.split()).encode()).hexdigest()[:12]
    split = rec.get("split") or "train"
    if split not in ("train", "heldout"):
        return None, [err("split", f"{split!r} must be 'train' or 'heldout'")]
    try:
        difficulty = int(rec.get("difficulty") or 0)
    except (TypeError, ValueError):
        return None, [err("difficulty", f"{rec.get('difficulty')!r} is not an integer")]
    expected = rec.get("expected_answer")
    row_suite = str(rec.get("suite") or suite)
    requires = rec.get("requires_tool", _required_tool(row_suite))
    if requires is not None and not isinstance(requires, str):
        return None, [err("requires_tool", f"{requires!r} must be a tool name or null")]
    task = Task(id=str(task_id), suite=row_suite, version="human", split=split, prompt=first_user,
                tools=list(tool_names(tools)), reference=ReferenceSolution(final=""),
                verifier=VerifierSpec(kind="numeric", answer=str(expected), requires_tool=requires)
                if expected is not None else VerifierSpec(kind="llm_judge", requires_tool=requires))
    answer = extract_answer(messages)
    details: dict[str, Any] = {"origin": f"{file} {where}"}
    if "missing_evidence" in rec:  # ATIF: what the file does not carry (token ids, logprobs, tool timings)
        details["missing_evidence"] = rec["missing_evidence"]
    contract = rec.get("contract")  # an OpenEnv rollout (warehouse/training_contract.py)
    strength: str | None = None
    if expected is not None:
        outcome = verify(task, messages)
        verdict, verifier, flags, strength = outcome.verdict, outcome.verifier, outcome.hack_flags, \
            outcome.verifier_strength
        details.update(outcome.details, verified=True, expected=str(expected), got=answer)
    elif contract is not None:  # judged by the environment's reward, as an `openenv:` suite's rows are, + forensics
        findings = inspect_episode(task, messages)
        flags = hack_flags(findings)
        env_reward = float(contract.get("reward") or 0.0)
        verdict = "hack" if flags else ("pass" if env_reward > 0 else "fail")
        verifier, strength = "openenv", "env"
        details.update(verified=True, env_reward=env_reward, forensics=[f.model_dump() for f in findings],
                       session_id=contract.get("session_id"))
    else:
        findings = inspect_episode(task, messages)
        flags = hack_flags(findings)
        verdict, verifier = ("hack" if flags else "pass"), HUMAN_VERIFIER
        details.update(verified=False, forensics=[f.model_dump() for f in findings],
                       note="human demonstration accepted as correct without a machine check")
    tools_json = json.dumps(tools)  # as given: key order is part of the prompt a model is trained on
    source = "env" if contract is not None else "human"
    key = json.dumps([source, run_id, round, normalised(messages), json.dumps(tools, sort_keys=True)],
                     separators=(",", ":"))
    author = rec.get("author")
    policy = f"human:{author}" if author else "human"
    if contract is not None:
        given = str(contract.get("policy") or contract.get("harness") or "import")
        policy = given if given.startswith("openenv:") else f"openenv:{given}"
    row = Trajectory(
        trajectory_id=hashlib.sha256(key.encode()).hexdigest()[:32],
        run_id=run_id, round=round, source=source, policy=policy,
        task_id=str(task_id), suite=row_suite, split=split,
        task_version=str(rec.get("task_version") or "human"), difficulty=difficulty,
        verifier=verifier, verifier_version=HUMAN_VERIFIER_VERSION, verifier_strength=strength,
        messages=messages, tools_json=tools_json, hack_flags=flags,
        answer=answer, reward=1.0 if verdict == "pass" else 0.0, success=verdict == "pass", verdict=verdict,
        verifier_details_json=json.dumps(details, sort_keys=True),
        turns=sum(1 for m in messages if m.role == "assistant"),
        n_tool_calls=sum(len(m.tool_calls or []) for m in messages),
        completion_token_ids=contract["completion_token_ids"] if contract else None,
        completion_logprobs=contract["logprobs"] if contract else None,
        prompt_token_ids=contract["prompt_token_ids"] if contract else None,
    )
    return row, []


def _required_tool(suite: str) -> str | None:
    """The tool the tasks of a built-in suite require (their verifier's requires_tool); None for other suites."""
    from tasks.suites import UnknownSuiteError, load_suite

    try:
        found = load_suite(suite, 1)
    except (UnknownSuiteError, ValueError, OSError):
        return None
    return found[0].verifier.requires_tool if found else None


def load_demos(
    paths: list[str], *, run_id: str, round: int = 0, suite: str = "human", default_tools: list[str] | None = None,
    format: str = "auto",
) -> tuple[list[Trajectory], list[DemoError]]:
    """Read and validate demos from files/folders; (valid rows, problems of the invalid records). Writes nothing.

    Raises DemoImportError when an input cannot be read at all (missing file, unknown format).
    """
    rows: list[Trajectory] = []
    errors: list[DemoError] = []
    for path in paths:
        for where, rec in read_records(path, format):
            row, errs = record_to_row(rec, file=path, where=where, run_id=run_id, round=round, suite=suite,
                                      default_tools=default_tools)
            errors.extend(errs)
            if row is not None:
                rows.append(row)
    return rows, errors


def import_demos(
    root: str, paths: list[str], *, run_id: str, round: int = 0, suite: str = "human",
    default_tools: list[str] | None = None, strict: bool = False, format: str = "auto",
) -> DemoImportResult:
    """Load, validate and write demos into the lake (idempotent). Invalid records are skipped and reported in
    the result; with strict=True any invalid record raises DemoImportError (listing all) and nothing is written.
    """
    from warehouse.lake import write_trajectories

    rows, errors = load_demos(paths, run_id=run_id, round=round, suite=suite, default_tools=default_tools,
                              format=format)
    if strict and errors:
        raise DemoImportError(errors)
    res = write_trajectories(root, rows) if rows else None
    unique = list({r.trajectory_id: r for r in rows}.values())
    return DemoImportResult(rows=unique, written=res.written if res else 0, skipped=res.skipped if res else 0,
                            errors=errors)
