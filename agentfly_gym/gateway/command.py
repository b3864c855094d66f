"""A command-line agent run inside the rollout's container, talking to its gateway session.

A sandbox has a network namespace of its own (loopback only, or outbound-only user-mode networking): it cannot
reach the host's 127.0.0.1, by design.  The gateway comes in as a Unix socket instead (``serve_gateway(...,
uds=PATH)``, PATH's folder mounted into the container read-only: :func:`gateway_mount`), and a small relay
(standard-library Python, copied into the container) listens on 127.0.0.1:``port`` inside and forwards each
connection to the socket.  The agent's command runs as the relay's child with ``OPENAI_BASE_URL`` (its session's
``/sessions/{id}/v1`` on that port), ``OPENAI_API_KEY`` (the session's key), ``AGENTFLY_TASK`` (the task as JSON)
and ``AGENTFLY_TASK_FILE`` (the same JSON in a file), so any agent that honours the OpenAI SDK's variables (the
``openai`` client reads both) runs unchanged.  Its standard output is the answer.

The session's key is the only secret it holds: the socket serves the gateway's API only, and another session's
data needs that session's key.
"""

from __future__ import annotations

import json
import os
import shlex
from typing import Any
from urllib.parse import urlsplit

from ..errors import AgentFlyError, ConfigError

__all__ = ["RELAY", "CommandFailed", "command_agent", "gateway_mount"]

#: Where :func:`gateway_mount` shows the socket's folder inside a container.
SOCKET_DIR = "/run/agentfly-gateway"

#: The relay (run by the container's python3): ``relay.py SOCKET PORT -- COMMAND...``; exits with the command's
#: status.
RELAY = r'''
import asyncio, os, sys

SOCK, PORT, CMD = sys.argv[1], int(sys.argv[2]), sys.argv[4:]


async def pipe(reader, writer):
    try:
        while True:
            data = await reader.read(65536)
            if not data:
                break
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        writer.close()


async def handle(reader, writer):
    try:
        ur, uw = await asyncio.open_unix_connection(SOCK)
    except OSError:
        writer.close()
        return
    await asyncio.gather(pipe(reader, uw), pipe(ur, writer))


async def main():
    server = await asyncio.start_server(handle, "127.0.0.1", PORT)
    async with server:
        proc = await asyncio.create_subprocess_exec(*CMD)
        return await proc.wait()


sys.exit(asyncio.run(main()))
'''


class CommandFailed(AgentFlyError, RuntimeError):
    """The agent's command exited with a non-zero status or ran past its time limit (the rollout's error)."""


def gateway_mount(uds: str | os.PathLike) -> Any:
    """The :class:`~agentfly_gym.resources.spec.Mount` that shows the folder of the gateway's socket ``uds`` at
    ``/run/agentfly-gateway`` (read-only: a socket can be connected to on a read-only mount) for a container spec's
    ``mounts``.  Put the socket in a folder of its own: the whole folder is visible inside."""
    from ..resources.spec import Mount

    return Mount(source=os.path.dirname(os.path.abspath(os.fspath(uds))), target=SOCKET_DIR, read_only=True)


def command_agent(command: str | list[str], *, uds: str | os.PathLike, port: int = 18080, timeout_s: float = 600.0,
                  workdir: str | None = None, python: str = "python3", container_key: str = "container") -> Any:
    """An agent (for :func:`~.agents.run_agent`) that runs ``command`` in the rollout's container.

    Args:
        command: a shell command (run by ``sh -c``) or an argv list.
        uds: the gateway's Unix socket on the host (``serve_gateway(..., uds=uds)``); its folder must be mounted
            with :func:`gateway_mount` in the container's spec.
        port: the port the relay listens on inside the container (127.0.0.1).
        timeout_s: the command's time limit in seconds (the container's exec kills it past that).
        workdir: the command's working folder (default: the container spec's).
        python: the container's Python, which runs the relay (standard library only).
        container_key: the resource keyword that carries the container (``run_agent(..., resources={key: box})``).

    Returns:
        ``async agent(base_url, api_key, task, **resources) -> the command's output``; it raises
        :class:`CommandFailed` on a non-zero exit or a time-out (``run_agent`` makes that an error rollout).

    Raises:
        ConfigError: a bad ``port`` or ``timeout_s``.
    """
    from ..limits import check_int
    from .agents import check_timeout

    port = check_int("port", port, maximum=65535)
    check_timeout(timeout_s)
    argv = ["sh", "-c", command] if isinstance(command, str) else list(command)
    inner_sock = f"{SOCKET_DIR}/{os.path.basename(os.fspath(uds))}"

    async def agent(base_url: str, api_key: str, task: Any, **resources: Any) -> str:
        box = resources.get(container_key)
        if box is None:
            raise ConfigError(f"command_agent needs the rollout's container as resources[{container_key!r}]")
        url = f"http://127.0.0.1:{port}{urlsplit(base_url).path}"
        task_json = json.dumps(task, default=str)
        await box.put_files({"/tmp/agentfly_gateway_relay.py": RELAY, "/tmp/agentfly_task.json": task_json})
        cmd = [python, "/tmp/agentfly_gateway_relay.py", inner_sock, str(port), "--", *argv]
        env = {"OPENAI_BASE_URL": url, "OPENAI_API_KEY": api_key, "AGENTFLY_TASK": task_json,
               "AGENTFLY_TASK_FILE": "/tmp/agentfly_task.json"}
        r = await box.exec(cmd, timeout=float(timeout_s), workdir=workdir, env=env)
        if r.timed_out:
            raise CommandFailed(f"the command ran past its time limit of {timeout_s:g} s: {r.output[-1000:]}")
        if r.exit_code != 0:
            raise CommandFailed(f"the command {shlex.join(argv)[:200]} exited with status {r.exit_code}: "
                                f"{r.output[-2000:]}")
        return r.output

    return agent
