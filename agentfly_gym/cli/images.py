"""``agentfly-gym images build [names] | list | openenv [ENV_NAME]``: build container images offline
(:mod:`agentfly_gym.images`)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

from ..errors import ConfigError, ResourceUnavailable
from ..images.base import build_base_image
from ..images.build import build_image, recipes_dir
from ..images.engine import ImageBuildError

__all__ = ["images_main"]


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
    """``agentfly-gym images build [names] [--force] [--mirror URI] | list | openenv [ENV_NAME] [--force]``;
    returns the exit status.

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
    o = sub.add_parser("openenv", help="build the image of an OpenEnv environment (needs the openenv extra)")
    o.add_argument("env_name", nargs="?", default="echo_env", help="the `openenv init` name (default echo_env)")
    o.add_argument("--force", action="store_true", help="rebuild even when the tag exists")
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
        if ns.command == "openenv":
            from ..images.openenv import build_openenv_image

            print(build_openenv_image(ns.env_name, force=ns.force, progress=progress))
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
