import atexit
import os
import signal
import sys

import verifiers.v1 as vf

PROMPT = "TASK-{k}: use the tools until the task is solved, then answer."
IMAGE = "agentfly/bench-peers:latest"
LABEL = "agentfly.bench-peers"


def lookup_value(key: str) -> str:
    h = sum(ord(c) * (i + 1) for i, c in enumerate(key)) % 1000
    return f"{key} = {h}"


class BenchToolset(vf.Toolset[vf.ToolsetConfig]):
    TOOL_PREFIX = None  # tools advertised bare: "run" / "lookup", the names every system serves
    _box = None

    def _container(self):
        if BenchToolset._box is None:
            import docker

            BenchToolset._box = docker.from_env(timeout=300).containers.run(
                IMAGE, ["sleep", "infinity"], detach=True, network_disabled=True, labels={LABEL: "verifiers"})

            def remove(*_):
                try:
                    BenchToolset._box.remove(force=True)
                except Exception:  # noqa: BLE001, S110  (already gone: killed mid-episode)
                    pass
            atexit.register(remove)
            signal.signal(signal.SIGTERM, lambda *a: (remove(), sys.exit(0)))
        return BenchToolset._box

    if os.environ.get("BENCH_PEERS_WORKLOAD", "light") == "container":
        @vf.tool(name="run")  # a method named run would shadow Toolset.run (the server's entry point)
        def run_command(self, cmd: str) -> str:
            """Run a shell command in the task's container and return its output."""
            code, out = self._container().exec_run(["/bin/sh", "-c", cmd])
            return out.decode(errors="replace")[-2000:] + ("" if code == 0 else f"\n(exit {code})")
    else:
        @vf.tool
        def lookup(self, key: str) -> str:
            """Look a key up in the task's table."""
            return lookup_value(key)


if __name__ == "__main__":
    BenchToolset.run()
