"""The ``agentfly-gym`` command.

Subcommands:
    rollout          roll out trajectories of one or more environments with a policy
    eval             evaluate a model (local, scripted or an OpenAI-compatible endpoint): pass@k with intervals
    envs             list the registered environments, where their data comes from and how many tasks
    images           build container images offline: build [names] | list | openenv [ENV_NAME]
    resources gc     reap containers and sandboxes left by dead managers
    r2e build-tasks  build the local R2E-Gym task set
    drift            measure re-tokenization drift on saved trajectories
    dataset          write a verl training dataset (needs the verl plugin); dataset check: tasks two data sets share
    data             the full public data sets: status | download NAME | verify NAME | precompute alfworld
    serve            serve an environment through OpenEnv's server interface (needs the openenv extra)
    gateway          serve a policy through an OpenAI-compatible API that records every session's token ids

Each command lives in its own module here (``cli/<command>.py``); library modules hold no argument parsing or
printing for the terminal.  ``python -m agentfly_gym`` runs the same command.
"""

from __future__ import annotations

import argparse
import logging
import re
import sys

from .envs import add_envs_parser
from .eval import add_eval_parser
from .rollout import add_rollout_parser

__all__ = ["main"]


# ----------------------------------------------------------------------------- delegated commands
#: command words -> (module, function taking the remaining argv list and returning an exit status)
DELEGATED: dict[tuple[str, ...], tuple[str, str, str]] = {
    ("images",): ("agentfly_gym.cli.images", "images_main", "build container images offline: images build [names] [--force] | list | openenv [ENV_NAME]"),
    ("resources", "gc"): ("agentfly_gym.cli.resources", "gc_main",
                          "remove containers and sandboxes left by dead managers: [--manager ID] [--older-than S] [--dry-run]"),
    ("r2e", "build-tasks"): ("agentfly_gym.cli.r2e", "build_tasks_main",
                             "build the local R2E-Gym task set from PyPI sdists: [--out DIR] [--force] [--only ID ...]"),
    ("drift",): ("agentfly_gym.cli.drift", "drift_main",
                 "measure what re-tokenizing saved trajectories would change: FILE [--tokenizer ...]"),
    ("dataset",): ("agentfly_gym_verl.dataset", "dataset_main", "write a verl training parquet for an environment: ENV -o OUT [options] | check A.parquet B.parquet ..."),
    ("data",): ("agentfly_gym.cli.data", "data_main",
                "the full public data sets: status | download NAME | verify NAME (resumable, checksummed) | precompute alfworld"),
    ("serve",): ("agentfly_gym.cli.serve", "serve_main",
                 "serve an environment to OpenEnv clients: --env ID --openenv [--port P] [--max-sessions N]"),
    ("gateway",): ("agentfly_gym.cli.gateway", "gateway_main",
                   "serve a policy through an OpenAI-compatible API recording token ids: --policy P [--port PORT]"),
}


def _run_delegated(argv: list[str]) -> int | None:
    from ..errors import ConfigError
    from ..utils.imports import load_object

    for words, (module, func, _) in DELEGATED.items():
        if tuple(argv[: len(words)]) == words:
            try:
                main = load_object(f"{module}:{func}", what="command")
            except ConfigError as e:
                print(f"agentfly-gym: '{' '.join(words)}' is not available: {e}", file=sys.stderr)
                return 2
            return int(main(argv[len(words):]) or 0)
    return None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="agentfly-gym", description=__doc__.split("\n\n")[0].replace("``", ""), allow_abbrev=False)
    p.add_argument("-v", "--verbose", action="count", default=0,
                   help="-v: INFO logging (e.g. one line per finished trajectory); -vv: DEBUG (accepted anywhere)")
    sub = p.add_subparsers(dest="command", required=True)

    add_rollout_parser(sub)

    add_eval_parser(sub)

    add_envs_parser(sub)

    groups: dict[str, argparse._SubParsersAction] = {}
    for words, (_, _, help_text) in DELEGATED.items():
        if len(words) == 1:
            sub.add_parser(words[0], help=help_text, add_help=False)
        else:
            if words[0] not in groups:
                groups[words[0]] = sub.add_parser(words[0], help=f"{words[0]} commands").add_subparsers(dest="sub")
            groups[words[0]].add_parser(words[1], help=help_text, add_help=False)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    # -v (progress: one line per finished trajectory, INFO) or -vv (DEBUG), anywhere on the line: no command
    # uses these flags for anything else
    def _v(a: str) -> int:
        return 1 if a == "--verbose" else len(a) - 1 if re.fullmatch(r"-v+", a) else 0

    verbosity = sum(_v(a) for a in argv)
    argv = [a for a in argv if not _v(a)]
    level = logging.DEBUG if verbosity >= 2 else logging.INFO if verbosity == 1 else logging.WARNING
    # -v shows this library's INFO lines only; other libraries stay at WARNING unless -vv
    logging.basicConfig(level=logging.DEBUG if verbosity >= 2 else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("agentfly_gym").setLevel(level)
    for handler in logging.getLogger().handlers:  # filter at the handler: some libraries force DEBUG on their loggers
        handler.setLevel(level)
    from ..errors import AgentFlyError
    from ..resources import teardown

    # the application's signal handler: a SIGTERM tears down what any manager started, then ends the process
    # (``rollout`` replaces it for its run with one that cancels the run and saves what finished)
    teardown.install()
    try:
        delegated = _run_delegated(argv)
        if delegated is not None:
            return delegated
        args = parser.parse_args(argv)
        if not hasattr(args, "func"):
            parser.parse_args([*argv, "--help"])
        return args.func(args)
    except AgentFlyError as e:
        print(f"agentfly-gym: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
