"""Evaluation: every chosen task of one or more environments played k times by a policy (a local model, a
scripted baseline or an OpenAI-compatible endpoint), scored with pass@1..k (Chen et al. 2021's unbiased
estimator), success and mean reward with 95% bootstrap intervals, infrastructure errors counted apart, saved
and resumable.  ``agentfly-gym eval`` is its command (:mod:`agentfly_gym.cli.eval`).

* :mod:`.stats`: :func:`~.stats.pass_at_k`, :func:`~.stats.bootstrap_ci`;
* :mod:`.plan`: which tasks (``--tasks``, ``--split``): :func:`~.plan.plan_tasks`;
* :mod:`.run`: :class:`~.run.EvalConfig`, :func:`~.run.arun_eval` (play, save as it goes, resume);
* :mod:`.results`: the ``results.json`` dict; :mod:`.report`: ``report.md`` and its plot.
"""

from .plan import EnvTasks, parse_tasks, plan_tasks
from .run import EvalConfig, EvalResult, arun_eval
from .stats import bootstrap_ci, pass_at_k

__all__ = ["EnvTasks", "EvalConfig", "EvalResult", "arun_eval", "bootstrap_ci", "parse_tasks", "pass_at_k",
           "plan_tasks"]
