# Sourced by .ci/compose-suite and .ci/swarm-suite: a Docker engine, and the islands image.
#   ensure_engine   apt-get install docker.io docker-compose debootstrap when missing; start
#                   dockerd when it does not answer; wait for it (bounded)
#   build_image     docker/build-image.sh: a debootstrap base (reused), a wheelhouse
#                   downloaded on the host, the legacy builder; nothing is pulled
# Both print through `log`, which the sourcing script defines.

ensure_engine() {
    local need_apt=()
    command -v dockerd >/dev/null || need_apt+=(docker.io)
    command -v docker-compose >/dev/null || need_apt+=(docker-compose)
    command -v debootstrap >/dev/null || need_apt+=(debootstrap)
    if ((${#need_apt[@]})); then
        log "apt-get install ${need_apt[*]}"
        export DEBIAN_FRONTEND=noninteractive
        { apt-get update -q && apt-get install -y -q "${need_apt[@]}"; } >/tmp/islands-apt.log 2>&1 \
            || { tail -20 /tmp/islands-apt.log; echo "error: apt-get failed" >&2; return 1; }
    fi
    if ! docker info >/dev/null 2>&1; then
        log "starting dockerd"
        # An engine killed with its machine leaves its pid file, and dockerd refuses to start
        # beside it; remove it only when no such process runs.
        local pid_file=/var/run/docker.pid
        if [[ -f $pid_file ]] && ! kill -0 "$(cat "$pid_file")" 2>/dev/null; then
            log "removing the stale $pid_file (pid $(cat "$pid_file") is gone)"
            rm -f "$pid_file"
        fi
        # A swarm task's start first tries to pull its image unless this is set; offline, or
        # with a registry that only drops packets, each start would wait for that to fail.
        DOCKER_SERVICE_PREFER_OFFLINE_IMAGE=1 nohup dockerd >/tmp/islands-dockerd.log 2>&1 &
        for _ in $(seq 1 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
        docker info >/dev/null 2>&1 || { tail -20 /tmp/islands-dockerd.log
                                         echo "error: dockerd did not answer within 60 s" >&2; return 1; }
    fi
}

build_image() {
    BASE_IMAGE=islands-base:bookworm-fuse3 timeout 900 docker/build-image.sh || { echo "error: image build failed" >&2; return 1; }
}
