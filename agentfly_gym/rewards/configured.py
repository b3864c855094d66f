"""Episode rewards named in configuration: an LLM judge or a user function.

A reward spec is one string, as given to ``agentfly-gym rollout --reward SPEC`` or to the verl
plugin's agent-loop YAML key ``reward: SPEC``:

* ``judge:KEY=VALUE,KEY=VALUE,...`` (or ``judge:{JSON object}``): an LLM judge grades the finished
  episode from its transcript.  Keys:

  - ``base_url`` + ``model``: an OpenAI-compatible API (``ModelAPISpec``); ``api_key_env`` names the
    environment variable holding its key;
  - or ``serve=transformers`` (CPU) / ``serve=vllm`` (GPU) + ``model`` (a folder, a hub name, or
    ``smollm2`` for the bundled model): a local server started as a global resource
    (``ModelServiceSpec``) and used through the same client;
  - ``concurrency`` (most judge requests in flight, default 4; 1 for ``serve=transformers``), ``retries``
    (on HTTP 429/5xx and connection errors, with exponential backoff; default 3), ``timeout`` (seconds per request,
    120), ``max_tokens`` (judge reply budget, 128), ``default`` (reward when the reply holds no
    rating, 0.0), ``combine`` (``replace``: the judge's score becomes the episode reward;
    ``add``: reward = env return + ``weight`` * score; default ``replace``), ``weight`` (1.0).

* ``MODULE:FUNCTION``: ``FUNCTION(trajectory)`` (sync or async) returns the episode reward as a
  float; a function decorated with :func:`~agentfly_gym.rewards.resourced` also gets
  ``manager=``, so it can declare the resources it needs.  ``combine`` is ``replace``.

The judge is held in GLOBAL scope: one server and one client for all rollouts of a process,
whose semaphore bounds concurrent requests.  Its score is ``[[N]] / 10`` in [0, 1], the format of
MT-Bench's single-answer grading (Zheng et al., 2023), read by
:func:`~agentfly_gym.rewards.judge.parse_score`.

:meth:`EpisodeReward.apply` sets ``trajectory.reward`` (and, in step mode, every row's
``episode_return``), and records ``env_return``, the reward spec's ``score`` and (judge) the
``judge_reply`` in the last turn's ``info``.  A judge that still fails after its retries sets
``trajectory.error`` and leaves the env return in place: one bad request never fails the run.
A judge reply that holds no rating gives the ``default`` reward and says so: ``trajectory.reward_error``
is set (a WARNING is logged), the run summary counts these (``reward_errors``) and warns when most
judgements failed (:func:`~agentfly_gym.rollout.summary.summarize`).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from typing import Any

from ..errors import ConfigError
from ..limits import check_int
from ..resources.protocol import Manager
from ..resources.spec import ModelAPISpec, ModelServiceSpec
from ..utils.imports import load_object
from ..utils.jsonargs import json_object
from .judge import parse_score

__all__ = ["EpisodeReward", "JudgeReward", "FunctionReward", "parse_reward", "TRAJECTORY_JUDGE_PROMPT",
           "transcript"]

log = logging.getLogger(__name__)

TRAJECTORY_JUDGE_PROMPT = (
    "Please act as an impartial judge and rate how well the agent accomplished the task below, from its actions "
    "and the environment's answers. Reply with a short explanation, then your rating from 0 to 10 strictly in the "
    "format [[rating]], for example [[7]].\n\n[Task]\n{task}\n\n[Agent's actions and the environment's answers]\n"
    "{transcript}\n\n[Outcome reported by the environment]\n{outcome}"
)

_JUDGE_KEYS = {"base_url", "model", "api_key_env", "serve", "concurrency", "retries", "timeout", "max_tokens",
               "default", "combine", "weight", "max_chars"}
COMBINE = ("replace", "add")


def transcript(trajectory: Any, *, max_chars: int = 6000) -> tuple[str, str, str]:
    """``(task, transcript, outcome)`` texts of a finished trajectory for a judge prompt.

    ``task`` is the first user message (the env's task); the transcript lists each turn's action and
    observation, keeping the LAST turns when longer than ``max_chars`` characters; ``outcome`` gives
    the env's return, success flag and how the episode ended.
    """
    task = next((m["content"] for m in trajectory.messages if m.get("role") == "user"), "")
    lines = [f"Step {i + 1}. Action: {t.action}\nObservation: {t.observation}" for i, t in enumerate(trajectory.turns)]
    kept: list[str] = []
    size = 0
    for line in reversed(lines):
        if size + len(line) > max_chars and kept:
            kept.append(f"({len(lines) - len(kept)} earlier steps omitted)")
            break
        kept.append(line[-max_chars:])
        size += len(line) + 1
    ended = "terminated" if trajectory.terminated else "truncated" if trajectory.truncated else "stopped"
    outcome = f"return {trajectory.reward:g}, success {bool(trajectory.success)}, episode {ended}"
    return task, "\n".join(reversed(kept)) or "(no steps)", outcome


class EpisodeReward:
    """A reward computed on a finished trajectory.  Subclasses implement :meth:`score`.

    Attributes:
        spec: the spec string it was parsed from.
        combine: ``"replace"`` or ``"add"``; weight: the factor of the score under ``"add"``.
    """

    spec: str = ""
    combine: str = "replace"
    weight: float = 1.0

    async def score(self, trajectory: Any, *, manager: Manager) -> tuple[float, dict[str, Any]]:
        """``(score, details)`` for ``trajectory``; details go to the last turn's info."""
        raise NotImplementedError

    async def apply(self, trajectory: Any, *, manager: Manager) -> Any:
        """Score ``trajectory`` and set its reward in place (see the module docstring); returns it.

        Trajectories that already failed (``error`` set) or have no turn are left as they are.  A score
        given by default (details ``reward_error``: e.g. a judge reply without a rating) is applied and
        recorded in ``trajectory.reward_error``; a failed scoring sets both ``error`` and ``reward_error``.
        """
        if trajectory.error or not trajectory.turns:
            return trajectory
        env_return = float(trajectory.reward)
        t0 = time.monotonic()
        try:
            score, details = await self.score(trajectory, manager=manager)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001  (a failed judge marks this trajectory only)
            log.warning("reward %s failed for trajectory %s: %s: %s", self.spec, trajectory.trajectory_id,
                        type(e).__name__, e)
            trajectory.error = f"reward {self.spec!r} failed: {type(e).__name__}: {e}"
            trajectory.reward_error = trajectory.error
            return trajectory
        if details.get("reward_error"):
            trajectory.reward_error = str(details["reward_error"])
        reward = score if self.combine == "replace" else env_return + self.weight * score
        trajectory.reward = float(reward)
        for row in trajectory.steps:
            if hasattr(row, "episode_return"):
                row.episode_return = float(reward)
            elif isinstance(row, dict):
                row["episode_return"] = float(reward)
        trajectory.timings["reward"] = time.monotonic() - t0
        trajectory.turns[-1].info.update({"env_return": env_return, "reward_score": float(score), **details})
        return trajectory


class FunctionReward(EpisodeReward):
    """``MODULE:FUNCTION`` called on the finished trajectory (awaited when async)."""

    def __init__(self, spec: str, fn: Any) -> None:
        self.spec, self.fn = spec, fn

    async def score(self, trajectory: Any, *, manager: Manager) -> tuple[float, dict[str, Any]]:
        kwargs = {"manager": manager} if getattr(self.fn, "resource_specs", None) is not None else {}
        value = self.fn(trajectory, **kwargs)
        if inspect.isawaitable(value):
            value = await value
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"reward function {self.spec!r} returned {value!r}, not a number")
        return float(value), {}


