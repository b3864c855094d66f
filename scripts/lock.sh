#!/usr/bin/env bash
# Regenerate requirements/lock.txt, the pinned set of every package `make demo` and `make test` install
# (pyproject's extras `all` and `verl`), for CPython 3.11 on x86_64 Linux (glibc >= 2.34: Debian 12, Ubuntu 22.04 and later).
#
#   make lock                 # or: bash scripts/lock.sh
#   make lock UPGRADE=1       # move every pin to the newest release the ranges in pyproject.toml allow
#
# Without UPGRADE the current pins are kept wherever pyproject.toml still allows them (uv reads the existing
# output file as preferences), so the lock changes only where pyproject.toml did.  tests/test_lock.py runs
# the same command and fails when the committed lock is stale.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-requirements/lock.txt}
BOOT_PY=${BOOT_PY:-python3}
# shellcheck source=scripts/uv-env.sh
source scripts/uv-env.sh
UV=${UV:-$(command -v uv || true)}
[ -n "$UV" ] || { echo "lock: uv not found (python3 -m pip install uv, or run make setup first)" >&2; exit 2; }
args=()
[ -z "${UPGRADE:-}" ] || args+=(--upgrade)
"$UV" pip compile pyproject.toml --extra all --extra verl \
    --python-version 3.11 --python-platform x86_64-manylinux_2_34 \
    --custom-compile-command "make lock   (scripts/lock.sh: uv pip compile pyproject.toml --extra all --extra verl)" --quiet "${args[@]}" -o "$OUT"
# Record which dependency declarations the lock was made from, so tests/test_lock.py can tell (offline) that
# pyproject.toml changed since: a stale lock fails the tests with "run make lock".
digest=$("${PY:-$BOOT_PY}" scripts/lock_digest.py)
sed -i "3i # pyproject-dependencies-sha256: $digest" "$OUT"
