"""``agentfly-gym eval``: evaluate a model (a local folder, a bundled name, a scripted baseline or an
OpenAI-compatible endpoint) on one or more environments: every chosen task played k times, pass@1..k, success and
mean reward with 95% bootstrap intervals, a table, and results.json / trajectories / report.md in --output-dir
(a re-run into the same folder plays only what is missing)."""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

__all__ = ["add_endpoint_arguments", "add_eval_parser", "cmd_eval", "endpoint_options"]


def add_endpoint_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of an ``openai:MODEL`` endpoint policy (shared by ``eval`` and ``rollout``)."""
    g = p.add_argument_group("endpoint (openai:MODEL)")
    g.add_argument("--base-url", default=None,
                   help="the endpoint's API root, e.g. http://127.0.0.1:8000/v1 (default: $OPENAI_BASE_URL, else "
                        "OpenAI's API)")
    g.add_argument("--api-key-env", default=None, metavar="VAR",
                   help="the environment variable holding the endpoint's key (never written to any file or log)")
    g.add_argument("--token-ids", action="store_true",
                   help="ask for vLLM's return_token_ids and logprobs (trainable trajectories); without it the "
                        "trajectories are text-only")
    g.add_argument("--request-timeout", type=float, default=120.0, help="seconds per request attempt")
    g.add_argument("--max-retries", type=int, default=4, help="retries after 429, 5xx, connection errors, timeouts")
    g.add_argument("--requests-per-second", type=float, default=None, help="a client-side request-rate limit")


def endpoint_options(args: argparse.Namespace) -> dict[str, Any]:
    """The :class:`~agentfly_gym.rollout.policies.endpoint_policy.EndpointPolicy` arguments of the flags above."""
    return {"timeout": args.request_timeout, "max_retries": args.max_retries,
            "requests_per_second": args.requests_per_second, "token_ids": args.token_ids}


def add_eval_parser(sub: Any) -> argparse.ArgumentParser:
    """Add the ``eval`` subcommand and its flags to ``sub`` (an ``add_subparsers()`` result)."""
    e = sub.add_parser("eval", help="evaluate a model on environments: pass@k, success, mean reward with intervals",
                       description=__doc__.split("\n\n")[0],
                       epilog="A sample that ends in an infrastructure error (a dead container, an endpoint failing "
                              "after its retries) is counted apart, never as reward 0, and is played again by a "
                              "re-run into the same --output-dir.")
    e.add_argument("--env", action="append", required=True,
                   help="environment id (e.g. ScienceWorld-v0), or mypkg.tasks:make_env (a function registering a "
                        "tool env with make_tool_env and returning its id); repeatable")
    e.add_argument("--model", default="smollm2",
                   help="smollm2 (bundled CPU model), tiny-qwen, a local model folder, random, expert, or "
                        "openai:MODEL with --base-url and --api-key-env")
    e.add_argument("--split", default=None, help="the task split (default: test where an env has splits)")
    e.add_argument("--tasks", default="all",
                   help="all (default), N (the split's first N tasks; seeds 0..N-1 for an env that lists none), or "
                        "task ids separated by commas")
    e.add_argument("-k", "--samples", dest="k", type=int, default=1, help="samples per task (pass@1..k)")
    e.add_argument("--max-concurrency", type=int, default=8, help="episodes in flight at once")
    e.add_argument("--output-dir", default=None,
                   help="where results.json, the trajectories and report.md go (default: a new folder "
                        "evals/<UTC date-time>); a folder holding this evaluation is resumed")
    e.add_argument("--max-turns", type=int, default=10)
    e.add_argument("--max-tokens", type=int, default=256, help="new tokens per reply")
    e.add_argument("--temperature", type=float, default=1.0)
    e.add_argument("--top-p", type=float, default=1.0)
    e.add_argument("--seed", type=int, default=0, help="sample j of a task resets with seed SEED+j")
    e.add_argument("--env-kwargs", default=None, help='JSON: per env id, constructor kwargs')
    e.add_argument("--tokenizer", default=None, help="tokenizer for scripted policies: smollm2 (default), qwen3, a folder")
    e.add_argument("--batch-size", type=int, default=16, help="local models: most generation requests batched")
    e.add_argument("--no-progress", action="store_true")
    add_endpoint_arguments(e)
    e.set_defaults(func=cmd_eval)
    return e


def _pct(v: Any) -> str:
    return "-" if v is None else f"{100 * v:.1f}%"


def _print_results(results: dict[str, Any]) -> None:
    from rich.table import Table

    from ..eval.report import format_ci
    from ..utils.console import console

    k = int(results["k"])
    js = sorted({1, k})
    t = Table(title=f"eval: {results.get('model')} ({k} sample(s) per task, 95% bootstrap intervals)")
    for col in ["env", "tasks", "scored", "errors", *[f"pass@{j}" for j in js], "success", "mean reward"]:
        t.add_column(col, justify="left" if col == "env" else "right")
    rows = list(results["envs"].items())
    if len(rows) > 1:
        rows.append(("all", results["overall"]))
    for env_id, r in rows:
        t.add_row(env_id, str(r["tasks"]), str(r["scored_samples"]), str(r["errors"]),
                  *[_pct(r.get(f"pass@{j}")) for j in js], format_ci(r["success"], r["success_ci"], True),
                  format_ci(r["mean_reward"], r["mean_reward_ci"]))
    console().print(t)
    n_tasks = sum(r["tasks"] for r in results["envs"].values())
    if n_tasks <= 30:
        pt = Table(title="per task")
        for col in ["env", "task", "n", "successes", "errors", *[f"pass@{j}" for j in js], "mean reward"]:
            pt.add_column(col)
        for env_id, r in results["envs"].items():
            for task, x in r["per_task"].items():
                pt.add_row(env_id.rsplit("/", 1)[-1], task, str(x["n"]), str(x["c"]), str(x["errors"]),
                           *[_pct(x.get(f"pass@{j}")) for j in js], format_ci(x["mean_reward"], x["mean_reward_ci"]))
        console().print(pt)


def cmd_eval(args: argparse.Namespace) -> int:
    from ..errors import ConfigError
    from ..eval.plan import parse_tasks, plan_tasks
    from ..eval.run import EvalConfig, arun_eval
    from ..registration import normalize_env_id
    from ..rollout.policies.base import SamplingParams
    from ..rollout.policies.factory import make_policy
    from ..utils.jsonargs import json_object

    env_kwargs = json_object(args.env_kwargs, "--env-kwargs") if args.env_kwargs else {}
    if not all(isinstance(v, dict) for v in env_kwargs.values()):
        raise ConfigError('--env-kwargs must map env ids to keyword dicts, e.g. \'{"Chess-v0": {"mode": "play"}}\'')
    env_kwargs = {normalize_env_id(k): v for k, v in env_kwargs.items()}
    env_ids = [normalize_env_id(e) for e in args.env]
    unused = sorted(set(env_kwargs) - set(env_ids))
    if unused:
        raise ConfigError(f"--env-kwargs names environments that are not evaluated: {unused}")
    if args.max_turns < 1 or args.k < 1 or args.max_concurrency < 1:
        raise ConfigError("-k, --max-turns and --max-concurrency must be >= 1")
    tasks = parse_tasks(args.tasks)
    sampling = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p)
    plans = [plan_tasks(e, tasks, split=args.split, env_kwargs=env_kwargs.get(e)) for e in env_ids]
    if args.output_dir is None:
        from ..rollout.outputs import fresh_run_dir

        args.output_dir = str(fresh_run_dir("evals"))
    config = EvalConfig(plans=plans, k=args.k, model=args.model, max_concurrency=args.max_concurrency,
                        max_turns=args.max_turns, sampling=sampling, seed=args.seed, output_dir=args.output_dir)
    is_endpoint = args.model.startswith("openai:")
    # make_policy refuses --base-url / --api-key-env with a policy that is no endpoint, before loading a model
    policy, chat = make_policy(args.model, tokenizer=args.tokenizer, seed=args.seed, max_batch_size=args.batch_size,
                               base_url=args.base_url, api_key_env=args.api_key_env,
                               endpoint_options=endpoint_options(args) if is_endpoint else None)

    async def run() -> Any:
        try:
            return await arun_eval(config, policy, chat, progress=not args.no_progress)
        finally:
            aclose = getattr(policy, "aclose", None)
            if callable(aclose):
                await aclose()

    try:
        result = asyncio.run(run())
    except KeyboardInterrupt:
        print(f"agentfly-gym: interrupted; the finished samples are kept in {args.output_dir}; the same command "
              "plays the rest", file=sys.stderr)
        return 130
    finally:
        close = getattr(policy, "close", None)
        if callable(close) and not is_endpoint:
            close()
    _print_results(result.results)
    print(f"played now: {result.played} episode(s)")
    for kind, path in result.paths.items():
        print(f"{kind}: {path}")
    overall = result.results["overall"]
    if overall["samples"] and overall["errors"] == overall["samples"]:
        first = next(t.error for by in result.samples.values() for ts in by.values() for t in ts if t.error)
        print(f"agentfly-gym: every sample failed; the first error: {first}", file=sys.stderr)
        return 1
    return 0
