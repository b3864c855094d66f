"""Container images built locally and offline: the Debian base image and the recipes in ``envs/``.

No image registry is needed.  The base image is a Debian root file system made by
``debootstrap --variant=minbase`` and imported with ``docker import``; every other image is a
recipe folder (``envs/<name>/Dockerfile``) built ``FROM`` that base with the build's network
switched off, its Python packages installed from wheels downloaded on the host::

    from agentfly_gym.images.build import build_base_image, build_image
    base = build_base_image()                 # "agentfly/base:<digest>", ~2-4 min the first time
    tag = build_image("envs/r2egym")          # "agentfly/r2egym:<digest>", a no-op when unchanged

Tags are content hashes.  The base tag digests the Debian suite, the package list and this
module's rootfs recipe version; a recipe tag digests every file of the recipe folder plus the
id of the base image it is built on.  A tag that already exists is not rebuilt, so building an
unchanged recipe is a quick check.  Each build also moves ``<name>:latest`` to its result.

Recipe folders:

* ``Dockerfile``: starts with ``ARG BASE_IMAGE=agentfly/base:latest`` / ``FROM ${BASE_IMAGE}``;
  the build passes the exact base id as ``BASE_IMAGE``.
* ``requirements.txt`` (optional): downloaded on the host with ``pip download`` (binary wheels
  for the base's CPython 3.11 on x86-64/aarch64 Linux) into ``wheels/`` of the build context;
  install them with ``pip install --no-index --find-links /wheels -r /wheels/requirements.txt``.

The root file system of the base is kept (``cache_dir("images", "rootfs", <digest>)``, see
:func:`base_rootfs_dir`) so the daemon-less sandbox backend can use the same Debian tree.
Command line: ``agentfly-gym images build [names]`` (:func:`images_main`).
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import logging
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from ..data.paths import cache_dir
from ..errors import AgentFlyError, ConfigError, ResourceUnavailable

__all__ = [
    "BASE_IMAGE", "BASE_PACKAGES", "BASE_SUITE", "ImageBuildError", "base_image_tag", "base_rootfs_dir",
    "build_base_image", "build_image", "debian_mirror", "image_exists", "images_main", "recipe_digest",
    "recipes_dir",
]

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
_RECIPE_PREFIX = "agentfly/"
_MIRROR_ENV = "AGENTFLY_DEBIAN_MIRROR"

Progress = Callable[[str], None]


class ImageBuildError(AgentFlyError):
    """An image could not be built; the message names the step and ends with the tail of its log."""


def _say(progress: Progress | None, msg: str) -> None:
    if progress is not None:
        progress(msg)
    else:
        log.info("%s", msg)


# ---------------------------------------------------------------------------------------- docker

def _client():
    try:
        import docker
    except ImportError as e:  # pragma: no cover - depends on installation
        raise ResourceUnavailable("building images needs docker-py: pip install 'agentfly-gym[docker]'") from e
    try:
        client = docker.from_env(timeout=600)
        client.ping()
    except Exception as e:
        raise ResourceUnavailable(
            f"no Docker engine answers ({type(e).__name__}: {e}); start one (scripts/docker-engine.sh)") from e
    return client


def image_exists(name: str, client: Any = None) -> bool:
    """Whether the local engine has image ``name`` (``repo:tag`` or id)."""
    import docker

    client = client or _client()
    try:
        client.images.get(name)
        return True
    except docker.errors.ImageNotFound:
        return False


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


def _run_logged(cmd: list[str], progress: Progress | None, what: str, **kw: Any) -> None:
    """Run ``cmd``, forwarding its output lines to ``progress``; raise ImageBuildError on failure."""
    tail: list[str] = []
    try:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                errors="replace", **kw)
    except OSError as e:
        raise ImageBuildError(f"{what}: cannot run {cmd[0]!r}: {e}") from e
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            line = line.rstrip()
            tail = (tail + [line])[-30:]
            _say(progress, f"  {line}")
        rc = proc.wait()
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    if rc != 0:
        raise ImageBuildError(f"{what} failed (exit {rc}):\n" + "\n".join(tail))


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
    client = _client()
    root = base_rootfs_dir(suite, packages)
    if not force and image_exists(tag, client):
        _say(progress, f"base image {tag}: present")
        _tag_latest(client, tag, tag.rpartition(':')[0])
        if not (root / ".agentfly-rootfs.json").is_file():  # the sandbox backend needs the rootfs too
            _rootfs_from_image(client, tag, root, suite, packages, progress)
        return tag
    root.parent.mkdir(parents=True, exist_ok=True)
    with open(root.parent / f".{root.name}.lock", "w") as lock:
        if _locked_elsewhere(lock):
            _say(progress, f"base image {tag}: waiting for another process's build")
        fcntl.flock(lock, fcntl.LOCK_EX)  # one build per rootfs at a time, across processes
        try:
            if not force and image_exists(tag, client):  # another process built it meanwhile
                _tag_latest(client, tag, tag.rpartition(':')[0])
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
        _say(progress, f"base image {tag}: restoring its rootfs at {root} from the image")
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
            _say(progress, f"base image {tag}: debootstrap {suite} from {uri} (takes a few minutes)")
            t0 = time.monotonic()
            _run_logged(cmd, progress, "debootstrap")
            _finish_rootfs(work)
            (work / ".agentfly-rootfs.json").write_text(json.dumps(
                {"suite": suite, "packages": list(packages), "mirror": uri, "built": time.time()}))
            if root.exists():
                shutil.rmtree(root)
            work.rename(root)
            _say(progress, f"base image {tag}: rootfs ready at {root} ({time.monotonic() - t0:.0f}s)")
        finally:
            if work.exists():
                shutil.rmtree(work, ignore_errors=True)
    _import_rootfs(client, root, tag, progress)
    _tag_latest(client, tag, tag.rpartition(':')[0])


def _import_rootfs(client: Any, root: Path, tag: str, progress: Progress | None) -> None:
    repo, _, version = tag.rpartition(":")
    changes = [
        "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "ENV LANG=C.UTF-8",
        "WORKDIR /",
        'CMD ["/bin/bash"]',
        "LABEL agentfly.image=base",
    ]
    _say(progress, f"base image {tag}: importing {root}")
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
    _say(progress, f"base image {tag}: imported ({time.monotonic() - t0:.0f}s)")


def _tag_latest(client: Any, tag: str, repo: str) -> None:
    try:
        client.images.get(tag).tag(repo, "latest")
    except Exception:  # pragma: no cover - best effort
        log.warning("could not tag %s as %s:latest", tag, repo, exc_info=True)


# ---------------------------------------------------------------------------------------- recipes

def recipes_dir() -> Path:
    """The folder of image recipes: ``$AGENTFLY_GYM_RECIPES`` or the repository's ``envs/``.

    Raises:
        ConfigError: neither exists (an installed wheel has no ``envs/``; pass a recipe folder).
    """
    env = os.environ.get("AGENTFLY_GYM_RECIPES")
    d = Path(env) if env else Path(__file__).resolve().parents[2] / "envs"
    if not d.is_dir():
        raise ConfigError(f"image recipes folder {d} not found; set AGENTFLY_GYM_RECIPES or pass a recipe folder path")
    return d


def _recipe_files(recipe: Path) -> list[Path]:
    files = []
    for p in sorted(recipe.rglob("*")):
        rel = p.relative_to(recipe)
        if any(part.startswith(".") or part in ("__pycache__", "wheels") for part in rel.parts):
            continue
        if p.is_file():
            files.append(p)
    return files


def recipe_digest(recipe_dir: str | os.PathLike, base_id: str) -> str:
    """12 hex digits of SHA-256 over the recipe's files (relative path, mode bit x, bytes) and ``base_id``.

    Hidden files, ``__pycache__`` and ``wheels/`` are ignored.
    """
    recipe = Path(recipe_dir)
    h = hashlib.sha256()
    h.update(f"base={base_id}\n".encode())
    for p in _recipe_files(recipe):
        rel = p.relative_to(recipe).as_posix()
        h.update(f"{rel}\0{os.access(p, os.X_OK)}\0{p.stat().st_size}\0".encode())
        h.update(p.read_bytes())
    return h.hexdigest()[:12]


def _download_wheels(requirements: Path, dest: Path, progress: Progress | None) -> None:
    """``pip download`` the requirements as binary wheels for CPython 3.11 Linux into ``dest``."""
    machine = platform.machine()
    plat = {"x86_64": "x86_64", "amd64": "x86_64", "aarch64": "aarch64", "arm64": "aarch64"}.get(machine.lower())
    if plat is None:
        raise ImageBuildError(f"no wheel platform known for machine {machine!r}")
    cache = cache_dir("images", "wheels", hashlib.sha256(requirements.read_bytes() + plat.encode()).hexdigest()[:12])
    if not (cache / ".complete").is_file():
        cache.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "--only-binary=:all:",
               "--implementation", "cp", "--python-version", "3.11", "--abi", "cp311",
               "--platform", f"manylinux2014_{plat}", "--platform", f"manylinux_2_28_{plat}",
               "--platform", f"manylinux_2_17_{plat}", "--platform", f"manylinux_2_34_{plat}",
               "--platform", f"linux_{plat}", "--platform", "any",
               "-d", str(cache), "-r", str(requirements)]
        _say(progress, f"  pip download -r {requirements.name} (on the host)")
        _run_logged(cmd, progress, "pip download")
        (cache / ".complete").write_text("")
    dest.mkdir(parents=True, exist_ok=True)
    for w in cache.iterdir():
        if w.suffix == ".whl":
            shutil.copy2(w, dest / w.name)
    shutil.copy2(requirements, dest / "requirements.txt")


def build_image(recipe_dir: str | os.PathLike, *, name: str | None = None, base: str | None = None,
                force: bool = False, progress: Progress | None = None) -> str:
    """Build the image of one recipe folder, offline, with a content-hash tag.

    Args:
        recipe_dir: folder with a ``Dockerfile`` (and optionally ``requirements.txt``), e.g. ``envs/r2egym``.
        name: repository name; default ``"agentfly/<folder name>"``.
        base: base image; default :func:`build_base_image` (built if missing).
        force: rebuild even when the tag exists.
        progress: called with each line of build output (default: the module logger).

    Returns:
        ``"<name>:<digest>"`` where digest is :func:`recipe_digest` of the folder and the base's id;
        ``<name>:latest`` points to it too.  If that tag exists nothing is built.

    Raises:
        ConfigError: the folder has no Dockerfile.
        ImageBuildError: downloading wheels or the Docker build failed (message ends with its log).
        ResourceUnavailable: no Docker engine answers.
    """
    import docker

    recipe = Path(recipe_dir)
    if not (recipe / "Dockerfile").is_file():
        raise ConfigError(f"recipe folder {recipe} has no Dockerfile")
    repo = name or f"{_RECIPE_PREFIX}{recipe.resolve().name}"
    if ":" in repo.rsplit("/", 1)[-1]:
        raise ConfigError(f"name={repo!r} must be a repository name without a tag (the tag is the content hash)")
    client = _client()
    base = base or build_base_image(progress=progress)
    try:
        base_id = client.images.get(base).id
    except docker.errors.ImageNotFound as e:
        raise ImageBuildError(f"base image {base!r} not found; build it with build_base_image()") from e
    tag = f"{repo}:{recipe_digest(recipe, base_id)}"
    if not force and image_exists(tag, client):
        _say(progress, f"image {tag}: up to date")
        _tag_latest(client, tag, repo)
        return tag
    _say(progress, f"image {tag}: building from {recipe}")
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="afg-build-") as tmp:
        ctx = Path(tmp) / "ctx"
        shutil.copytree(recipe, ctx, ignore=shutil.ignore_patterns(".*", "__pycache__", "wheels"))
        if (recipe / "requirements.txt").is_file():
            _download_wheels(recipe / "requirements.txt", ctx / "wheels", progress)
        else:
            (ctx / "wheels").mkdir()
        tail: list[str] = []
        try:
            stream = client.api.build(path=str(ctx), tag=tag, buildargs={"BASE_IMAGE": base_id}, rm=True,
                                      forcerm=True, network_mode="none", decode=True,
                                      labels={"agentfly.image": repo, "agentfly.recipe-digest": tag.rsplit(":", 1)[1]})
            for chunk in stream:
                if "error" in chunk or "errorDetail" in chunk:
                    msg = chunk.get("error") or chunk["errorDetail"].get("message", "")
                    raise ImageBuildError(f"docker build of {recipe} failed: {msg}\n" + "\n".join(tail))
                text = chunk.get("stream")
                if text:
                    for line in text.rstrip().splitlines():
                        tail = (tail + [line])[-30:]
                        _say(progress, f"  {line}")
        except docker.errors.APIError as e:
            raise ImageBuildError(f"docker build of {recipe} failed: {e}\n" + "\n".join(tail)) from e
    if not image_exists(tag, client):
        raise ImageBuildError(f"docker build of {recipe} finished without producing {tag}:\n" + "\n".join(tail))
    _tag_latest(client, tag, repo)
    _say(progress, f"image {tag}: built ({time.monotonic() - t0:.0f}s)")
    return tag


# ---------------------------------------------------------------------------------------- CLI

def _resolve_recipes(names: Iterable[str]) -> list[str | Path]:
    out: list[str | Path] = []
    for n in names:
        if n == "base":
            out.append("base")
            continue
        p = Path(n)
        if (p / "Dockerfile").is_file():
            out.append(p)
            continue
        d = recipes_dir() / n
        if not (d / "Dockerfile").is_file():
            known = sorted(q.name for q in recipes_dir().iterdir() if (q / "Dockerfile").is_file())
            raise ConfigError(f"no image recipe {n!r}; known: {['base', *known]} (or pass a folder with a Dockerfile)")
        out.append(d)
    return out


def images_main(args: Sequence[str] | None = None) -> int:
    """``agentfly-gym images build [names] [--force] [--mirror URI]``; returns the exit status.

    ``names`` are ``base`` and recipe names under :func:`recipes_dir` (or recipe folder paths);
    none means the base and every recipe.  Prints each built tag on stdout, progress on stderr.
    Exit status 0 on success, 1 on a build failure, 2 on a usage error.
    """
    parser = argparse.ArgumentParser(prog="agentfly-gym images", description="Build container images locally.")
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="build the base image and recipes (content-hash tags; unchanged = no-op)")
    b.add_argument("names", nargs="*", help="'base', recipe names under envs/, or recipe folders (default: all)")
    b.add_argument("--force", action="store_true", help="rebuild even when the tag exists")
    b.add_argument("--mirror", default=None, help="Debian mirror URI for the base (default: this machine's apt sources)")
    sub.add_parser("list", help="list the known recipes")
    ns = parser.parse_args(list(args) if args is not None else None)

    def progress(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    try:
        if ns.command == "list":
            print("base")
            for q in sorted(recipes_dir().iterdir()):
                if (q / "Dockerfile").is_file():
                    print(q.name)
            return 0
        names = ns.names or ["base", *(q.name for q in sorted(recipes_dir().iterdir()) if (q / "Dockerfile").is_file())]
        targets = _resolve_recipes(names)
        base = build_base_image(force=ns.force, mirror=ns.mirror, progress=progress)
        if "base" in targets:
            print(base)
        for t in targets:
            if t != "base":
                print(build_image(t, base=base, force=ns.force, progress=progress))
        return 0
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except (ImageBuildError, ResourceUnavailable) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(images_main())
