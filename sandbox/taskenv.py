"""Task environments: a Docker image built from a task's own Dockerfile, and fresh sandboxes in that image.

- `build_env_image(env_dir, name=...)`: the image is tagged `flywheel-env:<16 hex of a sha256 over the folder's
  files>`, so a folder that did not change is never built twice (and tasks with identical environments share one
  image). Nothing is pulled: every `FROM` base must already be in the local engine; one that is not is a
  SandboxUnavailable naming the base and the fix, raised before `docker build` runs. The build itself is
  `nice docker build --network none --pull=false`, one at a time per tag on this host (a file lock: a second
  process asking for the same image waits for the first build, then reuses it). The image must run `python3` (the
  sandbox's PID 1, file writes and cleanup need it): checked once after a build.
- `TaskEnvBackend(config, image=...)`: the Docker backend (sandbox/docker.py: the exec/timeout/capture machinery)
  with containers from that image, run as the image's user (or the task's) in the image's working directory (or the
  task's), with a writable root filesystem (a task's agent installs and edits files anywhere, as Harbor agents do),
  no network, the memory/CPU/pids limits of `config`, every capability dropped except the file-ownership and
  process ones a root shell needs (KEEP_CAPS), no-new-privileges. One fresh container per episode, unless the
  caller names `reset_paths` (and `config.reuse` is not false): then a container whose episode ended is reset and
  handed to the next episode of the same image, where the episode allowed it. The reset (`_reset`): every process
  but PID 1 killed from the host with the cgroup frozen (sandbox/docker.py), then the engine's own list of what
  changed in the container's filesystem since it was created (`docker diff`) must lie under the reset paths (the
  working directory and those named; their parent folders may show as changed); each reset path with a change is
  removed and put back from the archive taken of it in the backend's first fresh container (absent there: removed),
  /dev/shm and /dev/mqueue (tmpfs, not in the diff) are emptied and System V IPC objects removed, and PID 1 must be
  the only process left. A change anywhere else (a package installed, /etc edited), a failed step, or a host that
  cannot reach the container's cgroup (not root, a remote engine) removes the container instead, counted in
  `stats["reset_failed"]`; `stats["reused"]` counts the episodes that got a reset one. One background thread per
  backend does the resets; an acquire takes a reset container, else resets a waiting one itself, else starts one.
- `copy_paths(src, dst, paths)`: the state under `paths` moved from one container into another through the
  engine's archive API (bytes exact, modes and symlinks kept; what the destination had there first is removed):
  how a verifier in a fresh container sees what an agent left.
- `put_tree` / `get_file` / `root_exec`: files in and out of a container, and housekeeping commands as root.
This module knows nothing of task formats or rewards (tasks/harbor.py does).
"""

from __future__ import annotations

import fcntl
import hashlib
import io
import logging
import os
import re
import shlex
import subprocess
import tarfile
import tempfile
import time
from pathlib import Path, PurePosixPath

from sandbox import programs
from sandbox.cgroup import Cgroup
from sandbox.docker import HOST_CANNOT_RESET, DockerBackend, DockerSandbox, _Container, attach_and_start
from sandbox.dockerexec import is_infra
from sandbox.engine import BACKEND_LABEL, LABEL, OWNER_LABEL, docker_client, image_id
from sandbox.result import SandboxConfig, SandboxError, SandboxUnavailable

log = logging.getLogger(__name__)

