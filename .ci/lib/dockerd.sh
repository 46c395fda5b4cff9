# Sourced by .ci/provision-10-docker.sh: start a Docker engine when none answers.
# CI machines have no init system, so dockerd runs as a plain background process
# (it outlives this script; the tests talk to it through /var/run/docker.sock).

DOCKERD_LOG="${DOCKERD_LOG:-/var/log/fusion-tuner-dockerd.log}"

docker_ready() {
    docker info >/dev/null 2>&1
}

# Alive and not a zombie (a killed dockerd whose parent never reaped it still
# answers `kill -0`, and its pid file then blocks a new one).
process_running() {
    local state
    state="$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null)" || return 1
    [[ -n "$state" && "$state" != "Z" ]]
}

start_dockerd() {
    if docker_ready; then
        return 0
    fi
    if [[ -n "${DOCKER_HOST:-}" ]]; then
        echo "error: DOCKER_HOST=$DOCKER_HOST set but 'docker info' fails; unset it to use a local dockerd" >&2
        return 1
    fi
    echo "docker: starting dockerd (log: $DOCKERD_LOG)" >&2
    # A stale pid file from a dockerd that died (with its session) blocks a new one.
    if [[ -f /var/run/docker.pid ]] && ! process_running "$(cat /var/run/docker.pid)"; then
        rm -f /var/run/docker.pid
    fi
    # setsid: the engine must not die with this shell's process group.
    setsid nohup dockerd >>"$DOCKERD_LOG" 2>&1 </dev/null &
    local pid=$! i
    for i in $(seq 1 120); do
        docker_ready && return 0
        if ! process_running "$pid"; then
            echo "error: dockerd exited at start; last log lines:" >&2
            tail -n 5 "$DOCKERD_LOG" >&2
            return 1
        fi
        sleep 0.5
    done
    echo "error: dockerd did not answer within 60 s; last log lines:" >&2
    tail -n 20 "$DOCKERD_LOG" >&2
    return 1
}
