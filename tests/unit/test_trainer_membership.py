"""Membership: who counts in a merge's weights."""
from __future__ import annotations

from trainer.membership import Membership


def test_a_learner_that_said_bye_still_counts_in_the_weights_until_it_rejoins() -> None:
    ms = Membership(3)
    for i in (1, 2, 3):
        ms.join(i, f"nonce-{i}", conn=i, now=0.0)
    ms.finish(ms.members[2])
    ms.disconnect(2, conn=2)           # a clean stop: BYE, then the connection closes
    ms.disconnect(3, conn=3)           # a crash: no BYE
    assert [m.learner for m in ms.alive()] == [1]
    assert [m.learner for m in ms.weighed()] == [1, 2]
    ms.join(2, "nonce-new", conn=4, now=1.0)  # a new incarnation is live, and no longer "finished"
    assert not ms.members[2].finished
    assert [m.learner for m in ms.weighed()] == [1, 2]
