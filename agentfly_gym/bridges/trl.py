"""A bridge to TRL's ``GRPOTrainer``: train a model on agentfly-gym environments with TRL's own loop.

``pip install 'agentfly-gym[trl]'`` (tested with TRL 1.16).  Three pieces::

    from trl import GRPOConfig, GRPOTrainer
    from agentfly_gym.bridges.trl import AgentFlyRollout, env_return, env_success, task_dataset

    train = task_dataset("Chess-v0", n=64, seed=0)              # one row per task (env id, task id, seed)
    rollout = AgentFlyRollout(max_turns=4, max_tokens=48)
    trainer = GRPOTrainer(model=model, processing_class=tokenizer, reward_funcs=[env_return, env_success],
                          train_dataset=train, rollout_func=rollout, args=GRPOConfig(num_generations=4, ...))
    trainer.train()
    rollout.close()

* :class:`AgentFlyRollout` is the ``rollout_func``: TRL hands it the prompts of a step (each row repeated
  ``num_generations`` times, so a GRPO group is one task played ``num_generations`` times); it plays every
  prompt's task as one chain-mode episode with the trainer's CURRENT weights
  (:meth:`TransformersPolicy.from_model <agentfly_gym.rollout.policies.transformers_policy.TransformersPolicy.from_model>`
  on ``trainer.model``, in eval mode for the rollout), concurrently, with one long-lived resource manager
  (:class:`~agentfly_gym.rollout.tasks.TaskRunner`), and returns what TRL needs, token ids as sampled (nothing
  is decoded and re-tokenized): ``prompt_ids`` (the env's rendered first prompt), ``completion_ids`` (every
  later token of the chain), ``logprobs`` (the sampling log-probs; 0.0 at env tokens), ``env_mask`` (1 for
  sampled tokens, 0 for observations and template tokens: TRL's loss mask), and, forwarded to the reward
  functions, ``env_return``, ``env_success``, ``env_error``, ``reply_truncated`` and the played ``task_id``.
  A completion whose last reply was cut at ``max_tokens`` ends on its last sampled token, so TRL's
  ``completions/clipped_ratio`` counts it and ``mask_truncated_completions`` can drop it.
* :func:`env_return` and :func:`env_success`: the reward functions TRL calls (the episode's return, its
  success as 0/1).
* :func:`task_dataset`: a :class:`datasets.Dataset` of an env's tasks, one row per (env id, task id, seed), in
  the form :class:`AgentFlyRollout` reads back from its prompt.

Chain mode only: one completion per prompt is what ``GRPOTrainer`` groups.  Step mode gives a varying
number of rows per episode (one per env step), while TRL groups a fixed ``num_generations`` completions per
prompt; it would need a trainer that takes per-step rows (the verl plugin's step loop does).

With ``use_vllm=True`` TRL generates through its own vLLM engine and syncs the weights into it before
each ``rollout_func`` call; this bridge samples with the in-process transformers model instead (pass
``policy=`` to use another :class:`~agentfly_gym.rollout.policies.base.TextPolicy`, e.g. an
:class:`~agentfly_gym.rollout.policies.openai_policy.OpenAITokenPolicy` on a vLLM server whose weights
your loop syncs).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ..errors import ConfigError
from ..limits import check_int
from ..registration import normalize_env_id
from ..rollout.policies.base import SamplingParams
from ..rollout.tasks import TaskRow, TaskRunner

__all__ = ["AgentFlyRollout", "env_return", "env_success", "task_dataset", "task_prompt", "parse_task_prompt",
           "TASK_PROMPT_PREFIX"]

#: The start of a task prompt's text; the rest is a JSON object {"env_id", "task_id", "seed"}.
TASK_PROMPT_PREFIX = "agentfly-gym task "


def task_prompt(env_id: str, task_id: str | None = None, seed: int | None = None,
                env_kwargs: Mapping[str, Any] | None = None) -> list[dict[str, str]]:
    """The conversational prompt of one task, as :func:`task_dataset` writes it and :class:`AgentFlyRollout`
    reads it: one user message ``agentfly-gym task {"env_id": ..., "task_id": ..., "seed": ...}`` (and
    ``"env_kwargs"``, the env's constructor arguments such as its ``split``, when there are any).  The model
    never sees it: the env renders the real first prompt at reset."""
    key: dict[str, Any] = {"env_id": normalize_env_id(env_id), "task_id": task_id or "", "seed": seed}
    if env_kwargs:
        key["env_kwargs"] = dict(env_kwargs)
    return [{"role": "user", "content": TASK_PROMPT_PREFIX + json.dumps(key, sort_keys=True)}]


def parse_task_prompt(prompt: str | Sequence[Mapping[str, Any]]) -> TaskRow:
    """The :class:`~agentfly_gym.rollout.tasks.TaskRow` of a prompt made by :func:`task_prompt` (the messages,
    or their text).

    Raises:
        ConfigError: the prompt is not a task prompt, or its JSON is not the object :func:`task_prompt` writes
            (``env_id`` a string, ``task_id`` a string or absent, ``seed`` an integer or null, ``env_kwargs`` an
            object or absent); the message names what it got and what was expected.
    """
    if isinstance(prompt, str):
        text: Any = prompt
    elif isinstance(prompt, Sequence) and all(isinstance(m, Mapping) for m in prompt):
        text = next((m.get("content", "") for m in reversed(prompt) if m.get("role") == "user"), "")
    else:
        raise ConfigError("a task prompt is its text or a list of chat messages (dicts with role and content), as "
                          f"task_prompt() writes it; got {type(prompt).__name__}: {str(prompt)[:120]!r}")
    if not isinstance(text, str) or TASK_PROMPT_PREFIX not in text:
        raise ConfigError(f"not an agentfly-gym task prompt (make the data set with task_dataset()): {str(text)[:120]!r}")
    body = text[text.index(TASK_PROMPT_PREFIX) + len(TASK_PROMPT_PREFIX):]
    try:
        key = json.loads(body)
    except (ValueError, RecursionError) as e:  # RecursionError: nested past the decoder's depth
        raise ConfigError(f"task prompt {text[:120]!r} does not parse: {e}; expected {_TASK_PROMPT_FORMAT}") from None
    problem = _task_key_problem(key)
    if problem:
        raise ConfigError(f"task prompt {text[:120]!r} does not parse: {problem}; expected {_TASK_PROMPT_FORMAT}")
    return TaskRow(env_id=key["env_id"], task_id=key.get("task_id") or None, seed=key.get("seed"),
                   env_kwargs=key.get("env_kwargs") or None)


_TASK_PROMPT_FORMAT = ('a JSON object {"env_id": str, "task_id": str or "", "seed": int or null} (and "env_kwargs": '
                       'an object), as task_prompt() writes it')


def _task_key_problem(key: Any) -> str:
    """What is wrong with a task prompt's parsed JSON ``key`` ("" when nothing is)."""
    if not isinstance(key, dict):
        kind = {list: "array", str: "string", bool: "boolean", int: "number", float: "number"}.get(type(key), "null")
        return f"the text after {TASK_PROMPT_PREFIX.strip()!r} is a JSON {kind}, not an object"
    if not isinstance(key.get("env_id"), str) or not key["env_id"]:
        return "env_id is missing" if "env_id" not in key else f"env_id is {key['env_id']!r}, not an env id string"
    if key.get("task_id") is not None and not isinstance(key["task_id"], str):
        return f"task_id is a {type(key['task_id']).__name__}, not a string"
    seed = key.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        return f"seed is {seed!r}, not an integer or null"
    if seed is not None:
        from ..data.task_draw import check_seed

        try:
            check_seed(seed)  # the seed rule of every data set (task_draw)
        except ConfigError as e:
            return str(e)
    if key.get("env_kwargs") is not None and not isinstance(key["env_kwargs"], dict):
        return f"env_kwargs is a {type(key['env_kwargs']).__name__}, not an object"
    return ""


def task_dataset(env_id: str, tasks: Iterable[str] | None = None, *, n: int | None = None, seed: int = 0,
                 split: str | None = None, env_kwargs: Mapping[str, Any] | None = None,
                 exclude: Any = (), check: bool = True) -> Any:
    """A :class:`datasets.Dataset` of ``env_id``'s tasks for ``GRPOTrainer(train_dataset=...)``, drawn as the verl
    plugin's data sets are (:func:`agentfly_gym.data.task_draw.draw_tasks`): without ``tasks``, ``n`` task ids of
    the env's ``split`` (``"train"`` by default for an env with splits; ``"validation"`` / ``"test"`` never share
    a task with it), a permutation by ``seed``; an env that lists no tasks draws each row's task from its seed.

    Columns: ``prompt`` (:func:`task_prompt`, carrying the env's constructor arguments, ``split`` included, so the
    rollout plays the row in the split it was drawn from), ``env_id``, ``task_id`` ("" when drawn from the seed),
    ``seed`` (row ``i``: ``seed + i``), ``split`` ("" for the env's default).

    Args:
        env_id: a registered env id (short names accepted).
        tasks: task ids, one row each (cycled up to ``n``); None: drawn from the env's ``split``.
        n: rows (default: ``len(tasks)``; required without ``tasks``).
        seed: the first row's seed, and the draw's permutation.
        split: the env's task split (its constructor argument ``split``).
        env_kwargs: constructor arguments of the env for every row (checked against its signature).
        exclude: task ids to leave out of the draw (e.g. a validation set's), or a data set made by this
            function (its rows of ``env_id`` with a task id); a listed task among them is refused.
        check: reset the env once per distinct listed task (once for drawn tasks) and end the episode at once, so
            a bad task id, split or constructor argument fails here, not in training (as ``agentfly-gym dataset``
            checks, :func:`agentfly_gym.data.task_draw.check_draw`; ~1 s per ScienceWorld task).

    Raises:
        ConfigError: an unknown env, no ``n`` and no tasks, an empty task list, constructor arguments the env
            does not take, a listed task in ``exclude``, a split with no task left, (with ``check``) a task id
            the env rejects.
        DataNotFoundError: the env's data is missing.
    """
    import datasets

    from ..data.task_draw import check_draw, check_seed, draw_tasks

    env_id = normalize_env_id(env_id)
    seed = check_seed(seed)  # a plain int: row i's seed + i is written into its JSON prompt
    if isinstance(tasks, (str, bytes)):
        raise ConfigError("tasks: give task ids as a list, not one string")
    if env_kwargs is not None and not isinstance(env_kwargs, Mapping):
        raise ConfigError(f"env_kwargs must be a mapping of constructor arguments, got {type(env_kwargs).__name__}")
    if exclude is None:
        exclude = ()
    if hasattr(exclude, "column_names"):  # a data set made by task_dataset
        if not {"env_id", "task_id"} <= set(exclude.column_names):
            raise ConfigError(f"exclude: a data set made by task_dataset has env_id and task_id columns; "
                              f"got {exclude.column_names}")
        excluded = {t for e, t in zip(exclude["env_id"], exclude["task_id"]) if e == env_id and t}
    elif isinstance(exclude, (str, bytes)):
        raise ConfigError("exclude: give task ids as a list (or a data set made by task_dataset), not one string")
    else:
        exclude = list(exclude)
        if not all(isinstance(t, (str, int)) and not isinstance(t, bool) for t in exclude):
            raise ConfigError("exclude: give task ids (strings or integers), or a data set made by task_dataset; got "
                              f"{sorted({type(t).__name__ for t in exclude})}")
        excluded = {str(t) for t in exclude}
    draw = draw_tasks(env_id, None if tasks is None else list(tasks), n, split=split, seed=seed,
                      env_kwargs=dict(env_kwargs or {}), excluded=excluded, excluded_from="exclude")
    if check:
        check_draw(draw, seed)
    rows = []
    for i in range(draw.n):
        task = draw.task(i)
        rows.append({"prompt": task_prompt(env_id, task, seed + i, draw.env_kwargs), "env_id": env_id,
                     "task_id": task, "seed": seed + i, "split": draw.split or ""})
    return datasets.Dataset.from_list(rows)


def env_return(completions: list, env_return: list[float] | None = None, **kwargs: Any) -> list[float]:
    """TRL reward function: each episode's return (sum of the env's rewards, or the configured reward)."""
    if env_return is None:
        raise ConfigError("env_return needs the rollout_func's 'env_return' field (use AgentFlyRollout)")
    return [float(r) for r in env_return]


def env_success(completions: list, env_success: list[float] | None = None, **kwargs: Any) -> list[float]:
    """TRL reward function: 1.0 where the episode was won (the env's ``won`` flag), else 0.0."""
    if env_success is None:
        raise ConfigError("env_success needs the rollout_func's 'env_success' field (use AgentFlyRollout)")
    return [float(s) for s in env_success]


def model_policy(model: Any, tokenizer: Any, current: Any, *, seed: int | None, max_batch_size: int,
                 prefix_cache_bytes: int | None = 0) -> Any:
    """A :class:`~agentfly_gym.rollout.policies.transformers_policy.TransformersPolicy` sampling from ``model``'s
    live weights: ``current`` when it already samples from that model object (a trainer keeps one across steps),
    else a new one made by ``TransformersPolicy.from_model`` (``current``, if any, is closed first)."""
    if current is not None and getattr(current, "model", None) is model:
        return current
    from ..rollout.policies.transformers_policy import TransformersPolicy

    if current is not None:
        current.close()
    return TransformersPolicy.from_model(model, tokenizer, seed=seed, max_batch_size=max_batch_size,
                                         prefix_cache_bytes=prefix_cache_bytes)


def trainer_sampling(trainer: Any, *, max_tokens: int, temperature: float | None,
                     top_p: float | None) -> SamplingParams:
    """The sampling of a rollout function: ``temperature`` / ``top_p`` as given, else the trainer's ``args`` (TRL's
    ``GRPOConfig``; 1.0 where it has none), and ``max_tokens`` per reply (tokens)."""
    args = getattr(trainer, "args", None)
    temperature = temperature if temperature is not None else getattr(args, "temperature", 1.0)
    top_p = top_p if top_p is not None else getattr(args, "top_p", 1.0)
    return SamplingParams(max_tokens=max_tokens, temperature=float(temperature), top_p=float(top_p))


class AgentFlyRollout:
    """TRL ``rollout_func``: plays each prompt's task with the trainer's current weights (see the module
    docstring for what it returns).

    Args:
        max_turns: most policy turns per episode.
        max_tokens: most tokens of one reply (per turn).
        temperature, top_p: sampling; None takes the trainer's ``args.temperature`` / ``args.top_p``.
        max_context_tokens: hard cap of a chain (prompt + completion tokens; see
            :func:`~agentfly_gym.rollout.chain.run_chain_episode`); None for no cap.
        concurrency: most episodes in flight.
        env_kwargs: per env id, constructor keyword arguments.
        reward: a configured episode reward (``"judge:..."``, ``"MODULE:FUNCTION"``), else the env's return.
        policy: a TextPolicy to sample with instead of the trainer's model (its tokenizer must be the
            trainer's); None: :meth:`TransformersPolicy.from_model` on the unwrapped ``trainer.model``.
        manager: a resource manager to use (left open); None: one made on first use, closed by :meth:`close`.
        seed: seeds the policy's per-request sampling seeds (None: from the OS).

    Call :meth:`close` after training to release the environments' resources.
    """

    def __init__(self, *, max_turns: int = 8, max_tokens: int = 64, temperature: float | None = None,
                 top_p: float | None = None, max_context_tokens: int | None = None, concurrency: int = 8,
                 env_kwargs: Mapping[str, Mapping[str, Any]] | None = None, reward: Any = None,
                 policy: Any = None, manager: Any = None, seed: int | None = None) -> None:
        check_int("max_tokens", max_tokens)
        self.max_turns, self.max_tokens = max_turns, max_tokens
        self.temperature, self.top_p = temperature, top_p
        self.max_context_tokens, self.concurrency = max_context_tokens, concurrency
        self.env_kwargs, self.reward, self.manager, self.seed = env_kwargs, reward, manager, seed
        self._given_policy = policy
        self._policy: Any = None
        self._model: Any = None
        self._runner: TaskRunner | None = None
        #: the trajectories of the last call (for logging and checks)
        self.last_trajectories: list = []

    def _setup(self, trainer: Any) -> Any:
        """The policy and runner, made on the first call (the model object stays the same across steps)."""
        model = trainer.accelerator.unwrap_model(trainer.model)
        if self._runner is not None and (self._given_policy is not None or model is self._model):
            return model
        from ..rollout.chat import ChatTokenizer

        tokenizer = getattr(trainer.processing_class, "tokenizer", trainer.processing_class)
        if self._given_policy is not None:
            policy = self._given_policy
        else:
            # KV reuse on: every call clears the kept caches first (the weights changed in between)
            policy = self._policy = model_policy(model, tokenizer, self._policy, seed=self.seed,
                                                 max_batch_size=self.concurrency, prefix_cache_bytes=None)
        self._model = model
        chat = ChatTokenizer(tokenizer, chat_template_kwargs=dict(getattr(trainer, "chat_template_kwargs", None) or {}))
        if self._runner is not None:
            self._runner.policy, self._runner.chat = policy, chat
        else:
            self._runner = TaskRunner(policy, chat, manager=self.manager, concurrency=self.concurrency,
                                      max_turns=self.max_turns, max_context_tokens=self.max_context_tokens,
                                      env_kwargs=self.env_kwargs, reward=self.reward)
        return model

    def _sampling(self, trainer: Any) -> SamplingParams:
        return trainer_sampling(trainer, max_tokens=self.max_tokens, temperature=self.temperature, top_p=self.top_p)

    def __call__(self, prompts: list, trainer: Any) -> dict[str, list]:
        """Play one episode per prompt; returns TRL's rollout dict (lists of length ``len(prompts)``)."""
        rows = [parse_task_prompt(p) for p in prompts]
        model = self._setup(trainer)
        clear = getattr(self._runner.policy, "clear_prefix_cache", None)
        if callable(clear):  # KV kept from the last step was computed with the weights before its update
            clear()
        was_training = bool(getattr(model, "training", False))
        if was_training:
            model.eval()  # no dropout, and the KV cache that gradient checkpointing turns off in train mode
        try:
            trajs = self._runner.play(rows, sampling=self._sampling(trainer))
        finally:
            if was_training:
                model.train()
        self.last_trajectories = trajs
        return self.to_trl(trajs, self._runner.chat)

    @staticmethod
    def to_trl(trajectories: Sequence[Any], chat: Any) -> dict[str, list]:
        """TRL's rollout dict of chain-mode trajectories (see the module docstring).

        A trajectory that failed before its first reply (no tokens) becomes a one-token completion (the chat
        template's end-of-turn id, env mask 0: no loss) with return 0 and ``env_error`` set.

        Raises:
            TextOnlyTrajectory: a trajectory is text-only (a chat endpoint's without token ids).
        """
        out: dict[str, list] = {k: [] for k in ("prompt_ids", "completion_ids", "logprobs", "env_mask", "env_return",
                                                "env_success", "env_error", "reply_truncated", "task_id")}
        from ..rollout.trajectory import require_token_ids

        for t in trajectories:  # a text-only one (a chat endpoint's) has no ids to train on: refused, not re-tokenized
            require_token_ids(t, "a TRL training row")
        eot = int(chat.eot_token_id)
        for t in trajectories:
            if t.mode != "chain":
                raise ConfigError(f"trajectory {t.trajectory_id} is in {t.mode!r} mode; the TRL bridge takes chain mode")
            ids, mask, lps = t.trainer_response()
            lps = [float(x) if m else 0.0 for x, m in zip(lps, mask)]  # NaN (a scripted reply): TRL neutralizes it
            if not ids:
                ids, mask, lps = [eot], [0], [0.0]
            out["prompt_ids"].append(list(t.prompt_ids) or [eot])
            out["completion_ids"].append(list(ids))
            out["logprobs"].append(lps)
            out["env_mask"].append(list(mask))
            out["env_return"].append(float(t.reward))
            out["env_success"].append(float(bool(t.success)))
            out["env_error"].append(t.error or "")
            out["reply_truncated"].append(bool(t.reply_truncated))
            out["task_id"].append(t.task_id)
        return out

    def close(self) -> None:
        """Release the environments' resources (if the manager is the bridge's own) and stop the policy's
        worker thread (if the bridge made the policy).  Idempotent."""
        if self._runner is not None:
            self._runner.close()
        if self._policy is not None:
            self._policy.close()
            self._policy = None
