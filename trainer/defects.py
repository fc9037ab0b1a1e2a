"""Deliberate defects, for proving that the chaos suite's checks catch real bugs.

Off unless an environment variable names one: ISLANDS_SYNCER_DEFECT for the syncer,
ISLANDS_LEARNER_DEFECT for the learners. A process running with a defect says so in its
`process_start` event, so no run can pass one off as sound.
"""
from __future__ import annotations

import os

ENV = "ISLANDS_SYNCER_DEFECT"
LEARNER_ENV = "ISLANDS_LEARNER_DEFECT"
DEFECTS = {
    "ack_before_durable": "acknowledges pushes on arrival and makes them and merges durable "
                          "only once a minute from its start (a batched fsync): a SIGKILL loses "
                          "acknowledged pushes, and the syncer comes back at an older version",
    "ack_before_sync": "makes a group's push files durable by name but never syncs their contents before "
                       "acknowledging (renamed into place and the directory synced, the data left in the page "
                       "cache): a SIGKILL loses nothing, a power loss loses acknowledged pushes",
    "double_apply": "never consults the ledger: a retried (learner, incarnation, seq) is accepted "
                    "and merged again",
    # Recovery defects: each a part of the durable state a restart forgets (chaos explore
    # finds each in the simulator within a few hundred schedules, tests/sim).
    "forget_ledger": "restores Θ, versions and pending pushes after a restart but not the ledger of applied "
                     "pushes: a push retried across the restart is accepted and merged again",
    "forget_members": "does not restore its members after a restart: incarnation numbers start over, and a "
                      "learner that reconnects is refused its own incarnation's pushes",
    "drop_pending": "restores Θ and the ledger after a restart but not the pending pushes: every push "
                    "acknowledged and not yet merged is lost",
    "version_from_zero": "restores Θ after a restart but counts every fragment's versions from 0 again: "
                         "versions go back",
    # Merge-rule defects, in the syncer core (issue 28).
    "living_quorum": "counts and takes only the pushes of learners alive (or finished) at merge time: the "
                     "acknowledged pushes of a learner that died or was cut off before its round merged are "
                     "dropped, never applied",
    "merge_nothing": "merges as usual (versions, ledgers, events) but leaves the global parameters "
                     "as they were: the outer step is lost, so nothing the learners do is ever merged",
}
LEARNER_DEFECTS = {
    "fresh_id_on_retry": "sends a push again under a new seq after a reconnect or a refusal, instead of its "
                         "own: a push the syncer accepted but whose answer was lost is accepted and merged "
                         "again, its progress applied twice under two ids",
    "ignore_push_window": "pushes each fragment whenever its turn comes, without waiting for the version that "
                          "holds its last push (--push-window ignored): under a slow or cut link its pushes pile "
                          "up on an old version, each merged as a pipelined push",
    "never_adopt": "adopts every merged version in its bookkeeping (versions, apply events) but never "
                   "copies the global parameters into its model: it trains on alone",
}
# Long enough that any SIGKILL after the first acknowledgement finds some not yet durable:
# with a 2 s period (and a flush at the first merge) a kill lost acks about half the time,
# so shrinking a failing schedule stalled whenever a smaller one happened to miss; with 10 s
# a kill 6 s into a swarm run (whose syncer starts 5-10 s before training) sometimes came
# just after a flush, and a replay missed what its recording found.
FLUSH_EVERY = 60.0


def _named(env: str, known: dict[str, str]) -> str | None:
    name = os.environ.get(env, "").strip()
    if not name:
        return None
    if name not in known:
        raise ValueError(f"${env}: unknown defect {name!r} (known: {', '.join(known)})")
    return name


def active() -> str | None:
    """The syncer's defect, if $ISLANDS_SYNCER_DEFECT names one."""
    return _named(ENV, DEFECTS)


def learner_active() -> str | None:
    """The learners' defect, if $ISLANDS_LEARNER_DEFECT names one."""
    return _named(LEARNER_ENV, LEARNER_DEFECTS)
