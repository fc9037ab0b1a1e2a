"""Deliberate syncer defects, for proving that the chaos suite catches real bugs.

Off unless the environment variable ISLANDS_SYNCER_DEFECT names one. A syncer running
with a defect says so in its `process_start` event, so no run can pass one off as sound.
"""
from __future__ import annotations

import os

ENV = "ISLANDS_SYNCER_DEFECT"
DEFECTS = {
    "ack_before_durable": "acknowledges pushes on arrival and makes them and merges durable "
                          "only every 10 s from its start (a batched fsync): a SIGKILL loses "
                          "acknowledged pushes",
    "double_apply": "never consults the ledger: a retried (learner, incarnation, seq) is accepted "
                    "and merged again",
}
# Long enough that any SIGKILL after the first acknowledgement finds some not yet durable:
# with a 2 s period (and a flush at the first merge) a kill lost acks about half the time,
# so shrinking a failing schedule stalled whenever a smaller one happened to miss.
FLUSH_EVERY = 10.0


def active() -> str | None:
    name = os.environ.get(ENV, "").strip()
    if not name:
        return None
    if name not in DEFECTS:
        raise ValueError(f"${ENV}: unknown defect {name!r} (known: {', '.join(DEFECTS)})")
    return name
