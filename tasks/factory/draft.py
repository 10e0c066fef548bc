"""A synthesized task before admission (`TaskDraft`), and how it becomes a Harbor task folder.

A draft holds what a Harbor folder holds, as text: the instruction, the environment's input files (copied to the
working directory /app by a fixed Dockerfile over the sandbox image), the tests (test.sh and the files beside it)
and the solution (solve.sh and the files beside it), plus the task.toml limits. Both writers produce drafts: the
reference family (tasks/factory/ledger.py) and an LLM through `parse_proposal` (the strict JSON schema of
`ProposalSchema`, what agents/task_writer.py asks an endpoint for); a `Candidate` is a writer's output: a draft, or
why there is none, with what writing it cost. `write_folder(draft, dest)` writes one folder
atomically (a temp folder beside it, then rename): a folder is there whole or not at all.
This module does not judge or admit anything (curate/synthesis.py does) and builds no image.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import tomllib
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

import tomli_w
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

BASE_IMAGE = "flywheel-sandbox:bookworm"
WORKDIR = "/app"
_NAME = re.compile(r"^[a-z0-9][a-z0-9-]{1,62}$")


def dockerfile() -> str:
    """The Dockerfile of every synthesized task: the sandbox image, the input files copied to /app."""
    return f"FROM {BASE_IMAGE}\nUSER root\nWORKDIR {WORKDIR}\nCOPY files/ {WORKDIR}/\n"


def _relative(path: str) -> str:
    p = PurePosixPath(path)
    if p.is_absolute() or ".." in p.parts or not p.parts or path.endswith("/"):
        raise ValueError(f"{path!r} must be a relative file path without '..'")
    return p.as_posix()


class TaskDraft(BaseModel):
    """One candidate task as text (what a Harbor task folder holds)."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(description="Task name: lowercase letters, digits and '-' (the folder name, and "
                                  "'synth/<name>' in task.toml).")
    family: str = Field(description="The family or writer that made it, e.g. 'ledger' or 'openai'.")
    instruction: str = Field(min_length=1, description="The agent's prompt (instruction.md).")
    files: dict[str, str] = Field(default_factory=dict,
                                  description="Input files, relative path -> text, copied to /app in the image.")
    tests: dict[str, str] = Field(description="tests/ files, relative path -> text; test.sh writes the reward.")
    solution: dict[str, str] = Field(description="solution/ files, relative path -> text; solve.sh is the oracle.")
    difficulty: int = Field(default=1, ge=1, le=3, description="1-3, recorded in task.toml [metadata].")
    agent_timeout_s: float = Field(default=30.0, gt=0, description="Limit of each agent tool call, seconds.")
    verifier_timeout_s: float = Field(default=60.0, gt=0, description="Limit of test.sh, seconds.")
    memory_mb: int = Field(default=256, gt=0, description="Container memory limit, MB.")
    cpus: float = Field(default=1.0, gt=0, description="Container CPU quota, cores.")
    metadata: dict[str, str | int | float] = Field(default_factory=dict,
                                                   description="Extra [metadata] of task.toml (family knobs).")

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _NAME.match(v):
            raise ValueError(f"{v!r} must be 2-63 lowercase letters, digits or '-', starting with a letter or digit")
        return v

    @field_validator("files", "tests", "solution")
    @classmethod
    def _paths(cls, v: dict[str, str]) -> dict[str, str]:
        return {_relative(k): t for k, t in v.items()}

    @field_validator("tests")
    @classmethod
    def _has_test(cls, v: dict[str, str]) -> dict[str, str]:
        if "test.sh" not in v:
            raise ValueError("tests must hold test.sh")
        return v

    @field_validator("solution")
    @classmethod
    def _has_solve(cls, v: dict[str, str]) -> dict[str, str]:
        if "solve.sh" not in v:
            raise ValueError("solution must hold solve.sh")
        return v

    def size_bytes(self) -> int:
        """Bytes of every text of the folder."""
        return sum(len(t.encode()) for d in (self.files, self.tests, self.solution) for t in d.values()) + \
            len(self.instruction.encode())

    def task_toml(self) -> dict:
        """task.toml as a dict (schema 1.4)."""
        return {"schema_version": "1.4",
                "task": {"name": f"synth/{self.name}", "version": "1", "description": f"synthesized ({self.family})"},
                "metadata": {"family": self.family, "difficulty": self.difficulty, "synthesized": True,
                             **self.metadata},
                "verifier": {"timeout_sec": self.verifier_timeout_s},
                "agent": {"timeout_sec": self.agent_timeout_s},
                "environment": {"cpus": self.cpus, "memory_mb": self.memory_mb, "workdir": WORKDIR}}


