"""``report.md`` and ``pass_at_k.png`` of an evaluation, from its ``results.json`` dict.

The plot (matplotlib's object API, no pyplot state) has two panels: pass@j against j per env (the unbiased
estimator, :mod:`agentfly_gym.eval.stats`), and per env the success rate and the mean reward with their 95%
bootstrap intervals as error bars.  Without matplotlib the report is written without the plot and says so.
"""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["PLOT_NAME", "REPORT_NAME", "format_ci", "write_report"]

log = logging.getLogger(__name__)

PLOT_NAME = "pass_at_k.png"
REPORT_NAME = "report.md"


def _num(v: Any, pct: bool = False) -> str:
    if v is None:
        return "-"
    return f"{100 * v:.1f}%" if pct else f"{v:.3f}"


def format_ci(value: Any, ci: Any, pct: bool = False) -> str:
    """``"62.5% [40.0%, 80.0%]"``: a value and its interval (``"-"`` when there is none)."""
    if value is None:
        return "-"
    if not ci:
        return _num(value, pct)
    return f"{_num(value, pct)} [{_num(ci[0], pct)}, {_num(ci[1], pct)}]"


def _plot(results: Mapping[str, Any], path: Path) -> bool:
    try:
        from matplotlib.figure import Figure
    except ImportError:
        return False
    k = int(results["k"])
    envs = results["envs"]
    fig = Figure(figsize=(10, 4))
    ax1, ax2 = fig.subplots(1, 2)
    for env_id, r in envs.items():
        js = [j for j in range(1, k + 1) if r.get(f"pass@{j}") is not None]
        ax1.plot(js, [r[f"pass@{j}"] for j in js], marker="o", label=env_id)
    ax1.set_xticks(range(1, k + 1) if k <= 20 else range(1, k + 1, max(1, k // 10)))
    ax1.set_xlabel("k (samples)")
    ax1.set_ylabel("pass@k")
    ax1.set_ylim(0, 1.02)
    ax1.set_title("pass@k (unbiased estimator, Chen et al. 2021)")
    ax1.legend(fontsize=8)
    names = list(envs)
    for off, key, label in ((-0.15, "success", "success"), (0.15, "mean_reward", "mean reward")):
        xs, ys, lo, hi = [], [], [], []
        for i, env_id in enumerate(names):
            r = envs[env_id]
            if r.get(key) is None:
                continue
            ci = r.get(f"{key}_ci") or [r[key], r[key]]
            xs.append(i + off)
            ys.append(r[key])
            lo.append(max(0.0, r[key] - ci[0]))
            hi.append(max(0.0, ci[1] - r[key]))
        ax2.errorbar(xs, ys, yerr=[lo, hi], fmt="o", capsize=4, label=label)
    ax2.set_xticks(range(len(names)), [n.rsplit("/", 1)[-1] for n in names], rotation=20, fontsize=8)
    ax2.set_title("per env, 95% bootstrap intervals")
    ax2.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110, format="png")
    return True


def write_report(results: Mapping[str, Any], out: str | Path) -> dict[str, Path]:
    """Write ``report.md`` (and ``pass_at_k.png`` when matplotlib is installed) into ``out``.

    Returns:
        The written paths by kind (``"report"``, ``"plot"``).
    """
    from ..utils.files import atomic_path

    out = Path(out)
    k = int(results["k"])
    paths: dict[str, Path] = {}
    plot = out / PLOT_NAME
    drawn = False
    if importlib.util.find_spec("matplotlib") is not None:
        try:
            with atomic_path(plot) as tmp:
                drawn = _plot(results, Path(tmp))
            paths["plot"] = plot
        except Exception as e:  # noqa: BLE001 - a plot failure must not lose the results
            log.warning("the plot could not be drawn (%s: %s); report.md is written without it", type(e).__name__, e)
            drawn = False
    lines = [f"# Evaluation of {results.get('model') or 'the policy'}", ""]
    lines.append(f"{k} sample(s) per task; pass@k by the unbiased estimator of Chen et al. 2021; intervals are 95% "
                 "percentile bootstrap intervals (over tasks for an env, over samples for a task). Samples that "
                 "ended in an infrastructure error are counted under *errors* and left out of every score.")
    if results.get("text_only"):
        lines += ["", "The policy returned text only (no token ids): these trajectories cannot be trained on."]
    lines += ["", "| env | split | tasks | scored samples | errors | " + " | ".join(f"pass@{j}" for j in range(1, k + 1))
              + " | success | mean reward |",
              "|" + "---|" * (7 + k)]
    splits = results.get("splits", {})
    for env_id, r in results["envs"].items():
        lines.append(f"| {env_id} | {splits.get(env_id) or '-'} | {r['tasks']} | {r['scored_samples']} | {r['errors']} | "
                     + " | ".join(_num(r.get(f"pass@{j}"), True) for j in range(1, k + 1))
                     + f" | {format_ci(r['success'], r['success_ci'], True)} | "
                       f"{format_ci(r['mean_reward'], r['mean_reward_ci'])} |")
    lines += ["", "![pass@k and per-env scores](pass_at_k.png)" if drawn else "(no plot: matplotlib is not installed)"]
    for env_id, r in results["envs"].items():
        lines += ["", f"## {env_id}", "", "| task | n | successes | errors | pass@1 | pass@" + str(k)
                  + " | mean reward |", "|---|---|---|---|---|---|---|"]
        for task, t in r["per_task"].items():
            lines.append(f"| {task} | {t['n']} | {t['c']} | {t['errors']} | {_num(t.get('pass@1'), True)} | "
                         f"{_num(t.get(f'pass@{k}'), True)} | {format_ci(t['mean_reward'], t['mean_reward_ci'])} |")
    report = out / REPORT_NAME
    with atomic_path(report) as tmp:
        Path(tmp).write_text("\n".join(lines) + "\n", encoding="utf-8")
    paths["report"] = report
    return paths