IMAGE_REPO = "flywheel-env"
HASH_LABEL = "flywheel.env.hash"
BUILD_LOCKS = Path(tempfile.gettempdir()) / "flywheel-build-locks"  # one lock file per image tag being built
KEEP_CAPS = ("CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "SETGID", "SETUID")
MAX_STATE_BYTES = 256 * 1024 * 1024  # a state path larger than this is not copied (the verifier fails closed)
# the reset's one root command: remove the changed reset paths (its arguments), empty the tmpfs folders that
# `docker diff` does not see, remove System V IPC objects
CLEAR = 'rm -rf -- "$@" && find /dev/shm /dev/mqueue -mindepth 1 -delete && ipcrm --all'


# ------------------------------------------------------------------------------------------------ images


def env_hash(env_dir: str | Path) -> str:
    """sha256 over every file of the folder: relative path, executable bit, bytes (symlinks: their target)."""
    root = Path(env_dir)
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        if p.is_symlink():
            h.update(b"L\0" + rel.encode() + b"\0" + os.readlink(p).encode() + b"\0")
        elif p.is_file():
            h.update(b"F\0" + rel.encode() + b"\0" + (b"x" if os.access(p, os.X_OK) else b"-") + b"\0")
            h.update(hashlib.sha256(p.read_bytes()).digest())
    return h.hexdigest()


def _logical_lines(text: str) -> list[str]:
    out, cur = [], ""
    for raw in text.splitlines():
        line = raw.strip()
        if not cur and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            cur += line[:-1] + " "
            continue
        out.append(cur + line)
        cur = ""
    if cur:
        out.append(cur)
    return out


def dockerfile_bases(text: str) -> list[str]:
    """The images a Dockerfile builds FROM (earlier stage names and `scratch` left out), ARG defaults applied.

    Raises ValueError for a FROM this cannot resolve (an ARG without a default) or a Dockerfile without FROM.
    """
    args: dict[str, str] = {}
    stages: set[str] = set()
    bases: list[str] = []
    for line in _logical_lines(text):
        word, _, rest = line.partition(" ")
        word = word.upper()
        if word == "ARG" and not bases:
            name, eq, default = rest.strip().partition("=")
            if eq:
                args[name.strip()] = default.strip().strip('"').strip("'")
        elif word == "FROM":
            parts = [p for p in rest.split() if not p.startswith("--")]
            if not parts:
                raise ValueError(f"FROM without an image: {line!r}")

            def sub(m: re.Match, line: str = line) -> str:
                name = m.group(1) or m.group(2)
                if name not in args:
                    raise ValueError(f"FROM uses ${{{name}}}, an ARG without a default: {line!r}")
                return args[name]

            image = re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)", sub, parts[0])
            if image.lower() != "scratch" and image not in stages:
                bases.append(image)
            if len(parts) >= 3 and parts[1].upper() == "AS":
                stages.add(parts[2])
    if not bases and "FROM" not in text.upper():
        raise ValueError("the Dockerfile has no FROM line")
    return bases


