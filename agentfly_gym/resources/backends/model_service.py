"""Local OpenAI-compatible inference servers as resources (``ModelServiceSpec``).

Engines:

* ``vllm``: ``vllm serve MODEL --host 127.0.0.1 --port P --tensor-parallel-size N
  --gpu-memory-utilization X [--max-model-len L] [extra args]`` (GPU).  Its
  ``/v1/completions`` takes token-id prompts and returns sampled token ids
  (``return_token_ids``), which :class:`~agentfly_gym.rollout.policies.openai_policy.OpenAITokenPolicy` uses.
* ``transformers``: ``transformers serve MODEL --host 127.0.0.1 --port P --device cpu``
  (CPU; ``pip install 'transformers[serving]'``).  Good for lifecycle tests and as a chat
  model API (an LLM judge); it returns no token ids, so it cannot back a token-faithful policy.

Lifecycle: ``start`` launches the server in its own process group with its output in a log
file and waits until ``GET /health`` answers 200 (failing early, with the log's tail, if the
process exits); ``status`` checks the process and ``/health``; ``reset`` does nothing (a
server keeps no per-rollout state); ``adestroy`` stops the whole process group (SIGTERM, then
SIGKILL after 10 s).  The log file stays for inspection (``resource.log_path``).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from ...data.paths import cache_dir
from ...errors import ResourceStartError, ResourceUnavailable
from ..base import Resource, ResourceStatus
from ..spec import ModelServiceSpec

__all__ = ["ModelServiceResource", "create", "free_port"]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ModelServiceResource(Resource):
    """A running inference server process.

    Attributes:
        base_url: ``http://127.0.0.1:<port>/v1`` once started.
        model_name: the name to send as ``"model"`` in requests.
        log_path: the server's combined stdout/stderr.
    """

    def __init__(self, spec: ModelServiceSpec, *, labels: dict[str, str] | None = None) -> None:
        super().__init__(spec, labels=labels)
        self.spec: ModelServiceSpec = spec
        self.port = spec.port
        self.proc: subprocess.Popen | None = None
        self.log_path: Path | None = None
        self.base_url = ""
        self.model_name = spec.model

    def command(self) -> list[str]:
        """The server's argv."""
        s = self.spec
        if s.engine == "vllm":
            exe = shutil.which("vllm")
            if exe is None:
                raise ResourceUnavailable("engine='vllm' needs vLLM installed (pip install vllm) and a GPU")
            cmd = [exe, "serve", s.model, "--host", "127.0.0.1", "--port", str(self.port),
                   "--tensor-parallel-size", str(s.tensor_parallel_size),
                   "--gpu-memory-utilization", str(s.gpu_memory_utilization)]
            if s.max_model_len:
                cmd += ["--max-model-len", str(s.max_model_len)]
        else:
            try:
                import fastapi  # noqa: F401
                import uvicorn  # noqa: F401
            except ImportError as e:
                raise ResourceUnavailable("engine='transformers' needs: pip install 'transformers[serving]'") from e
            cmd = [sys.executable, "-c", "import sys; from transformers.cli.transformers import main; sys.exit(main())",
                   "serve", s.model, "--host", "127.0.0.1", "--port", str(self.port), "--device", "cpu"]
        return cmd + list(s.extra_args)

    async def start(self) -> None:
        self._status = ResourceStatus.STARTING
        if self.port is None:
            self.port = free_port()
        cmd = self.command()
        logs = cache_dir("logs")
        logs.mkdir(parents=True, exist_ok=True)
        self.log_path = logs / f"{self.spec.engine}-{self.id}-{self.port}.log"
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True, env=env)
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        health = f"http://127.0.0.1:{self.port}/health"
        import httpx

        deadline = time.monotonic() + self.spec.start_timeout
        async with httpx.AsyncClient(timeout=5) as client:
            while True:
                if self.proc.poll() is not None:
                    raise ResourceStartError(f"{self.spec.engine} server exited with code {self.proc.returncode} "
                                             f"during start; log tail:\n{self.log_tail()}")
                try:
                    r = await client.get(health)
                    if r.status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    raise ResourceStartError(f"{self.spec.engine} server not healthy after {self.spec.start_timeout}s; "
                                             f"log tail:\n{self.log_tail()}")
                await asyncio.sleep(0.5)
        self._status = ResourceStatus.READY

    def log_tail(self, n: int = 4000) -> str:
        """The last ``n`` characters of the server log."""
        if self.log_path is None or not self.log_path.exists():
            return ""
        return self.log_path.read_bytes()[-n:].decode("utf-8", "replace")

    async def reset(self) -> None:
        """Nothing to do: a server keeps no per-rollout state."""

    async def status(self) -> ResourceStatus:
        if self._status != ResourceStatus.READY:
            return self._status
        if self.proc is None or self.proc.poll() is not None:
            self._status = ResourceStatus.UNHEALTHY
            return self._status
        import httpx

        try:
            async with httpx.AsyncClient(timeout=5) as client:
                ok = (await client.get(f"http://127.0.0.1:{self.port}/health")).status_code == 200
        except httpx.HTTPError:
            ok = False
        if not ok:
            self._status = ResourceStatus.UNHEALTHY
        return self._status

    async def adestroy(self) -> None:
        await asyncio.to_thread(self.destroy)

    def destroy(self) -> None:
        proc, self.proc = self.proc, None
        self._status = ResourceStatus.STOPPED
        if proc is None or proc.poll() is not None:
            return
        try:
            pgid = os.getpgid(proc.pid)
        except ProcessLookupError:
            return
        for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
            try:
                os.killpg(pgid, sig)
            except ProcessLookupError:
                return
            try:
                proc.wait(wait)
                # the group may still hold children; make sure they are gone too
                try:
                    os.killpg(pgid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                return
            except subprocess.TimeoutExpired:
                continue

    def describe(self) -> dict:
        d = super().describe()
        d.update(engine=self.spec.engine, model=self.spec.model, base_url=self.base_url,
                 log=str(self.log_path) if self.log_path else None)
        return d


def create(spec: ModelServiceSpec, labels: dict[str, str]) -> ModelServiceResource:
    """The ``("model_service", "")`` backend: an unstarted :class:`ModelServiceResource` for ``spec``."""
    return ModelServiceResource(spec, labels=labels)
