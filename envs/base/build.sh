#!/usr/bin/env bash
# The agentfly base image: Debian bookworm minbase + python3, pip, venv, git, ca-certificates, procps,
# rsync and a user "agent" (uid 1000), built offline with debootstrap and `docker import`.
# The recipe itself (package list, post-processing) lives in agentfly_gym/images/build.py
# (BASE_PACKAGES, build_base_image); this script is the command-line way to run it.
# Needs root, debootstrap and a Docker engine (scripts/docker-engine.sh). Options: --force, --mirror URI.
set -euo pipefail
exec python3 -m agentfly_gym images build base "$@"
