"""Child process of the ALFWorld expert planner (run as a script, never imported by the library).

Run as ``python -P _plan_worker.py <parent pid>``; it exits as soon as that parent is gone.
Reads one JSON request from stdin: ``{"game": {...}, "game_file": str, "history": [str, ...]}``
(``game``: the game file's JSON as the simulator plays it, upgraded or not); loads the game
exactly as the simulator does (PddlEnv + ALFWorld's demangler), replays ``history``,
asks Fast Downward for a plan from that state (``PddlState.replan``, the source of ALFWorld's
``policy_commands`` / planner expert) and writes one JSON line to stdout:
``{"plan": [str, ...]}`` or ``{"error": str}``.  It runs in its own process so that a plan that
takes minutes or hundreds of MB can be timed out and its memory returned by killing it.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time


def _plan(game: dict, history: list[str]) -> dict:
    import textworld
    from alfworld.agents.environment.alfred_tw_env import AlfredDemangler, AlfredInfos
    from textworld.envs.pddl import PddlEnv

    env = AlfredInfos(AlfredDemangler(PddlEnv(textworld.EnvInfos(admissible_commands=True, won=True)), shuffle=False))
    env.load(game)
    state = env.reset()
    for i, command in enumerate(history):
        if command not in state["admissible_commands"]:
            return {"error": f"history command {i} {command!r} is not admissible when replayed"}
        state, _, _ = env.step(command)
    if state["won"]:
        return {"plan": []}
    pddl = env.unwrapped
    plan = pddl._pddl_state.replan(pddl._entity_infos)
    if not plan:
        return {"error": "Fast Downward found no plan from this state"}
    return {"plan": [str(c) for c in plan]}


def _die_with_parent(parent: int) -> None:
    """End this process as soon as ``parent`` (the library's process) is gone, so a plan that takes minutes
    and hundreds of MB never outlives it: the kernel's parent-death signal on Linux (it fires even while
    Fast Downward holds the GIL), and a thread that watches the parent pid everywhere."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent:  # the parent died before the signal was armed
        os._exit(1)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def main() -> int:
    if len(sys.argv) > 1:
        _die_with_parent(int(sys.argv[1]))
    request = json.loads(sys.stdin.read())
    try:
        result = _plan(request["game"], list(request.get("history", [])))
    except Exception as e:  # noqa: BLE001  (any failure is reported to the parent, which raises ExpertPlanError)
        result = {"error": f"{type(e).__name__}: {e}"}
    sys.stdout.write("\n" + json.dumps(result) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