def build_env_image(env_dir: str | Path, *, name: str, timeout_s: float = 600.0, client=None) -> str:
    """The tag of the image built from env_dir/Dockerfile (reused when present); see the module docstring.

    Raises SandboxUnavailable (no engine, a base image that is not local, a failed build, no python3 in the image).
    """
    env = Path(env_dir)
    dockerfile = env / "Dockerfile"
    if not dockerfile.is_file():
        raise SandboxUnavailable(f"{name}: {dockerfile} is missing; a task environment needs a Dockerfile")
    tag = f"{IMAGE_REPO}:{env_hash(env)[:16]}"
    client = client or docker_client(timeout=300)
    if image_id(tag, client) is not None:
        return tag
    # one build per tag on this host: a second process (the flywheel's teacher running ahead, loading the same
    # tasks) waits for the first and then finds the image
    BUILD_LOCKS.mkdir(parents=True, exist_ok=True)
    with open(BUILD_LOCKS / f"{tag.split(':')[1]}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if image_id(tag, client) is not None:
            return tag
        return _build(env, dockerfile, tag, name=name, timeout_s=timeout_s, client=client)


def _build(env: Path, dockerfile: Path, tag: str, *, name: str, timeout_s: float, client) -> str:
    try:
        bases = dockerfile_bases(dockerfile.read_text(encoding="utf-8", errors="replace"))
    except ValueError as e:
        raise SandboxUnavailable(f"{name}: {dockerfile}: {e}; fix the FROM line") from None
    for base in bases:
        if image_id(base, client) is None:
            raise SandboxUnavailable(
                f"{name}: {dockerfile} builds FROM {base!r}, which is not in the local Docker engine, and nothing "
                f"is pulled here; fix: `docker pull {base}` (or `docker load` a saved copy) where a registry is "
                f"reachable, or build FROM an image that is local, e.g. {SandboxConfig().image}")
    cmd = ["nice", "-n", "10", "docker", "build", "-q", "--network", "none", "--pull=false",
           "--label", f"{HASH_LABEL}={tag.split(':')[1]}", "-t", tag, "-f", str(dockerfile), str(env)]
    log.info("building %s for %s: %s", tag, name, shlex.join(cmd))
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        raise SandboxUnavailable(f"{name}: docker build of {env} ran past {timeout_s:g}s "
                                 "([environment] build_timeout_sec); fix the Dockerfile or raise the limit") from None
    if proc.returncode != 0:
        raise SandboxUnavailable(f"{name}: docker build of {env} failed (exit {proc.returncode}): "
                                 f"{(proc.stderr or proc.stdout)[-1500:]}")
    check = subprocess.run(["docker", "run", "--rm", "--network", "none", "--entrypoint", "python3", tag, "-c",
                            "import json"], capture_output=True, text=True, timeout=120, check=False)
    if check.returncode != 0:
        subprocess.run(["docker", "rmi", "-f", tag], capture_output=True, check=False)
        raise SandboxUnavailable(f"{name}: the image built from {dockerfile} cannot run `python3 -c 'import json'` "
                                 f"({check.stderr.strip()[-300:]}); flywheel's sandboxes need Python 3 in the image: "
                                 "install it in the Dockerfile (e.g. RUN apt-get install -y python3)")
    return tag


def image_defaults(tag: str, client=None) -> tuple[str, str]:
    """(user, working directory) the image declares: USER (root when unset) and WORKDIR (/ when unset)."""
    client = client or docker_client(timeout=60)
    cfg = client.images.get(tag).attrs.get("Config") or {}
    return (cfg.get("User") or "0:0"), (cfg.get("WorkingDir") or "/")


# ------------------------------------------------------------------------------------------------ sandboxes


class TaskEnvBackend(DockerBackend):
    """Fresh containers from a task's own image (see the module docstring); pool_size 0 creates one per acquire."""

    name = "docker"

    def __init__(self, config: SandboxConfig, *, user: str | None = None, workdir: str | None = None,
                 env: dict[str, str] | None = None, pool_size: int = 0, reset_paths: list[str] | None = None,
                 client=None):
        client = client or docker_client()
        if image_id(config.image, client) is None:
            raise SandboxUnavailable(f"task image {config.image!r} is not in the Docker engine; fix: flywheel tasks "
                                     "import harbor DIR (it builds the image)")
        img_user, img_workdir = image_defaults(config.image, client)
        self.exec_user = user or img_user
        self.exec_workdir = workdir or img_workdir
        self.env = [f"{k}={v}" for k, v in (env or {}).items()]
        # reuse only with reset paths, and never of a container whose working directory is / (it cannot be put back)
        self.reset_paths = _outermost([self.exec_workdir, *reset_paths]) if reset_paths is not None else []
        reuse = bool(self.reset_paths) and "/" not in self.reset_paths and config.reuse is not False
        self._pristine: dict[str, bytes | None] | None = None  # reset path -> its archive in a fresh container
        # with reuse, one thread resets the containers whose episode ended while the caller goes on
        super().__init__(config.model_copy(update={"reuse": reuse}), pool_size=pool_size, reset_threads=1,
                         client=client)

    def idle(self) -> int:
        """Containers reset and waiting for the next episode."""
        return self._pool.ready()

    def trim_idle(self, keep: int = 0) -> int:
        """Remove the waiting containers beyond `keep`; how many went."""
        return self._pool.trim(keep)

    def _create_once(self, prestart: bool = False) -> _Container:
        c = self.config
        api = self.client.api
        from docker.types import Ulimit

        mb = f"{c.memory_mb}m"
        host_config = api.create_host_config(
            network_mode="none", mem_limit=mb, memswap_limit=mb, pids_limit=c.pids_limit,
            nano_cpus=int(c.cpus * 1e9), tmpfs={"/dev/shm": f"size={c.tmpfs_mb}m,mode=1777"},
            cap_drop=["ALL"], cap_add=list(KEEP_CAPS), security_opt=["no-new-privileges"], auto_remove=True,
            ipc_mode="private", ulimits=[Ulimit(name="core", soft=0, hard=0),
                                         Ulimit(name="nofile", soft=1024, hard=1024)],
        )
        cont = api.create_container(
            c.image, command=programs.command("python3", "pid1"), entrypoint=[], user=self.exec_user,
            working_dir=self.exec_workdir, hostname="sandbox", stdin_open=True, network_disabled=True,
            environment=self.env,
            use_config_proxy=False, labels={LABEL: "1", OWNER_LABEL: self.owner, BACKEND_LABEL: self.instance},
            host_config=host_config,
        )
        box = _Container(cont["Id"], attach_and_start(api, cont["Id"]), Cgroup(cont["Id"]))
        if self.reuse and box.cgroup.resettable:
            try:
                procs = box.cgroup.processes()  # PID 1 alone, before any exec
                box.pid1 = procs[0] if len(procs) == 1 else 0
                if box.pid1 and self._pristine is None:
                    self._pristine = {p: _read_archive_id(api, box.id, p, MAX_STATE_BYTES) for p in self.reset_paths}
            except (OSError, SandboxError) as e:  # this container is used once and removed
                log.info("container %s of %s will not be reused: %s", box.id[:12], c.image, e)
                box.pid1 = 0
        self._pool.count_started()
        return box

    def _reset(self, box: _Container) -> str | None:
        """Make a used container as the image made it (see the module docstring); None when done, else why not."""
        cg = box.cgroup
        if os.geteuid() != 0 or not box.pid1 or self._pristine is None or not cg.resettable:
            return HOST_CANNOT_RESET
        it, box.interp = box.interp, None
        if it is not None:
            it.stream.close()
        why = self._kill_all_but(box, {box.pid1})
        if why is not None:
            return why
        api = self.client.api
        try:
            changed = [(d["Path"], d["Kind"]) for d in api.diff(box.id) or []]
            outside = [p for p, kind in changed if not any(_within(p, r) for r in self.reset_paths)
                       and not (kind == 0 and any(_within(r, p) for r in self.reset_paths))]
            if outside:
                return f"changed outside the reset paths {self.reset_paths}: {', '.join(sorted(outside)[:5])}"
            touched = [r for r in self.reset_paths if any(_within(p, r) for p, _ in changed)]
            code, out = _root_exec_id(api, box.id, ["sh", "-c", CLEAR, "reset", *touched])
            if code != 0:
                return f"clearing {touched}, /dev/shm, /dev/mqueue and IPC failed (exit {code}): {out[-200:]}"
            for root in touched:
                data = self._pristine[root]
                if data is not None and not api.put_archive(box.id, str(PurePosixPath(root).parent), data):
                    return f"putting {root} back failed"
            procs = cg.processes()
        except Exception as e:
            if not is_infra(e) and not isinstance(e, (OSError, SandboxError)):
                raise
            return f"resetting failed: {type(e).__name__}: {e}"
        if procs != [box.pid1]:
            return f"the host sees {len(procs)} processes in the container after the reset, expected PID 1 alone"
        return None


def _within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _outermost(paths: list[str]) -> list[str]:
    """The absolute paths of `paths` not inside another of them, normalised, in order."""
    norm = [str(PurePosixPath(p)) for p in paths if p]
    return [p for i, p in enumerate(norm) if p not in norm[:i] and not any(q != p and _within(p, q) for q in norm)]


def _api(sb: DockerSandbox):
    return sb._owner.client.api


def root_exec(sb: DockerSandbox, argv: list[str], timeout_s: float = 60.0) -> tuple[int | None, str]:
    """Run argv as root in the sandbox's container (housekeeping around an episode, never the agent's calls)."""
    return _root_exec_id(_api(sb), sb.container_id, argv, timeout_s)


def _root_exec_id(api, container_id: str, argv: list[str], timeout_s: float = 60.0) -> tuple[int | None, str]:
    ex = api.exec_create(container_id, ["timeout", "-s", "KILL", str(int(timeout_s)), *argv], user="0:0",
                         workdir="/", stdout=True, stderr=True)
    out = api.exec_start(ex["Id"])
    deadline = time.monotonic() + 5
    while (info := api.exec_inspect(ex["Id"])).get("Running") and time.monotonic() < deadline:
        time.sleep(0.02)
    return info.get("ExitCode"), (out or b"").decode("utf-8", errors="replace")


def _tar(files: dict[str, bytes], *, executable: bool = False) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        dirs: set[str] = set()
        for rel in sorted(files):
            parts = PurePosixPath(rel).parts
            for i in range(1, len(parts)):
                d = "/".join(parts[:i])
                if d not in dirs:
                    dirs.add(d)
                    info = tarfile.TarInfo(d)
                    info.type, info.mode = tarfile.DIRTYPE, 0o755
                    tf.addfile(info)
            info = tarfile.TarInfo(rel)
            info.size = len(files[rel])
            info.mode = 0o755 if executable or rel.endswith(".sh") else 0o644
            tf.addfile(info, io.BytesIO(files[rel]))
    return buf.getvalue()


def put_tree(sb: DockerSandbox, dest: str, files: dict[str, bytes]) -> None:
    """Write files (relative path -> bytes) under the absolute folder `dest` of the container, as root."""
    code, out = root_exec(sb, ["mkdir", "-p", dest])
    if code != 0:
        raise SandboxError(f"mkdir {dest} in the container failed: {out[-300:]}")
    if not _api(sb).put_archive(sb.container_id, dest, _tar(files)):
        raise SandboxError(f"copying {len(files)} file(s) into {dest} of the container failed")


def _read_archive(sb: DockerSandbox, path: str, limit: int) -> bytes | None:
    return _read_archive_id(_api(sb), sb.container_id, path, limit)


def _read_archive_id(api, container_id: str, path: str, limit: int) -> bytes | None:
    import docker.errors

    try:
        stream, _stat = api.get_archive(container_id, path)
    except docker.errors.NotFound:
        return None
    buf = bytearray()
    for chunk in stream:
        buf += chunk
        if len(buf) > limit:
            raise SandboxError(f"{path} in the container holds more than {limit} bytes; not copied")
    return bytes(buf)


def get_file(sb: DockerSandbox, path: str, limit: int = 1 << 20) -> bytes | None:
    """The bytes of one regular file of the container (None when absent or not a regular file)."""
    data = _read_archive(sb, path, limit + 4096)
    if data is None:
        return None
    with tarfile.open(fileobj=io.BytesIO(data)) as tf:
        for m in tf.getmembers():
            if m.isfile():
                f = tf.extractfile(m)
                return f.read(limit) if f else None
    return None


def copy_paths(src: DockerSandbox, dst: DockerSandbox, paths: list[str], *,
               limit: int = MAX_STATE_BYTES) -> dict[str, str]:
    """Move what `src` holds under each absolute path into `dst` at the same place (see the module docstring).

    Returns path -> "copied" | "absent". Raises SandboxError when a copy fails or a path is too large.
    """
    status: dict[str, str] = {}
    for p in paths:
        path = str(PurePosixPath(p))
        if not path.startswith("/") or path == "/":
            raise SandboxError(f"state path {p!r} must be an absolute path below /")
        data = _read_archive(src, path, limit)
        code, out = root_exec(dst, ["rm", "-rf", "--", path])
        if code != 0:
            raise SandboxError(f"clearing {path} in the verifier's container failed: {out[-300:]}")
        if data is None:
            status[path] = "absent"
            continue
        parent = str(PurePosixPath(path).parent)
        root_exec(dst, ["mkdir", "-p", parent])
        if not _api(dst).put_archive(dst.container_id, parent, data):
            raise SandboxError(f"copying {path} into the verifier's container failed")
        status[path] = "copied"
    return status
