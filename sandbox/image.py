"""Build the sandbox image with no registry access: Debian packages via debootstrap, then `docker import`.

`build_image` makes a minimal Debian bookworm root filesystem with Python 3 (debootstrap, default Debian mirror),
trims it, and imports it as a Docker image whose default user is nobody (65534) and whose working directory is
/workspace. An image that already carries the tag is reused unless `force`; `image_id` (sandbox/engine.py) looks
a tag up.
sandbox/Dockerfile builds an equivalent image for users who can pull from a registry.
This module does not start containers (sandbox/docker.py does).
"""

from __future__ import annotations

import logging
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

from sandbox.engine import SANDBOX_USER, WORKDIR, docker_client, image_id
from sandbox.result import SandboxConfig, SandboxUnavailable

log = logging.getLogger(__name__)

SUITE = "bookworm"
# python3 brings the standard library (json, math, fractions, ...); python3-minimal alone lacks most of it.
PACKAGES = ("python3-minimal", "python3")
IMAGE_LABEL = "flywheel.sandbox.image"
IMAGE_CHANGES = (
    f"USER {SANDBOX_USER}",
    f"WORKDIR {WORKDIR}",
    "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "ENV LANG=C.UTF-8",
    "ENV PYTHONDONTWRITEBYTECODE=1",
    "ENV HOME=/tmp",
    f"LABEL {IMAGE_LABEL}=1",
    'CMD ["sleep", "infinity"]',
)
# Paths removed from the root filesystem before import: caches and docs nobody in a sandbox needs.
TRIM = ("var/cache/apt/archives", "var/lib/apt/lists", "usr/share/doc", "usr/share/man", "usr/share/locale",
        "usr/share/info")

Progress = Callable[[str], None]


def _run(cmd: list[str], progress: Progress, **kw) -> subprocess.CompletedProcess:
    progress("$ " + " ".join(cmd))
    proc = subprocess.run(cmd, capture_output=True, check=False, **kw)
    if proc.returncode != 0:
        err = proc.stderr.decode(errors="replace")[-2000:] if isinstance(proc.stderr, bytes) else proc.stderr
        raise SandboxUnavailable(f"`{' '.join(cmd[:3])} ...` failed with exit {proc.returncode}: {err}")
    return proc


def build_image(tag: str = SandboxConfig().image, *, force: bool = False, progress: Progress | None = None) -> str:
    """Build (or reuse) the sandbox image `tag` from Debian packages and return its image id.

    Needs root (debootstrap), the `debootstrap` command and a running Docker engine; raises SandboxUnavailable naming
    the fix when one is missing. Reuses an existing image with this tag unless `force`.
    """
    say: Progress = progress or (lambda line: log.info("%s", line))
    client = docker_client(timeout=300)
    existing = image_id(tag, client)
    if existing and not force:
        say(f"image {tag} already present ({existing[:19]}); reusing it")
        return existing
    if shutil.which("debootstrap") is None:
        raise SandboxUnavailable(
            "the `debootstrap` command is missing; fix: apt-get install -y debootstrap "
            "(or build sandbox/Dockerfile with `docker build` where a registry is reachable)"
        )
    with tempfile.TemporaryDirectory(prefix="flywheel-rootfs-") as tmp:
        rootfs = Path(tmp) / "rootfs"
        say(f"debootstrap {SUITE} into {rootfs} (about 30-60 s)")
        _run(["debootstrap", "--variant=minbase", "--include=" + ",".join(PACKAGES), SUITE, str(rootfs)], say)
        for rel in TRIM:
            p = rootfs / rel
            if p.is_dir():
                for child in p.iterdir():
                    if child.is_dir() and not child.is_symlink():
                        shutil.rmtree(child, ignore_errors=True)
                    else:
                        child.unlink(missing_ok=True)
        ws = rootfs / WORKDIR.lstrip("/")
        ws.mkdir(exist_ok=True)
        ws.chmod(0o1777)
        # Sanity check before importing: the image must run python3 with json (the interpreter protocol needs it).
        _run(["chroot", str(rootfs), "python3", "-c", "import json, math, fractions, decimal"], say)
        say(f"docker import -> {tag}")
        changes = [arg for c in IMAGE_CHANGES for arg in ("--change", c)]
        tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
        try:
            imp = subprocess.run(["docker", "import", *changes, "-", tag], stdin=tar.stdout, capture_output=True,
                                 check=False)
        finally:
            assert tar.stdout is not None
            tar.stdout.close()
            tar.wait()
        if imp.returncode != 0 or tar.returncode != 0:
            raise SandboxUnavailable(
                f"docker import of {tag} failed (tar exit {tar.returncode}, import exit {imp.returncode}): "
                f"{imp.stderr.decode(errors='replace')[-2000:]}"
            )
    new_id = image_id(tag, client)
    if new_id is None:  # pragma: no cover - import said ok but the tag is absent
        raise SandboxUnavailable(f"docker import reported success but image {tag} is absent")
    say(f"built {tag} ({new_id[:19]})")
    return new_id
