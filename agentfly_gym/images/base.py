"""The Debian base image: a root file system made by ``debootstrap --variant=minbase``, imported with
``docker import`` and kept on disk for the daemon-less sandbox backend.

    from agentfly_gym.images.base import build_base_image
    base = build_base_image()                 # "agentfly/base:<digest>", ~2-4 min the first time

The tag digests the Debian suite, the package list and this module's rootfs recipe version; a tag that
already exists is not rebuilt.  The root file system is kept (``cache_dir("images", "rootfs", <digest>)``,
see :func:`base_rootfs_dir`) so the sandbox backend can use the same Debian tree.  The Debian mirror is this
machine's apt sources (:func:`debian_mirror`) unless ``AGENTFLY_DEBIAN_MIRROR`` or ``mirror=`` names one.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import platform
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..data.paths import cache_dir
from ..errors import ResourceUnavailable
from .engine import ImageBuildError, Progress, docker_client, run_logged, say, tag_latest, image_exists

__all__ = ["BASE_IMAGE", "BASE_PACKAGES", "BASE_SUITE", "BASE_USER", "base_image_tag", "base_rootfs_dir",
           "build_base_image", "debian_mirror"]

log = logging.getLogger(__name__)

BASE_IMAGE = "agentfly/base"
"""Repository name of the base image; its tags are ``<digest>`` and ``latest``."""

BASE_SUITE = "bookworm"
"""Debian release of the base image (CPython 3.11)."""

BASE_PACKAGES: tuple[str, ...] = (
    "ca-certificates", "git", "procps", "python3", "python3-pip", "python3-venv", "rsync",
)
"""Debian packages added to ``minbase``.  ``procps`` gives ps/kill/pkill to tools, ``rsync`` makes
container resets cheap, ``python3-pip`` installs the recipes' wheels."""

BASE_USER = ("agent", 1000)
"""A non-root user added to the base (name, uid = gid), home ``/home/agent``; select it with
``ContainerSpec(user="agent")``."""

_ROOTFS_RECIPE_VERSION = "1"  # bump when the rootfs post-processing below changes
_MIRROR_ENV = "AGENTFLY_DEBIAN_MIRROR"


# ---------------------------------------------------------------------------------------- mirror
def _parse_deb822(text: str) -> list[dict[str, str]]:
    stanzas, cur = [], {}
    key = None
    for line in text.splitlines() + [""]:
        if not line.strip():
            if cur:
                stanzas.append(cur)
            cur, key = {}, None
            continue
        if line.lstrip().startswith("#"):
            continue
        if line[0].isspace() and key:
            cur[key] += " " + line.strip()
            continue
        k, sep, v = line.partition(":")
        if sep:
            key = k.strip().lower()
            cur[key] = v.strip()
    return stanzas


def _source_entries(apt_dir: Path) -> list[tuple[list[str], list[str], str | None]]:
    """``(uris, suites, signed_by)`` for every enabled ``deb`` entry apt would read under ``apt_dir``."""
    entries: list[tuple[list[str], list[str], str | None]] = []
    files: list[Path] = []
    main = apt_dir / "sources.list"
    if main.is_file():
        files.append(main)
    d = apt_dir / "sources.list.d"
    if d.is_dir():
        files += sorted(p for p in d.iterdir() if p.suffix in (".list", ".sources") and p.is_file())
    for f in files:
        try:
            text = f.read_text(errors="replace")
        except OSError:
            continue
        if f.suffix == ".sources":
            for st in _parse_deb822(text):
                if "deb" not in st.get("types", "").split() or st.get("enabled", "yes").lower() == "no":
                    continue
                entries.append((st.get("uris", "").split(), st.get("suites", "").split(), st.get("signed-by")))
        else:
            for line in text.splitlines():
                line = line.split("#", 1)[0].strip()
                m = re.match(r"^deb\s+(?:\[([^\]]*)\]\s+)?(\S+)\s+(\S+)", line)
                if m:
                    opts = dict(o.split("=", 1) for o in (m.group(1) or "").split() if "=" in o)
                    entries.append(([m.group(2)], [m.group(3)], opts.get("signed-by")))
    return entries


def debian_mirror(suite: str = BASE_SUITE, *, apt_dir: str | os.PathLike = "/etc/apt") -> tuple[str, str | None]:
    """The Debian mirror this machine's apt uses for ``suite``, read at call time.

    Reads ``sources.list`` and ``sources.list.d/*.list`` (one-line format) and
    ``sources.list.d/*.sources`` (deb822 format, see ``sources.list(5)``).  ``$AGENTFLY_DEBIAN_MIRROR``
    overrides the result.

    Returns:
        ``(uri, keyring)``: the mirror URI and the entry's ``Signed-By`` keyring file (or ``None``).

    Raises:
        ImageBuildError: no ``deb`` entry serves ``suite`` (pass ``mirror=`` or set the variable).
    """
    env = os.environ.get(_MIRROR_ENV)
    if env:
        return env, None
    entries = _source_entries(Path(apt_dir))
    for uris, suites, signed in entries:
        if suite in suites and uris:
            keyring = signed if signed and os.path.isfile(signed) else None
            return uris[0], keyring
    raise ImageBuildError(
        f"no apt source under {apt_dir} serves Debian {suite!r} (found {len(entries)} deb entries); "
        f"pass mirror=... to build_base_image or set ${_MIRROR_ENV} to a Debian mirror URI")


