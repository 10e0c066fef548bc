"""Harbor task folders as flywheel tasks: load and validate them, give their agent a sandbox, grade them fail-closed.

A Harbor task (the layout of the `harbor` package's harbor/models/task, read as the spec; task.toml schema 1.x) is a
folder with `task.toml`, `instruction.md` (the prompt; leading canary comment lines stripped, as Harbor does),
`environment/Dockerfile` (or `[environment] docker_image`), `tests/test.sh` (writes /logs/verifier/reward.json or
reward.txt) and `solution/solve.sh` (the oracle). `load_harbor(DIR)` takes one task folder or a folder of them and
returns Tasks with verifier kind `harbor`, or raises HarborTaskError listing every problem of every folder (nothing
partial). What is honoured, from task.toml:
- `schema_version` (or the old `version`) must be 1.x; `[task]` name/version/description, `[metadata]` (kept; a
  `split = "heldout"` there puts the task in the held-out split, else train);
- `[agent] timeout_sec` is the wall-clock limit of each of the agent's tool calls, `user` the user they run as;
- `[verifier] timeout_sec` bounds test.sh, `user` runs it, `env` is set for it; `[solution] env` for the oracle;
- `[environment]`: `memory_mb` (or the old `memory = "1G"`) and `cpus` become the container's limits, `workdir` its
  working directory, `env` its variables (`${VAR:-default}` takes the default; a host variable without a default is
  refused: no host variable enters a sandbox), `build_timeout_sec` bounds the image build; `storage_mb` and
  `network_mode` are recorded (every sandbox here has no network at all); `gpus`, `os = "windows"`, `mcp_servers`,
  `[[steps]]` and a `[verifier.environment]` are refused with the reason.
The agent gets the `shell`, `read_file` and `write_file` tools in a fresh container of the task's image (built from
environment/ by sandbox/taskenv.py, tagged by a content hash). The tests are never in that container. When the
agent is done, `verify_harbor` starts a fresh container from the same image, copies into it what the agent left
under the state paths (the working directory, /logs/artifacts and task.toml `artifacts`), clears /logs/verifier,
copies tests/ to /tests, runs test.sh there and reads the reward from /logs/verifier/reward.json (a number, or an
object whose `reward` key, or single key, is the number) or else reward.txt. No reward file, an empty or
non-numeric or non-finite one, reward.json and reward.txt that disagree (code the grader ran may have written one),
or a test.sh past its timeout is reward 0, verdict fail, with the reason in the details. test.sh runs with
PYTHONSAFEPATH=1 and PYTHONPATH=/tests (GRADER_ENV, before the task's [verifier] env): its Python never puts the
working folder or a script's folder first on sys.path, so an agent's /app/json.py cannot shadow a grader's import.
Reward 1 (or more) is a pass; a fraction is kept as the reward of a fail. A reward file the agent wrote in its own
container never reaches the verifier's, and neither does anything it did to /tests.
The oracle becomes the reference solution: one `shell` call that writes solution/ to /solution and runs
solve.sh (with `[solution] env`), then a final message. A stored episode judged again (no open container) has its
tool calls replayed in a fresh container of the image first.
This module does not run the episode loop (agents/loop.py) nor build images itself (sandbox/taskenv.py).
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import re
import shlex
import threading
import time
import tomllib
from pathlib import Path, PurePosixPath
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from sandbox.result import Backend, SandboxConfig, SandboxError, SandboxUnavailable
from tasks.judge.errors import VerifierUnavailable
from tasks.spec import ReferenceSolution, Task, ToolCallStep, VerifierSpec
from warehouse.record import Message

# 2: test.sh's Python never imports from its working folder (PYTHONSAFEPATH, /tests on the path), and reward.json
# and reward.txt that disagree are a fail
HARBOR_VERIFIER_VERSION = "2"
# test.sh's environment before the task's [verifier] env: Python in it does not put the working folder (the agent's
# /app) or a script's folder first on sys.path, so an agent's /app/json.py cannot shadow a grader's `import json`;
# /tests stays importable for the grader's own helpers; no user site, no startup file
GRADER_ENV = {"PYTHONSAFEPATH": "1", "PYTHONPATH": "/tests", "PYTHONNOUSERSITE": "1"}
GRADER_UNSET = ("PYTHONSTARTUP", "PYTHONHOME", "PYTHONINSPECT", "PYTHONUSERBASE", "PYTHONPLATLIBDIR")
HARBOR_TOOLS = ["shell", "read_file", "write_file"]
REWARD_JSON = "/logs/verifier/reward.json"
REWARD_TXT = "/logs/verifier/reward.txt"
TEST_STDOUT = "/logs/verifier/test-stdout.txt"
RESERVED = ("/tests", "/logs/verifier", "/solution")
_CANARY = re.compile(r"^(<!--.*canary.*-->|#.*canary.*)$", re.IGNORECASE)
_ORG_NAME = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9._-]*/[a-zA-Z0-9][a-zA-Z0-9._-]*$")
_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(:-([^}]*))?\}")


class HarborTaskError(ValueError):
    """Harbor task folders that cannot be loaded; the message lists every problem (folder, file, field)."""


# ---------------------------------------------------------------------------------------------- task.toml
# The fields of harbor/models/task/config.py (TaskConfig, schema 1.4) that flywheel reads; unknown keys are ignored,
# as Harbor's own models ignore them.


class _Section(BaseModel):
    model_config = ConfigDict(extra="ignore")


class PackageInfo(_Section):
    name: str = Field(description="org/name, e.g. 'flywheel/count-lines'.")
    version: str | None = Field(default=None, description="The task's own version string.")
    description: str = Field(default="", description="What the task is about.")

    @field_validator("name")
    @classmethod
    def _org_name(cls, v: str) -> str:
        if not _ORG_NAME.match(v) or ".." in v:
            raise ValueError(f"must be 'org/name' (letters, digits, '.', '_', '-'), not {v!r}")
        return v


class AgentSection(_Section):
    timeout_sec: float | None = Field(default=None, gt=0, description="Limit of each agent tool call, seconds.")
    user: str | int | None = Field(default=None, description="User the agent's calls run as (image USER if unset).")


class VerifierSection(_Section):
    timeout_sec: float = Field(default=600.0, gt=0, description="Limit of test.sh, seconds.")
    env: dict[str, str] = Field(default_factory=dict, description="Variables set for test.sh.")
    user: str | int | None = Field(default=None, description="User test.sh runs as (image USER if unset).")
    environment_mode: Literal["shared", "separate"] | None = Field(
        default=None, description="Harbor's verifier placement; flywheel always verifies in a fresh container.")
    environment: dict[str, Any] | None = Field(default=None, description="A separate verifier image: refused.")


class EnvironmentSection(_Section):
    build_timeout_sec: float = Field(default=600.0, gt=0, description="Limit of the image build, seconds.")
    docker_image: str | None = Field(default=None, description="A prebuilt image instead of environment/.")
    os: str = Field(default="linux", description="linux (windows is refused).")
    cpus: float | None = Field(default=None, gt=0, description="CPU quota of the container, cores.")
    memory_mb: int | None = Field(default=None, gt=0, description="Memory limit of the container, MB.")
    storage_mb: int | None = Field(default=None, description="Recorded only (no disk quota here).")
    gpus: int | None = Field(default=None, description="GPUs: any above 0 is refused.")
    network_mode: str | None = Field(default=None, description="Recorded only: sandboxes here have no network.")
    allow_internet: bool | None = Field(default=None, description="Deprecated Harbor field; recorded only.")
    workdir: str | None = Field(default=None, description="Working directory of every command.")
    env: dict[str, str] = Field(default_factory=dict, description="Container variables.")
    mcp_servers: list[Any] = Field(default_factory=list, description="MCP servers: refused when any.")

    @model_validator(mode="before")
    @classmethod
    def _legacy_sizes(cls, data: Any) -> Any:
        if isinstance(data, dict):
            data = dict(data)
            for old, new in (("memory", "memory_mb"), ("storage", "storage_mb")):
                if isinstance(data.get(old), str):
                    data.setdefault(new, _size_mb(data.pop(old)))
        return data


def _size_mb(s: str) -> int:
    t = s.strip().upper()
    scale = {"G": 1024.0, "M": 1.0, "K": 1 / 1024}
    if not t or t[-1] not in scale:
        raise ValueError(f"size {s!r} must look like '1G', '512M' or '1024K'")
    return int(float(t[:-1]) * scale[t[-1]])


class SolutionSection(_Section):
    env: dict[str, str] = Field(default_factory=dict, description="Variables set for solve.sh.")


class TaskToml(_Section):
    schema_version: str = Field(default="1.4", description="Harbor task.toml schema version (1.x).")
    task: PackageInfo | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    verifier: VerifierSection = Field(default_factory=VerifierSection)
    agent: AgentSection = Field(default_factory=AgentSection)
    environment: EnvironmentSection = Field(default_factory=EnvironmentSection)
    solution: SolutionSection = Field(default_factory=SolutionSection)
    steps: list[Any] | None = None
    artifacts: list[str | dict[str, Any]] = Field(default_factory=list)

    @model_validator(mode="before")
    @classmethod
    def _version_rename(cls, data: Any) -> Any:
        if isinstance(data, dict) and "version" in data:
            data = dict(data)
            data.setdefault("schema_version", str(data.pop("version")))
        return data


# ---------------------------------------------------------------------------------------------- loading


def strip_canary(text: str) -> str:
    lines = text.split("\n")
    i = 0
    while i < len(lines) and _CANARY.match(lines[i].strip()):
        i += 1
    while i < len(lines) and not lines[i].strip():
        i += 1
    return "\n".join(lines[i:])


def _resolve_env(env: dict[str, str], where: str, problems: list[str]) -> dict[str, str]:
    out = {}
    for k, v in env.items():
        def sub(m: re.Match, k: str = k) -> str:
            if m.group(2) is None:
                problems.append(f"{where}.{k}: uses host variable ${{{m.group(1)}}} without a default; no host "
                                f"variable enters a sandbox here: write the value, or ${{{m.group(1)}:-VALUE}}")
                return ""
            return m.group(3)
        out[k] = _ENV_REF.sub(sub, str(v))
    return out


def _files(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _folder_hash(folder: Path) -> str:
    h = hashlib.sha256()
    for rel, data in _files(folder).items():
        h.update(rel.encode() + b"\0" + hashlib.sha256(data).digest())
    return h.hexdigest()


def _state_paths(cfg: TaskToml, workdir: str | None, problems: list[str]) -> list[str]:
    paths = ([workdir] if workdir else []) + ["/logs/artifacts"]
    for a in cfg.artifacts:
        src = a if isinstance(a, str) else a.get("source")
        if not isinstance(src, str) or not src.startswith("/"):
            problems.append(f"task.toml: artifacts entry {a!r} needs an absolute source path")
            continue
        paths.append(str(PurePosixPath(src)))
    out = []
    for p in paths:
        if p == "/" or any(p == r or p.startswith(r + "/") or r.startswith(p + "/") for r in RESERVED):
            problems.append(f"state path {p!r} (workdir or artifacts) must not be /, nor hold or lie in "
                            f"{', '.join(RESERVED)}: the verifier's inputs are its own")
        elif p not in out:
            out.append(p)
    return out


def _reference(solution: dict[str, bytes], env: dict[str, str]) -> ReferenceSolution:
    """One shell call that writes solution/ to /solution and runs solve.sh, as Harbor's oracle agent does."""
    lines = ["mkdir -p /solution"]
    for rel, data in solution.items():
        dest = shlex.quote(f"/solution/{rel}")
        parent = shlex.quote(str(PurePosixPath(f"/solution/{rel}").parent))
        if parent != "/solution":
            lines.append(f"mkdir -p {parent}")
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            text = None
        mark = "FLYWHEEL_EOF"
        if text is not None and text.endswith("\n") and mark not in text:
            lines.append(f"cat > {dest} <<'{mark}'\n{text}{mark}")
        else:
            lines.append(f"printf '%s' '{base64.b64encode(data).decode()}' | base64 -d > {dest}")
        if rel.endswith(".sh"):
            lines.append(f"chmod +x {dest}")
    exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
    lines.append(f"{exports + ' ' if exports else ''}bash /solution/solve.sh")
    return ReferenceSolution(steps=[ToolCallStep(tool="shell", arguments={"command": "\n".join(lines)})],
                             final="Done: I ran the solution script; the task should be complete.")


