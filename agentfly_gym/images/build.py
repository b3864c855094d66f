"""Images of the recipes in ``envs/``, built locally and offline on the Debian base image (:mod:`.base`).

No image registry is needed.  Every image is a recipe folder (``envs/<name>/Dockerfile``) built ``FROM``
the base with the build's network switched off, its Python packages installed from wheels downloaded on
the host::

    from agentfly_gym.images.build import build_image
    tag = build_image("envs/r2egym")          # "agentfly/r2egym:<digest>", a no-op when unchanged

Tags are content hashes: a recipe tag digests every file of the recipe folder plus the
id of the base image it is built on.  A tag that already exists is not rebuilt, so building an
unchanged recipe is a quick check.  Each build also moves ``<name>:latest`` to its result.

Recipe folders:

* ``Dockerfile``: starts with ``ARG BASE_IMAGE=agentfly/base:latest`` / ``FROM ${BASE_IMAGE}``;
  the build passes the exact base id as ``BASE_IMAGE``.
* ``requirements.txt`` (optional): downloaded on the host with ``pip download`` (binary wheels
  for the base's CPython 3.11 on x86-64/aarch64 Linux) into ``wheels/`` of the build context;
  install them with ``pip install --no-index --find-links /wheels -r /wheels/requirements.txt``.

Command line: ``agentfly-gym images build [names]`` (:mod:`agentfly_gym.cli.images`).
"""

from __future__ import annotations

import hashlib
import logging
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ..data.paths import cache_dir
from ..errors import ConfigError
from ..utils.files import file_lock
from .base import build_base_image
from .engine import ImageBuildError, Progress, docker_client, run_logged, say, tag_latest, image_exists

__all__ = ["build_image", "recipe_digest", "recipes_dir"]

log = logging.getLogger(__name__)

_RECIPE_PREFIX = "agentfly/"


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
        say(progress, f"  pip download -r {requirements.name} (on the host)")
        run_logged(cmd, progress, "pip download")
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
    client = docker_client()
    base = base or build_base_image(progress=progress)
    try:
        base_id = client.images.get(base).id
    except docker.errors.ImageNotFound as e:
        raise ImageBuildError(f"base image {base!r} not found; build it with build_base_image()") from e
    tag = f"{repo}:{recipe_digest(recipe, base_id)}"
    if not force and image_exists(tag, client):
        say(progress, f"image {tag}: up to date")
        tag_latest(client, tag, repo)
        return tag
    # one build of a tag at a time, across processes (two test workers, two shells): they would share the wheel
    # download folder half-written; the second waits and finds the image the first built
    with file_lock(build_lock_path(tag)):
        if not force and image_exists(tag, client):  # another process built it meanwhile
            tag_latest(client, tag, repo)
            return tag
        return _build_locked(client, recipe, repo, tag, base_id, progress)


def build_lock_path(tag: str) -> Path:
    """The file :func:`build_image` locks (``fcntl.flock``) while it builds ``tag``, in the cache folder."""
    return cache_dir("images", "locks", hashlib.sha256(tag.encode()).hexdigest()[:16] + ".lock")


def _build_locked(client: Any, recipe: Path, repo: str, tag: str, base_id: str, progress: Progress | None) -> str:
    """:func:`build_image`'s build, with the tag's build lock held."""
    import docker

    say(progress, f"image {tag}: building from {recipe}")
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
                        say(progress, f"  {line}")
        except docker.errors.APIError as e:
            raise ImageBuildError(f"docker build of {recipe} failed: {e}\n" + "\n".join(tail)) from e
    if not image_exists(tag, client):
        raise ImageBuildError(f"docker build of {recipe} finished without producing {tag}:\n" + "\n".join(tail))
    tag_latest(client, tag, repo)
    say(progress, f"image {tag}: built ({time.monotonic() - t0:.0f}s)")
    return tag