# ---------------------------------------------------------------------------------------- base
def _base_digest(suite: str, packages: Sequence[str]) -> str:
    payload = json.dumps({"suite": suite, "packages": sorted(packages), "recipe": _ROOTFS_RECIPE_VERSION,
                          "arch": platform.machine()}, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:12]


def base_image_tag(suite: str = BASE_SUITE, packages: Sequence[str] = BASE_PACKAGES) -> str:
    """The content-hash tag of the base image, ``"agentfly/base:<12 hex digits>"``."""
    return f"{BASE_IMAGE}:{_base_digest(suite, packages)}"


def base_rootfs_dir(suite: str = BASE_SUITE, packages: Sequence[str] = BASE_PACKAGES) -> Path:
    """Where :func:`build_base_image` keeps the base's root file system (it may not exist yet).

    A complete tree holds ``.agentfly-rootfs.json``; the sandbox backend can use it as its root.
    """
    return cache_dir("images", "rootfs", f"{suite}-{_base_digest(suite, packages)}")


def _finish_rootfs(root: Path) -> None:
    """Post-process a fresh debootstrap tree (the steps that ``_ROOTFS_RECIPE_VERSION`` versions)."""
    # apt caches: ~30-60 MB that no container needs
    for sub in ("var/cache/apt/archives", "var/lib/apt/lists"):
        d = root / sub
        if d.is_dir():
            for p in d.iterdir():
                if p.is_file() and p.name not in ("lock",):
                    p.unlink()
    # let pip install into the system Python (the image is the task's own machine; PEP 668 marker removed)
    for marker in (root / "usr" / "lib").glob("python3*/EXTERNALLY-MANAGED"):
        marker.unlink()
    # a non-root user for tasks that want one
    name, uid = BASE_USER
    etc = root / "etc"
    passwd = (etc / "passwd").read_text()
    if not re.search(rf"^{name}:", passwd, re.MULTILINE):
        with open(etc / "passwd", "a") as f:
            f.write(f"{name}:x:{uid}:{uid}::/home/{name}:/bin/bash\n")
        with open(etc / "group", "a") as f:
            f.write(f"{name}:x:{uid}:\n")
        if (etc / "shadow").exists():
            with open(etc / "shadow", "a") as f:
                f.write(f"{name}:!:19000:0:99999:7:::\n")
        home = root / "home" / name
        home.mkdir(parents=True, exist_ok=True)
        os.chown(home, uid, uid)
    # DNS inside containers comes from the engine; an empty file keeps tools quiet in the sandbox
    (etc / "resolv.conf").unlink(missing_ok=True)
    (etc / "resolv.conf").write_text("")
    (etc / "hostname").write_text("agentfly\n")


def build_base_image(name: str | None = None, *, suite: str = BASE_SUITE, packages: Sequence[str] = BASE_PACKAGES,
                     mirror: str | None = None, force: bool = False, progress: Progress | None = None) -> str:
    """Build (or find) the Debian base image, offline from any image registry.

    Steps: ``debootstrap --variant=minbase --include=<packages> <suite> ROOTFS <mirror>`` into
    :func:`base_rootfs_dir` (kept, reused when complete), small post-processing (apt caches removed,
    PEP 668 marker removed, user ``agent`` uid 1000 added), then ``tar -C ROOTFS -c . | docker import``
    with ``ENV PATH/LANG``, ``WORKDIR /`` and ``CMD ["/bin/bash"]``.  Idempotent: an existing tag is
    returned at once.  Needs root (debootstrap) and a Docker engine.  ~2-4 min and ~400 MB the first time.

    Args:
        name: the image tag to create; default :func:`base_image_tag` (content hash).  The result is
            also tagged ``<repository of name>:latest`` (``agentfly/base:latest`` by default).
        mirror: Debian mirror URI; default :func:`debian_mirror` (this machine's apt sources).
        force: rebuild the rootfs and the image even if they exist.
        progress: called with each line of progress output (default: the module logger).

    Returns:
        The image tag (``name``).

    Raises:
        ImageBuildError: debootstrap or the import failed (message ends with its output).
        ResourceUnavailable: no Docker engine answers, or debootstrap is not installed.
    """
    tag = name or base_image_tag(suite, packages)
    client = docker_client()
    root = base_rootfs_dir(suite, packages)
    if not force and image_exists(tag, client):
        say(progress, f"base image {tag}: present")
        tag_latest(client, tag, tag.rpartition(':')[0])
        if not (root / ".agentfly-rootfs.json").is_file():  # the sandbox backend needs the rootfs too
            _rootfs_from_image(client, tag, root, suite, packages, progress)
        return tag
    root.parent.mkdir(parents=True, exist_ok=True)
    with open(root.parent / f".{root.name}.lock", "w") as lock:
        if _locked_elsewhere(lock):
            say(progress, f"base image {tag}: waiting for another process's build")
        fcntl.flock(lock, fcntl.LOCK_EX)  # one build per rootfs at a time, across processes
        try:
            if not force and image_exists(tag, client):  # another process built it meanwhile
                tag_latest(client, tag, tag.rpartition(':')[0])
                return tag
            _build_base_locked(client, root, tag, suite, packages, mirror, force, progress)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return tag


