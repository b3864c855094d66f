"""``agentfly-gym rollout``: roll out trajectories of one or more environments with a policy, save them and
print a summary (multi-agent environments: games, with ``--opponent``)."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import signal
import sys
from typing import Any

__all__ = ["add_rollout_parser", "cmd_rollout"]


def add_rollout_parser(sub: Any) -> argparse.ArgumentParser:
    """Add the ``rollout`` subcommand and its flags to ``sub`` (an ``add_subparsers()`` result)."""
    r = sub.add_parser("rollout", help="roll out trajectories and save them with a summary",
                       epilog="-v logs one line per finished trajectory, -vv everything (anywhere on the line). "
                              "Ctrl-C / SIGTERM saves the finished trajectories (summary: interrupted=true).")
    r.add_argument("--env", action="append", required=True,
                   help="environment id, e.g. Chess-v0 or agentfly/ScienceWorld-v0, or a function of your own module "
                        "that registers one and returns its id, e.g. mypkg.tasks:make_env (repeatable; groups "
                        "alternate)")
    r.add_argument("--policy", default="smollm2",
                   help="smollm2 (bundled CPU model), tiny-qwen, random, expert, a local model folder, or "
                        "openai:MODEL (an OpenAI-compatible endpoint: --base-url, --api-key-env; chain mode)")
    r.add_argument("--split", default=None, help="the task split of envs that have splits (default: the env's)")
    r.add_argument("--tasks", default=None,
                   help="all, N (the split's first N tasks) or task ids separated by commas: group i of an env plays "
                        "its i-th task (cycling once all were played); default: each group draws its task from its "
                        "seed")
    r.add_argument("--opponent", default=None,
                   help="multi-agent envs (ChessSelfPlay-v0): the other side's policy (same names as --policy); "
                        "default: --policy plays both sides (self-play). -n counts games there, --max-turns is per player")
    r.add_argument("--tokenizer", default=None, help="tokenizer for scripted policies: smollm2 (default), qwen3, or a folder")
    r.add_argument("-n", "--num-trajectories", type=int, default=8)
    r.add_argument("--group-size", type=int, default=1, help="trajectories per task (GRPO group)")
    r.add_argument("--concurrency", type=int, default=8, help="trajectories in flight at once")
    r.add_argument("--batch-size", "--max-batch-size", dest="batch_size", type=int, default=16,
                   help="most generation requests batched together (model policies)")
    r.add_argument("--device", default="cpu",
                   help="torch device of a model policy: cpu (default), cuda, cuda:1, ...")
    r.add_argument("--dtype", default="auto",
                   help="dtype of a model policy's weights: auto (default: bfloat16 on a GPU that supports it, else "
                        "the model folder's), float32, bfloat16, float16")
    r.add_argument("--max-turns", type=int, default=8)
    r.add_argument("--max-tokens", type=int, default=64, help="new tokens per turn")
    r.add_argument("--max-context-tokens", type=int, default=None)
    r.add_argument("--temperature", type=float, default=1.0)
    r.add_argument("--top-p", type=float, default=1.0)
    r.add_argument("--seed", type=int, default=None,
                   help="group g resets with seed SEED+g (default 0; with --append, the seed after the highest one in "
                        "--output-dir's run, so the appended episodes are new ones; an explicit --seed that replays "
                        "seeds already there is honoured, with a warning)")
    r.add_argument("--mode", choices=("chain", "step"), default="chain",
                   help="chain: one token sequence per trajectory; step: a fresh prompt and one row per env step")
    r.add_argument("--history", type=int, default=3, help="step mode: past (action, observation) pairs per prompt")
    r.add_argument("--env-kwargs", default=None,
                   help='JSON: per env id, constructor kwargs, e.g. \'{"Chess-v0": {"mode": "play"}}\'')
    r.add_argument("--reward", default=None,
                   help="episode reward from configuration: 'judge:model=M,base_url=URL[,api_key_env=VAR,concurrency=4,"
                        "retries=3,combine=replace|add]' (an OpenAI-compatible API), 'judge:serve=transformers,"
                        "model=smollm2' (a local server), or 'MODULE:FUNCTION' (FUNCTION(trajectory) -> float)")
    r.add_argument("--output-dir", default=None,
                   help="where trajectories and summary.json go (default: a new folder runs/<UTC date-time>); a "
                        "folder that holds a run is refused unless --overwrite or --append is given")
    onto = r.add_mutually_exclusive_group()
    onto.add_argument("--overwrite", action="store_true",
                      help="replace the run in --output-dir, once this run is complete (an interrupted run never "
                           "replaces a complete one: it goes to --output-dir/interrupted)")
    onto.add_argument("--append", action="store_true",
                      help="add this run's trajectories to the run in --output-dir (ids continue after its ids, "
                           "and so do the seeds unless --seed is given)")
    r.add_argument("--order", choices=("longest", "arrival"), default="longest",
                   help="longest (default): start the trajectories predicted to run longest first, from the lengths "
                        "earlier runs into --output-dir kept in its lengths.json (updated by this run; nothing known: "
                        "arrival order); arrival: start them in order (lengths.json is still updated, so a later "
                        "longest run benefits)")
    r.add_argument("--no-progress", action="store_true")
    from .eval import add_endpoint_arguments

    add_endpoint_arguments(r)
    r.set_defaults(func=cmd_rollout)
    return r


def _print_summary(summary: dict[str, Any]) -> None:
    from ..utils.console import console
    from rich.table import Table

    res = summary["resources"]
    t = Table(title=f"rollout summary ({summary.get('mode', 'chain')} mode)")
    t.add_column("metric")
    t.add_column("value", justify="right")
    rows = [
        ("trajectories", summary["trajectories"]),
        ("success rate", f"{summary['success_rate']:.1%}"),
        ("mean reward", f"{summary['mean_reward']:.3f}"),
        ("mean turns", f"{summary['mean_turns']:.2f}"),
        ("sampled tokens", summary["sampled_tokens"]),
        ("total tokens", summary["total_tokens"]),
        ("errors", summary["errors"]),
        ("reward errors", summary.get("reward_errors", 0)),
        ("wall time (s)", f"{summary['wall_s']:.1f}"),
        ("trajectories / s", f"{summary['trajectories_per_s']:.3f}"),
        ("resource starts", res["started"]),
        ("resource reuses", res["reused"]),
        ("max resources in use", res["max_in_use"]),
        ("mean acquire wait (s)", f"{res['mean_acquire_wait_s']:.3f}"),
    ]
    for k, v in rows:
        t.add_row(k, str(v))
    console().print(t)
    if len(summary.get("per_env", {})) > 1:
        pe = Table(title="per environment")
        for col in ("env", "trajectories", "success", "mean reward", "mean turns", "errors"):
            pe.add_column(col)
        for env_id, s in summary["per_env"].items():
            pe.add_row(env_id, str(s["trajectories"]), f"{s['success_rate']:.1%}", f"{s['mean_reward']:.3f}",
                       f"{s['mean_turns']:.2f}", str(s["errors"]))
        console().print(pe)


def cmd_rollout(args: argparse.Namespace) -> int:
    fresh = args.output_dir is None  # a new runs/<date-time> folder: removed again if the run wrote nothing
    try:
        return _cmd_rollout(args)
    finally:
        if fresh and args.output_dir is not None:
            from pathlib import Path

            from ..rollout.outputs import LOCK_NAME

            folder = Path(args.output_dir)
            if folder.is_dir() and all(p.name == LOCK_NAME for p in folder.iterdir()):
                import shutil

                shutil.rmtree(folder, ignore_errors=True)
                try:
                    folder.parent.rmdir()  # runs/, when this run made it and nothing else is there
                except OSError:
                    pass


def _cmd_rollout(args: argparse.Namespace) -> int:
    from ..errors import ConfigError
    from ..rollout.policies.base import SamplingParams
    from ..rollout.runner import RolloutConfig, check_config, run_rollouts
    from ..utils.jsonargs import json_object

    env_kwargs = json_object(args.env_kwargs, "--env-kwargs") if args.env_kwargs else {}
    if not all(isinstance(v, dict) for v in env_kwargs.values()):
        raise ConfigError('--env-kwargs must map env ids to keyword dicts, e.g. \'{"Chess-v0": {"mode": "play"}}\'')
    if _is_multiagent(args.env):
        if args.tasks is not None or args.split is not None or args.policy.startswith("openai:") or \
                (args.opponent or "").startswith("openai:"):
            raise ConfigError("multi-agent games take no --tasks, --split or openai:MODEL policy (their turn loop is "
                              "over token ids)")
        args.seed = 0 if args.seed is None else args.seed  # games are never appended (refused)
        return _rollout_multiagent(args, env_kwargs)
    _resolve_seed(args)
    from ..registration import normalize_env_id

    env_kwargs = {normalize_env_id(k): dict(v) for k, v in env_kwargs.items()}
    # random picks among info["admissible_actions"], which ScienceWorld lists only on request
    if args.policy == "random" and "agentfly/ScienceWorld-v0" in map(normalize_env_id, args.env):
        env_kwargs.setdefault("agentfly/ScienceWorld-v0", {}).setdefault("with_admissible_actions", True)
    tasks = _plan_tasks(args, env_kwargs)
    config = RolloutConfig(
        env_ids=args.env, tasks=tasks, num_trajectories=args.num_trajectories, group_size=args.group_size,
        concurrency=args.concurrency, max_turns=args.max_turns, seed=args.seed, mode=args.mode, history=args.history,
        sampling=SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p),
        max_context_tokens=args.max_context_tokens, env_kwargs=env_kwargs, output_dir=args.output_dir,
        reward=args.reward, if_exists=_if_exists(args), order=args.order)
    config.output_dir = _output_dir(args)  # once the arguments are known to be good
    check_config(config)  # fail on a typo before the model is loaded
    policy, chat = _make_policy(args, args.policy, seed=args.seed)

    try:
        result = _run_interruptible(lambda: run_rollouts(config, policy, chat, progress=not args.no_progress),
                                    config.output_dir)
    finally:
        close = getattr(policy, "close", None)
        if callable(close):
            close()
    if isinstance(result, int):
        return result
    _print_summary(result.summary)
    for kind, path in result.paths.items():
        print(f"{kind}: {path}")
    s = result.summary
    for warning in s.get("warnings", []):
        print(f"agentfly-gym: WARNING: {warning}", file=sys.stderr)
    if s["trajectories"] and s["errors"] == s["trajectories"]:
        first = next(t.error for t in result.trajectories if t.error)
        print(f"agentfly-gym: every trajectory failed; the first error: {first}", file=sys.stderr)
        return 1
    return 0


def _make_policy(args: argparse.Namespace, name: str, *, seed: int | None) -> tuple[Any, Any]:
    """``make_policy`` with the endpoint flags (refused for a policy that is no endpoint, and an endpoint in step
    mode, before anything runs).

    Raises:
        ConfigError: see above, or what ``make_policy`` refuses.
    """
    from ..errors import ConfigError
    from ..rollout.policies.factory import make_policy
    from .eval import endpoint_options

    endpoint = name.startswith("openai:")
    if endpoint and args.mode != "chain":
        raise ConfigError(f"--policy {name} is an endpoint (messages in, a reply out): it plays --mode chain only")
    if not endpoint:
        return make_policy(name, tokenizer=args.tokenizer, seed=seed, max_batch_size=args.batch_size,
                           device=args.device, dtype=args.dtype, base_url=args.base_url, api_key_env=args.api_key_env)
    return make_policy(name, base_url=args.base_url, api_key_env=args.api_key_env,
                       endpoint_options=endpoint_options(args))


def _plan_tasks(args: argparse.Namespace, env_kwargs: dict[str, Any]) -> dict[str, list[str]] | None:
    """``--tasks`` / ``--split``: per env its task ids (``--split`` alone goes into each env's kwargs that takes it).
    Sets the split into ``env_kwargs``.

    Raises:
        ConfigError: what :func:`~agentfly_gym.eval.plan.plan_tasks` refuses (an unknown task, a split of an env
            without splits, ``--tasks all`` on an env that lists none).
    """
    if args.tasks is None and args.split is None:
        return None
    from ..eval.plan import plan_tasks
    from ..registration import normalize_env_id

    out: dict[str, list[str]] = {}
    for env in args.env:
        env_id = normalize_env_id(env)
        plan = plan_tasks(env_id, args.tasks or "all", split=args.split, env_kwargs=env_kwargs.get(env_id),
                          default_split=None)
        if plan.split is not None:
            env_kwargs.setdefault(env_id, {})["split"] = plan.split
        if args.tasks is not None and not plan.seeded:
            out[env_id] = plan.tasks
    return out or None


def _run_interruptible(make_run: Any, output_dir: Any) -> Any:
    """``asyncio.run(make_run())``, where the first Ctrl-C or SIGTERM cancels the run (which saves the finished
    trajectories, then releases its resources) and a repeated one is answered with a line.  Returns the run's
    result, or the exit status (128 + the signal) of an interrupted run."""
    received: list[int] = []

    async def run() -> Any:
        task = asyncio.current_task()
        loop = asyncio.get_running_loop()

        def interrupt(signum: int) -> None:
            # the first Ctrl-C or SIGTERM cancels the run (it saves what finished, then releases resources); a
            # repeated one must not break into that save or the tear-down
            if received:
                print("agentfly-gym: already stopping (saving finished trajectories, releasing resources)",
                      file=sys.stderr)
                return
            received.append(signum)
            task.cancel()

        loop.add_signal_handler(signal.SIGTERM, interrupt, signal.SIGTERM)
        if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
            loop.add_signal_handler(signal.SIGINT, interrupt, signal.SIGINT)
        return await make_run()

    try:
        return asyncio.run(run())
    except (KeyboardInterrupt, asyncio.CancelledError):
        _answer_repeated_ctrl_c()
        print(f"agentfly-gym: interrupted; finished trajectories (if any) were saved in {output_dir} (in "
              f"its interrupted/ when it held a complete run, which is kept)", file=sys.stderr)
        return _signal_status(received[0] if received else signal.SIGINT)


def _answer_repeated_ctrl_c() -> None:
    """Once the run has stopped, a further Ctrl-C (while the process ends: its threads are joined at interpreter
    exit) is answered with a line, not a ``KeyboardInterrupt`` traceback from the interpreter's shutdown."""
    def answer(signum: int, frame: Any) -> None:
        print("agentfly-gym: already stopping (releasing resources)", file=sys.stderr)

    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        signal.signal(signal.SIGINT, answer)


def _signal_status(signum: int) -> int:
    """The shell's exit status of a run stopped by ``signum``: 128 + its number (SIGINT 130, SIGTERM 143)."""
    return 128 + int(signum)


def _played_seeds(output_dir: Any) -> set[int]:
    """The reset seeds of the trajectories of the run in ``output_dir`` (empty when it holds none, or none that
    loads: appending to a run that does not load is refused later, with its own message)."""
    from pathlib import Path

    path = Path(output_dir) / "trajectories.parquet"
    if not path.is_file():
        return set()
    try:
        import pyarrow.parquet as pq

        seeds = pq.read_table(path, columns=["seed"]).column("seed").to_pylist()
    except Exception:  # noqa: BLE001 - unreadable or without a seed column: the append's own check reports it
        return set()
    return {int(s) for s in seeds if s is not None}


def _resolve_seed(args: argparse.Namespace) -> None:
    """Set ``args.seed``: without ``--seed`` 0, or with ``--append`` one more than the highest seed of the run in
    ``--output-dir`` (appended episodes are new ones, not the first run's again); an explicit ``--seed`` that would
    replay seeds of that run is kept, with a one-line warning.  Group ``g`` resets with seed ``args.seed + g``."""
    from ..data.task_draw import check_seed
    from ..errors import ConfigError

    played = _played_seeds(args.output_dir) if args.append and args.output_dir is not None else set()
    groups = -(-max(1, args.num_trajectories) // max(1, args.group_size))
    explicit = args.seed is not None
    if not explicit:
        args.seed = max(played) + 1 if played else 0
    check_seed(args.seed, "--seed" if explicit else "the seed after the run's")
    if args.seed + groups - 1 >= 2**63:
        raise ConfigError(f"seed {args.seed} with {groups} groups: the last group's seed is past 2**63 - 1")
    again = sorted(s for s in played if args.seed <= s < args.seed + groups) if explicit else []
    if again:
        print(f"agentfly-gym: WARNING: --seed {args.seed} replays {len(again)} seed(s) the run in {args.output_dir} "
              f"already played ({again[0]}..{again[-1]}); leave --seed out to continue after its seeds "
              f"(next: {max(played) + 1})", file=sys.stderr)


def _if_exists(args: argparse.Namespace) -> str:
    return "replace" if args.overwrite else "append" if args.append else "fail"


def _output_dir(args: argparse.Namespace) -> Any:
    """``--output-dir``, or a new folder ``runs/<UTC date-time>`` for this run."""
    if args.output_dir is None:
        from ..rollout.outputs import fresh_run_dir

        args.output_dir = str(fresh_run_dir("runs"))
    return args.output_dir


# ----------------------------------------------------------------------------- multi-agent rollout
def _is_multiagent(env_ids: list[str]) -> bool:
    """True when the (single) env id names a multi-agent env, e.g. ChessSelfPlay-v0.

    Raises:
        ConfigError: a multi-agent env is mixed with other envs.
    """
    from ..errors import ConfigError
    from ..registration import normalize_multiagent_id

    def multi(e: str) -> bool:
        try:
            normalize_multiagent_id(e)
        except ConfigError:
            return False
        return True

    flags = [multi(e) for e in env_ids]
    if any(flags) and len(env_ids) > 1:
        raise ConfigError(f"--env {env_ids}: a multi-agent environment is rolled out on its own")
    return any(flags)


def _rollout_multiagent(args: argparse.Namespace, env_kwargs: dict[str, Any]) -> int:
    from ..utils.console import console
    from rich.table import Table

    from ..limits import EpisodeLimits
    from ..rollout.multiagent import MultiAgentConfig, run_multiagent_rollouts
    from ..rollout.policies.base import SamplingParams
    from ..rollout.policies.factory import make_policy

    env_id = args.env[0]
    kwargs: dict[str, Any] = {}
    for k, v in env_kwargs.items():
        if k.split("/", 1)[-1].removesuffix("-v0") != env_id.split("/", 1)[-1].removesuffix("-v0"):
            from ..errors import ConfigError

            raise ConfigError(f"--env-kwargs names {k!r}, which is not rolled out (--env {env_id})")
        kwargs.update(v)
    sampling = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p)
    config = MultiAgentConfig(  # bad numbers fail before a folder is made or a model loaded
        num_games=args.num_trajectories, concurrency=args.concurrency, mode=args.mode, sampling=sampling,
        limits=EpisodeLimits(max_turns=args.max_turns, max_context_tokens=args.max_context_tokens, history=args.history),
        seed=args.seed, env_kwargs=kwargs, if_exists=_if_exists(args))
    output_dir = _output_dir(args)
    config = dataclasses.replace(config, output_dir=output_dir)
    policy, chat = make_policy(args.policy, tokenizer=args.tokenizer, seed=args.seed, max_batch_size=args.batch_size,
                               device=args.device, dtype=args.dtype)
    opponent = opp_chat = None
    if args.opponent:
        opponent, opp_chat = make_policy(args.opponent, tokenizer=args.tokenizer, seed=args.seed + 1,
                                         max_batch_size=args.batch_size, device=args.device, dtype=args.dtype)
    try:
        # the same Ctrl-C / SIGTERM handling as single-agent runs: the finished games are saved
        result = _run_interruptible(lambda: run_multiagent_rollouts(
            env_id, policy, chat, config=config, opponent=opponent, opponent_chat=opp_chat,
            progress=not args.no_progress), output_dir)
    finally:
        for p in (policy, opponent):
            close = getattr(p, "close", None)
            if callable(close):
                close()
    if isinstance(result, int):
        return result
    g = result.summary["games"]
    t = Table(title=f"{env_id} ({args.mode} mode, {'self-play' if opponent is None else 'vs ' + args.opponent})")
    t.add_column("metric")
    t.add_column("value", justify="right")
    for k, v in [("games", g["games"]), ("white wins", g["white_wins"]), ("black wins", g["black_wins"]),
                 ("draws", g["draws"]), ("no result (move/turn cap)", g["no_result"]), ("failed games", g["failed"]),
                 ("illegal-move rate", f"{g['illegal_move_rate']:.1%}")] + \
            [(f"illegal-move rate ({a})", f"{s['illegal_move_rate']:.1%}") for a, s in g["per_agent"].items()] + \
            [("sampled tokens", result.summary["sampled_tokens"]), ("wall time (s)", f"{result.summary['wall_s']:.1f}")]:
        t.add_row(k, str(v))
    console().print(t)
    for kind, path in result.paths.items():
        print(f"{kind}: {path}")
    return 1 if g["games"] and g["failed"] == g["games"] else 0
