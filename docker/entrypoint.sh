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
# shellcheck disable=SC2086  # word splitting of ISLANDS_EXTRA_ARGS is the point
exec python3 -m "$module" "$sub" $task ${ISLANDS_EXTRA_ARGS:-} "$@"