def _rootfs_from_image(client: Any, tag: str, root: Path, suite: str, packages: Sequence[str],
                       progress: Progress | None) -> None:
    """Recreate the kept rootfs folder from an existing image (``docker export``), without the network."""
    root.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{root.name}-", dir=root.parent))
    container = client.api.create_container(tag, command=["/bin/true"], labels={"agentfly": "1"})["Id"]
    try:
        say(progress, f"base image {tag}: restoring its rootfs at {root} from the image")
        tar = subprocess.Popen(["tar", "-x", "-C", str(work), "-f", "-"], stdin=subprocess.PIPE)
        assert tar.stdin is not None
        for chunk in client.api.export(container):
            tar.stdin.write(chunk)
        tar.stdin.close()
        if tar.wait() != 0:
            raise ImageBuildError(f"extracting the filesystem of {tag} failed (tar exit {tar.returncode})")
        (work / ".agentfly-rootfs.json").write_text(json.dumps(
            {"suite": suite, "packages": list(packages), "from_image": tag, "built": time.time()}))
        if root.exists():
            shutil.rmtree(root)
        work.rename(root)
    finally:
        client.api.remove_container(container, force=True)
        if work.exists():
            shutil.rmtree(work, ignore_errors=True)


def _locked_elsewhere(lock: Any) -> bool:
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    fcntl.flock(lock, fcntl.LOCK_UN)
    return False


def _build_base_locked(client: Any, root: Path, tag: str, suite: str, packages: Sequence[str], mirror: str | None,
                       force: bool, progress: Progress | None) -> None:
    marker = root / ".agentfly-rootfs.json"
    if force or not marker.is_file():
        if shutil.which("debootstrap") is None:
            raise ResourceUnavailable("building the base image needs debootstrap (apt-get install debootstrap)")
        if os.geteuid() != 0:
            raise ResourceUnavailable("debootstrap needs root to build the base image's root file system")
        uri, keyring = (mirror, None) if mirror else debian_mirror(suite)
        root.parent.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix=f".{root.name}-", dir=root.parent))
        try:
            cmd = ["debootstrap", "--variant=minbase", f"--include={','.join(packages)}"]
            if keyring:
                cmd.append(f"--keyring={keyring}")
            cmd += [suite, str(work), uri]
            say(progress, f"base image {tag}: debootstrap {suite} from {uri} (takes a few minutes)")
            t0 = time.monotonic()
            run_logged(cmd, progress, "debootstrap")
            _finish_rootfs(work)
            (work / ".agentfly-rootfs.json").write_text(json.dumps(
                {"suite": suite, "packages": list(packages), "mirror": uri, "built": time.time()}))
            if root.exists():
                shutil.rmtree(root)
            work.rename(root)
            say(progress, f"base image {tag}: rootfs ready at {root} ({time.monotonic() - t0:.0f}s)")
        finally:
            if work.exists():
                shutil.rmtree(work, ignore_errors=True)
    _import_rootfs(client, root, tag, progress)
    tag_latest(client, tag, tag.rpartition(':')[0])


def _import_rootfs(client: Any, root: Path, tag: str, progress: Progress | None) -> None:
    repo, _, version = tag.rpartition(":")
    changes = [
        "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "ENV LANG=C.UTF-8",
        "WORKDIR /",
        'CMD ["/bin/bash"]',
        "LABEL agentfly.image=base",
    ]
    say(progress, f"base image {tag}: importing {root}")
    t0 = time.monotonic()
    tar = subprocess.Popen(["tar", "-C", str(root), "--exclude=./.agentfly-rootfs.json", "-c", "."],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert tar.stdout is not None
        out = client.api.import_image_from_stream(tar.stdout, repository=repo, tag=version, changes=changes)
    except Exception as e:
        tar.kill()
        raise ImageBuildError(f"docker import of {root} as {tag} failed: {e}") from e
    finally:
        rc = tar.wait()
    if rc != 0:
        raise ImageBuildError(f"tar of {root} failed (exit {rc}): {tar.stderr.read().decode(errors='replace')[-2000:]}")
    if not image_exists(tag, client):
        raise ImageBuildError(f"docker import of {root} did not produce {tag}: {str(out)[-2000:]}")
    say(progress, f"base image {tag}: imported ({time.monotonic() - t0:.0f}s)")
