"""Admission of synthesized tasks: the checks each candidate must pass, as reason codes.

Static checks (no sandbox), `static_reasons(...)`:
- over_limits: task.toml limits above the config's (memory, CPUs, timeouts) or a folder too big (bytes, files);
- leaks_test: a line of a tests/ file (at least `min_leak_line` characters, not a comment) is in the instruction;
- leaks_answer: a number of at least 3 characters from tests/ (any file), or a string or number value of a tests/
  data file (not .sh/.py; JSON keys, paths and names of input files left out), occurs in the instruction;
- heldout_copy: the candidate, as an episode (its instruction and input files as the user message, its oracle's
  tool calls), is matched by curate/decontam.py's rules against the held-out tasks, indexed with their input files
  too (`with_files`): the same rules that clean training rows, at the level of tasks, so that two tasks of one
  template with other data are not copies while a copy with its data is;
- duplicate: the same rules against the tasks admitted before it (`DuplicateIndex`).
Audit checks, `audit_reasons(row)` on agents/audit.py's HealthRow (the oracle, the null agent, the perturbed
oracles, K re-grades): audit_error, oracle_fails, null_passes, flaky, perturbed_<kind>_passes.
This module runs no sandbox and writes nothing (curate/synthesis.py does both).
"""

from __future__ import annotations

import json
import re
from pathlib import Path, PurePosixPath

from datasketch import MinHash, MinHashLSH

from agents.audit import HealthRow
from curate.config import DecontamConfig
from curate.decontam import Decontaminator
from curate.normalise import grams, tokens
from tasks.factory.draft import TaskDraft
from tasks.spec import Task
from warehouse.record import FunctionCall, Message, ToolCall, Trajectory

OVER_LIMITS = "over_limits"
LEAKS_TEST = "leaks_test"
LEAKS_ANSWER = "leaks_answer"
HELDOUT_COPY = "heldout_copy"
DUPLICATE = "duplicate"
INVALID_TASK = "invalid_task"
BUILD_FAILED = "build_failed"
MALFORMED_REPLY = "malformed_reply"
WRITER_ERROR = "writer_error"
AUDIT_ERROR = "audit_error"
ORACLE_FAILS = "oracle_fails"
NULL_PASSES = "null_passes"
FLAKY = "flaky"
_NUMBER = re.compile(r"(?<![\w.])-?\d+(?:\.\d+)?(?!\w|\.\d)")
_WS = re.compile(r"\s+")
_LSH_SEED = 3


def _norm(text: str) -> str:
    return _WS.sub(" ", text).strip().lower()


def _num(tok: str) -> str:
    v = float(tok)
    return str(int(v)) if v.is_integer() else repr(v)


def _leaves(value: object, out: list[str]) -> None:
    if isinstance(value, dict):
        for v in value.values():
            _leaves(v, out)
    elif isinstance(value, list):
        for v in value:
            _leaves(v, out)
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        out.append(_num(str(value)))
    elif isinstance(value, str):
        out.append(value)


def leak_reasons(draft: TaskDraft, *, min_leak_line: int = 24) -> list[str]:
    """leaks_test and/or leaks_answer (see the module docstring)."""
    instr = _norm(draft.instruction)
    reasons = []
    for text in draft.tests.values():
        lines = [_norm(line) for line in text.splitlines()]
        if any(len(line) >= min_leak_line and not line.startswith("#") and line in instr for line in lines):
            reasons.append(LEAKS_TEST)
            break
    input_names = {part for rel in draft.files for part in PurePosixPath(rel).parts} | \
        {PurePosixPath(rel).stem for rel in draft.files}
    numbers_in_instruction = {_num(t) for t in _NUMBER.findall(draft.instruction)}
    answers: set[str] = set()
    for rel, text in draft.tests.items():
        answers |= {_num(t) for t in _NUMBER.findall(text) if len(t.lstrip("-")) >= 3}
        if rel.endswith((".sh", ".py")):
            continue
        try:
            data = json.loads(text)
        except ValueError:
            data = None
        leaves: list[str] = []
        if data is not None:
            _leaves(data, leaves)
        else:
            leaves = [w for line in text.splitlines() for w in line.split()]
        for leaf in leaves:
            if _NUMBER.fullmatch(leaf.strip()):
                if len(leaf.strip().lstrip("-")) >= 3:
                    answers.add(_num(leaf))
            elif len(leaf) >= 3 and "/" not in leaf and leaf not in input_names and _norm(leaf) in instr:
                reasons.append(LEAKS_ANSWER)
                return reasons
    if answers & numbers_in_instruction:
        reasons.append(LEAKS_ANSWER)
    return reasons


