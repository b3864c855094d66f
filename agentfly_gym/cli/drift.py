"""``agentfly-gym drift``: what re-tokenizing saved trajectories would change (:mod:`agentfly_gym.rollout.drift`)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from ..errors import ConfigError
from ..rollout.drift import measure_drift

__all__ = ["add_drift_arguments", "drift_main"]


def add_drift_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the ``drift`` command's arguments to ``parser`` (``trajectories``, ``--tokenizer``,
    ``--json``, ``--per-trajectory``) and return it."""
    parser.add_argument("trajectories", help="trajectories.parquet or trajectories.jsonl (as `rollout` writes them)")
    parser.add_argument("--tokenizer", default="smollm2",
                        help="the tokenizer that produced the ids: smollm2 (default), qwen3, or a tokenizer folder")
    parser.add_argument("--json", dest="json_out", default=None, help="also write the full result to this JSON file")
    parser.add_argument("--per-trajectory", action="store_true", help="print one line per trajectory")
    return parser


def drift_main(args: argparse.Namespace | Sequence[str] | None = None) -> int:
    """Entry point of ``agentfly-gym drift``: measure and print the drift of a trajectory file.

    Args:
        args: a namespace with ``trajectories``, ``tokenizer`` and optionally ``json_out`` and
            ``per_trajectory`` (see :func:`add_drift_arguments`), or an argv list.

    Returns:
        0 on success (whatever the drift), 2 when the file is missing or unreadable.

    Raises:
        ConfigError: an unknown tokenizer name.
    """
    if not isinstance(args, argparse.Namespace):
        args = add_drift_arguments(argparse.ArgumentParser(prog="agentfly-gym drift")).parse_args(args)
    from ..rollout.light_tokenizer import load_tokenizer
    from ..rollout.policies.factory import _tokenizer_dir
    from ..rollout.trajectory import load_trajectories

    path = Path(args.trajectories)
    if not path.is_file():
        print(f"agentfly-gym drift: error: {str(path)!r} is not a file", file=sys.stderr)
        return 2
    if path.suffix not in (".parquet", ".jsonl"):
        raise ConfigError(f"{str(path)!r}: expected a .parquet or .jsonl trajectory file")
    try:
        trajs = load_trajectories(path)
    except Exception as e:  # noqa: BLE001  (a corrupt file is reported, not a traceback)
        print(f"agentfly-gym drift: error: cannot read {str(path)!r}: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    tok = load_tokenizer(_tokenizer_dir(getattr(args, "tokenizer", None)))  # no transformers/torch where exact
    res = measure_drift(trajs, tok)
    c, t = res["chain"], res["turn"]
    print(f"{res['trajectories']} trajectories ({res['skipped']} without tokens skipped), tokenizer {tok.name_or_path}")
    print(f"re-tokenize whole chain: {c['trajectories_drifted']}/{res['trajectories']} trajectories "
          f"({100 * c['trajectory_share']:.1f}%), {c['tokens_changed']}/{c['tokens']} tokens "
          f"({100 * c['token_share']:.3f}%) would change")
    print(f"re-tokenize each turn:   {t['trajectories_drifted']}/{res['trajectories']} trajectories "
          f"({100 * t['trajectory_share']:.1f}%), {t['turns_drifted']}/{t['turns']} turns, "
          f"{t['tokens_changed']}/{t['tokens']} sampled tokens ({100 * t['token_share']:.3f}%) would change")
    print("stored ids are the sampled ids: training on them has no drift")
    if getattr(args, "per_trajectory", False):
        for r in res["per_trajectory"]:
            print(f"  {r['trajectory_id']}: chain {r['chain_changed']}/{r['tokens']}, "
                  f"turns {r['turns_drifted']}/{r['turns']} ({r['turn_changed']}/{r['sampled_tokens']} tokens)")
    out = getattr(args, "json_out", None)
    if out:
        from ..utils.files import atomic_path

        Path(out).parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(out) as tmp:  # a reader (or a crash) never leaves half a report
            tmp.write_text(json.dumps(res, indent=2))
    return 0
