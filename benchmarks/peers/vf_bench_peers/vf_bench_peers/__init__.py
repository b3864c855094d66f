"""The benchmark's tasks as a verifiers v1 taskset: ``vf-eval vf-bench-peers`` (workload from the environment
variable ``BENCH_PEERS_WORKLOAD``: ``container`` or ``light``; ``BENCH_PEERS_TOTAL`` tasks)."""

from vf_bench_peers.taskset import BenchTaskset

__all__ = ["BenchTaskset"]
