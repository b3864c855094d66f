"""Rollout: policies, chain/step rollout, token-ID trajectories, the concurrent runner.

Heavy modules (transformers) are imported only by the names that need them.
"""

from .policies import ActionPolicy, ExpertPolicy, Generation, RandomPolicy, SamplingParams, TextPolicy
from .chain import run_chain_episode
from .episode import play_episode
from .light_tokenizer import LightTokenizer, load_tokenizer
from .runner import RolloutConfig, RolloutResult, run_rollouts
from .tasks import TaskRow, TaskRunner
from .trajectory import Trajectory, Turn, load_trajectories, save_trajectories

__all__ = [
    "ActionPolicy", "ExpertPolicy", "Generation", "LightTokenizer", "RandomPolicy", "RolloutConfig", "RolloutResult",
    "SamplingParams", "TaskRow", "TaskRunner", "TextPolicy", "Trajectory", "Turn", "load_tokenizer", "load_trajectories", "play_episode",
    "run_chain_episode", "run_rollouts", "save_trajectories",
]
