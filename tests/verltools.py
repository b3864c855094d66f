"""verl trainer configs for the plugin's tests."""

from __future__ import annotations

from pathlib import Path


def trainer_config(prompt_length: int, response_length: int, *, use_v1: bool = True):
    """verl's generated PPO trainer config (an OmegaConf ``DictConfig``) with the data lengths (tokens) set,
    ``trainer.use_v1`` as given and the plugin's agent-loop file registered."""
    import agentfly_gym_verl
    import verl
    from omegaconf import OmegaConf

    cfg = OmegaConf.load(Path(verl.__file__).parent / "trainer" / "config" / "_generated_ppo_trainer.yaml")
    cfg.data.max_prompt_length = prompt_length
    cfg.data.max_response_length = response_length
    cfg.trainer.use_v1 = use_v1
    cfg.actor_rollout_ref.rollout.agent.agent_loop_config_path = str(agentfly_gym_verl.config_path())
    return cfg
