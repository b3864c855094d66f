"""What every driver shares: the task rows, the two tools, the per-rollout container of user code that has no
container pool, and the result record.  Standard library and docker-py only: this module is imported by the
drivers inside each peer's own virtual environment.

Workloads:

- ``container``: tool ``run(cmd)`` runs a shell command in the rollout's container (created at the rollout's first
  call, reused on its later turns, removed when it ends); the replay model asks for ``sleep <traced tool time>``.
- ``light``: tool ``lookup(key)`` reads a fixed table (no container, no process).

A driver prints one line ``RESULT <json>`` (:func:`emit`) with ``wall_s`` (first rollout started to last ended),
``trajectories`` (how many ended with the model's final answer), ``steps`` (rows ``[k, t, seconds]``: the env-side
time of trajectory k's tool call t, as the system's own API exposes it; empty where it exposes none), ``ids``
(trajectory k's turn t -> the token ids the trainer would get, where the system records them) and ``notes``.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

IMAGE = "agentfly/bench-peers:latest"
LABEL = "agentfly.bench-peers"
SYSTEM = "You are an agent. Call the tools you are given; answer in plain text when done."

TOOL_RUN = {"type": "function", "function": {
    "name": "run", "description": "Run a shell command in the task's container and return its output.",
    "parameters": {"type": "object", "properties": {"cmd": {"type": "string", "description": "the command"}},
                   "required": ["cmd"]}}}
TOOL_LOOKUP = {"type": "function", "function": {
    "name": "lookup", "description": "Look a key up in the task's table.",
    "parameters": {"type": "object", "properties": {"key": {"type": "string", "description": "the key"}},
                   "required": ["key"]}}}


def prompt(k: int) -> str:
    """Trajectory k's task prompt (the replay server reads ``TASK-<k>`` from it)."""
    return f"TASK-{k}: use the tools until the task is solved, then answer."


def lookup(key: str) -> str:
    """The light workload's tool: a pure function of ``key``."""
    h = sum(ord(c) * (i + 1) for i, c in enumerate(key)) % 1000
    return f"{key} = {h}"


class DockerBox:
    """A container for one rollout, the way user code without a pool writes it (docker-py): ``start()`` runs
    one, ``exec(cmd)`` runs a command in it, ``close()`` removes it."""

    def __init__(self, run_id: str) -> None:
        import docker

        self.client = docker.from_env(timeout=300)
        self.run_id = run_id
        self.container = None

    def start(self) -> None:
        self.container = self.client.containers.run(IMAGE, ["sleep", "infinity"], detach=True, network_disabled=True,
                                                    labels={LABEL: self.run_id})

    def exec(self, cmd: str) -> str:
        if self.container is None:
            self.start()
        code, out = self.container.exec_run(["/bin/sh", "-c", cmd])
        return out.decode(errors="replace")[-2000:] + ("" if code == 0 else f"\n(exit {code})")

    def close(self) -> None:
        if self.container is not None:
            try:
                self.container.remove(force=True)
            except Exception:  # noqa: BLE001, S110  (already gone: killed mid-episode)
                pass
            self.container = None


def parse_args() -> dict[str, Any]:
    """The driver's arguments: one JSON object in argv[1] (``url``, ``workload``, ``n``, ``total``, ``run_id``,
    ``turns`` (k -> turn count, for the loops a peer leaves to its user), ``config`` (the peer's settings))."""
    return json.loads(sys.argv[1])


def emit(result: dict[str, Any]) -> None:
    print("RESULT " + json.dumps(result), flush=True)


class Clock:
    def __init__(self) -> None:
        self.t0 = time.monotonic()

    def wall(self) -> float:
        return time.monotonic() - self.t0


def action_text(message: Any) -> str:
    """An OpenAI chat message (the SDK's object) as the text a text-in/text-out env steps on and a trainer
    re-tokenizes: its content, then its tool call as a Hermes ``<tool_call>`` block (the server's own rendering)."""
    text = message.content or ""
    for call in message.tool_calls or []:
        text += "\n<tool_call>\n" + json.dumps({"name": call.function.name,
                                               "arguments": json.loads(call.function.arguments)}) + "\n</tool_call>"
    return text


def parse_call(action: str) -> dict[str, Any] | None:
    """The tool call in an action text, or None for a final answer."""
    i = action.find("<tool_call>")
    if i < 0:
        return None
    j = action.find("</tool_call>", i)
    try:
        return json.loads(action[i + len("<tool_call>"): j if j > 0 else None])
    except ValueError:
        return None


class TextTask:
    """The env logic of one trajectory for the peers whose env is text in / text out (gem, skyrl-gym): ``step``
    runs the tool call in ``action`` and returns ``(observation, done, env_seconds)``."""

    def __init__(self, workload: str, run_id: str) -> None:
        self.workload, self.run_id = workload, run_id
        self.box: DockerBox | None = None

    def step(self, action: str) -> tuple[str, bool, float]:
        t0 = time.monotonic()
        call = parse_call(action)
        if call is None:
            self.close()
            return "", True, time.monotonic() - t0
        args = call.get("arguments") or {}
        if call.get("name") == "run":
            if self.box is None:
                self.box = DockerBox(self.run_id)
            obs = self.box.exec(str(args.get("cmd", "")))
        else:
            obs = lookup(str(args.get("key", "")))
        return obs, False, time.monotonic() - t0

    def close(self) -> None:
        if self.box is not None:
            self.box.close()
            self.box = None


def tools_for(workload: str) -> list[dict[str, Any]]:
    return [TOOL_RUN] if workload == "container" else [TOOL_LOOKUP]