class JudgeReward(EpisodeReward):
    """An LLM judge over a global-scope model API (optionally on a local server it starts).

    Args:
        api: the endpoint (``base_url`` set), or None when ``service`` is given.
        service: a local server to start first; the judge's API spec then points at it.
        concurrency, retries, timeout: the API spec's ``max_instances``, ``max_retries``, ``request_timeout``.
        max_tokens: judge reply budget (tokens).  default: reward when no rating is found.
        combine, weight: see the module docstring.  max_chars: transcript budget (characters).
    """

    def __init__(self, *, api: ModelAPISpec | None = None, service: ModelServiceSpec | None = None, model: str = "",
                 api_key_env: str | None = None, concurrency: int = 4, retries: int = 3, timeout: float = 120.0,
                 max_tokens: int = 128, default: float = 0.0, combine: str = "replace", weight: float = 1.0,
                 max_chars: int = 6000, spec: str = "judge") -> None:
        if (api is None) == (service is None):
            raise ConfigError("a judge needs exactly one of base_url (an API) or serve (a local server)")
        if combine not in COMBINE:
            raise ConfigError(f"combine={combine!r} is not one of {COMBINE}")
        for name, v in (("concurrency", concurrency), ("max_tokens", max_tokens), ("max_chars", max_chars)):
            check_int(f"judge {name}", v)
        check_int("judge retries", retries, minimum=0)
        self.api, self.service, self.model, self.api_key_env = api, service, model, api_key_env
        self.concurrency, self.retries, self.timeout = concurrency, retries, float(timeout)
        self.max_tokens, self.default, self.combine, self.weight = max_tokens, float(default), combine, float(weight)
        self.max_chars, self.spec = max_chars, spec

    async def api_spec(self, manager: Manager) -> ModelAPISpec:
        """The endpoint's spec; for ``serve=...`` the local server is acquired (global scope) first."""
        if self.api is not None:
            return self.api
        svc = await manager.acquire_global(self.service)
        return ModelAPISpec(base_url=svc.base_url, model=svc.model_name, max_instances=self.concurrency,
                            max_retries=self.retries, request_timeout=self.timeout)

    async def score(self, trajectory: Any, *, manager: Manager) -> tuple[float, dict[str, Any]]:
        api = await manager.acquire_global(await self.api_spec(manager))
        task, text, outcome = transcript(trajectory, max_chars=self.max_chars)
        prompt = TRAJECTORY_JUDGE_PROMPT.format(task=task, transcript=text, outcome=outcome)
        reply = await api.chat([{"role": "user", "content": prompt}], max_tokens=self.max_tokens, temperature=0.0)
        score = parse_score(reply)
        if score is None:
            why = (f"the judge's reply holds no rating [[N]] (max_tokens={self.max_tokens}); "
                   f"reward is the default {self.default:g}")
            log.warning("trajectory %s: %s: %r", getattr(trajectory, "trajectory_id", ""), why, reply[:200])
            return self.default, {"judge_reply": reply[:2000], "reward_error": why}
        return score, {"judge_reply": reply[:2000]}


