"""Container images of OpenEnv environments, built offline on the agentfly base image.

OpenEnv's own recipe (``openenv init``'s ``server/Dockerfile``) starts from a registry image and
runs ``uv sync`` against a package index; neither is reachable where agentfly builds images.  This
builds the same server from what is installed here instead:

* the environment's code is made by OpenEnv's own CLI, ``openenv init <env_name>`` (its template is
  OpenEnv's echo environment: ``reset`` says "... environment ready!", ``step({"message": m})``
  echoes ``m`` with reward ``0.1 * len(m)``); only its ``*.py`` files and ``openenv.yaml`` are kept
  (the README's front matter is random per run, and would change the image tag);
* the Python packages its server imports (:func:`server_distributions`: ``openenv-core`` and what
  its server imports, at the versions installed here, ~50 MB; OpenEnv's optional web UI (gradio) is
  left out, as ``openenv.core.env_server`` allows) are copied file by file from this interpreter's
  site-packages into ``/opt/openenv/site`` of the image;
* the recipe is built by :func:`agentfly_gym.images.build.build_image` with the build's network off, so
  the tag is a content hash of all of the above plus the base image id, and an unchanged build is a
  no-op (a few seconds to hash ~10 MB).

The image serves ``uvicorn server.app:app`` on :data:`SERVER_PORT` inside the container (its
default command); :class:`~agentfly_gym.bridges.openenv.OpenEnvEnv` runs it with ``image=`` and
publishes that port on 127.0.0.1 of the host.

Command line: ``agentfly-gym images openenv [ENV_NAME] [--force]`` prints the tag.
"""

from __future__ import annotations

import importlib.metadata as md
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from .engine import ImageBuildError, Progress
from .build import build_image

__all__ = ["SERVER_PORT", "server_distributions", "build_openenv_image", "openenv_server_command",
           "stage_openenv_recipe"]

_RECIPE_VERSION = "1"  # bump when the staging or the Dockerfile below changes

SERVER_PORT = 8000
"""The TCP port the server listens on inside the container (OpenEnv's default)."""

_BLOCKED = ("gradio", "openenv.core.env_server.web_interface")
"""Left out of the image: OpenEnv's optional web UI (``openenv.core.env_server`` imports it only if present)."""

_PROBE = r"""
import importlib.abc, importlib.metadata as md, json, sys
blocked = set(sys.argv[2].split(","))
class _Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name in blocked or name.split(".")[0] in blocked:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, _Block())
sys.path.insert(0, sys.argv[1])
before = set(sys.modules)
import server.app, uvicorn.main, uvicorn.lifespan.on, uvicorn.loops.asyncio
import uvicorn.protocols.http.h11_impl, uvicorn.protocols.websockets.websockets_impl
tops = md.packages_distributions()
dists = {d for m in set(sys.modules) - before for d in tops.get(m.split(".")[0], ())}
print(json.dumps(sorted(dists)))
"""


def server_distributions(env_dir: str | Path) -> list[str]:
    """The installed distributions that serving the OpenEnv env in ``env_dir`` imports (sorted names).

    Found by importing its ``server.app`` and uvicorn's pure-Python protocol modules in a fresh
    interpreter, with :data:`_BLOCKED` (gradio, the web UI) made unimportable, and mapping every
    module loaded to its distribution; so the set follows the versions installed here.

    Raises:
        ImageBuildError: the import failed (its output is in the message).
    """
    import json

    proc = subprocess.run([sys.executable, "-c", _PROBE, str(env_dir), ",".join(_BLOCKED)], capture_output=True,
                          text=True, timeout=300, cwd=str(env_dir))
    if proc.returncode != 0:
        raise ImageBuildError(f"importing the OpenEnv server in {env_dir} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


_DOCKERFILE = """\
# An OpenEnv environment server on the agentfly base image, built offline by
# agentfly_gym.images.openenv (packages copied from the host's site-packages, env code from
# `openenv init {env_name}`).
ARG BASE_IMAGE=agentfly/base:latest
FROM ${{BASE_IMAGE}}
ARG BASE_IMAGE
COPY site/ /opt/openenv/site/
COPY env/ /opt/openenv/env/
ENV PYTHONPATH=/opt/openenv/site:/opt/openenv/env PYTHONDONTWRITEBYTECODE=1
WORKDIR /opt/openenv/env
LABEL agentfly.recipe=openenv agentfly.openenv.env={env_name} agentfly.openenv.recipe={version} \
      agentfly.openenv.base=${{BASE_IMAGE}} agentfly.openenv.dists="{dists}"
CMD ["python3", "-m", "uvicorn", "server.app:app", "--host", "0.0.0.0", "--port", "{port}"]
"""


def openenv_server_command(port: int = SERVER_PORT) -> tuple[str, ...]:
    """The container command that serves the image's environment on ``port`` (all interfaces)."""
    return ("python3", "-m", "uvicorn", "server.app:app", "--host", "0.0.0.0", "--port", str(port))


def _copy_distribution(name: str, site: Path) -> None:
    """Copy the files of installed distribution ``name`` that live in site-packages into ``site``."""
    try:
        dist = md.distribution(name)
    except md.PackageNotFoundError:
        raise ConfigError(f"distribution {name!r} is not installed here; install 'agentfly-gym[openenv]'") from None
    root = Path(dist.locate_file("")).resolve()
    for f in dist.files or ():
        rel = Path(str(f))
        if rel.parts and rel.parts[0] == ".." or "__pycache__" in rel.parts or rel.suffix == ".pyc":
            continue  # console scripts outside site-packages, byte code (made in the image if needed)
        src = root / rel
        if not src.is_file():
            continue
        dst = site / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dst)


