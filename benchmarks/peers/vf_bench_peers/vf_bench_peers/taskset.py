"""Tasks ``TASK-<k>`` with one task-scoped toolset (verifiers launches one MCP server per rollout): ``run`` (a
shell command in the rollout's Docker container, started by the toolset at the first call: verifiers' docker
runtime needs network access from the container to install uv, which this machine does not give) or ``lookup``."""

import os

import verifiers.v1 as vf

from vf_bench_peers.tools import PROMPT, BenchToolset


class BenchTaskConfig(vf.TaskConfig):
    tools: vf.ToolsetConfig = vf.ToolsetConfig()


class BenchTask(vf.Task[vf.TaskData, vf.State, BenchTaskConfig]):
    @classmethod
    def toolsets(cls, config: BenchTaskConfig) -> list[vf.Toolset]:
        return [BenchToolset(config.tools)]

    @vf.reward(weight=1.0)
    async def answered(self, trace: vf.Trace) -> float:
        return float("ANSWER-" in (trace.last_reply or ""))


class BenchConfig(vf.TasksetConfig):
    task: BenchTaskConfig = BenchTaskConfig()


class BenchTaskset(vf.Taskset[BenchTask, BenchConfig]):
    def load(self) -> list[BenchTask]:
        total = int(os.environ.get("BENCH_PEERS_TOTAL", "8"))
        return [BenchTask(vf.TaskData(idx=k, name=f"t{k}", prompt=PROMPT.format(k=k)), self.config.task)
                for k in range(total)]
