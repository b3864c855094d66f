"""Helpers shared by the benchmark scripts: machine info, package versions, result files, plots.

Every benchmark writes ``<out>/<name>.json`` with the raw numbers plus ``machine`` (cores, RAM,
CPU model), ``packages`` (versions), ``seed`` and ``command`` (the exact command line), and a PNG
plot ``<out>/<name>.png``.  ``<out>`` defaults to ``benchmarks/results``.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import json
import math
import os
import platform
import shlex
import statistics
import sys
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"

PACKAGES = ("agentfly-gym", "gymnasium", "numpy", "torch", "transformers", "tokenizers", "scienceworld", "chess",
            "alfworld", "textworld", "docker", "matplotlib", "spacy", "bm25s")


def base_parser(description: str) -> argparse.ArgumentParser:
    """A parser with the options every benchmark has: ``--scale``, ``--seed``, ``--repeats``, ``--out``."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--scale", type=float, default=1.0,
                   help="size knob: multiplies trajectory counts / sizes (1 = the default small run; "
                        "0 = the smallest run, for smoke tests)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeats", type=int, default=None, help="repeats per measurement (median reported)")
    p.add_argument("--out", default=str(RESULTS), help="folder for the JSON and PNG results")
    return p


def scaled(n: int, scale: float, minimum: int = 1) -> int:
    """``n`` times ``scale``, at least ``minimum`` (``scale == 0`` gives ``minimum``)."""
    return max(minimum, int(round(n * scale)))


def machine_info() -> dict[str, Any]:
    """Cores, RAM (bytes), CPU model, OS and Python of this machine."""
    model = platform.processor() or ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    ram = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    ram = int(line.split()[1]) * 1024
                    break
    except OSError:
        pass
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count()
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    return {"cores": os.cpu_count(), "usable_cores": usable, "ram_bytes": ram, "cpu_model": model,
            "platform": platform.platform(), "python": sys.version.split()[0],
            "loadavg_at_start": list(load) if load else None}


def package_versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def command_line() -> str:
    return " ".join(shlex.quote(a) for a in [Path(sys.executable).name, *sys.argv])


class Result:
    """Collects a benchmark's numbers and writes them as JSON (``save``)."""

    def __init__(self, name: str, args: argparse.Namespace) -> None:
        self.name = name
        self.out = Path(args.out)
        self.data: dict[str, Any] = {"benchmark": name, "command": command_line(), "seed": args.seed,
                                     "scale": args.scale, "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                                     "machine": machine_info(), "packages": package_versions(),
                                     "skipped": {}}
        self._t0 = time.monotonic()

    def skip(self, what: str, reason: str) -> None:
        """Record and print why a part was skipped."""
        print(f"[{self.name}] SKIPPED {what}: {reason}", flush=True)
        self.data["skipped"][what] = reason

    def save(self) -> Path:
        self.out.mkdir(parents=True, exist_ok=True)
        self.data["duration_s"] = time.monotonic() - self._t0
        path = self.out / f"{self.name}.json"
        path.write_text(json.dumps(self.data, indent=2, default=_jsonable, allow_nan=False))
        print(f"[{self.name}] wrote {path}", flush=True)
        return path

    @property
    def png(self) -> Path:
        self.out.mkdir(parents=True, exist_ok=True)
        return self.out / f"{self.name}.png"


def _jsonable(o: Any) -> Any:
    if hasattr(o, "tolist"):
        return o.tolist()
    if isinstance(o, Path):
        return str(o)
    return str(o)


def clean(x: Any) -> Any:
    """Replace NaN/inf floats by None, recursively (strict JSON)."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [clean(v) for v in x]
    return x


def median(xs) -> float:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else float("nan")


def pct(xs, q: float) -> float:
    xs = sorted(x for x in xs if x is not None)
    if not xs:
        return float("nan")
    k = (len(xs) - 1) * q
    lo, hi = int(math.floor(k)), int(math.ceil(k))
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def plt():
    """matplotlib.pyplot with the non-interactive Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as pyplot

    return pyplot


def subplots(*args: Any, **kwargs: Any):
    """``plt().subplots(*args, **kwargs)``: a new figure and its axes (Agg backend); the preamble of every plot."""
    return plt().subplots(*args, **kwargs)


class Guard:
    """What :func:`skip_on_error` yields: ``failed`` is True once the guarded block raised."""

    failed = False


@contextlib.contextmanager
def skip_on_error(res: Result, what: str, *, trace: bool = True, prefix: str = "failed: ") -> Iterator[Guard]:
    """Run a part of a benchmark so that its failure is recorded as a skip instead of losing the
    other parts' numbers.

    An ``Exception`` raised in the block is swallowed: its traceback printed (``trace``) and
    ``res.skip(what, f"{prefix}{type(e).__name__}: {e}")`` recorded; the yielded :class:`Guard` then
    has ``failed=True`` (test it after the block to ``continue``).  ``KeyboardInterrupt`` and other
    ``BaseException``s propagate.
    """
    guard = Guard()
    try:
        yield guard
    except Exception as e:  # noqa: BLE001  (one part failing must not lose the others' numbers)
        if trace:
            traceback.print_exc()
        res.skip(what, f"{prefix}{type(e).__name__}: {e}")
        guard.failed = True


def setup_env_vars() -> None:
    """Put the repository on ``sys.path``.  Data comes from ``AGENTFLY_GYM_DATA`` when it is set (a folder with the
    full data sets, e.g. what the committed results were measured on), else from the library's resolution order (down
    to the package's samples); nothing outside the repository is read by default.  The tests set the variable to
    ``tests/data`` before any script runs."""
    repo = str(Path(__file__).resolve().parents[1])
    if repo not in sys.path:
        sys.path.insert(0, repo)


def label_bars(axes, labels) -> None:
    """Put ``labels`` under bar groups 0..n-1 and a legend on every axis."""
    for ax in axes:
        ax.set_xticks(range(len(labels)))
        ax.set_xticklabels(labels)
        ax.legend(fontsize=8)


def save_figure(res: Result, fig) -> None:
    """Lay out ``fig``, write it to the result's PNG and close it."""
    fig.tight_layout()
    fig.savefig(res.png, dpi=110)
    plt().close(fig)
    print(f"[{res.name}] wrote {res.png}")


def finish(res: Result, plot) -> int:
    """Clean the result's data for JSON, write it, draw its plot; the script's exit status (0)."""
    res.data = clean(res.data)
    res.save()
    plot(res)
    return 0