def _parse_fields(body: str, spec: str) -> dict[str, Any]:
    body = body.strip()
    if body.startswith("{"):
        return json_object(body, f"reward spec {spec!r}: the JSON after 'judge:'")
    fields: dict[str, Any] = {}
    for part in filter(None, (p.strip() for p in body.split(","))):
        key, eq, value = part.partition("=")
        if not eq or not key.strip():
            raise ConfigError(f"reward spec {spec!r}: {part!r} is not KEY=VALUE")
        fields[key.strip()] = value.strip()
    return fields


def _number(fields: dict[str, Any], key: str, kind: type, default: Any, spec: str) -> Any:
    v = fields.get(key, default)
    try:
        return kind(v)
    except (TypeError, ValueError):
        what = "an integer" if kind is int else "a number"
        raise ConfigError(f"reward spec {spec!r}: {key}={v!r} is not {what}") from None


def parse_reward(spec: str | EpisodeReward | None) -> EpisodeReward | None:
    """An :class:`EpisodeReward` from a spec string (see the module docstring); None stays None.

    Raises:
        ConfigError: an unknown key, a bad value, an unimportable ``MODULE:FUNCTION``.
    """
    if spec is None or isinstance(spec, EpisodeReward):
        return spec
    if not isinstance(spec, str) or not spec.strip():
        raise ConfigError(f"reward spec {spec!r} must be 'judge:...' or 'MODULE:FUNCTION'")
    spec = spec.strip()
    kind, _, body = spec.partition(":")
    if kind == "judge":
        fields = _parse_fields(body, spec)
        unknown = sorted(set(fields) - _JUDGE_KEYS)
        if unknown:
            raise ConfigError(f"reward spec {spec!r}: unknown keys {unknown}; valid: {sorted(_JUDGE_KEYS)}")
        model = str(fields.get("model") or "")
        if not model:
            raise ConfigError(f"reward spec {spec!r} needs model=<name, folder or smollm2>")
        # transformers serve answers one request at a time (concurrent ones stall it): default 1 there
        concurrency = _number(fields, "concurrency", int, 1 if fields.get("serve") == "transformers" else 4, spec)
        retries = _number(fields, "retries", int, 3, spec)
        timeout = _number(fields, "timeout", float, 120.0, spec)
        if concurrency < 1 or retries < 0 or not timeout > 0:
            raise ConfigError(f"reward spec {spec!r}: concurrency={concurrency} must be an integer >= 1, "
                              f"retries={retries} >= 0, timeout={timeout} seconds > 0")
        common = dict(concurrency=concurrency, retries=retries, timeout=timeout,
                      max_tokens=_number(fields, "max_tokens", int, 128, spec),
                      default=_number(fields, "default", float, 0.0, spec),
                      combine=str(fields.get("combine", "replace")),
                      weight=_number(fields, "weight", float, 1.0, spec),
                      max_chars=_number(fields, "max_chars", int, 6000, spec), spec=spec)
        if "serve" in fields:
            if "base_url" in fields:
                raise ConfigError(f"reward spec {spec!r}: give base_url (an API) or serve (a local server), not both")
            if model == "smollm2":
                from ..rollout.models import smollm2_dir

                model = str(smollm2_dir())
            service = ModelServiceSpec(engine=str(fields["serve"]), model=model, start_timeout=timeout * 5)
            return JudgeReward(service=service, model=model, **common)
        if "base_url" not in fields:
            raise ConfigError(f"reward spec {spec!r} needs base_url=<OpenAI-compatible URL> or serve=transformers|vllm")
        api = ModelAPISpec(base_url=str(fields["base_url"]), model=model, api_key_env=fields.get("api_key_env") or None,
                           max_instances=concurrency, max_retries=retries, request_timeout=timeout)
        return JudgeReward(api=api, model=model, **common)
    if ":" not in spec.strip(":"):
        raise ConfigError(f"reward spec {spec!r} must be 'judge:KEY=VALUE,...' or 'MODULE:FUNCTION'")
    return FunctionReward(spec, load_object(spec, what="reward spec"))
