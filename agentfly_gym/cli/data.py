"""``agentfly-gym data``: the full public data sets (status, download, verify) and ALFWorld's engine cache."""

from __future__ import annotations

import argparse
import os
import sys
import zipfile
from pathlib import Path

from ..data.datasets import DATASETS, read_manifest, download_dataset, verify_dataset
from ..data.paths import data_candidates, default_download_dir
from ..errors import ChecksumError, ConfigError, DataNotFoundError, DownloadError

__all__ = ["data_main"]


def _parse_pins(items: list[str] | None) -> dict[str, str]:
    pins = {}
    for item in items or []:
        name, sep, hexd = item.partition("=")
        if not sep or len(hexd) != 64 or any(c not in "0123456789abcdefABCDEF" for c in hexd):
            raise ConfigError(f"--sha256 {item!r} is not FILE=<64 hex characters>")
        pins[name] = hexd.lower()
    return pins


def _holds(folder: Path, marker: str) -> bool:
    """Whether ``folder`` holds ``marker``: a relative path, or a glob (the rule of ``resolve_data_dir``)."""
    if any(ch in marker for ch in "*?["):
        return folder.is_dir() and next(folder.glob(marker), None) is not None
    return (folder / marker).exists()


def _status_rows() -> list[tuple[str, ...]]:
    rows = []
    for ds in DATASETS.values():
        folder = default_download_dir(ds.folder)
        manifest = read_manifest(folder)
        present = sum((folder / f.name).is_file() for f in ds.files)
        pins = ", ".join(f"{f.name}: " + ("pinned" if f.sha256 else "recorded" if manifest.get("files", {}).get(
            f.name, {}).get("sha256") else "none yet") for f in ds.files)
        ready = "ready" if _holds(folder, ds.ready) else "not downloaded"
        rows.append((ds.name, str(folder), f"{present}/{len(ds.files)} files, {ready}", pins, ds.licence, ds.source))
    return rows


def _in_use_rows() -> list[tuple[str, str, str]]:
    # the same markers the environments pass to resolve_data_dir, so this table names the folder they read
    from ..envs.webshop.catalog import DATA_MARKER

    rows = []
    for folder_name, marker in (("chess", ("lichess_db_puzzle.csv", "lichess_puzzles_sample.csv")),
                                ("alfworld", ("json_2.1.1/*/*/*/game.tw-pddl",)), ("webshop", (DATA_MARKER,))):
        found = "none (the environment raises DataNotFoundError)"
        for m in marker:
            hit = next(((label, p) for label, p in data_candidates(folder_name) if _holds(p, m)), None)
            if hit:
                found = f"{hit[1]} ({hit[0]})"
                break
        rows.append((folder_name, found, ", ".join(marker)))
    from ..envs.r2egym.local_tasks import default_tasks_dir

    tasks = default_tasks_dir() / "tasks.jsonl"  # R2EGym-v0's default; downloaded rows are passed as tasks=
    rows.append(("r2egym", str(tasks) if tasks.is_file() else "none: run `agentfly-gym r2e build-tasks`",
                 "the local task set (downloaded rows are passed as tasks=<file>)"))
    return rows


