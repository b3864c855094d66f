"""Trajectory records: token ids, masks and logprobs as sampled, plus what happened each turn.

Saved as Parquet (one row per trajectory, list columns for ids/mask/logprobs) and as
JSONL, with a summary JSON beside them.

Every saved file says which version of this format it holds (:data:`SCHEMA_VERSION`): Parquet
files in their schema metadata (key ``agentfly_gym.schema_version``), JSONL files in a first
header line ``{"agentfly_gym_schema": "<kind>", "schema_version": N}``.  Files without a
version are version 1 (written before versions were recorded; their ``status`` is derived
from ``error``, ``terminated`` and ``truncated``).  Loaders read the versions in
:data:`KNOWN_SCHEMA_VERSIONS` and refuse any other by name (:class:`SchemaVersionError`).

Version 2 added, per row, ``status``: whether the episode is complete or why not (one of
:data:`STATUSES`).

Version 3 added, per trajectory, ``reply_truncated`` (the last reply was cut at ``max_tokens``),
``context_cut`` (tokens left out to keep a chain within ``max_context_tokens``) and ``reward_error``
(why a configured reward, e.g. a judge, gave no score); per step row, ``reply_truncated``.  Older
files read with ``reply_truncated`` False, ``context_cut`` 0 and ``reward_error`` None.

Version 4 added, per trajectory, ``scope_id``: the id of the rollout scope its resources were held in
(the env's episode id, a multi-agent game's id; see docs/glossary.md), so a trajectory can be matched
with the resource manager's logs and metrics.  Older files read with ``scope_id`` ``""``.

Version 5 added, per trajectory, ``text_only``: the policy (a chat endpoint that returns no token ids) gave text
only, so the token fields are empty and the training paths refuse the trajectory (:func:`require_token_ids`).
Older files read with ``text_only`` False.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..errors import ConfigError, PolicyError
from ..utils.files import atomic_path

__all__ = ["Turn", "Trajectory", "save_trajectories", "load_trajectories", "SCHEMA_VERSION", "KNOWN_SCHEMA_VERSIONS",
           "STATUSES", "SchemaVersionError", "episode_status", "schema_metadata", "read_schema_version",
           "read_jsonl_records", "jsonl_header", "end_on_last_sampled", "require_token_ids", "TextOnlyTrajectory"]

#: The version of the saved trajectory / step-row format written by this code.
SCHEMA_VERSION = 5
#: Versions the loaders read (1: files without a version, written before versions were recorded).
KNOWN_SCHEMA_VERSIONS = (1, 2, 3, 4, 5)
#: Metadata key of the version in Parquet files.
SCHEMA_METADATA_KEY = b"agentfly_gym.schema_version"

#: Per-row ``status``: ``complete`` (the env ended the episode: terminated), ``truncated`` (the env
#: truncated it, or ``max_turns`` was reached), ``token_budget`` (stopped by a token budget: the
#: context/response limit of a chain, or a trainer's ``response_length`` cut), ``error`` (a fault:
#: the env, a resource or the policy failed; ``error`` holds the message), ``interrupted`` (the
#: generation was aborted by the inference server, or the run was interrupted).
STATUSES = ("complete", "truncated", "token_budget", "error", "interrupted")


class SchemaVersionError(ConfigError):
    """A saved file's schema version is not one this code reads."""


