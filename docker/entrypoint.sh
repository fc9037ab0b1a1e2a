#!/bin/sh
# Run one Islands module: `islands-entrypoint trainer syncer ...`, `... chaos toxiproxy ...`.
#
# Why a script: compose cannot splice one variable into several argv words, and each run
# hands its own training flags to the containers. ISLANDS_EXTRA_ARGS is split on spaces
# (flags and values hold none) and appended to the command.
set -eu
module="$1"
shift
# ISLANDS_TASK (compose.yaml) names the task the syncer and the learners train; flags in
# ISLANDS_EXTRA_ARGS come later and win.
task=""
if [ "$module" = trainer ] && [ -n "${ISLANDS_TASK:-}" ]; then
    case "${1:-}" in syncer|learner) task="--task ${ISLANDS_TASK}" ;; esac
fi
# shellcheck disable=SC2086  # word splitting of ISLANDS_EXTRA_ARGS is the point
exec python3 -m "$module" "$@" $task ${ISLANDS_EXTRA_ARGS:-}