def stage_openenv_recipe(dest: str | Path, env_name: str = "echo_env") -> Path:
    """Write the recipe folder (``Dockerfile``, ``env/``, ``site/``) of ``env_name`` into ``dest``.

    Args:
        dest: an empty or missing folder.
        env_name: the snake_case name given to ``openenv init`` (the env's class names derive from it).

    Returns:
        ``dest`` as a Path.

    Raises:
        ConfigError: a bad ``env_name``.
        ImageBuildError: ``openenv init`` or importing its server failed (the output is in the message).
    """
    import re

    if not re.fullmatch(r"[a-z][a-z0-9_]*", env_name or ""):
        raise ConfigError(f"env_name={env_name!r} must be a snake_case name such as 'echo_env'")
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="afg-openenv-") as tmp:
        proc = subprocess.run([sys.executable, "-m", "openenv.cli", "init", env_name, "--output-dir", tmp],
                              capture_output=True, text=True, timeout=300)
        made = Path(tmp) / env_name
        if proc.returncode != 0 or not (made / "server" / "app.py").is_file():
            raise ImageBuildError(f"`openenv init {env_name}` failed (exit {proc.returncode}):\n"
                                  f"{(proc.stdout + proc.stderr)[-3000:]}")
        for src in sorted(made.rglob("*")):
            rel = src.relative_to(made)
            if src.is_file() and "__pycache__" not in rel.parts and (src.suffix == ".py" or rel.name == "openenv.yaml"):
                (dest / "env" / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, dest / "env" / rel)
    pins = []
    for name in server_distributions(dest / "env"):
        _copy_distribution(name, dest / "site")
        pins.append(f"{name}=={md.version(name)}")
    (dest / "Dockerfile").write_text(_DOCKERFILE.format(env_name=env_name, port=SERVER_PORT, version=_RECIPE_VERSION,
                                                        dists=",".join(pins)))
    return dest


def build_openenv_image(env_name: str = "echo_env", *, name: str | None = None, base: str | None = None,
                        force: bool = False, progress: Progress | None = None) -> str:
    """Build the image of an OpenEnv environment made by ``openenv init env_name`` (offline, cached).

    Args:
        env_name: the ``openenv init`` name (default ``"echo_env"``, OpenEnv's echo environment).
        name: repository name; default ``"agentfly/openenv-<env_name with - for _>"``.
        base: base image (default: the agentfly base, built if missing).
        force: rebuild even when the content-hash tag exists.
        progress: called with each line of build output.

    Returns:
        ``"<name>:<digest>"`` (``<name>:latest`` points to it too).

    Raises:
        ConfigError, ImageBuildError: see :func:`stage_openenv_recipe` and :func:`~agentfly_gym.images.build.build_image`.
        ResourceUnavailable: no Docker engine answers.
    """
    from .base import build_base_image
    from .engine import docker_client

    repo = name or f"agentfly/openenv-{env_name.replace('_', '-')}"
    client = docker_client()
    base = base or build_base_image(progress=progress)
    if not force:
        found = _built_image(client, repo, env_name, client.images.get(base).id)
        if found is not None:
            return found
    with tempfile.TemporaryDirectory(prefix="afg-openenv-recipe-") as tmp:
        recipe = stage_openenv_recipe(Path(tmp) / "recipe", env_name)
        return build_image(recipe, name=repo, base=base, force=force, progress=progress)


def _built_image(client: Any, repo: str, env_name: str, base_id: str) -> str | None:
    """A tag of ``repo`` built by this recipe version for ``env_name`` on ``base_id`` whose copied
    distributions are all still installed here at the same versions (its ``agentfly.openenv.dists``
    label); None if there is none.  This skips staging (``openenv init`` and the import probe take
    ~30-50 s on a loaded machine) when nothing that went into the image has changed."""
    labels = [f"agentfly.openenv.env={env_name}", f"agentfly.openenv.recipe={_RECIPE_VERSION}",
              f"agentfly.openenv.base={base_id}"]
    for image in client.images.list(name=repo, filters={"label": labels}):
        pins = [p.partition("==") for p in (image.labels.get("agentfly.openenv.dists") or "").split(",") if p]
        try:
            same = bool(pins) and all(md.version(n) == v for n, _, v in pins)
        except md.PackageNotFoundError:
            same = False
        tags = [t for t in image.tags if t.startswith(f"{repo}:") and not t.endswith(":latest")]
        if same and tags:
            return sorted(tags)[0]
    return None
