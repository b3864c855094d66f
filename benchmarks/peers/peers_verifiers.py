"""Install the benchmark's verifiers taskset package (``vf_bench_peers/``) into the verifiers environment."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def install_taskset(py: Path) -> None:
    uv = Path(sys.executable).parent / "uv"
    pkg = Path(__file__).resolve().parent / "vf_bench_peers"
    subprocess.run([str(uv), "pip", "install", "-q", "--python", str(py), "-e", str(pkg)], check=True)