@dataclass
class Candidate:
    """One writer output: a draft, or why the reply was none; with what writing it cost."""

    candidate_id: str
    writer: str
    family: str
    draft: TaskDraft | None
    problem: str | None = None  # reason code when draft is None (malformed_reply, writer_error)
    detail: str | None = None
    seed_tasks: list[str] = field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    usd: float = 0.0
    writer_s: float = 0.0


class ProposalSchema(BaseModel):
    """The strict JSON an LLM writer must answer with (one task); anything else is a malformed reply."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(description="lowercase-words-with-dashes")
    instruction: str = Field(description="The task for the agent; must not state the answer.")
    files: dict[str, str] = Field(description="Input files under /app: relative path -> text.")
    test_sh: str = Field(description="tests/test.sh: checks /app and writes 1 or 0 to /logs/verifier/reward.txt.")
    test_files: dict[str, str] = Field(default_factory=dict, description="Other tests/ files.")
    solve_sh: str = Field(description="solution/solve.sh: does the task in /app.")


class MalformedProposal(ValueError):
    """A writer's reply that is not one task in ProposalSchema; the message says what is wrong."""


def parse_proposal(text: str, *, family: str) -> TaskDraft:
    """A draft from a writer's reply (a JSON object, optionally inside a ```json fence); MalformedProposal else."""
    body = text.strip()
    fence = re.match(r"^```(?:json)?\s*\n(.*)\n```$", body, re.DOTALL)
    if fence:
        body = fence.group(1)
    try:
        raw = json.loads(body)
    except ValueError as e:
        raise MalformedProposal(f"not JSON: {e}") from None
    try:
        p = ProposalSchema.model_validate(raw)
        return TaskDraft(name=p.name, family=family, instruction=p.instruction, files=p.files,
                         tests={"test.sh": p.test_sh, **p.test_files}, solution={"solve.sh": p.solve_sh})
    except ValidationError as e:
        first = e.errors()[0]
        raise MalformedProposal(f"{len(e.errors())} schema error(s), first: "
                                f"{'.'.join(str(x) for x in first['loc'])}: {first['msg']}") from None


def _write(root: Path, files: dict[str, str], *, executable: bool = False) -> None:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text, encoding="utf-8")
        if executable and rel.endswith(".sh"):
            p.chmod(0o755)


def write_folder(draft: TaskDraft, dest: Path) -> Path:
    """Write the draft as the Harbor task folder `dest` (which must not exist), atomically; returns dest."""
    if dest.exists():
        raise FileExistsError(f"{dest} exists already; synthesized folders are never overwritten")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        (tmp / "task.toml").write_text(tomli_w.dumps(draft.task_toml()))
        (tmp / "instruction.md").write_text(draft.instruction.rstrip() + "\n", encoding="utf-8")
        (tmp / "environment" / "files").mkdir(parents=True)
        (tmp / "environment" / "Dockerfile").write_text(dockerfile())
        _write(tmp / "environment" / "files", draft.files)
        _write(tmp / "tests", draft.tests, executable=True)
        _write(tmp / "solution", draft.solution, executable=True)
        tmp.chmod(0o755)
        os.rename(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dest


def read_folder(folder: Path, name: str | None = None) -> TaskDraft:
    """A draft back from a Harbor task folder (one this module wrote, or any with tests/test.sh and
    solution/solve.sh), named `name` (default: the folder's name, which must then be a valid draft name)."""
    cfg = tomllib.loads((folder / "task.toml").read_text())

    def texts(sub: Path) -> dict[str, str]:
        return {p.relative_to(sub).as_posix(): p.read_text(encoding="utf-8", errors="replace")
                for p in sorted(sub.rglob("*")) if p.is_file()}

    meta = cfg.get("metadata", {})
    return TaskDraft(name=name or folder.name, family=str(meta.get("family", "?")),
                     instruction=(folder / "instruction.md").read_text(encoding="utf-8"),
                     files=texts(folder / "environment" / "files"), tests=texts(folder / "tests"),
                     solution=texts(folder / "solution"))
