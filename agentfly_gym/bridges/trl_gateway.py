"""TRL's ``GRPOTrainer`` on any agent harness: a ``rollout_func`` that runs an agent per prompt through the gateway.

::

    from agentfly_gym.bridges.trl import env_return
    from agentfly_gym.bridges.trl_gateway import GatewayRollout

    rollout = GatewayRollout(my_agent, score=lambda answer, task: float("5" in answer), max_tokens=64)
    trainer = GRPOTrainer(model=model, processing_class=tokenizer, reward_funcs=[env_return],
                          train_dataset=Dataset.from_list([{"prompt": [{"role": "user", "content": "2+3?"}]}]),
                          rollout_func=rollout, args=GRPOConfig(num_generations=4, ...))

Each prompt (a row's ``prompt``: its messages, or its text) becomes the task ``{"prompt": <the last user message's
text>, "messages": <the messages>}`` of one :func:`~agentfly_gym.gateway.run_agent` run against a
:class:`~agentfly_gym.gateway.Gateway` over the trainer's CURRENT weights (as
:class:`~agentfly_gym.bridges.trl.AgentFlyRollout` samples them: ``TransformersPolicy.from_model`` on the unwrapped
model, in eval mode during the rollout).  TRL takes one completion per prompt, so each rollout gives ONE row: its
segment when the agent's calls formed one chain, else its LAST segment (a rewritten history: the earlier segments
are not trained here; :func:`agentfly_gym_verl.gateway_outputs` trains every segment).  The dict is
:meth:`AgentFlyRollout.to_trl <agentfly_gym.bridges.trl.AgentFlyRollout.to_trl>`'s (token ids as sampled,
``env_mask``, ``logprobs``, ``env_return`` = the score), plus ``gateway_segments`` (segments per rollout).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ..gateway import Gateway, run_agents, segment_rows, serve_gateway
from ..gateway.agents import prompt_task
from .trl import AgentFlyRollout, model_policy, trainer_sampling

__all__ = ["GatewayRollout", "prompt_task"]


class GatewayRollout:
    """TRL ``rollout_func`` running ``agent`` per prompt through the gateway (see the module docstring).

    Args:
        agent: ``agent(base_url, api_key, task, **resources) -> answer`` (:func:`~agentfly_gym.gateway.run_agent`).
        score: ``score(answer, task) -> reward`` (may be async); the rollout's ``env_return``.
        max_turns: the gateway's turn limit per rollout (calls).
        max_tokens: the largest reply an agent may ask for, and the default one (tokens).
        timeout_s: each agent's time limit (seconds).
        concurrency: most agents at once.
        temperature, top_p: the gateway's default sampling; None takes the trainer's ``args``.
        policy: a TextPolicy to sample with instead of the trainer's model (its tokenizer must be the trainer's).
        seed: seeds the policy's per-request sampling seeds.
    """

    def __init__(self, agent: Callable[..., Any], *, score: Callable[[Any, Any], Any], max_turns: int = 8,
                 max_tokens: int = 64, timeout_s: float = 600.0, concurrency: int = 8,
                 temperature: float | None = None, top_p: float | None = None, policy: Any = None,
                 seed: int | None = None) -> None:
        from ..limits import check_int

        self.agent, self.score = agent, score
        self.max_turns, self.max_tokens = check_int("max_turns", max_turns), check_int("max_tokens", max_tokens)
        self.concurrency = check_int("concurrency", concurrency)
        self.timeout_s, self.temperature, self.top_p, self.seed = timeout_s, temperature, top_p, seed
        self._given_policy, self._policy, self._chat = policy, None, None
        #: the rollouts of the last call (AgentRollout objects)
        self.last_rollouts: list = []

    def _gateway(self, trainer: Any) -> tuple[Gateway, Any]:
        """A gateway over the trainer's live model (the policy is made once per model object, as
        :class:`~agentfly_gym.bridges.trl.AgentFlyRollout` makes it), and that model."""
        from ..rollout.chat import ChatTokenizer

        model = trainer.accelerator.unwrap_model(trainer.model)
        tokenizer = getattr(trainer.processing_class, "tokenizer", trainer.processing_class)
        if self._given_policy is not None:
            policy = self._given_policy
        else:
            policy = self._policy = model_policy(model, tokenizer, self._policy, seed=self.seed,
                                                 max_batch_size=self.concurrency)
        if self._chat is None or self._chat.tokenizer is not tokenizer:
            kwargs = dict(getattr(trainer, "chat_template_kwargs", None) or {})
            self._chat = ChatTokenizer(tokenizer, chat_template_kwargs=kwargs)
        chat = self._chat
        sampling = trainer_sampling(trainer, max_tokens=self.max_tokens, temperature=self.temperature,
                                    top_p=self.top_p)
        return Gateway(policy, chat, max_turns=self.max_turns, max_tokens=self.max_tokens,
                       default_sampling=sampling), model

    async def aplay(self, gateway: Gateway, prompts: Sequence[Any]) -> list:
        """Run the agent on every prompt behind ``gateway`` (served for the call); the rollouts, in order."""
        async with serve_gateway(gateway) as url:
            return await run_agents(gateway, self.agent, [prompt_task(p) for p in prompts], base_url=url,
                                    concurrency=self.concurrency, timeout_s=self.timeout_s, score=self.score)

    def __call__(self, prompts: list, trainer: Any) -> dict[str, list]:
        """One agent run per prompt; returns TRL's rollout dict (lists of length ``len(prompts)``)."""
        from ..utils.aio import run_sync

        gateway, model = self._gateway(trainer)
        was_training = bool(getattr(model, "training", False))
        if was_training:
            model.eval()
        try:
            rollouts = run_sync(self.aplay(gateway, prompts))
        finally:
            if was_training:
                model.train()
        self.last_rollouts = rollouts
        rows = []
        for r in rollouts:
            rows.append(segment_rows([r])[-1])  # its one chain, or its last segment (a rewritten history)
        out = AgentFlyRollout.to_trl(rows, gateway.chat)
        out["gateway_segments"] = [len(r.segments) for r in rollouts]
        return out

    def close(self) -> None:
        """Stop the policy's worker thread if this rollout made the policy.  Idempotent."""
        if self._policy is not None:
            self._policy.close()
            self._policy = None
