#!/bin/sh
# Run one Islands module: `islands-entrypoint trainer syncer ...`, `... chaos toxiproxy ...`.
#
# Why a script: compose cannot splice one variable into several argv words, and each run
# hands its own training flags to the containers. ISLANDS_EXTRA_ARGS is split on spaces
# (flags and values hold none) and appended to the command.
set -eu
module="$1"
shift
# shellcheck disable=SC2086  # word splitting of ISLANDS_EXTRA_ARGS is the point
exec python3 -m "$module" "$@" ${ISLANDS_EXTRA_ARGS:-}