def limit_reasons(draft: TaskDraft, *, max_bytes: int, max_files: int, max_memory_mb: int, max_cpus: float,
                  max_timeout_s: float) -> list[str]:
    """[over_limits] when any limit is exceeded, else []."""
    n_files = len(draft.files) + len(draft.tests) + len(draft.solution)
    over = (draft.size_bytes() > max_bytes or n_files > max_files or draft.memory_mb > max_memory_mb
            or draft.cpus > max_cpus or max(draft.agent_timeout_s, draft.verifier_timeout_s) > max_timeout_s)
    return [OVER_LIMITS] if over else []


def task_text(task: Task) -> str:
    """What a task asks about: its prompt, then its input files (a Harbor task's environment/files, a code task's
    workspace), each as `path:` and its text. Two tasks with one template but other data differ here."""
    files = dict(task.files)
    h = task.metadata.get("harbor")
    if isinstance(h, dict):
        env = Path(h["dir"]) / "environment" / "files"
        if env.is_dir():
            files.update({p.relative_to(env).as_posix(): p.read_text(encoding="utf-8", errors="replace")
                          for p in sorted(env.rglob("*")) if p.is_file()})
    return "\n\n".join([task.prompt, *(f"{rel}:\n{text}" for rel, text in sorted(files.items()))])


def with_files(tasks: list[Task]) -> list[Task]:
    """The tasks with task_text as their prompt: what the decontamination rules index for task-level matches."""
    return [t.model_copy(update={"prompt": task_text(t)}) for t in tasks]


def as_episode(task: Task) -> Trajectory:
    """The task as one episode for the decontamination rules: its prompt and input files (task_text) as the user
    message, then its oracle's tool calls."""
    calls = [ToolCall(id=f"call_{i}", function=FunctionCall(name=s.tool, arguments=json.dumps(s.arguments)))
             for i, s in enumerate(task.reference.steps)]
    msgs = [Message(role="user", content=task_text(task))]
    if calls:
        msgs.append(Message(role="assistant", content=None, tool_calls=calls))
    msgs.append(Message(role="assistant", content=task.reference.final or "Done."))
    return Trajectory(trajectory_id=f"candidate:{task.id}", run_id="synthesis", source="reference",
                      policy="oracle", task_id=task.id, suite=task.suite, split="train", task_version=task.version,
                      verifier=task.verifier.kind, verifier_version="-", messages=msgs, verdict="pass")


class DuplicateIndex:
    """Tasks admitted so far; `match(task)` names the first that the decontamination rules say the task copies.

    The rules are checked against the task's near neighbours only: a MinHash/LSH over 3-token shingles of each
    task_text with a low Jaccard threshold (`prefilter`, far below the rules' own) proposes them, and a
    Decontaminator over those decides. Rebuilding the rules' index over every admitted task for each candidate
    was quadratic (100 ledger candidates: 88 s here); a task nothing resembles is now one LSH query."""

    def __init__(self, tasks: list[Task], cfg: DecontamConfig, *, prefilter: float = 0.3, num_perm: int = 64):
        self.cfg = cfg
        self.num_perm = num_perm
        self.lsh = MinHashLSH(threshold=prefilter, num_perm=num_perm)
        self.indexed: dict[str, Task] = {}
        self._hashes: dict[str, MinHash] = {}  # a candidate's, from match() to add()
        for t in tasks:
            self.add(t)

    def _minhash(self, task: Task) -> MinHash:
        if task.id not in self._hashes:
            sh = grams(tokens(task_text(task)), 3) or {("",)}
            self._hashes[task.id] = next(iter(MinHash.bulk([[" ".join(g).encode() for g in sh]],
                                                           num_perm=self.num_perm, seed=_LSH_SEED)))
        return self._hashes[task.id]

    def add(self, task: Task) -> None:
        if task.id not in self.indexed:
            self.indexed[task.id] = with_files([task])[0]
            self.lsh.insert(task.id, self._minhash(task))
        self._hashes.pop(task.id, None)

    def match(self, task: Task) -> str | None:
        near = sorted(self.lsh.query(self._minhash(task)))
        if not near:
            return None
        hit = Decontaminator([self.indexed[i] for i in near], self.cfg).match(
            as_episode(task).model_copy(update={"task_id": f"candidate:{task.id}"}))
        return hit.heldout_id if hit else None


def audit_reasons(row: HealthRow) -> list[str]:
    """Reason codes of one audit row (empty: the verifier is healthy for admission: every perturbed oracle
    killed, no disagreement among the oracle's gradings)."""
    if row.error:
        return [AUDIT_ERROR]
    out = []
    if not row.oracle_pass:
        out.append(ORACLE_FAILS)
    if row.null_pass:
        out.append(NULL_PASSES)
    if row.flake_rate > 0:
        out.append(FLAKY)
    out += [f"perturbed_{kind}_passes" for kind in row.mutant_survivors]
    return out
