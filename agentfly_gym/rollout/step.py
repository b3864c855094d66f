"""Step rollout: a fresh prompt at every environment step, one training row per step.

At step t the policy sees ``system`` + one user message holding the task (the reset
observation), the last ``history`` (action, observation) pairs as text, and the current
observation; it samples one reply.  Each step becomes a :class:`StepRow` with its own
prompt ids and sampled ids (verbatim), sharing ``trajectory_id`` and ``group_id`` with the
other rows of the episode, and carrying the raw current observation as the *anchor* for
step-level grouping (GiGPO: steps of a group with identical anchor observations form a
step group; Feng et al., 2025, "Group-in-Group Policy Optimization for LLM Agent Training").

Step mode costs a full prompt per step but bounds the context and allows step-level credit
assignment; chain mode (:mod:`.chain`) trains all turns in one sequence.  Both run the same
env, policy and resources; :class:`~agentfly_gym.rollout.runner.RolloutConfig.mode` switches.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..envs.base import AgentFlyEnv
from ..limits import DEFAULT_HISTORY  # re-exported: its old home
from ..utils.files import atomic_path
from .turns import act_and_record, fail_trajectory, finish_trajectory
from .policies.base import ActionPolicy, SamplingParams, TextPolicy, check_policy, take_turn
from .trajectory import Trajectory, episode_status, read_schema_version, schema_metadata

__all__ = ["StepRow", "run_step_episode", "render_step_prompt", "fit_step_prompt", "save_step_rows", "load_step_rows",
           "DEFAULT_HISTORY"]


@dataclasses.dataclass
class StepRow:
    """One training row of step mode.

    Attributes:
        trajectory_id, group_id: shared by all rows of an episode / of a GRPO group.
        step: 0-based index of the step within the episode.
        prompt_ids: the rendered fresh prompt, length P.
        response_ids: the ids sampled at this step, exactly as generated, plus (mask 0) the
            template's end-of-turn id when the policy did not sample it; length R.
        response_mask: 1 for sampled ids, 0 for the closing id; length R.
        response_logprobs: per response id; 0.0 at mask 0, NaN where the policy has none.
        reward: this step's env reward.
        episode_return: the sum of rewards over the whole episode (filled when it ends).
        anchor_obs: the raw observation the step acted on (GiGPO's anchor state).
        action: the parsed action; done: whether the episode ended at this step.
        history_shown: past (action, observation) pairs the prompt shows (fewer than asked when
            older ones were dropped to fit ``max_prompt_tokens``).
        prompt_cut: tokens cut out of the prompt after its system part to fit
            ``max_prompt_tokens`` when even no history did not fit (0: none).
        reply_truncated: the reply was cut at ``max_tokens`` (finish reason ``"length"``); its closing
            end-of-turn id (mask 0) is then not one the policy sampled (drop it with
            :func:`~agentfly_gym.rollout.trajectory.end_on_last_sampled` where a trainer tells a cut reply by
            its last token).
    """

    trajectory_id: str
    group_id: str
    step: int
    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    response_logprobs: list[float]
    reward: float
    episode_return: float
    anchor_obs: str
    action: str
    done: bool
    history_shown: int = 0
    prompt_cut: int = 0
    reply_truncated: bool = False

    @classmethod
    def from_reply(cls, chat: Any, *, trajectory_id: str, group_id: str, step: int, prompt_ids: list[int],
                   sampled: list[int], logprobs: list[float] | None, reward: float, anchor_obs: str, action: str,
                   done: bool, history_shown: int = 0, prompt_cut: int = 0, finish_reason: str = "") -> StepRow:
        """The row of one reply: ``response_ids`` = ``sampled`` verbatim (mask 1, ``logprobs`` or NaN)
        + the ids closing the assistant message that the policy did not sample
        (``chat.close_assistant_ids``; mask 0, logprob 0.0); ``episode_return`` 0.0 until the episode ends;
        ``reply_truncated`` when ``finish_reason`` is ``"length"``."""
        close = list(chat.close_assistant_ids(sampled))
        lps = list(logprobs) if logprobs is not None else [float("nan")] * len(sampled)
        return cls(trajectory_id=trajectory_id, group_id=group_id, step=step, prompt_ids=prompt_ids,
                   response_ids=sampled + close, response_mask=[1] * len(sampled) + [0] * len(close),
                   response_logprobs=lps + [0.0] * len(close), reward=reward, episode_return=0.0,
                   anchor_obs=anchor_obs, action=action, done=done, history_shown=history_shown,
                   prompt_cut=prompt_cut, reply_truncated=finish_reason == "length")


def render_step_prompt(env: AgentFlyEnv, task_obs: str, history: Sequence[tuple[str, str]], current_obs: str,
                       step: int, history_len: int) -> list[dict[str, str]]:
    """The messages of step ``step``: system + one user message (task, recent history, current observation).

    ``history`` holds (action, observation) pairs of earlier steps; the last ``history_len`` are shown.
    At step 0 the user message is the env's first message (as in chain mode).
    """
    prompt = env.agent_prompt
    if step == 0:
        return [{"role": "system", "content": prompt.system},
                {"role": "user", "content": prompt.first_message(task_obs)}]
    recent = list(history)[-history_len:] if history_len > 0 else []
    parts = [prompt.first_message(task_obs)]
    if recent:
        first = step - len(recent)
        lines = [f"Your last {len(recent)} actions and what followed:"]
        for i, (act, obs) in enumerate(recent):
            lines.append(f"[Step {first + i + 1}] Action: {act}\nObservation: {obs}")
        parts.append("\n".join(lines))
    parts.append(f"Current observation (step {step + 1}):\n{current_obs}")
    return [{"role": "system", "content": prompt.system}, {"role": "user", "content": "\n\n".join(parts)}]


def fit_step_prompt(chat, env: AgentFlyEnv, task_obs: str, history: Sequence[tuple[str, str]], current_obs: str,
                    step: int, history_len: int, max_prompt_tokens: int | None
                    ) -> tuple[list[dict[str, str]], list[int], int, int]:
    """The messages and prompt ids of step ``step`` within ``max_prompt_tokens`` tokens.

    The system prompt and the newest content are kept: first the OLDEST history pairs are
    dropped, one at a time, until the prompt fits; if it still does not fit with no history, the
    tokens right after the system part (the start of the user message: the task text) are cut
    out, so the prompt keeps its system part (whole, unless it leaves fewer than
    ``min(64, max_prompt_tokens // 2)`` tokens for the rest) and its newest tokens
    (the current observation and the generation prompt).  Never cut from the left: that would
    drop the system prompt.

    Returns:
        ``(messages, prompt_ids, history_shown, prompt_cut)``: the messages as rendered (before
        any token cut), the ids (length <= ``max_prompt_tokens`` when it is given), the history
        pairs shown, and the number of tokens cut out (0 when it fits).

    Raises:
        ValueError: ``max_prompt_tokens`` < 2.
    """
    if max_prompt_tokens is not None and max_prompt_tokens < 2:
        raise ValueError(f"max_prompt_tokens={max_prompt_tokens!r} must be None or >= 2 (tokens)")
    shown = min(history_len, len(history))
    while True:
        messages = render_step_prompt(env, task_obs, history, current_obs, step, shown)
        tools = env.agent_prompt.tools
        ids = list(chat.prompt_ids(messages, tools=tools) if tools else chat.prompt_ids(messages))
        if max_prompt_tokens is None or len(ids) <= max_prompt_tokens or shown == 0:
            break
        shown -= 1
    if max_prompt_tokens is None or len(ids) <= max_prompt_tokens:
        return messages, ids, shown, 0
    head = _system_head_len(chat, messages[0], ids)
    head = min(head, max_prompt_tokens - min(64, max_prompt_tokens // 2))  # leave room for the newest tokens
    cut = len(ids) - max_prompt_tokens
    return messages, ids[:head] + ids[head + cut:], shown, cut


def _system_head_len(chat, system: dict[str, str], ids: list[int]) -> int:
    """Tokens at the start of ``ids`` that a render of the system message alone also has."""
    try:
        sys_ids = chat.tokenizer.apply_chat_template([system], tokenize=True, add_generation_prompt=False,
                                                     return_dict=False, **getattr(chat, "chat_template_kwargs", {}))
        if isinstance(sys_ids, dict) or hasattr(sys_ids, "input_ids"):
            sys_ids = sys_ids["input_ids"]
    except Exception:  # noqa: BLE001  (a template that rejects a lone system message: nothing to keep)
        return 0
    n = 0
    for a, b in zip(sys_ids, ids):
        if int(a) != int(b):
            break
        n += 1
    return n


async def run_step_episode(env: AgentFlyEnv, policy: TextPolicy | ActionPolicy, chat, *, env_id: str = "",
                           sampling: SamplingParams | None = None, max_turns: int = 10, history: int = DEFAULT_HISTORY,
                           seed: int | None = None, options: dict[str, Any] | None = None,
                           trajectory_id: str | None = None, group_id: str | None = None,
                           max_prompt_tokens: int | None = None, keep_on_error: bool = False) -> Trajectory:
    """Play one episode in step mode.  Returns a :class:`Trajectory` with ``mode="step"`` whose
    ``steps`` list holds one :class:`StepRow` per env step (its token fields are empty:
    the rows carry the tokens).  Arguments as :func:`~agentfly_gym.rollout.chain.run_chain_episode`,
    plus ``history``: how many past (action, observation) pairs each prompt shows, and
    ``max_prompt_tokens``: the most tokens of a prompt (None: no limit); a longer prompt drops its
    oldest history first (:func:`fit_step_prompt`), and the row records what was dropped.
    ``keep_on_error`` as in :func:`~agentfly_gym.rollout.chain.run_chain_episode` (the rows played so
    far are kept).
    """
    sampling = sampling or SamplingParams()
    check_policy(policy)
    t_start = time.monotonic()
    try:
        t0 = time.monotonic()
        obs, info = await env.areset(seed=seed, options=options)
        reset_s = time.monotonic() - t0
        traj_id = trajectory_id or uuid.uuid4().hex[:12]
        traj = Trajectory(trajectory_id=traj_id, group_id=group_id or "", env_id=env_id or env.env_name,
                          task_id=str(info.get("task_id", "")), seed=seed, mode="step", prompt_ids=[],
                          scope_id=getattr(env, "scope_id", ""))
        task_obs, past = obs, []
        terminated = truncated = False
        try:
            for step in range(max_turns):
                messages, prompt_ids, shown, cut = fit_step_prompt(chat, env, task_obs, past, obs, step, history,
                                                                   max_prompt_tokens)
                if step == 0:
                    traj.prompt_ids = prompt_ids
                    traj.messages = list(messages)
                t0 = time.monotonic()
                sampled, logprobs, finish, reply = await take_turn(policy, chat, prompt_ids, sampling, obs, info,
                                                                   env)
                gen_s = time.monotonic() - t0
                anchor = obs
                action, obs, reward, terminated, truncated, info = await act_and_record(env, traj, reply, sampled,
                                                                                       finish, gen_s)
                done = terminated or truncated or step == max_turns - 1
                traj.steps.append(StepRow.from_reply(chat, trajectory_id=traj_id, group_id=traj.group_id, step=step,
                                                     prompt_ids=prompt_ids, sampled=sampled, logprobs=logprobs,
                                                     reward=float(reward), anchor_obs=anchor, action=action, done=done,
                                                     history_shown=shown, prompt_cut=cut, finish_reason=finish))
                past.append((action, obs))
                if terminated or truncated:
                    break
            else:
                truncated = True
        except Exception as e:
            if not keep_on_error:
                raise
            for row in traj.steps:
                row.episode_return = traj.reward
            if traj.steps:
                traj.steps[-1].done = True  # the episode ended there
            return fail_trajectory(traj, e, info=info, t_start=t_start, reset_s=reset_s)
        for row in traj.steps:
            row.episode_return = traj.reward
        return finish_trajectory(traj, terminated=terminated, truncated=truncated, info=info, t_start=t_start,
                                 reset_s=reset_s)
    finally:
        await env.aend_episode()


def save_step_rows(trajectories: Sequence[Trajectory], out_dir: str | Path) -> dict[str, Path]:
    """Write every step row of step-mode ``trajectories`` to ``steps.parquet`` in ``out_dir``.

    The file carries the schema version in its metadata
    (:data:`~agentfly_gym.rollout.trajectory.SCHEMA_VERSION`) and each row its episode's
    ``status`` (:func:`~agentfly_gym.rollout.trajectory.episode_status`); read it back with
    :func:`load_step_rows`.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for t in trajectories:
        for r in t.steps:
            d = dataclasses.asdict(r) if isinstance(r, StepRow) else dict(r)
            d["env_id"] = t.env_id
            d["task_id"] = t.task_id
            d["status"] = episode_status(t)
            rows.append(d)
    schema = pa.schema([
        ("trajectory_id", pa.string()), ("group_id", pa.string()), ("step", pa.int32()),
        ("prompt_ids", pa.list_(pa.int32())), ("response_ids", pa.list_(pa.int32())),
        ("response_mask", pa.list_(pa.int8())), ("response_logprobs", pa.list_(pa.float32())),
        ("reward", pa.float64()), ("episode_return", pa.float64()), ("anchor_obs", pa.string()),
        ("action", pa.string()), ("done", pa.bool_()), ("env_id", pa.string()), ("task_id", pa.string()),
        ("history_shown", pa.int32()), ("prompt_cut", pa.int32()), ("status", pa.string()),
        ("reply_truncated", pa.bool_()),
    ], metadata=schema_metadata("steps"))
    path = out / "steps.parquet"
    with atomic_path(path) as tmp:  # a reader sees the old file or the whole new one
        pq.write_table(pa.Table.from_pylist(rows, schema=schema), tmp)
    return {"steps": path}


def load_step_rows(path: str | Path) -> list[dict[str, Any]]:
    """The rows of a ``steps.parquet`` written by :func:`save_step_rows`, as dicts (one per step;
    the :class:`StepRow` fields plus ``env_id``, ``task_id`` and ``status``).  Version-1 files
    (no version recorded) get ``history_shown``/``prompt_cut`` None and ``status`` "".

    Raises:
        SchemaVersionError: the file records a version this code does not read.
    """
    import pyarrow.parquet as pq

    read_schema_version(path)
    rows = pq.read_table(path).to_pylist()
    for r in rows:
        r.setdefault("history_shown", None)
        r.setdefault("prompt_cut", None)
        r.setdefault("status", "")
        r.setdefault("reply_truncated", False)
    return rows
