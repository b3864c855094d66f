"""The commands of :class:`~.container.DockerContainer` (a mixin of it): ``exec`` and its host-side kill of a
command past its timeout."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid

from ....errors import ConfigError, ResourceDied, ResourceError
from ..api import DEFAULT_MAX_OUTPUT, ExecResult
from ..output import OutputBuffer
from .engine import docker_module
from .exec_stream import EngineError, exec_start_frames

__all__ = ["DockerExec"]

log = logging.getLogger(__name__)

_EXEC_MARK = "AGENTFLY_EXEC"
_KILL_GRACE = 5.0  # seconds past an exec's timeout before the host-side kill

# Kill every process whose environment holds the exec marker (host-side backstop of exec timeouts).
_KILL_MARKED = r"""
for n in 1 2 3; do
  for d in /proc/[0-9]*; do
    grep -qz "^$1\$" "$d/environ" 2>/dev/null && kill -s KILL "${d#/proc/}" 2>/dev/null
  done
done
exit 0
"""


def _consume_outcome(fut: asyncio.Future) -> None:
    if not fut.cancelled():
        fut.exception()


class DockerExec:
    """``exec`` of :class:`~.container.DockerContainer` (a mixin of it).

    It uses the container's ``id``, ``spec``, ``engine``, ``container_id``, ``_in_thread()``, ``_has_timeout``
    (the image has ``timeout``), ``_death_reason`` (set by the disk watchdog) and clears ``_fresh``.
    """

    async def exec(self, cmd: str | list[str], *, timeout: float = 60.0, workdir: str | None = None,
                   env: dict[str, str] | None = None, max_output: int = DEFAULT_MAX_OUTPUT,
                   user: str | None = None) -> ExecResult:
        """Run ``cmd`` in the container (see :meth:`ContainerResource.exec`).

        The command runs under ``timeout -s KILL <timeout>``, which kills its whole process group
        at the deadline (``exit_code=-1``, ``timed_out=True``); then every process that carries
        this exec's marker variable ``AGENTFLY_EXEC`` (descendants that left the group, e.g. via
        ``setsid``) is killed too.  The same marker kill is the backstop when the exec has not
        returned 5 seconds after the deadline, and runs when the awaiting task is cancelled.
        Background processes of a command that finished in time keep running (a server started
        by one call can serve the next); ``reset()`` kills them.  Output is read incrementally and
        only its head and tail are kept, so memory stays bounded.

        Raises:
            ConfigError: ``timeout`` or ``max_output`` is not positive, or ``cmd`` is empty.
            ResourceDied: the container is gone or not running.
        """
        if not timeout or timeout <= 0:
            raise ConfigError(f"timeout={timeout!r} must be > 0 seconds")
        if max_output < 1:
            raise ConfigError(f"max_output={max_output!r} must be >= 1 character")
        argv = ["/bin/sh", "-c", cmd] if isinstance(cmd, str) else [str(a) for a in cmd]
        if not argv or (isinstance(cmd, str) and not cmd.strip()):
            raise ConfigError("cmd must be a non-empty shell string or argv list")
        return await self._exec_async(argv, timeout=timeout, workdir=workdir, env=env, user=user,
                                      max_output=max_output, use_timeout=True)

    async def _exec_async(self, argv: list[str], *, timeout: float, workdir: str | None, env: dict[str, str] | None,
                          user: str | None, max_output: int, use_timeout: bool) -> ExecResult:
        mark = f"{_EXEC_MARK}={uuid.uuid4().hex}"
        fut = asyncio.get_running_loop().run_in_executor(
            self.engine.pool(), lambda: self._exec_sync(argv, timeout=timeout, workdir=workdir, env=env, user=user,
                                                    max_output=max_output, use_timeout=use_timeout, mark=mark))
        # a caller that gives up (cancelled, or the exec abandoned below) never awaits fut: its outcome (often
        # ResourceDied, the container being torn down on Ctrl-C) is consumed here, not printed as "Future
        # exception was never retrieved"
        fut.add_done_callback(_consume_outcome)
        try:
            return await asyncio.wait_for(asyncio.shield(fut), timeout + _KILL_GRACE)
        except TimeoutError:
            log.warning("%s: exec still running %.0fs past its timeout; killing it", self.id, _KILL_GRACE)
            await self._in_thread(self._kill_marked_sync, mark)
            try:
                return await asyncio.wait_for(asyncio.shield(fut), 10)
            except TimeoutError:
                log.warning("%s: exec did not end after the kill; abandoning its output", self.id)
                return ExecResult(exit_code=-1, output="", timed_out=True, duration=timeout + _KILL_GRACE + 10)
        except asyncio.CancelledError:
            # the caller gave up: kill the command instead of leaving it running
            self.engine.pool().submit(self._kill_marked_sync, mark)
            raise

    def _kill_marked_sync(self, mark: str) -> None:
        cid = self.container_id
        if cid is None:
            return
        try:
            api = self.engine.client().api
            eid = api.exec_create(cid, ["/bin/sh", "-c", _KILL_MARKED, "sh", mark], user="root")["Id"]
            api.exec_start(eid)
        except Exception:
            log.debug("killing marked processes in %s failed", self.id, exc_info=True)

    def _exec_sync(self, argv: list[str], *, timeout: float, workdir: str | None = None,
                   env: dict[str, str] | None = None, user: str | None = None,
                   max_output: int = DEFAULT_MAX_OUTPUT, use_timeout: bool = True,
                   mark: str | None = None) -> ExecResult:
        docker = docker_module()
        cid = self.container_id
        if cid is None:
            raise ResourceDied(f"{self.id} was released")
        if self._death_reason is not None:
            raise ResourceDied(f"{self.id}: {self._death_reason}")
        self._fresh = False
        api = self.engine.client().api
        environment = dict(env or {})
        if mark:
            k, _, v = mark.partition("=")
            environment[k] = v
        if use_timeout and self._has_timeout:
            argv = ["timeout", "-s", "KILL", f"{timeout:.3f}", *argv]
        t0 = time.monotonic()
        buf = OutputBuffer(max_output)
        try:
            eid = api.exec_create(cid, argv, stdout=True, stderr=True, user=user or self.spec.user or "",
                                  environment=environment or None, workdir=workdir or self.spec.workdir or None)["Id"]
            for chunk in exec_start_frames(api, eid):
                buf.feed(chunk)
            code = api.exec_inspect(eid).get("ExitCode")
        except docker.errors.NotFound as e:
            raise ResourceDied(f"{self.id}: the container is gone ({e.explanation or e})") from e
        except EngineError as e:  # exec start's own answer (see exec_stream)
            if e.status == 404:
                raise ResourceDied(f"{self.id}: the container is gone ({e.message})") from e
            if e.status == 409 or "not running" in e.message:
                raise ResourceDied(f"{self.id}: the container is not running ({e.message})") from e
            raise ResourceError(f"{self.id}: exec failed: {e.message}") from e
        except docker.errors.APIError as e:
            if e.status_code == 409 or "not running" in str(e):
                raise ResourceDied(f"{self.id}: the container is not running ({e.explanation or e})") from e
            raise ResourceError(f"{self.id}: exec failed: {e.explanation or e}") from e
        duration = time.monotonic() - t0
        if self._death_reason is not None:  # the disk watchdog killed the container meanwhile
            raise ResourceDied(f"{self.id}: {self._death_reason}")
        text, truncated = buf.text(max_output)
        timed_out = use_timeout and code in (124, 137) and duration >= timeout
        if timed_out and mark:  # descendants that left the process group (setsid) die too
            self._kill_marked_sync(mark)
        if code is None or (code == 137 and not timed_out):
            # cut off or SIGKILLed: if the container itself is gone (killed from outside, OOM), say so, so the
            # env ends the episode with an error instead of showing the agent "exit 137"
            running = True
            for _ in range(20):  # the engine marks a killed container stopped a moment after its execs end
                try:
                    running = api.inspect_container(cid).get("State", {}).get("Running", False)
                except docker.errors.NotFound:
                    running = False
                except docker.errors.APIError:
                    break
                if not running:
                    break
                time.sleep(0.1)
            if not running:
                why = f": {self._death_reason}" if self._death_reason else ""
                raise ResourceDied(f"{self.id}: the container stopped during the command (exit {code}){why}")
        if code is None:
            code = -1
        return ExecResult(exit_code=-1 if timed_out else int(code), output=text, timed_out=timed_out,
                          truncated=truncated, duration=duration)
