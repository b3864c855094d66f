#!/usr/bin/env bash
# Start or stop a local Docker engine for agentfly-gym's container backend and its tests.
#
#   scripts/docker-engine.sh [start]   start dockerd in the background unless an engine already
#                                      answers, then wait until `docker info` succeeds (idempotent)
#   scripts/docker-engine.sh stop      stop the dockerd that this script started (idempotent;
#                                      an engine started some other way is left alone)
#   scripts/docker-engine.sh status    exit 0 when an engine answers, 1 otherwise
#
# Environment:
#   AGENTFLY_DOCKERD_LOG      dockerd's log file      (default: /tmp/agentfly-dockerd.log)
#   AGENTFLY_DOCKERD_PIDFILE  pid of the dockerd started here (default: /tmp/agentfly-dockerd.pid)
#   AGENTFLY_DOCKERD_WAIT     seconds to wait for the engine to answer (default: 60)
#   AGENTFLY_DOCKERD_ARGS     extra dockerd arguments (e.g. "--storage-driver=vfs")
#   AGENTFLY_DOCKERD_USERNS   1: start dockerd with --userns-remap=default, so that root in a container
#                             is an unprivileged host uid (subordinate ids of the user "dockremap").
#                             Off by default: the engine then keeps its images in a separate store
#                             (<data-root>/<uid>.<gid>/), so every image must be built or pulled again,
#                             and read-write bind mounts of host folders (ContainerSpec.mounts) are
#                             seen as owned by nobody inside.
# Where runsc (gVisor, Debian package runsc) is installed and /etc/docker/daemon.json does not exist,
# the engine knows it as the runtime "runsc" (ContainerSpec(runtime="runsc")), run with its own network
# off (runsc --network=none: loopback only, whatever ContainerSpec.network says; runsc's own network
# stack refuses to start on some hosts).  The configuration is written to $AGENTFLY_DOCKERD_CONFIG
# (default: /tmp/agentfly-dockerd.json).
# Needs root (dockerd) and the Debian packages docker.io (dockerd, containerd, runc) or equivalent.
set -euo pipefail

LOG=${AGENTFLY_DOCKERD_LOG:-/tmp/agentfly-dockerd.log}
PIDFILE=${AGENTFLY_DOCKERD_PIDFILE:-/tmp/agentfly-dockerd.pid}
WAIT=${AGENTFLY_DOCKERD_WAIT:-60}
LOCK=${PIDFILE}.lock

answers() { docker info >/dev/null 2>&1; }

our_pid() {
    # The pid recorded by an earlier start, if that process is still a dockerd.
    [[ -f $PIDFILE ]] || return 1
    local pid
    pid=$(cat "$PIDFILE" 2>/dev/null) || return 1
    # (setsid and nohup: the moments before they exec dockerd, right after a start)
    [[ $pid =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null \
        && [[ $(cat "/proc/$pid/comm" 2>/dev/null) =~ ^(dockerd|setsid|nohup)$ ]] && echo "$pid"
}

start() {
    if answers; then echo "docker engine: already running"; return 0; fi
    command -v dockerd >/dev/null || { echo "docker engine: dockerd not found (install docker.io)" >&2; return 2; }
    exec 9>"$LOCK"
    flock -w "$WAIT" 9 || { echo "docker engine: another start holds $LOCK" >&2; return 1; }
    if answers; then echo "docker engine: already running"; return 0; fi
    if ! our_pid >/dev/null; then
        local extra=()
        if [[ ${AGENTFLY_DOCKERD_USERNS:-0} == 1 ]]; then extra+=(--userns-remap=default); fi
        if command -v runsc >/dev/null && [[ ! -e /etc/docker/daemon.json ]]; then
            local conf=${AGENTFLY_DOCKERD_CONFIG:-/tmp/agentfly-dockerd.json}
            printf '{"runtimes": {"runsc": {"path": "%s", "runtimeArgs": ["--network=none"]}}}\n' \
                "$(command -v runsc)" >"$conf"
            extra+=(--config-file "$conf")
        fi
        # 9>&-: dockerd (and every container shim it starts) must not inherit the lock, or a later start
        # after a dockerd crash would wait on shims that still hold it
        # shellcheck disable=SC2086
        setsid nohup dockerd ${extra[@]+"${extra[@]}"} ${AGENTFLY_DOCKERD_ARGS:-} >>"$LOG" 2>&1 </dev/null 9>&- &
        echo $! >"$PIDFILE"
        echo "docker engine: started dockerd (pid $(cat "$PIDFILE"), log $LOG)"
    fi
    local t=0
    until answers; do
        if ! our_pid >/dev/null; then
            echo "docker engine: dockerd exited; last lines of $LOG:" >&2; tail -n 20 "$LOG" >&2; return 1
        fi
        if (( t >= WAIT * 2 )); then echo "docker engine: no answer after ${WAIT}s (see $LOG)" >&2; return 1; fi
        sleep 0.5; t=$((t + 1))
    done
    echo "docker engine: ready"
}

stop() {
    local pid
    if ! pid=$(our_pid); then
        rm -f "$PIDFILE"
        echo "docker engine: no dockerd started by this script is running"; return 0
    fi
    kill -TERM "$pid"
    for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    if kill -0 "$pid" 2>/dev/null; then kill -KILL "$pid"; fi
    rm -f "$PIDFILE"
    echo "docker engine: stopped dockerd (pid $pid)"
}

case "${1:-start}" in
    start) start ;;
    stop) stop ;;
    status) if answers; then echo "docker engine: running"; else echo "docker engine: not running"; exit 1; fi ;;
    *) echo "usage: $0 [start|stop|status]" >&2; exit 2 ;;
esac
