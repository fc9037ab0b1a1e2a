#!/usr/bin/env bash
# Build the Islands image without pulling anything from a registry.
#
#   docker/build-image.sh                  # base python:3.11-slim if present, else a debootstrap base
#   BASE_IMAGE=islands-base:bookworm-fuse3 docker/build-image.sh
#
# 1. A base image: $BASE_IMAGE when it exists locally; otherwise Debian bookworm with
#    python3 and fuse3 (the disk-fault layer) built by debootstrap and `docker import`ed as islands-base:bookworm-fuse3 (kept and
#    reused by later builds).
# 2. A wheelhouse: every dependency downloaded on the host into ./wheelhouse, torch pinned
#    to the CPU build, so pip inside the build runs with --no-index.
# 3. `docker build` with the legacy builder (BuildKit fails with the client installed here).
set -euo pipefail
cd "$(dirname "$0")/.."

IMAGE=${ISLANDS_IMAGE:-islands:latest}
DEBOOTSTRAP_IMAGE=islands-base:bookworm-fuse3
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}

log() { printf '[build-image] %s\n' "$*" >&2; }

base_image() {
    if [[ -n ${BASE_IMAGE:-} ]] && docker image inspect "$BASE_IMAGE" >/dev/null 2>&1; then
        echo "$BASE_IMAGE"; return
    fi
    if [[ -n ${BASE_IMAGE:-} && $BASE_IMAGE != "$DEBOOTSTRAP_IMAGE" ]]; then
        log "BASE_IMAGE=$BASE_IMAGE is not present locally, and nothing is pulled: docker pull or docker load it first"
        exit 1
    fi
    if [[ -z ${BASE_IMAGE:-} ]] && docker image inspect python:3.11-slim >/dev/null 2>&1; then
        echo python:3.11-slim; return
    fi
    if ! docker image inspect "$DEBOOTSTRAP_IMAGE" >/dev/null 2>&1; then
        command -v debootstrap >/dev/null || { log "debootstrap is missing: apt-get install -y debootstrap"; exit 1; }
        local root
        root=$(mktemp -d /tmp/islands-rootfs.XXXXXX)
        log "debootstrap bookworm into $root (about a minute)"
        debootstrap --variant=minbase --include=python3,python3-venv,tini,fuse3 bookworm "$root" "$MIRROR" >"$root.log" 2>&1 \
            || { log "debootstrap failed; see $root.log"; exit 1; }
        rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
        tar -C "$root" -c . | docker import -c 'ENV LANG=C.UTF-8' - "$DEBOOTSTRAP_IMAGE" >/dev/null
        rm -rf "$root" "$root.log"
        log "imported $DEBOOTSTRAP_IMAGE"
    fi
    echo "$DEBOOTSTRAP_IMAGE"
}

wheelhouse() {
    mkdir -p wheelhouse
    # The project's dependencies and the `examples` extra, so the example tasks run in containers.
    python3 -c 'import tomllib; p = tomllib.load(open("pyproject.toml", "rb"))["project"]; print("\n".join(p["dependencies"] + p["optional-dependencies"]["examples"]))' \
        > wheelhouse/requirements.txt
    log "collecting wheels into ./wheelhouse"
    # The host's pip config may name index folders that do not exist; pip says so per package.
    python3 -m pip wheel -q --wheel-dir wheelhouse "$TORCH_SPEC" -r wheelhouse/requirements.txt 2>&1 \
        | { grep -v "is ignored: it is neither a file nor a directory" || true; } >&2
}

base=$(base_image)
wheelhouse
log "building $IMAGE on $base"
DOCKER_BUILDKIT=0 docker build -q --build-arg "BASE_IMAGE=$base" -t "$IMAGE" . >/dev/null
log "built $IMAGE"