def data_main(argv: list[str]) -> int:
    """``agentfly-gym data status | download NAME | verify NAME`` (returns the exit status)."""
    p = argparse.ArgumentParser(prog="agentfly-gym data", allow_abbrev=False,
                                description="the full public data sets: where they are, download, verify; "
                                            "precompute ALFWorld's engine cache")
    sub = p.add_subparsers(dest="action", required=True)
    sub.add_parser("status", help="data sets, their folders and pins, and the folder each env reads now")
    for action in ("download", "verify"):
        a = sub.add_parser(action, help=f"{action} a data set: {', '.join(DATASETS)}")
        a.add_argument("name", choices=list(DATASETS))
        a.add_argument("--dest", default=None, help="the data set's folder (default: $AGENTFLY_GYM_DATA/<folder>, "
                                                    "else the cache folder the envs search)")
        a.add_argument("--sha256", action="append", metavar="FILE=HEX", help="expected digest of a file (repeatable)")
        a.add_argument("--no-progress", action="store_true")
        if action == "download":
            a.add_argument("--mirror", default=None, help="base URL of a copy: <mirror>/<folder>/<file>")
            a.add_argument("--precompute", action="store_true",
                           help="alfworld: then fill the engine cache for its evaluation splits (as `precompute`)")
    a = sub.add_parser("precompute", help="alfworld: load every game of the splits once so that first resets are "
                                          "disk-cache hits (~0.2 s instead of ~1 s); entries go to "
                                          "$AGENTFLY_GYM_CACHE/alfworld/engine; Ctrl-C keeps the finished ones")
    a.add_argument("name", choices=["alfworld"])
    a.add_argument("--split", action="append", default=None,
                   help="split to fill (repeatable; default: valid_seen and valid_unseen; train is ~1 h)")
    a.add_argument("--data-dir", default=None, help="the ALFWorld data root (default: the one the env reads)")
    a.add_argument("--limit", type=int, default=None, help="at most this many games")
    a.add_argument("--no-sample", action="store_true", help="skip the sample games shipped in the package")
    a.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    from ..utils.console import console as make_console
    from rich.table import Table

    console = make_console()
    try:
        if args.action == "status":
            t = Table(title="public data sets (agentfly-gym data download NAME)")
            for col in ("name", "folder", "state", "checksums", "licence", "source"):
                t.add_column(col, overflow="fold")
            for row in _status_rows():
                t.add_row(*row)
            console.print(t)
            u = Table(title="what the environments read now (first match of the resolution order)")
            for col in ("data set", "folder in use", "looked for"):
                u.add_column(col, overflow="fold")
            for row in _in_use_rows():
                u.add_row(*row)
            console.print(u)
            return 0
        if args.action == "precompute":
            return _precompute(args.split, args.data_dir, limit=args.limit, sample=not args.no_sample,
                               progress=not args.no_progress)
        pins = _parse_pins(args.sha256)
        if args.action == "download":
            folder = download_dataset(args.name, args.dest, sha256=pins, mirror=args.mirror,
                                      progress=not args.no_progress)
            if args.precompute and args.name == "alfworld":
                return _precompute(None, folder, limit=None, sample=True, progress=not args.no_progress)
            return 0
        results = verify_dataset(args.name, args.dest, sha256=pins, progress=not args.no_progress)
        for name, ok, detail in results:
            print(f"{'OK  ' if ok else 'FAIL'} {name}: {detail}")
        return 0 if all(ok for _, ok, _ in results) else 1
    except (DownloadError, ChecksumError, ConfigError, DataNotFoundError) as e:
        print(f"agentfly-gym data: error: {e}", file=sys.stderr)
        return 1
    except (OSError, zipfile.BadZipFile) as e:  # e.g. a full disk while unpacking, a broken archive
        what = getattr(args, "name", "the data")
        print(f"agentfly-gym data: error while preparing {what}: {e}; the downloaded files are kept, free the space "
              "or fix the cause and run the command again", file=sys.stderr)
        return 1


def _precompute(splits: list[str] | None, data_dir: str | os.PathLike | None, *, limit: int | None, sample: bool,
                progress: bool) -> int:
    from ..envs.alfworld.precompute import DEFAULT_SPLITS, precompute_engine_cache

    try:
        r = precompute_engine_cache(tuple(splits or DEFAULT_SPLITS), data_dir=data_dir, include_sample=sample,
                                    limit=limit, progress=progress)
    except KeyboardInterrupt:
        print("agentfly-gym data precompute: interrupted; the entries written so far are kept (rerun to go on)",
              file=sys.stderr)
        return 130
    print(f"alfworld engine cache: {r['computed']} computed, {r['present']} already there, {r['failed']} failed, "
          f"of {r['games']} games in {r['seconds']} s ({r['cache_dir']})")
    return 1 if r["failed"] else 0
