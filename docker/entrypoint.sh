#!/bin/sh
# Run one Islands module: `islands-entrypoint trainer syncer ...`, `... chaos toxiproxy ...`.
#
# Why a script: compose cannot splice one variable into several argv words, and each run
# hands its own training flags to the containers. ISLANDS_EXTRA_ARGS is split on spaces
# (flags and values hold none) and appended to the command.
set -eu
module="$1"
shift
# ISLANDS_TASK (compose.yaml) names the task the syncer and the learners train. The shared
# flags (ISLANDS_TASK, then ISLANDS_EXTRA_ARGS) go right after the subcommand and the
# service's own command follows, so one learner's own flags (its --ranks, its --device)
# win over the flags every learner shares: argparse keeps the last.
sub="${1:-}"
[ "$#" -gt 0 ] && shift
task=""
if [ "$module" = trainer ] && [ -n "${ISLANDS_TASK:-}" ]; then
    case "$sub" in syncer|learner) task="--task ${ISLANDS_TASK}" ;; esac
fi
if [ "$module" = trainer ] && [ "$sub" = syncer ] && [ "${ISLANDS_DISK_LAYER:-0}" = 1 ]; then
    # The disk-fault layer (chaos/diskfs, docs/diskfs.md) over the syncer's state dir: its
    # durable image is the state volume, mounted at /islands/state.disk as well. The
    # container needs /dev/fuse and CAP_SYS_ADMIN (the compose backend's override). It
    # starts in the mode the harness keeps in force (a disk fault outlives a restart), and
    # stops cleanly after the syncer, so a clean stop flushes everything; a killed
    # container is a power loss: what the daemon held unsynced is gone.
    python3 -m chaos.diskfs --backing /islands/state.disk --mount /islands/state \
        --control /run/islands-diskfs.sock --mode-file /islands/run/diskfs-mode.json \
        --ready-file /run/islands-diskfs.ready >/dev/null
    # shellcheck disable=SC2086  # word splitting of ISLANDS_EXTRA_ARGS is the point
    python3 -m trainer syncer $task ${ISLANDS_EXTRA_ARGS:-} "$@" &
    child=$!
    trap 'kill -TERM "$child" 2>/dev/null' TERM INT
    status=0
    while kill -0 "$child" 2>/dev/null; do
        status=0
        wait "$child" || status=$?  # (set -e: a failing wait must not end the script)
    done
    disk=$(python3 -c 'import json; print(json.load(open("/run/islands-diskfs.ready"))["pid"])' 2>/dev/null || true)
    [ -n "$disk" ] && kill -TERM "$disk" 2>/dev/null
    i=0  # its flush is bounded by the stop grace period; this wait by 15 s
    while [ -n "$disk" ] && kill -0 "$disk" 2>/dev/null && [ "$i" -lt 150 ]; do sleep 0.1; i=$((i + 1)); done
    exit "$status"
fi
# shellcheck disable=SC2086  # word splitting of ISLANDS_EXTRA_ARGS is the point
exec python3 -m "$module" "$sub" $task ${ISLANDS_EXTRA_ARGS:-} "$@"
