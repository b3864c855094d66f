"""agentfly-gym environments as a verl 0.9.1 agent loop (the official extension point, no fork).

verl instantiates :class:`AgentFlyAgentLoop` once per trajectory (``hydra.utils.instantiate`` of
an entry of ``actor_rollout_ref.rollout.agent.agent_loop_config_path``, see ``agent_loops.yaml``)
and awaits ``run(sampling_params, **row)`` where ``row`` holds the dataset columns
(``raw_prompt``, ``extra_info``, ``index``, ``data_source``, ``uid``, ...).  ``run`` makes the
environment named by ``extra_info`` with the worker's shared resource manager
(:func:`agentfly_gym_verl.runtime.get_manager`), plays it with the project's own
:func:`~agentfly_gym.rollout.episode.play_episode` (chain or step mode, as ``agentfly-gym rollout`` does)
over verl's server manager
(:class:`~agentfly_gym_verl.policy.VerlServerPolicy`, one ``request_id`` per trajectory), and
returns verl's ``AgentLoopOutput``:

* chain mode: ONE output: ``prompt_ids`` (the rendered initial prompt), ``response_ids`` (every
  sampled id verbatim with mask 1 and logprob, the template/observation ids between turns with
  mask 0 and logprob 0.0), ``reward_score`` = the episode return.
* step mode: a LIST of outputs, one per env step (verl's V1 trainer, ``trainer.use_v1=true``,
  stores each as a row and copies the final row's reward to the others), each with the step's
  fresh prompt and sampled ids; ``reward_score`` = the episode return on every row.

Every response ENDS ON A SAMPLED TOKEN (mask 1): verl puts ``reward_score`` on the last response
token (``AgentLoopOutput.as_dict``: ``rm_scores[-1]``; the legacy ``_postprocess``: the last
attended token), and GAE / REINFORCE++ discount over mask-1 positions only, so a reward on a
mask-0 token (the end-of-turn id closing a reply that stopped on another eos or at its token
cap, or observation ids after the last action) would be lost (a return of 0 instead of 1).
Trailing mask-0 ids are therefore not part of the output; they carry no training signal.  Only
a response without any sampled id (the server returned none) is the single mask-0 end-of-turn
id verl needs to have at least one response token.

Lengths: ``len(response_ids) == len(response_mask) == len(response_logprobs) <=
rollout.response_length`` and ``len(prompt_ids) <= rollout.prompt_length`` always.  In chain
mode a longer initial prompt is cut from the left before generation (what the server sees is
what is trained); each reply is capped to what is left of the response budget and no turn
starts once it is used up, so the final cut to ``response_length`` only drops the ids closing
the last turn and the observation after the last action, never an action that earned reward.
In step mode a prompt over ``prompt_length`` keeps its system prompt and newest content: the
oldest history pairs are dropped first, then (if needed) the tokens right after the system part
(:func:`agentfly_gym.rollout.step.fit_step_prompt`); the row records it (``history_shown``,
``prompt_cut``, ``prompt_truncated``).

``min_global_steps`` / ``max_global_steps`` (the model-weights versions V1 checks for
staleness, as ints) are the versions the server reported, else the ``global_steps`` verl passes
to ``run`` with the row: V1 builds an int array from them.

Start order: the rollouts a worker plays at once start longest-predicted first.  The worker keeps (across
training steps, :meth:`agentfly_gym_verl.runtime.WorkerRuntime.ordering`) a
:class:`~agentfly_gym.rollout.ordering.RolloutLengths` per task (``"ENV_ID/TASK_ID"``, or ``"ENV_ID/seed=SEED"``),
updated from every trajectory it finishes; the rollouts of a batch (verl starts them all at once) pass a
:class:`~agentfly_gym.rollout.ordering.StartGate` that lets them in by that prediction (at most
``max_concurrent`` at a time, when set), and every acquisition of a rollout carries its prediction as a
priority, so a saturated pool (local or a Ray cluster pool) serves the longest first.  ``lengths_path`` keeps
the estimate in a file (shared by the workers, written at the end of each batch), so a resumed training keeps
it.  ``order: arrival`` turns the ordering off (FIFO).

``extra_fields`` has the SAME keys and value types in every row of both modes and every env
(:data:`EXTRA_FIELD_DEFAULTS`), so verl can stack rows of mixed loops (verl issues #5301, #7491).

A trajectory whose env fails (bad task option, unknown env, a resource that cannot start, a
generation error) never fails the batch.  Under verl's V1 trainer it leaves NO row (``run``
returns ``[]``, which V1's ``_agent_loop_postprocess`` accepts: verl's own convention for a
session without output), so it cannot shift the GRPO statistics of its group the way a row with
reward 0 under the group's ``uid`` would (the same for an episode the env or its resource ended
with a fault, ``info["error"]``); it is logged (WARNING) and counted per worker in
:func:`agentfly_gym_verl.runtime.failure_metrics`.  The legacy trainer (``trainer.use_v1=false``,
chain mode only) needs exactly one output per trajectory: there it is one row with
``reward_score`` 0.0, an all-zero response mask and the error text in
``extra_fields["error"]`` (it trains nothing, but it does enter its GRPO group's mean).  The env
is closed (its rollout scope released) when ``run`` ends, also on error and cancellation.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from agentfly_gym.errors import ConfigError, EnvError, ResourceError
from agentfly_gym.limits import check_int
from agentfly_gym.registration import normalize_env_id
from agentfly_gym.resources.priority import acquire_priority
from agentfly_gym.rewards.configured import parse_reward
from agentfly_gym.rollout.episode import MODES, play_episode
from agentfly_gym.rollout.ordering import length_key
from agentfly_gym.rollout.policies.base import SamplingParams
from agentfly_gym.rollout.step import DEFAULT_HISTORY
from agentfly_gym.rollout.trajectory import Trajectory, episode_status, require_token_ids
from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopMetrics, AgentLoopOutput

from .policy import VerlServerPolicy
from .runtime import chat_tokenizer, get_manager, get_runtime, record_failure

__all__ = ["AgentFlyAgentLoop", "EXTRA_FIELD_DEFAULTS", "MODES", "parse_row"]

log = logging.getLogger(__name__)

#: The keys (and value types) of ``extra_fields`` in every output row.
#: ``step`` is -1 and ``anchor_obs`` "" in chain mode; ``error`` is "" when nothing failed;
#: ``status`` is the episode's status (:data:`agentfly_gym.rollout.trajectory.STATUSES`; ``token_budget``
#: also when the response was cut to ``response_length``); ``prompt_cut`` the tokens cut out of the
#: prompt; ``history_shown`` (step mode) the past steps the prompt shows (-1 in chain mode);
#: ``min_global_steps`` / ``max_global_steps`` ints (None only when neither the server nor verl gave one);
#: ``step_reward`` is the row's env reward (chain: the episode return); ``turn_scores`` the
#: per-step env rewards of the trajectory; ``reward_extra_info`` goes to verl's reward metrics
#: (``acc`` = success as 0.0/1.0).
EXTRA_FIELD_DEFAULTS: dict[str, Any] = {
    "trajectory_id": "", "group_id": "", "env_id": "", "task_id": "", "seed": -1, "mode": "",
    "step": -1, "num_steps": 0, "anchor_obs": "", "action": "", "step_reward": 0.0, "env_return": 0.0,
    "success": False, "terminated": False, "truncated": False, "error": "",
    "prompt_truncated": False, "response_truncated": False, "history_shown": -1, "prompt_cut": 0, "status": "",
    "turn_scores": [], "tool_rewards": [], "min_global_steps": None, "max_global_steps": None,
    "reward_extra_info": {"acc": 0.0},
}


def _extra_fields(**values: Any) -> dict[str, Any]:
    unknown = set(values) - set(EXTRA_FIELD_DEFAULTS)
    if unknown:  # a programming error: keep the schema closed
        raise KeyError(f"unknown extra_fields keys {sorted(unknown)}")
    out = {k: (list(v) if isinstance(v, list) else dict(v) if isinstance(v, dict) else v)
           for k, v in EXTRA_FIELD_DEFAULTS.items()}
    out.update(values)
    return out


def response_logprobs(lps: list[float], mask: list[int], want: bool) -> list[float] | None:
    """A row's ``response_logprobs`` (None unless ``want``): 0.0 at mask-0 ids, and at sampled ids whose logprob
    the server did not report (None or NaN; counted in a warning)."""
    if not want:
        return None
    out, missing = [], 0
    for x, m in zip(lps, mask):
        if m == 0:
            out.append(0.0)
        elif x is None or math.isnan(x):
            out.append(0.0)
            missing += 1
        else:
            out.append(float(x))
    if missing:
        log.warning("server returned no logprobs for %d sampled tokens although logprobs were requested; "
                    "0.0 stored", missing)
    return out


def end_on_sampled(ids: list[int], mask: list[int], lps: list[float], eot_token_id: int) -> None:
    """Drop the trailing mask-0 ids in place, so that the reward verl puts on the last token sits on a sampled one
    (see the module docstring); a response with no sampled id becomes the one mask-0 ``eot_token_id`` verl needs
    (>= 1 response token; it trains nothing either way)."""
    while mask and mask[-1] == 0:
        ids.pop()
        mask.pop()
        lps.pop()
    if not ids:
        ids.append(int(eot_token_id))
        mask.append(0)
        lps.append(0.0)


def _as_dict(value: Any, what: str) -> dict[str, Any]:
    """A mapping, a JSON object string, None or a 0-d numpy object array -> dict."""
    if hasattr(value, "item") and getattr(value, "shape", None) == ():
        value = value.item()
    if value is None or (isinstance(value, str) and not value.strip()):
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise ConfigError(f"{what} is not a JSON object: {value[:200]!r} ({e})") from e
    if hasattr(value, "items") and not isinstance(value, Mapping):  # an OmegaConf DictConfig
        from omegaconf import OmegaConf

        value = OmegaConf.to_container(value, resolve=True)
    if not isinstance(value, Mapping):
        raise ConfigError(f"{what} must be a dict (or a JSON object string), got {type(value).__name__}: {value!r}")
    return dict(value)


def parse_row(extra_info: Any, *, default_mode: str | None = None, default_max_turns: int = 10,
              default_history: int = DEFAULT_HISTORY, default_env_kwargs: dict[str, Any] | None = None
              ) -> dict[str, Any]:
    """What to play, from a dataset row's ``extra_info`` (the format of
    :func:`agentfly_gym_verl.dataset.build_dataset`).

    Keys read: ``env_id`` (required; short names like ``"Chess"`` accepted), ``seed`` (int or
    None), ``task_id`` (str/int or None: becomes the reset option ``task_id``),
    ``reset_options`` (dict or JSON string), ``env_kwargs`` (dict or JSON string; merged over
    ``default_env_kwargs``), ``mode`` (``"chain"``/``"step"``), ``max_turns`` (int >= 1),
    ``history`` (int >= 0, step mode).

    Returns:
        dict with keys env_id, seed, options, env_kwargs, mode, max_turns, history, task_id.

    Raises:
        ConfigError: a missing env id, an unknown env, a bad mode or number.
    """
    info = _as_dict(extra_info, "extra_info")
    env_id = info.get("env_id")
    if not env_id:
        raise ConfigError(f"extra_info has no 'env_id' (keys: {sorted(info)}); build the data set with "
                          "agentfly_gym_verl.dataset.build_dataset")
    env_id = normalize_env_id(str(env_id))
    mode = info.get("mode") or default_mode or "chain"
    if mode not in MODES:
        raise ConfigError(f"mode={mode!r} is not one of {MODES}")
    max_turns = info.get("max_turns")
    max_turns = default_max_turns if max_turns is None else max_turns
    history = info.get("history")
    history = default_history if history is None else history
    for name, v, lo in (("max_turns", max_turns, 1), ("history", history, 0)):
        check_int(f"extra_info[{name!r}]", v, minimum=lo)
    seed = info.get("seed")
    if seed is not None:
        if hasattr(seed, "__index__") and not isinstance(seed, bool):
            seed = int(seed)
        else:
            raise ConfigError(f"extra_info['seed']={seed!r} must be an integer or None")
        if seed < 0:
            seed = None  # the data set's "no seed" marker
    options = _as_dict(info.get("reset_options"), "extra_info['reset_options']")
    task_id = info.get("task_id")
    if task_id is not None and str(task_id) != "" and "task_id" not in options:
        options["task_id"] = task_id
    env_kwargs = dict(default_env_kwargs or {})
    env_kwargs.update(_as_dict(info.get("env_kwargs"), "extra_info['env_kwargs']"))
    return {"env_id": env_id, "seed": seed, "options": options or None, "env_kwargs": env_kwargs, "mode": mode,
            "max_turns": int(max_turns), "history": int(history),
            "task_id": "" if options.get("task_id") is None else str(options["task_id"])}


@dataclass(frozen=True)
class _RunStart:
    """What the shared prologue of ``run()`` settled (see :meth:`AgentFlyAgentLoop._start`)."""

    want_logprobs: bool
    traj_id: str
    group_id: str  # verl's uid (the GRPO group), else "index-<index>"
    use_v1: bool
    row: dict[str, Any]
    mode: str


class AgentFlyAgentLoop(AgentLoopBase):
    """verl agent loop that plays one agentfly-gym episode per trajectory.

    Construction is cheap (verl builds one per trajectory); pools live in
    :mod:`agentfly_gym_verl.runtime`.  Extra constructor arguments come from the YAML entry:

    Args:
        mode: ``"chain"`` or ``"step"``; None takes ``extra_info["mode"]`` of each row (default chain).
            An explicit mode here wins over the row's.
        max_turns: default most policy turns when a row gives none.
        history: step mode: past (action, observation) pairs shown in each prompt, when a row gives none.
        max_tokens_per_turn: most tokens sampled per turn (None: ``rollout.response_length``).
        env_kwargs: constructor kwargs for every env, under the row's own ``env_kwargs``.
        reward: an episode reward from configuration (``"judge:..."`` or ``"MODULE:FUNCTION"``, see
            :mod:`agentfly_gym.rewards.configured`) that replaces or adds to the env return; a judge that
            fails after its retries makes the trajectory an error row.
        order: ``"longest"`` (default): the worker's rollouts start longest-predicted first and their
            acquisitions carry that priority (nothing known yet: arrival order); ``"arrival"``: FIFO.
        lengths_path: a JSON file that keeps the predicted lengths across runs (read when the worker starts,
            written at the end of each batch, merged with the other workers'); None: kept in memory, for the
            life of the worker.
        max_concurrent: most rollouts a worker plays at once, let in longest-predicted first (None: no limit;
            the pools' capacities are the limit then).
        (all other arguments: see verl's ``AgentLoopBase``.)

    Raises:
        ConfigError: (from :meth:`run`) step mode with the legacy trainer (``trainer.use_v1=false``),
            which accepts one output per trajectory only; a bad ``order`` or ``max_concurrent``.
    """

    def __init__(self, *args: Any, mode: str | None = None, max_turns: int = 10, history: int = DEFAULT_HISTORY,
                 max_tokens_per_turn: int | None = None, env_kwargs: Any = None, reward: str | None = None,
                 order: str = "longest", lengths_path: str | None = None, max_concurrent: int | None = None,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if mode is not None and mode not in MODES:
            raise ConfigError(f"agent loop mode={mode!r} is not one of {MODES} (or null: per row)")
        check_int("max_tokens_per_turn", max_tokens_per_turn, optional=True)
        self.mode = mode
        self.max_turns = max_turns
        self.history = history
        self.prompt_length = int(self.rollout_config.prompt_length)
        self.response_length = int(self.rollout_config.response_length)
        self.max_tokens_per_turn = max_tokens_per_turn or self.response_length
        self.default_env_kwargs = _as_dict(env_kwargs, "env_kwargs")
        self.reward = parse_reward(reward)
        if order not in ("longest", "arrival"):
            raise ConfigError(f"agent loop order={order!r} is not one of ('longest', 'arrival')")
        check_int("max_concurrent", max_concurrent, optional=True)
        self.order, self.max_concurrent = order, max_concurrent
        self.lengths_path = str(lengths_path) if lengths_path else None

    # ------------------------------------------------------------------ verl entry point
    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput | list[AgentLoopOutput]:
        """Play one episode; see the module docstring for the outputs.

        Args:
            sampling_params: verl's sampling dict (``temperature``, ``top_p``, ``top_k``,
                ``logprobs``, ...); forwarded to the server with ``max_tokens`` added.
            **kwargs: the dataset row (``extra_info``, ``raw_prompt``, ``index``, ``uid``, ...;
                under V1 also ``global_steps``, the trainer step this row was sampled for).

        Returns:
            chain mode: one ``AgentLoopOutput``; step mode: a list of them (one per env step).
            A failed trajectory: ``[]`` under the V1 trainer (no row), else one error row.

        Raises:
            ConfigError: step mode under ``trainer.use_v1=false``.
            asyncio.CancelledError: when cancelled (the env is closed first).
        """
        start = self._start(sampling_params, kwargs, parse_row, what="agentfly", step_rows="env step",
                            chain_hint="the chain-mode agent loop")
        if not isinstance(start, _RunStart):
            return start
        want_logprobs, traj_id, group_id, use_v1 = start.want_logprobs, start.traj_id, start.group_id, start.use_v1
        row, mode = start.row, start.mode
        chat = chat_tokenizer(self.tokenizer, self.apply_chat_template_kwargs)
        policy = self._policy(traj_id, sampling_params, mode, kwargs)
        sampling = SamplingParams(max_tokens=self.max_tokens_per_turn)
        try:
            traj = await self._play_in_order(row, lambda: play_episode(
                row["env_id"], policy, chat, mode=mode, manager=get_manager(), env_kwargs=row["env_kwargs"],
                sampling=sampling, max_turns=row["max_turns"], history=row["history"], seed=row["seed"],
                options=row["options"], trajectory_id=traj_id, group_id=group_id,
                max_response_tokens=self.response_length, max_prompt_tokens=self.prompt_length, on_error="raise"))
            if mode == "step" and not traj.steps:
                raise ConfigError(f"the episode ended without a step (max_turns={row['max_turns']})")
            await self._apply_reward(traj)
            if traj.error and use_v1:
                # the env or its resource faulted mid-episode (info["error"]): its return says nothing
                # about the policy, so under V1 it leaves no row either
                log.warning("agentfly trajectory %s (%s, task %r) ended by a fault after %d steps: %s", traj_id,
                            row["env_id"], row["task_id"], len(traj.turns), traj.error)
                return self._failed(EnvError(traj.error), kwargs, want_logprobs, traj_id, group_id, mode, row,
                                    policy, use_v1)
            require_token_ids(traj, "a verl training row")  # never re-tokenized text
            if mode == "chain":
                return self._chain_output(traj, policy, want_logprobs, row)
            return self._step_outputs(traj, policy, want_logprobs, row)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001  (every failure is dropped or an error row, never a failed batch)
            log.warning("agentfly trajectory %s (%s, task %r) failed: %s: %s", traj_id, row["env_id"],
                        row["task_id"], type(e).__name__, e, exc_info=not isinstance(e, ConfigError))
            return self._failed(e, kwargs, want_logprobs, traj_id, group_id, mode, row, policy, use_v1)

    async def _play_in_order(self, row: dict[str, Any], play: Callable[[], Any]) -> Trajectory:
        """Await ``play()`` (the episode) once the worker's start gate lets this rollout in (longest-predicted
        first), with its prediction as the priority of its acquisitions; a trajectory that finishes without
        an error updates the prediction of its task."""
        key = length_key(row["env_id"], row.get("task_id"), row.get("seed"))
        lengths, gate = get_runtime().ordering(self.lengths_path, self.max_concurrent)
        priority = lengths.priority(key) if self.order == "longest" else None
        async with gate.admit(priority):
            with acquire_priority(priority):
                traj = await play()
            if key is not None:
                lengths.observe_trajectory(key, traj)  # before leaving: the last one out saves the batch's
        return traj

    def _start(self, sampling_params: dict[str, Any], kwargs: dict[str, Any],
               parse: Callable[..., dict[str, Any]], *, what: str, step_rows: str,
               chain_hint: str) -> _RunStart | AgentLoopOutput | list[AgentLoopOutput]:
        """The prologue every ``run()`` shares: ids, trainer context, the row parsed by ``parse`` (a
        :func:`parse_row`-like function of ``extra_info`` and the loop's defaults), and the step-mode check.

        Args:
            what: the loop's name in logs and errors (e.g. ``"agentfly self-play"``).
            step_rows: what one step-mode row stands for (``"env step"``, ``"turn"``).
            chain_hint: the alternative the step-mode error proposes.

        Returns:
            a :class:`_RunStart`, or (a row that does not parse) what :meth:`_failed` returns for it.

        Raises:
            ConfigError: step mode under ``trainer.use_v1=false``.
        """
        want_logprobs = bool(sampling_params.get("logprobs", False))
        traj_id = uuid.uuid4().hex[:16]
        group_id = str(_scalar(kwargs.get("uid")) or f"index-{_scalar(kwargs.get('index'))}")
        use_v1 = self._trainer_context(kwargs)
        try:
            row = parse(kwargs.get("extra_info"), default_mode=self.mode, default_max_turns=self.max_turns,
                        default_history=self.history, default_env_kwargs=self.default_env_kwargs)
        except ConfigError as e:
            log.warning("%s row %s (group %s): %s", what, traj_id, group_id, e)
            return self._failed(e, kwargs, want_logprobs, traj_id, group_id, self.mode or "chain", {}, None, use_v1)
        mode = self.mode or row["mode"]
        if mode == "step" and not use_v1:
            raise ConfigError(f"{what} step mode returns one row per {step_rows}, which only verl's V1 trainer "
                              f"accepts: set trainer.use_v1=true (or use {chain_hint})")
        return _RunStart(want_logprobs, traj_id, group_id, use_v1, row, mode)

    def _policy(self, request_id: str, sampling_params: dict[str, Any], mode: str,
                kwargs: dict[str, Any]) -> VerlServerPolicy:
        """The policy of one trajectory (one player): verl's server manager under ``request_id``, with
        the row's ``priority`` (when verl passes one) forwarded to every generate call."""
        extra_gen = {}
        if kwargs.get("priority") is not None:
            extra_gen["priority"] = int(_scalar(kwargs["priority"]))
        return VerlServerPolicy(self.server_manager, self.tokenizer, request_id=request_id,
                                sampling_params=sampling_params, mode=mode, prompt_length=self.prompt_length,
                                response_length=self.response_length, extra_generate_kwargs=extra_gen)

    def _trainer_context(self, kwargs: dict[str, Any]) -> bool:
        """Note the ``global_steps`` verl passes to ``run()`` (the weights version rows carry) and return
        whether verl's V1 trainer runs (it takes a list of rows, the legacy trainer one row)."""
        steps = _scalar(kwargs.get("global_steps"))
        self._global_steps = int(steps) if steps is not None and not isinstance(steps, bool) else None
        return bool(_select(self.config, "trainer.use_v1", True))

    async def _apply_reward(self, traj: Trajectory) -> None:
        """The configured episode reward, if any; its failure fails the trajectory (no row under V1, else an error row)."""
        if self.reward is None:
            return
        before = traj.error
        await self.reward.apply(traj, manager=get_manager())
        if traj.error != before:
            raise ResourceError(traj.error)

    def _failed(self, error: BaseException, kwargs: dict[str, Any], want_logprobs: bool, traj_id: str,
                group_id: str, mode: str, row: dict[str, Any], policy: VerlServerPolicy | None,
                use_v1: bool) -> AgentLoopOutput | list[AgentLoopOutput]:
        """What a failed trajectory returns: nothing under V1 (counted in ``failure_metrics``), else
        the legacy error row."""
        record_failure(str(row.get("env_id", "")), error, mode)
        if use_v1:
            return []
        return self._error_output(error, kwargs, want_logprobs, traj_id, group_id, mode, row, policy)

    # ------------------------------------------------------------------ outputs
    def _logprobs(self, lps: list[float], mask: list[int], want: bool) -> list[float] | None:
        return response_logprobs(lps, mask, want)

    def _end_on_sampled(self, ids: list[int], mask: list[int], lps: list[float]) -> None:
        end_on_sampled(ids, mask, lps, chat_tokenizer(self.tokenizer, self.apply_chat_template_kwargs).eot_token_id)

    def _common_fields(self, traj: Trajectory, policy: VerlServerPolicy, row: dict[str, Any]) -> dict[str, Any]:
        return dict(trajectory_id=traj.trajectory_id, group_id=traj.group_id, env_id=traj.env_id,
                    task_id=traj.task_id, seed=-1 if traj.seed is None else int(traj.seed), mode=traj.mode,
                    num_steps=len(traj.turns), env_return=float(traj.reward), success=bool(traj.success),
                    terminated=bool(traj.terminated), truncated=bool(traj.truncated), error=traj.error or "",
                    turn_scores=[float(t.reward) for t in traj.turns], status=episode_status(traj),
                    **self._steps_fields(policy), reward_extra_info={"acc": 1.0 if traj.success else 0.0})

    def _steps_fields(self, policy: VerlServerPolicy | None) -> dict[str, Any]:
        """min/max_global_steps: the server's, else the ``global_steps`` verl passed to ``run`` (ints)."""
        lo = policy.min_global_steps if policy is not None else None
        hi = policy.max_global_steps if policy is not None else None
        fallback = getattr(self, "_global_steps", None)
        lo = fallback if lo is None else lo
        hi = fallback if hi is None else hi
        return {"min_global_steps": None if lo is None else int(lo),
                "max_global_steps": None if hi is None else int(hi)}

    def _chain_output(self, traj: Trajectory, policy: VerlServerPolicy, want_logprobs: bool,
                      row: dict[str, Any]) -> AgentLoopOutput:
        prompt_ids = list(traj.prompt_ids[policy.prompt_cut:])
        n = self.response_length
        ids, mask, lps = list(traj.response_ids[:n]), list(traj.response_mask[:n]), list(traj.response_logprobs[:n])
        self._end_on_sampled(ids, mask, lps)
        common = self._common_fields(traj, policy, row)
        cut_sampled = sum(traj.response_mask[n:]) > 0  # a sampled id fell beyond response_length
        if cut_sampled and common["status"] in ("complete", "truncated"):
            common["status"] = "token_budget"
        extra = _extra_fields(**common, step_reward=float(traj.reward),
                              prompt_truncated=policy.prompt_cut > 0, prompt_cut=int(policy.prompt_cut),
                              response_truncated=len(traj.response_ids) > n,
                              action=traj.turns[-1].action if traj.turns else "")
        metrics = AgentLoopMetrics(generate_sequences=traj.timings.get("generate", 0.0),
                                   tool_calls=traj.timings.get("env", 0.0) + traj.timings.get("reset", 0.0),
                                   num_preempted=policy.num_preempted)
        return AgentLoopOutput(prompt_ids=prompt_ids, response_ids=ids, response_mask=mask,
                               response_logprobs=self._logprobs(lps, mask, want_logprobs),
                               reward_score=float(traj.reward), num_turns=max(0, len(traj.messages) - 1),
                               metrics=metrics, extra_fields=extra)

    def _step_outputs(self, traj: Trajectory, policy: VerlServerPolicy, want_logprobs: bool,
                      row: dict[str, Any]) -> list[AgentLoopOutput]:
        outs = []
        common = self._common_fields(traj, policy, row)
        n = self.response_length
        for i, r in enumerate(traj.steps):
            cut = policy.cut_for(len(r.prompt_ids))  # 0: run_step_episode fitted the prompt already
            ids, mask, lps = list(r.response_ids[:n]), list(r.response_mask[:n]), list(r.response_logprobs[:n])
            self._end_on_sampled(ids, mask, lps)
            turn = traj.turns[i] if i < len(traj.turns) else None
            pcut = int(r.prompt_cut) + cut
            extra = _extra_fields(**common, step=int(r.step), anchor_obs=r.anchor_obs, action=r.action,
                                  step_reward=float(r.reward),
                                  prompt_truncated=pcut > 0 or r.history_shown < min(row["history"], i),
                                  prompt_cut=pcut, history_shown=int(r.history_shown),
                                  response_truncated=len(r.response_ids) > n)
            metrics = AgentLoopMetrics(generate_sequences=turn.generate_s if turn else 0.0,
                                       tool_calls=turn.env_s if turn else 0.0, num_preempted=policy.num_preempted)
            outs.append(AgentLoopOutput(prompt_ids=list(r.prompt_ids[cut:]), response_ids=ids, response_mask=mask,
                                        response_logprobs=self._logprobs(lps, mask, want_logprobs),
                                        reward_score=float(traj.reward), num_turns=2, metrics=metrics,
                                        extra_fields=extra))
        return outs

    def _error_output(self, error: BaseException, kwargs: dict[str, Any], want_logprobs: bool, traj_id: str,
                      group_id: str, mode: str, row: dict[str, Any],
                      policy: VerlServerPolicy | None = None) -> AgentLoopOutput:
        """A row that trains nothing (response mask all 0) with reward 0.0 and the error text."""
        prompt_ids: list[int] = []
        try:
            chat = chat_tokenizer(self.tokenizer, self.apply_chat_template_kwargs)
            eot = int(chat.eot_token_id)
            raw = kwargs.get("raw_prompt")
            if raw is not None and len(raw):
                prompt_ids = list(chat.prompt_ids([dict(m) for m in raw]))[-self.prompt_length:]
        except Exception as e:  # noqa: BLE001  (an unrenderable prompt must not hide the original error)
            log.debug("cannot render raw_prompt for the error row: %s", e)
            eot = int(self.tokenizer.eos_token_id or 0)
        if not prompt_ids:
            prompt_ids = [eot]
        extra = _extra_fields(trajectory_id=traj_id, group_id=group_id, env_id=str(row.get("env_id", "")),
                              task_id=str(row.get("task_id", "")),
                              seed=-1 if row.get("seed") is None else int(row["seed"]), mode=mode,
                              error=f"{type(error).__name__}: {error}", status="error", **self._steps_fields(policy))
        return AgentLoopOutput(prompt_ids=prompt_ids, response_ids=[eot], response_mask=[0],
                               response_logprobs=[0.0] if want_logprobs else None, reward_score=0.0, num_turns=0,
                               metrics=AgentLoopMetrics(), extra_fields=extra)


def _scalar(v: Any) -> Any:
    """A 0-d numpy value -> its Python value (verl passes non-tensor columns as numpy objects)."""
    if hasattr(v, "item") and getattr(v, "shape", None) in ((), (1,)):
        return v.item()
    return v


def _select(config: Any, key: str, default: Any) -> Any:
    try:
        from omegaconf import OmegaConf

        v = OmegaConf.select(config, key, default=default)
    except Exception:  # noqa: BLE001  (a plain dict config)
        v = default
    return default if v is None else v
