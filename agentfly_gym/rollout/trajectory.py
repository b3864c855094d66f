"""Trajectory records: token ids, masks and logprobs as sampled, plus what happened each turn.

Saved as Parquet (one row per trajectory, list columns for ids/mask/logprobs) and as
JSONL, with a summary JSON beside them.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["Turn", "Trajectory", "save_trajectories", "load_trajectories"]


@dataclasses.dataclass
class Turn:
    """One agent turn.

    Attributes:
        reply: the policy's reply text (decoded from the sampled ids; for display and parsing only).
        action: the action parsed from the reply and sent to the env.
        observation: the env's observation after the action.
        reward: the env's reward for this step.
        terminated, truncated: the env's flags after this step.
        sampled_tokens: number of sampled ids this turn.
        finish_reason: ``"stop"`` / ``"length"`` / ``"action"`` (scripted policy).
        generate_s, env_s: seconds spent generating and stepping the env.
        info: a JSON-able subset of the env's info (score, won, error, task_id, step).
    """

    reply: str
    action: str
    observation: str
    reward: float
    terminated: bool
    truncated: bool
    sampled_tokens: int
    finish_reason: str
    generate_s: float
    env_s: float
    info: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class Trajectory:
    """One episode as the trainer sees it (chain mode: one sequence).

    Token fields (all lists of equal length L = len(response_ids)):
        prompt_ids: the rendered initial prompt (system + first observation), length P.
        response_ids: every later token in order: sampled ids exactly as generated (mask 1),
            template tokens closing a turn and observation messages (mask 0).
        response_mask: 1 for sampled ids, 0 for tokens the policy did not sample.
        response_logprobs: the policy's logprob for each sampled id; 0.0 at mask-0 positions;
            NaN where the policy reports none (scripted policies).

    Attributes:
        trajectory_id, group_id: ids; trajectories with the same group_id share a task (GRPO groups).
        env_id, task_id, seed: what was played.
        reward: the episode return (sum of step rewards).
        success: the env's ``won`` flag at the end.
        terminated, truncated: how the episode ended (truncated also on max_turns or the context budget).
        error: a handled fault, or None.
        turns: per-turn records.
        messages: the conversation as text ({"role", "content"}), for reading only.
        timings: seconds: ``wall``, ``generate``, ``env``, ``reset``.
        steps: step mode only: one :class:`~agentfly_gym.rollout.step.StepRow` per env step
            (the token fields above are then empty but for ``prompt_ids`` of step 0).
    """

    trajectory_id: str
    group_id: str
    env_id: str
    task_id: str
    seed: int | None
    mode: str
    prompt_ids: list[int]
    response_ids: list[int] = dataclasses.field(default_factory=list)
    response_mask: list[int] = dataclasses.field(default_factory=list)
    response_logprobs: list[float] = dataclasses.field(default_factory=list)
    reward: float = 0.0
    success: bool = False
    terminated: bool = False
    truncated: bool = False
    error: str | None = None
    turns: list[Turn] = dataclasses.field(default_factory=list)
    messages: list[dict[str, str]] = dataclasses.field(default_factory=list)
    timings: dict[str, float] = dataclasses.field(default_factory=dict)
    steps: list[Any] = dataclasses.field(default_factory=list)

    @property
    def num_turns(self) -> int:
        return len(self.turns)

    @property
    def num_sampled_tokens(self) -> int:
        if self.steps:
            return sum(sum(getattr(r, "response_mask", None) or r["response_mask"]) for r in self.steps)
        return sum(self.response_mask)

    def extend(self, ids: Sequence[int], mask: int, logprobs: Sequence[float] | None = None) -> None:
        """Append ``ids`` with one mask value; logprobs default to 0.0 (mask 0) or NaN (mask 1)."""
        ids = list(ids)
        if logprobs is None:
            logprobs = [0.0 if mask == 0 else math.nan] * len(ids)
        elif len(logprobs) != len(ids):
            raise ValueError(f"{len(logprobs)} logprobs for {len(ids)} ids")
        self.response_ids.extend(int(i) for i in ids)
        self.response_mask.extend([mask] * len(ids))
        self.response_logprobs.extend(float(x) for x in logprobs)

    def to_record(self) -> dict[str, Any]:
        """A flat dict for Parquet/JSONL (turns and messages nested)."""
        d = dataclasses.asdict(self)
        d.pop("steps", None)
        d["num_turns"] = self.num_turns
        d["num_sampled_tokens"] = self.num_sampled_tokens
        return d


def save_trajectories(trajectories: Sequence[Trajectory], out_dir: str | Path, *, jsonl: bool = True) -> dict[str, Path]:
    """Write ``trajectories.parquet`` (and ``trajectories.jsonl``) into ``out_dir`` (created).

    Returns the written paths by format.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    records = [t.to_record() for t in trajectories]
    paths: dict[str, Path] = {}
    rows = []
    for r in records:
        row = dict(r)
        row["turns"] = json.dumps(r["turns"], ensure_ascii=False)
        row["messages"] = json.dumps(r["messages"], ensure_ascii=False)
        row["timings"] = json.dumps(r["timings"])
        rows.append(row)
    schema = pa.schema([
        ("trajectory_id", pa.string()), ("group_id", pa.string()), ("env_id", pa.string()), ("task_id", pa.string()),
        ("seed", pa.int64()), ("mode", pa.string()), ("prompt_ids", pa.list_(pa.int32())),
        ("response_ids", pa.list_(pa.int32())), ("response_mask", pa.list_(pa.int8())),
        ("response_logprobs", pa.list_(pa.float32())), ("reward", pa.float64()), ("success", pa.bool_()),
        ("terminated", pa.bool_()), ("truncated", pa.bool_()), ("error", pa.string()), ("turns", pa.string()),
        ("messages", pa.string()), ("timings", pa.string()), ("num_turns", pa.int32()), ("num_sampled_tokens", pa.int64()),
    ])
    table = pa.Table.from_pylist(rows, schema=schema)
    paths["parquet"] = out / "trajectories.parquet"
    pq.write_table(table, paths["parquet"])
    if jsonl:
        paths["jsonl"] = out / "trajectories.jsonl"
        with open(paths["jsonl"], "w", encoding="utf-8") as f:
            for r in records:
                f.write(json.dumps(r, ensure_ascii=False, default=_nan_safe) + "\n")
    return paths


def _nan_safe(o: Any) -> Any:
    return str(o)


def load_trajectories(path: str | Path) -> list[Trajectory]:
    """Read trajectories back from a ``.parquet`` or ``.jsonl`` file written by :func:`save_trajectories`."""
    path = Path(path)
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        records = pq.read_table(path).to_pylist()
        for r in records:
            for k in ("turns", "messages", "timings"):
                r[k] = json.loads(r[k])
    else:
        with open(path, encoding="utf-8") as f:
            records = [json.loads(line) for line in f if line.strip()]
    out = []
    fields = {f.name for f in dataclasses.fields(Trajectory)}
    for r in records:
        kw = {k: v for k, v in r.items() if k in fields and k != "steps"}
        kw["turns"] = [Turn(**t) for t in kw.get("turns", [])]
        out.append(Trajectory(**kw))
    return out