def _task_dirs(root: Path) -> list[Path]:
    if (root / "task.toml").is_file():
        return [root]
    return sorted(p for p in root.iterdir() if p.is_dir() and (p / "task.toml").is_file())


def load_one(folder: Path, suite: str, problems: list[str]) -> Task | None:
    """One task folder as a Task, or None with its problems appended (each prefixed with the folder)."""
    mine: list[str] = []
    raw: dict[str, Any] = {}
    try:
        raw = tomllib.loads((folder / "task.toml").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        mine.append(f"task.toml: not valid TOML ({e})")
    cfg: TaskToml | None = None
    if not mine:
        try:
            cfg = TaskToml.model_validate(raw)
        except ValidationError as e:
            for err in e.errors():
                mine.append(f"task.toml: field {'.'.join(str(x) for x in err['loc'])}: {err['msg']}")
    if cfg is not None:
        if not re.match(r"^1(\.\d+)*$", cfg.schema_version):
            mine.append(f"task.toml: schema_version {cfg.schema_version!r} is not 1.x, the Harbor schema flywheel "
                        "reads (1.4)")
        if cfg.steps:
            mine.append("task.toml: [[steps]] (multi-step tasks) are not supported; split it into single tasks")
        if cfg.verifier.environment is not None:
            mine.append("task.toml: [verifier.environment] (a verifier image of its own) is not supported; flywheel "
                        "verifies in a fresh container of the task's own image")
        if cfg.environment.os.lower() != "linux":
            mine.append(f"task.toml: [environment] os = {cfg.environment.os!r}: only linux containers run here")
        if cfg.environment.gpus:
            mine.append(f"task.toml: [environment] gpus = {cfg.environment.gpus}: sandboxes here have no GPU")
        if cfg.environment.mcp_servers:
            mine.append("task.toml: [environment] mcp_servers are not supported (sandboxes have no network)")
    instruction = folder / "instruction.md"
    if not instruction.is_file():
        mine.append("instruction.md is missing (it is the agent's prompt)")
    elif not strip_canary(instruction.read_text(encoding="utf-8", errors="replace")).strip():
        mine.append("instruction.md is empty")
    if not (folder / "tests" / "test.sh").is_file():
        mine.append("tests/test.sh is missing (the verifier runs it)")
    if not (folder / "solution" / "solve.sh").is_file():
        mine.append("solution/solve.sh is missing (the oracle, flywheel's reference solution)")
    has_df = (folder / "environment" / "Dockerfile").is_file()
    if any((folder / "environment" / f).is_file() for f in ("docker-compose.yaml", "docker-compose.yml")):
        mine.append("environment/docker-compose.yaml: multi-container environments are not supported; give the "
                    "task one environment/Dockerfile")
    elif cfg is not None and not has_df and not cfg.environment.docker_image:
        mine.append("environment/Dockerfile is missing and [environment] docker_image is not set")
    if cfg is None or mine:
        problems.extend(f"{folder}: {m}" for m in mine)
        return None
    env = _resolve_env(cfg.environment.env, "[environment] env", mine)
    venv = _resolve_env(cfg.verifier.env, "[verifier] env", mine)
    senv = _resolve_env(cfg.solution.env, "[solution] env", mine)
    from sandbox.taskenv import env_hash

    image = (f"flywheel-env:{env_hash(folder / 'environment')[:16]}" if has_df else cfg.environment.docker_image)
    state = _state_paths(cfg, cfg.environment.workdir, mine)
    if mine:
        problems.extend(f"{folder}: {m}" for m in mine)
        return None
    split = cfg.metadata.get("split", "train")
    tid = cfg.task.name if cfg.task else folder.name
    digest = _folder_hash(folder)[:12]
    version = f"{cfg.task.version}+{digest}" if cfg.task and cfg.task.version else digest
    tests = {rel: base64.b64encode(b).decode() for rel, b in _files(folder / "tests").items()}
    harbor = {
        "dir": str(folder.resolve()), "schema_version": cfg.schema_version, "image": image,
        "build_from": "environment/Dockerfile" if has_df else "docker_image",
        "build_timeout_s": cfg.environment.build_timeout_sec, "workdir": cfg.environment.workdir,
        "agent_user": None if cfg.agent.user is None else str(cfg.agent.user),
        "verifier_user": None if cfg.verifier.user is None else str(cfg.verifier.user),
        "agent_timeout_s": cfg.agent.timeout_sec, "verifier_timeout_s": cfg.verifier.timeout_sec,
        "memory_mb": cfg.environment.memory_mb, "cpus": cfg.environment.cpus,
        "storage_mb": cfg.environment.storage_mb, "network_mode": cfg.environment.network_mode,
        "env": env, "verifier_env": venv, "state_paths": state, "tests": tests,
        "description": cfg.task.description if cfg.task else "",
    }
    try:
        return Task(id=tid, suite=suite, version=version, split=split if split in ("train", "heldout") else "train",
                    prompt=strip_canary(instruction.read_text(encoding="utf-8", errors="replace")).strip(),
                    tools=list(HARBOR_TOOLS),
                    verifier=VerifierSpec(kind="harbor", timeout_s=cfg.verifier.timeout_sec),
                    reference=_reference(_files(folder / "solution"), senv),
                    metadata={"source_format": "harbor", "harbor": harbor, "task_metadata": cfg.metadata})
    except ValidationError as e:
        problems.append(f"{folder}: {e}")
        return None


def is_harbor_dir(path: str | Path) -> bool:
    """True for a Harbor task folder or a folder holding at least one."""
    p = Path(path)
    return p.is_dir() and bool(_task_dirs(p))


def load_harbor(path: str | Path, *, build: bool = False) -> list[Task]:
    """Every task under `path` (one task folder, or a folder of task folders), validated; with `build`, their images
    too (reused when present). Raises HarborTaskError naming every problem; nothing partial is returned."""
    root = Path(path)
    if not root.is_dir():
        raise HarborTaskError(f"{root}: no such folder; pass a Harbor task folder or a folder of them")
    dirs = _task_dirs(root)
    if not dirs:
        raise HarborTaskError(f"{root}: holds no task.toml, neither itself nor in a subfolder; a Harbor task is a "
                              "folder with task.toml, instruction.md, environment/, tests/ and solution/")
    problems: list[str] = []
    suite = root.name if len(dirs) > 1 or dirs[0] != root else root.parent.name or root.name
    tasks = [t for d in dirs if (t := load_one(d, suite, problems)) is not None]
    seen: dict[str, str] = {}
    for t in tasks:
        if t.id in seen:
            problems.append(f"{t.metadata['harbor']['dir']}: task id {t.id!r} is also the id of {seen[t.id]}")
        seen[t.id] = t.metadata["harbor"]["dir"]
    if problems:
        raise HarborTaskError(f"{len(problems)} problem(s) in {root}:\n" + "\n".join(problems))
    if build:
        build_images(tasks)
    return tasks


def build_images(tasks: list[Task]) -> dict[str, str]:
    """Build (or reuse) the image of every task; task id -> image tag. Raises SandboxUnavailable naming the task."""
    from sandbox.engine import docker_client, image_id
    from sandbox.taskenv import build_env_image

    client = docker_client(timeout=300)
    out: dict[str, str] = {}
    try:
        for t in tasks:
            h = t.metadata["harbor"]
            if h["build_from"] == "docker_image":
                if image_id(h["image"], client) is None:
                    raise SandboxUnavailable(
                        f"{t.id}: [environment] docker_image {h['image']!r} is not in the local Docker engine and "
                        f"nothing is pulled here; fix: `docker pull {h['image']}` (or `docker load`) where a "
                        "registry is reachable, or give the task an environment/Dockerfile")
                out[t.id] = h["image"]
            else:
                out[t.id] = build_env_image(Path(h["dir"]) / "environment", name=t.id,
                                            timeout_s=h["build_timeout_s"], client=client)
    finally:
        client.close()
    return out


# ---------------------------------------------------------------------------------------------- sandboxes

_backends: dict[tuple, Backend] = {}
_lock = threading.Lock()


# with reuse, what an agent's container has reset besides the task's state paths: scratch, and the folders the
# verifier and the oracle own (an agent that wrote /solution or /tests must not hand them to the next episode)
AGENT_RESET_PATHS = ("/tmp", "/solution", "/tests", "/logs")
IDLE_CAP = 32  # reset agent containers kept waiting, over every task image (the least recently used go first)
_last_used: dict[tuple, float] = {}


def _backend(task: Task, base: SandboxConfig, role: Literal["agent", "verifier"], reuse: bool = False) -> Backend:
    from sandbox.taskenv import TaskEnvBackend

    reuse = reuse and role == "agent"
    h = task.metadata["harbor"]
    timeout = h["agent_timeout_s"] if role == "agent" else h["verifier_timeout_s"]
    cfg = base.model_copy(update={"image": h["image"], "backend": "docker",
                                  "memory_mb": h["memory_mb"] or base.memory_mb, "cpus": h["cpus"] or base.cpus,
                                  "timeout_s": timeout or base.timeout_s})
    user = h["agent_user"] if role == "agent" else h["verifier_user"]
    key = (cfg.model_dump_json(), user, h["workdir"], json.dumps(h["env"], sort_keys=True), reuse)
    with _lock:
        be = _backends.get(key)
        if be is None:
            be = TaskEnvBackend(cfg, user=user, workdir=h["workdir"], env=h["env"],
                                reset_paths=[*h["state_paths"], *AGENT_RESET_PATHS] if reuse else None)
            _backends[key] = be
        if reuse:
            _last_used[key] = time.monotonic()
    return be


def _trim_idle(keep: Backend) -> None:
    """Remove waiting agent containers, least recently used image first (never `keep`'s), down to IDLE_CAP."""
    with _lock:
        others = [_backends[k] for _, k in sorted((t, k) for k, t in _last_used.items()) if _backends[k] is not keep]
    over = sum(b.idle() for b in [*others, keep]) - IDLE_CAP  # type: ignore[attr-defined]
    for b in others:
        if over <= 0:
            break
        over -= b.trim_idle(0)  # type: ignore[attr-defined]


def _base_config(backend: Backend | None) -> SandboxConfig:
    if backend is None:
        return SandboxConfig(backend="docker")
    if getattr(backend, "name", None) != "docker":
        raise SandboxUnavailable(f"Harbor tasks run in their own Docker images, not on the {backend.name!r} backend; "
                                 "fix: --backend docker")
    return backend.config  # type: ignore[attr-defined]


def acquire(task: Task, backend: Backend | None, *, reuse: bool = False):
    """A container of the task's image for the agent (the run's backend gives the limits; must be Docker): a fresh
    one, or with `reuse` (and the run's sandbox.reuse not false) one an earlier episode of the same image left,
    reset as sandbox/taskenv.py describes (a fresh one when none waits)."""
    be = _backend(task, _base_config(backend), "agent", reuse)
    if reuse:
        _trim_idle(be)
    return be.acquire()


def reuse_stats() -> dict[str, int]:
    """Over this process's reusing agent backends: containers started, episodes that got a reset one, resets that
    failed (the container was removed)."""
    with _lock:
        bes = [_backends[k] for k in _last_used if k in _backends]
    return {k: sum(b.stats[k] for b in bes) for k in ("started", "reused", "reset_failed")}  # type: ignore[attr-defined]


def shutdown() -> None:
    """Remove every container of the task backends this process opened."""
    with _lock:
        bes = list(_backends.values())
        _backends.clear()
        _last_used.clear()
    for be in bes:
        be.shutdown()


# ---------------------------------------------------------------------------------------------- the verifier


def parse_reward(json_bytes: bytes | None, txt_bytes: bytes | None) -> tuple[float | None, dict[str, Any]]:
    """(reward, details) from the reward files, reward.json first as Harbor reads them; None when there is none
    that parses (details say why)."""
    if json_bytes is not None:
        where = REWARD_JSON
        if not json_bytes.strip():
            return None, {"error": f"{where} is empty"}
        try:
            val = json.loads(json_bytes)
        except ValueError as e:
            return None, {"error": f"{where} is not JSON: {e}"}
        rewards = val if isinstance(val, dict) else {"reward": val}
        for k, v in rewards.items():
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                return None, {"error": f"{where}: {k!r} is {v!r}, not a finite number", "rewards": str(val)[:300]}
        if "reward" in rewards:
            return float(rewards["reward"]), {"rewards": rewards, "reward_file": where}
        if len(rewards) == 1:
            return float(next(iter(rewards.values()))), {"rewards": rewards, "reward_file": where}
        return None, {"error": f"{where} holds {sorted(rewards)} but no 'reward' key", "rewards": rewards}
    if txt_bytes is not None:
        where = REWARD_TXT
        if not txt_bytes.strip():
            return None, {"error": f"{where} is empty"}
        try:
            v = float(txt_bytes.decode("utf-8", errors="replace").strip())
        except ValueError:
            return None, {"error": f"{where} is not a number: {txt_bytes[:80]!r}"}
        if not math.isfinite(v):
            return None, {"error": f"{where} is {v}, not finite"}
        return v, {"rewards": {"reward": v}, "reward_file": where}
    return None, {"error": f"test.sh wrote neither {REWARD_JSON} nor {REWARD_TXT}"}


def reward_files_disagree(json_bytes: bytes | None, txt_bytes: bytes | None) -> str | None:
    """Why two reward files (reward.json and reward.txt both written) do not give one reward, or None when they do
    or when there is at most one. Code the grader ran (the agent's module, imported by a check) can write one of
    them; Harbor reads reward.json first, so the verifier fails closed when they disagree."""
    if json_bytes is None or txt_bytes is None:
        return None
    rj, dj = parse_reward(json_bytes, None)
    rt, dt = parse_reward(None, txt_bytes)
    if rj is not None and rt is not None and math.isclose(rj, rt, rel_tol=1e-9, abs_tol=1e-9):
        return None
    return (f"{REWARD_JSON} and {REWARD_TXT} disagree ({rj if rj is not None else dj['error']} vs "
            f"{rt if rt is not None else dt['error']}): fail-closed")


def _replay(sb: Any, messages: list[Message]) -> int:
    """Run the episode's tool calls again, in order, in `sb`; the number that ran (undecodable ones are skipped, as
    the loop never ran them either)."""
    from tasks.tools import ToolArgumentError, parse_arguments, run_tool

    n = 0
    for m in messages:
        for call in (m.tool_calls or []) if m.role == "assistant" else []:
            try:
                args = parse_arguments(call.function.name, call.function.arguments)
            except ToolArgumentError:
                continue
            run_tool(sb, call.function.name, args)
            n += 1
    return n


def verify_harbor(task: Task, messages: list[Message], agent_sandbox: Any,
                  backend: Backend | None) -> tuple[float, bool, dict[str, Any]]:
    """Grade the agent's final state in a fresh container (see the module docstring): (reward, passed, details).

    `agent_sandbox` is the episode's open container; None when the loop never opened one (no tool call) or when a
    stored episode is judged again: its tool calls are then replayed in a fresh container of the image first.
    Raises VerifierUnavailable on infrastructure failures (infra_error).
    """
    from sandbox.taskenv import copy_paths, get_file, put_tree, root_exec

    h = task.metadata["harbor"]
    base = _base_config(backend)
    details: dict[str, Any] = {"image": h["image"], "verifier_timeout_s": h["verifier_timeout_s"]}
    opened = []
    try:
        src = agent_sandbox
        if src is None:  # re-judging a stored episode (flywheel verify): its tool calls again, in a fresh container
            src = _backend(task, base, "agent").acquire()
            opened.append(src)
            details["replayed_calls"] = _replay(src, messages)
        vsb = _backend(task, base, "verifier").acquire()
        opened.append(vsb)
        paths = list(h["state_paths"])
        workdir = _backend(task, base, "agent").exec_workdir  # type: ignore[attr-defined]
        if workdir in ("", "/"):
            details["error"] = ("the task's working directory is /, which cannot be carried to the verifier; set "
                                "[environment] workdir (or WORKDIR in the Dockerfile)")
            return 0.0, False, details
        if workdir not in paths:
            paths.insert(0, workdir)
        details["state"] = copy_paths(src, vsb, paths)
        prepare = ("rm -rf /tests /logs/verifier && mkdir -p /logs/verifier /logs/artifacts && "
                   "chmod 777 /logs /logs/verifier /logs/artifacts")
        code, out = root_exec(vsb, ["sh", "-c", prepare])
        if code != 0:
            raise SandboxError(f"preparing /logs/verifier failed: {out[-300:]}")
        put_tree(vsb, "/tests", {rel: base64.b64decode(b) for rel, b in h["tests"].items()})
        exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in {**GRADER_ENV, **h["verifier_env"]}.items())
        cmd = (f"chmod +x /tests/test.sh 2>/dev/null; unset {' '.join(GRADER_UNSET)}; export {exports}; "
               f"/tests/test.sh > {TEST_STDOUT} 2>&1")
        res = vsb.exec(["sh", "-c", cmd], timeout_s=h["verifier_timeout_s"])
        if res.verdict == "infra_error":
            raise SandboxError(res.error or "the verifier's container failed")
        details["test_exit_code"] = res.exit_code
        stdout = get_file(vsb, TEST_STDOUT, 1 << 16)
        details["test_stdout"] = (stdout or b"").decode("utf-8", errors="replace")[-2000:]
        if res.verdict == "timeout":
            details["error"] = f"test.sh ran past [verifier] timeout_sec = {h['verifier_timeout_s']:g}s"
            return 0.0, False, details
        json_bytes, txt_bytes = get_file(vsb, REWARD_JSON), get_file(vsb, REWARD_TXT)
        reward, rd = parse_reward(json_bytes, txt_bytes)
        details.update(rd)
        disagree = reward_files_disagree(json_bytes, txt_bytes)
        if disagree:
            details["error"] = disagree
            return 0.0, False, details
    except (SandboxError, OSError) as e:
        raise VerifierUnavailable(f"the Harbor verifier of {task.id} could not run: {type(e).__name__}: {e}") from e
    finally:
        for sb in opened:
            sb.close()
    if reward is None:
        return 0.0, False, details
    details["raw_reward"] = reward
    return min(max(reward, 0.0), 1.0), reward >= 1.0, details
