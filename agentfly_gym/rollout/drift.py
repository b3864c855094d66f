"""Re-tokenization drift: how much naive decode/re-encode would change stored trajectories.

AgentFly (section 3; mission.md) found that decoding sampled tokens to text and tokenizing
the conversation again changed 36% of trajectories and 0.07% of tokens, because BPE
re-tokenization is not an identity (e.g. Qwen ids ``[220, 1782]`` decode to ``" the"`` and
re-encode as ``[279]``).  This module measures, for trajectories stored as token ids, what
two naive pipelines would have produced instead:

* ``chain``: decode the whole sequence (``prompt_ids + response_ids``, special tokens kept)
  and encode the text again (``add_special_tokens=False``).
* ``turn``: decode each assistant turn (each maximal run of ``response_mask == 1``, i.e. the
  sampled ids of one turn) and encode it again on its own.

A sequence *drifts* when the re-encoded ids differ from the stored ones.  The number of
*changed tokens* of a sequence is ``len(original) - matched``, where ``matched`` is the total
size of the matching blocks of :class:`difflib.SequenceMatcher` (``autojunk=False``) between
the original and the re-encoded ids: the original tokens that no alignment keeps.

Our own rollouts store the sampled ids verbatim, so training on them has no drift by
construction; these numbers say what re-tokenizing would have cost.

The command ``agentfly-gym drift <trajectories.parquet|jsonl> --tokenizer ...`` is
:mod:`agentfly_gym.cli.drift`.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence
from typing import Any

from ..errors import ConfigError

__all__ = ["measure_drift", "sequence_drift", "assistant_segments"]


def _get(obj: Any, name: str, default: Any = None) -> Any:
    if isinstance(obj, dict):
        return obj.get(name, default)
    return getattr(obj, name, default)


def assistant_segments(response_ids: Sequence[int], response_mask: Sequence[int]) -> list[list[int]]:
    """The sampled ids of each assistant turn: the maximal runs of ``response_mask == 1``.

    Args:
        response_ids, response_mask: equal-length sequences (length L).

    Returns:
        One list of ids per run, in order (the sum of their lengths is ``sum(response_mask)``).

    Raises:
        ConfigError: the lengths differ.
    """
    if len(response_ids) != len(response_mask):
        raise ConfigError(f"response_ids has {len(response_ids)} ids but response_mask {len(response_mask)} entries")
    out: list[list[int]] = []
    cur: list[int] = []
    for tid, m in zip(response_ids, response_mask):
        if m:
            cur.append(int(tid))
        elif cur:
            out.append(cur)
            cur = []
    if cur:
        out.append(cur)
    return out


def sequence_drift(ids: Sequence[int], tokenizer: Any) -> tuple[list[int], int]:
    """Decode ``ids`` (special tokens kept, no space clean-up) and encode the text again.

    Returns:
        ``(reencoded_ids, changed)``: the re-encoded ids and the number of original tokens
        not kept by the best alignment (see the module docstring); ``changed == 0`` iff the
        round trip is the identity.
    """
    ids = [int(i) for i in ids]
    text = tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
    re_ids = list(tokenizer.encode(text, add_special_tokens=False))
    if re_ids == ids:
        return re_ids, 0
    sm = difflib.SequenceMatcher(a=ids, b=re_ids, autojunk=False)
    matched = sum(b.size for b in sm.get_matching_blocks())
    return re_ids, max(1, len(ids) - matched)


def _sequences(traj: Any) -> list[tuple[list[int], list[int], list[int]]]:
    """(prompt_ids, response_ids, response_mask) per training sequence of a trajectory:
    one for chain mode, one per step row for step mode."""
    steps = _get(traj, "steps") or []
    if steps:
        return [(list(_get(r, "prompt_ids") or []), list(_get(r, "response_ids") or []),
                 list(_get(r, "response_mask") or [])) for r in steps]
    return [(list(_get(traj, "prompt_ids") or []), list(_get(traj, "response_ids") or []),
             list(_get(traj, "response_mask") or []))]


def measure_drift(trajectories: Iterable[Any], tokenizer: Any) -> dict[str, Any]:
    """Share of trajectories and of tokens that naive re-tokenization would change.

    Args:
        trajectories: :class:`~agentfly_gym.rollout.trajectory.Trajectory` objects or their
            records (dicts with ``prompt_ids``, ``response_ids``, ``response_mask``; step-mode
            trajectories with ``steps`` rows are measured row by row).  Trajectories without
            tokens (failed ones) are skipped and counted in ``skipped``.
        tokenizer: the Hugging Face tokenizer that produced the ids.

    Returns:
        A JSON-able dict::

            trajectories, skipped: counts
            chain: {trajectories_drifted, trajectory_share, tokens, tokens_changed, token_share}
                   (whole sequence decoded and re-encoded; tokens = prompt + response tokens)
            turn:  {trajectories_drifted, trajectory_share, turns, turns_drifted, turn_share,
                    tokens, tokens_changed, token_share}
                   (each assistant turn decoded and re-encoded alone; tokens = sampled tokens)
            per_trajectory: [{trajectory_id, tokens, chain_changed, sampled_tokens, turns,
                              turns_drifted, turn_changed}]

        Shares are fractions in [0, 1] (0.0 when the denominator is 0).
    """
    per: list[dict[str, Any]] = []
    skipped = 0
    for k, traj in enumerate(trajectories):
        seqs = _sequences(traj)
        if not any(p or r for p, r, _ in seqs):
            skipped += 1
            continue
        row = {"trajectory_id": str(_get(traj, "trajectory_id", k)), "tokens": 0, "chain_changed": 0,
               "sampled_tokens": 0, "turns": 0, "turns_drifted": 0, "turn_changed": 0}
        for prompt, resp, mask in seqs:
            full = prompt + resp
            row["tokens"] += len(full)
            row["chain_changed"] += sequence_drift(full, tokenizer)[1] if full else 0
            for seg in assistant_segments(resp, mask):
                changed = sequence_drift(seg, tokenizer)[1]
                row["sampled_tokens"] += len(seg)
                row["turns"] += 1
                row["turns_drifted"] += changed > 0
                row["turn_changed"] += changed
        per.append(row)

    def share(a: float, b: float) -> float:
        return a / b if b else 0.0

    n = len(per)
    tok = sum(r["tokens"] for r in per)
    chg = sum(r["chain_changed"] for r in per)
    st = sum(r["sampled_tokens"] for r in per)
    tchg = sum(r["turn_changed"] for r in per)
    turns = sum(r["turns"] for r in per)
    tdr = sum(r["turns_drifted"] for r in per)
    cdr = sum(1 for r in per if r["chain_changed"])
    udr = sum(1 for r in per if r["turn_changed"])
    return {
        "trajectories": n, "skipped": skipped,
        "chain": {"trajectories_drifted": cdr, "trajectory_share": share(cdr, n), "tokens": tok,
                  "tokens_changed": chg, "token_share": share(chg, tok)},
        "turn": {"trajectories_drifted": udr, "trajectory_share": share(udr, n), "turns": turns,
                 "turns_drifted": tdr, "turn_share": share(tdr, turns), "tokens": st, "tokens_changed": tchg,
                 "token_share": share(tchg, st)},
        "per_trajectory": per,
    }


