"""Any agent harness as a verl 0.9.1 agent loop: one gateway session per trajectory over verl's own servers.

The YAML entry ``agentfly_gateway`` (``agent_loops.yaml``) names the agent (``agent: "module:function"``, as
:func:`agentfly_gym.gateway.run_agent` takes it) and optionally its score (``score: "module:function"``,
``score(answer, task) -> reward``).  ``run`` builds the row's task (``{"prompt": <last user text>, "messages":
<raw_prompt>, "extra_info": {...}}``), serves a :class:`~agentfly_gym.gateway.Gateway` on 127.0.0.1 over a
:class:`~.policy.VerlServerPolicy` (one ``request_id`` per trajectory; each call a fresh prompt, capped at
``prompt_length + response_length`` tokens), runs the agent with the loop's time and turn limits and returns
:func:`~.gateway.gateway_outputs` rows: under the V1 trainer one row per segment (``join: rows``) or the one chain
(``join: chain``; a rollout of several segments then leaves no row); under the legacy trainer the LAST segment's row
only (it takes one output per trajectory).  An agent that fails before its first call leaves no row under V1 and
an error row (mask 0) under the legacy trainer, as the env loops do.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

from agentfly_gym.errors import ConfigError
from agentfly_gym.gateway import Gateway, run_agent, serve_gateway
from agentfly_gym.gateway.agents import prompt_task
from agentfly_gym.gateway.rows import JOINS
from agentfly_gym.limits import check_int
from agentfly_gym.utils.imports import load_object
from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopOutput

from .agent_loop import _as_dict, _scalar, _select
from .gateway import gateway_outputs
from .policy import VerlServerPolicy
from .runtime import chat_tokenizer, record_failure

__all__ = ["GatewayAgentLoop"]

log = logging.getLogger(__name__)


class GatewayAgentLoop(AgentLoopBase):
    """verl agent loop running an agent harness through a per-trajectory gateway (see the module docstring).

    Args:
        agent: ``"module:function"`` of the agent.
        score: ``"module:function"`` of its score (None: reward 0.0).
        max_turns: the session's turn limit (chat-completion calls).
        max_tokens_per_turn: the largest reply a call may ask for (None: ``rollout.response_length``).
        timeout_s: the agent's time limit (seconds).
        join: ``"rows"`` or ``"chain"`` (see the module docstring).
        (all other arguments: see verl's ``AgentLoopBase``.)

    Raises:
        ConfigError: no ``agent``, an agent or score that does not import, a bad limit or ``join``.
    """

    def __init__(self, *args: Any, agent: str | None = None, score: str | None = None, max_turns: int = 8,
                 max_tokens_per_turn: int | None = None, timeout_s: float = 600.0, join: str = "rows",
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if not agent:
            raise ConfigError("the agentfly_gateway loop needs agent: \"module:function\" (the agent to run)",
                              field="agent")
        if join not in JOINS:
            raise ConfigError(f"join={join!r} is not one of {JOINS}", field="join")
        self.agent = load_object(agent, what="agent")
        self.score = load_object(score, what="score") if score else None
        self.max_turns = check_int("max_turns", max_turns)
        self.prompt_length = int(self.rollout_config.prompt_length)
        self.response_length = int(self.rollout_config.response_length)
        self.max_tokens_per_turn = check_int("max_tokens_per_turn", max_tokens_per_turn or self.response_length)
        self.timeout_s, self.join = float(timeout_s), join

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput | list[AgentLoopOutput]:
        """Run the agent on the row; see the module docstring for the outputs."""
        use_v1 = bool(_select(self.config, "trainer.use_v1", True))
        want_logprobs = bool(sampling_params.get("logprobs"))
        raw = kwargs.get("raw_prompt")
        task = prompt_task([dict(m) for m in raw] if raw is not None else "")
        task["extra_info"] = _as_dict(kwargs.get("extra_info"), "extra_info")
        group_id = str(_scalar(kwargs.get("uid")) or f"index-{_scalar(kwargs.get('index'))}")
        chat = chat_tokenizer(self.tokenizer, self.apply_chat_template_kwargs)
        traj_id = uuid.uuid4().hex[:16]
        policy = VerlServerPolicy(self.server_manager, self.tokenizer, request_id=traj_id,
                                  sampling_params=sampling_params, mode="step",
                                  prompt_length=self.prompt_length + self.response_length,
                                  response_length=self.response_length)
        gateway = Gateway(policy, chat, max_turns=self.max_turns, max_tokens=self.max_tokens_per_turn)
        async with serve_gateway(gateway) as url:
            rollout = await run_agent(gateway, self.agent, task, base_url=url, timeout_s=self.timeout_s,
                                      score=self.score, trajectory_id=traj_id, group_id=group_id,
                                      task_id=str(task["extra_info"].get("task_id", "")))
        if rollout.error:
            log.warning("agentfly_gateway trajectory %s: %s", traj_id, rollout.error)
            record_failure("gateway", RuntimeError(rollout.error), "gateway")
            if not rollout.segments and use_v1:
                return []
        if self.join == "chain" and len(rollout.segments) > 1:
            log.warning("agentfly_gateway trajectory %s: %d segments (its agent rewrote its history), no chain",
                        traj_id, len(rollout.segments))
            return [] if use_v1 else self._last(rollout, chat, want_logprobs)
        if not use_v1:
            return self._last(rollout, chat, want_logprobs)
        return gateway_outputs([rollout], eot_token_id=chat.eot_token_id, response_length=self.response_length,
                               prompt_length=self.prompt_length, want_logprobs=want_logprobs)

    def _last(self, rollout: Any, chat: Any, want_logprobs: bool) -> AgentLoopOutput:
        """The row of the rollout's last segment (the legacy trainer's one output per trajectory)."""
        outs = gateway_outputs([rollout], eot_token_id=chat.eot_token_id, response_length=self.response_length,
                               prompt_length=self.prompt_length, want_logprobs=want_logprobs)
        return outs[-1]