class TextOnlyTrajectory(PolicyError):
    """A trajectory from a text-only policy (``text_only``) was given to a path that trains on token ids."""


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
        status: one of :data:`STATUSES` (set when the episode ends; "" before, and then
            :func:`episode_status` derives it when the trajectory is saved).
        reply_truncated: the last reply was cut at ``max_tokens`` (its turn's ``finish_reason`` is
            ``"length"``); the chain still closes it with a mask-0 end-of-turn id, so a trainer that tells a
            cut completion by its last token needs :meth:`trainer_response` (``end_on_sampled``).
        context_cut: tokens (mask 0: an observation message's tail, a closing end-of-turn id) left out so that
            the chain stays within ``max_context_tokens``; 0 when nothing was cut.
        scope_id: the id of the rollout scope that held the episode's resources (the env's episode id, a
            game's id); ``""`` when no episode started or in files older than schema version 4.
        text_only: the policy returned text only (a chat endpoint without token ids): the token fields are empty
            (``prompt_ids`` too), ``messages`` and ``turns`` hold the episode, and :meth:`trainer_response` (every
            path that builds training rows) raises :class:`TextOnlyTrajectory` rather than re-tokenize.
        reward_error: why a configured episode reward (:mod:`agentfly_gym.rewards.configured`, e.g. a judge
            whose reply held no rating) gave no score and ``reward`` kept its default; None otherwise.
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
    status: str = ""
    reply_truncated: bool = False
    context_cut: int = 0
    reward_error: str | None = None
    scope_id: str = ""
    text_only: bool = False
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

    def trainer_response(self, *, end_on_sampled: bool | None = None) -> tuple[list[int], list[int], list[float]]:
        """``(response_ids, response_mask, response_logprobs)`` as a trainer reads them (equal lengths).

        Args:
            end_on_sampled: drop the mask-0 tokens after the last sampled token (the end-of-turn id closing
                a cut reply, an observation at the token budget), so that a trainer that tells a cut
                completion by its last token not being an end-of-sequence id (TRL's ``clipped_ratio`` and
                ``mask_truncated_completions``) sees it.  None (default): only when :attr:`reply_truncated`.

        Raises:
            TextOnlyTrajectory: the trajectory is :attr:`text_only` (no token ids to train on).
        """
        require_token_ids(self)
        if end_on_sampled is None:
            end_on_sampled = self.reply_truncated
        if not end_on_sampled:
            return list(self.response_ids), list(self.response_mask), list(self.response_logprobs)
        return end_on_last_sampled(self.response_ids, self.response_mask, self.response_logprobs)

    def to_record(self) -> dict[str, Any]:
        """A flat dict for Parquet/JSONL (turns and messages nested)."""
        d = dataclasses.asdict(self)
        d.pop("steps", None)
        d["status"] = episode_status(self)
        d["num_turns"] = self.num_turns
        d["num_sampled_tokens"] = self.num_sampled_tokens
        return d

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> Trajectory:
        """The trajectory of a :meth:`to_record` dict (turns as dicts; keys that are not fields, such as
        ``num_turns`` or a step-mode ``steps``, are ignored).

        Raises:
            TypeError: a turn or the record lacks a required field, or holds an unknown one in a turn.
        """
        fields = {f.name for f in dataclasses.fields(cls)}
        kw = {k: v for k, v in record.items() if k in fields and k != "steps"}
        kw["turns"] = [Turn(**t) for t in kw.get("turns", [])]
        return cls(**kw)


def require_token_ids(traj: Trajectory, what: str = "training") -> None:
    """Refuse a text-only trajectory where token ids are needed (training rows).

    Raises:
        TextOnlyTrajectory: ``traj.text_only`` is set (the message says why re-tokenizing is not done).
    """
    if getattr(traj, "text_only", False):
        raise TextOnlyTrajectory(
            f"trajectory {traj.trajectory_id} ({traj.env_id}) is text-only: its policy (a chat endpoint) returned no "
            f"token ids, so it cannot be used for {what}; re-tokenizing its text would train on ids the model did "
            "not sample (drift). Serve the model with vLLM and token ids (EndpointPolicy(token_ids=True), "
            "--token-ids) or use a token-id policy")


def end_on_last_sampled(ids: Sequence[int], mask: Sequence[int], logprobs: Sequence[float]
                        ) -> tuple[list[int], list[int], list[float]]:
    """The three lists up to and including the last mask-1 (sampled) position (all of them empty when
    nothing was sampled)."""
    n = len(mask)
    while n and not mask[n - 1]:
        n -= 1
    return list(ids[:n]), list(mask[:n]), list(logprobs[:n])


def episode_status(traj: Trajectory) -> str:
    """``traj.status`` if set, else derived from its flags: ``error`` if ``traj.error``, else
    ``complete`` if terminated, else ``truncated``.

    Raises:
        ValueError: ``traj.status`` is set to something not in :data:`STATUSES`.
    """
    if traj.status:
        if traj.status not in STATUSES:
            raise ValueError(f"trajectory {traj.trajectory_id}: status={traj.status!r} is not one of {STATUSES}")
        return traj.status
    if traj.error:
        return "error"
    return "complete" if traj.terminated else "truncated"


def schema_metadata(kind: str) -> dict[bytes, bytes]:
    """Parquet schema metadata of a file of ``kind`` (``"trajectories"`` or ``"steps"``)."""
    return {SCHEMA_METADATA_KEY: str(SCHEMA_VERSION).encode(), b"agentfly_gym.kind": kind.encode()}


def _check_version(version: Any, path: Path) -> int:
    try:
        v = int(version)
    except (TypeError, ValueError):
        raise SchemaVersionError(f"{str(path)!r}: schema version {version!r} is not a number; this agentfly-gym reads "
                                 f"versions {list(KNOWN_SCHEMA_VERSIONS)}") from None
    if v not in KNOWN_SCHEMA_VERSIONS:
        raise SchemaVersionError(f"{str(path)!r}: schema version {v} is not one this agentfly-gym reads "
                                 f"(versions {list(KNOWN_SCHEMA_VERSIONS)}); a newer agentfly-gym wrote it?")
    return v


def read_schema_version(path: str | Path) -> int:
    """The schema version of a saved ``.parquet`` or ``.jsonl`` file (1 when it records none).

    Raises:
        SchemaVersionError: the file records a version not in :data:`KNOWN_SCHEMA_VERSIONS`.
    """
    path = Path(path)
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        meta = pq.read_schema(path).metadata or {}
        return _check_version(meta.get(SCHEMA_METADATA_KEY, b"1").decode(), path)
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                head = json.loads(line)
                return _check_version(head["schema_version"], path) if _is_header(head) else 1
    return 1


def _is_header(record: Any) -> bool:
    return isinstance(record, dict) and "agentfly_gym_schema" in record


def read_jsonl_records(path: str | Path) -> tuple[int, list[dict[str, Any]]]:
    """``(schema version, records)`` of a JSONL file written by this module (header line removed).

    Raises:
        SchemaVersionError: the header names a version not in :data:`KNOWN_SCHEMA_VERSIONS`.
    """
    path = Path(path)
    with open(path, encoding="utf-8") as f:
        records = [json.loads(line) for line in f if line.strip()]
    version = 1
    if records and _is_header(records[0]):
        version = _check_version(records.pop(0).get("schema_version"), path)
    return version, records


def jsonl_header(kind: str) -> str:
    """The first line of a JSONL file of ``kind`` (with its newline)."""
    return json.dumps({"agentfly_gym_schema": kind, "schema_version": SCHEMA_VERSION}) + "\n"


def save_trajectories(trajectories: Sequence[Trajectory], out_dir: str | Path, *, jsonl: bool = True) -> dict[str, Path]:
    """Write ``trajectories.parquet`` (and ``trajectories.jsonl``) into ``out_dir`` (created).

    Both carry the schema version (:data:`SCHEMA_VERSION`; see the module docstring) and a
    ``status`` per trajectory (:func:`episode_status`).

    Each file is written under a temporary name in ``out_dir`` and renamed when complete
    (:func:`~agentfly_gym.utils.files.atomic_path`): a reader sees the old file or the whole new one.
    For a run's whole output folder (a lock, no silent overwrite) see :mod:`agentfly_gym.rollout.outputs`.

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
        ("terminated", pa.bool_()), ("truncated", pa.bool_()), ("error", pa.string()), ("status", pa.string()),
        ("reply_truncated", pa.bool_()), ("context_cut", pa.int32()), ("reward_error", pa.string()),
        ("scope_id", pa.string()), ("text_only", pa.bool_()), ("turns", pa.string()),
        ("messages", pa.string()), ("timings", pa.string()), ("num_turns", pa.int32()), ("num_sampled_tokens", pa.int64()),
    ], metadata=schema_metadata("trajectories"))
    table = pa.Table.from_pylist(rows, schema=schema)
    paths["parquet"] = out / "trajectories.parquet"
    with atomic_path(paths["parquet"]) as tmp:
        pq.write_table(table, tmp)
    if jsonl:
        paths["jsonl"] = out / "trajectories.jsonl"
        with atomic_path(paths["jsonl"]) as tmp, open(tmp, "w", encoding="utf-8") as f:
            f.write(jsonl_header("trajectories"))
            for r in records:
                f.write(json.dumps(r, ensure_ascii=False, default=_nan_safe) + "\n")
    return paths


def _nan_safe(o: Any) -> Any:
    return str(o)


def load_trajectories(path: str | Path) -> list[Trajectory]:
    """Read trajectories back from a ``.parquet`` or ``.jsonl`` file written by :func:`save_trajectories`
    (any version in :data:`KNOWN_SCHEMA_VERSIONS`; version-1 rows get a derived ``status``).

    Raises:
        SchemaVersionError: the file records a version this code does not read.
    """
    path = Path(path)
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        read_schema_version(path)
        records = pq.read_table(path).to_pylist()
        for r in records:
            for k in ("turns", "messages", "timings"):
                r[k] = json.loads(r[k])
    else:
        _, records = read_jsonl_records(path)
    return [Trajectory.from_record(r) for r in records]
