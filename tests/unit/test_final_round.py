"""The final round (issue 18): at a clean stop each learner pushes every fragment as its
last, and the syncer merges the live learners' last pushes together into their
token-weighted mean, instead of merging each residual at its share of a round."""
from __future__ import annotations

import pytest
import torch

from trainer import wire
from trainer.outer import Contribution, final_average

from tests.unit.syncer_rig import TOKENS, Rig, initial_params, push_frame, wait_until


def _contrib(learner: int, seq: int, tokens: int, value: float) -> Contribution:
    return Contribution(learner, 1, seq, tokens, 0, {"w": torch.full((2,), value)}, steps=1)


def test_final_average_sums_each_learners_pushes_and_weighs_learners_by_tokens() -> None:
    # Learner 1: two stretches (300 + 100 tokens) of its progress; learner 2: one of 400.
    contribs = [_contrib(1, 1, 300, 1.0), _contrib(1, 2, 100, 2.0), _contrib(2, 1, 400, 5.0)]
    step, weights = final_average(contribs)
    torch.testing.assert_close(step["w"], torch.full((2,), 0.5 * (1.0 + 2.0) + 0.5 * 5.0))
    assert weights == [0.5, 0.5, 0.5]
    _, equal = final_average([_contrib(1, 1, 0, 1.0), _contrib(2, 1, 0, 1.0)])
    assert equal == [0.5, 0.5]  # no tokens reported: equal shares
    with pytest.raises(ValueError, match="at least one"):
        final_average([])


def _final_push(learner: int, seq: int, delta: dict, tokens: int = TOKENS) -> wire.Message:
    return push_frame(learner, 1, seq, delta, tokens=tokens, final=1)


def test_the_final_round_waits_for_every_live_learner_then_takes_their_mean(rig: Rig) -> None:
    s = rig.start(quorum=0, grace=0.0, final_wait=3600.0)
    c1, c2 = rig.client(s), rig.client(s)
    c1.hello(1, "n1")
    c2.hello(2, "n2")
    d1, d2 = rig.delta(s, 1), rig.delta(s, 2)
    # Learner 1's last push is in, and learner 2 pushes no regular work: the run's end.
    # Nothing merges until learner 2's last push is in too.
    assert c1.send(_final_push(1, 1, d1)).header["status"] == "accepted"
    with s.cond:
        s.cond.wait_for(lambda: s.frags[0].version > 0, 0.5)
    assert s.frags[0].version == 0, "nothing of the fragment merges before every live learner's last push"
    assert c2.send(_final_push(2, 1, d2, tokens=TOKENS + TOKENS // 2)).header["status"] == "accepted"
    wait_until(s, lambda: s.frags[0].version >= 1, "the final round's merge")
    # Θ ← Θ − Σ w_l·D_l, w_l the learner's share of the tokens: equal token totals are not
    # needed, learner 1 has TOKENS and learner 2 1.5·TOKENS.
    w1, w2 = 1 / 2.5, 1.5 / 2.5
    initial = initial_params()
    for n in d1:
        torch.testing.assert_close(s.frags[0].params[n], initial[n] - w1 * d1[n] - w2 * d2[n], rtol=1e-5, atol=1e-7)
    s.stop()
    merge = [e for e in rig.events("merge") if e["fragment"] == 0][-1]
    assert merge["final"] is True and merge["reason"] == "final-round" and merge["outer"]["step"] == "final-average"
    assert sorted(c["learner"] for c in merge["contributors"]) == [1, 2]


def test_a_learner_that_stops_while_another_trains_on_does_not_hold_its_merges(rig: Rig) -> None:
    """Learner 1's last push is in while learner 2 trains on: 2's regular push merges at once,
    by quorum and alone, and 1's last push waits for the final round, which 2's last push
    then completes (the final round held every merge for --final-wait instead: the
    multi-node swarm run found it)."""
    s = rig.start(quorum=0, grace=5.0, final_wait=3600.0)
    c1, c2 = rig.client(s), rig.client(s)
    c1.hello(1, "n1")
    c2.hello(2, "n2")
    d1, d2, d2_last = rig.delta(s, 1), rig.delta(s, 2), rig.delta(s, 3)
    assert c1.send(_final_push(1, 1, d1)).header["status"] == "accepted"
    assert c2.send(push_frame(2, 1, 1, d2)).header["status"] == "accepted"
    wait_until(s, lambda: s.frags[0].version >= 1, "the live learner's merge, not held for the last push", timeout=3)
    with s.cond:
        assert [(p.contribution.learner, p.final) for p in s.frags[0].pending] == [(1, True)]
    assert c2.send(_final_push(2, 2, d2_last)).header["status"] == "accepted"
    wait_until(s, lambda: s.frags[0].version >= 2, "the final round", timeout=3)
    s.stop()
    regular, last = [e for e in rig.events("merge") if e["fragment"] == 0][-2:]
    assert regular["reason"] == "quorum" and [c["learner"] for c in regular["contributors"]] == [2]
    assert last["reason"] == "final-round" and sorted(c["learner"] for c in last["contributors"]) == [1, 2]


def test_a_learner_that_never_sends_its_last_push_holds_the_round_only_for_final_wait(rig: Rig) -> None:
    s = rig.start(quorum=0, grace=0.0, final_wait=0.3)
    c1, c2 = rig.client(s), rig.client(s)
    c1.hello(1, "n1")
    c2.hello(2, "n2")
    d1 = rig.delta(s, 1)
    assert c1.send(_final_push(1, 1, d1)).header["status"] == "accepted"
    wait_until(s, lambda: s.frags[0].version >= 1, "the final round to close after --final-wait", timeout=10)
    initial = initial_params()
    for n in d1:  # alone in its round, the learner's share is all of it
        torch.testing.assert_close(s.frags[0].params[n], initial[n] - d1[n], rtol=1e-5, atol=1e-7)
    s.stop()
    merge = rig.events("merge")[-1]
    assert merge["reason"] == "final-timeout" and merge["grace"]["missing"] == [2]


def test_a_last_push_stays_last_across_a_syncer_crash(rig: Rig) -> None:
    s = rig.start(quorum=0, grace=0.0, final_wait=3600.0)
    c1, c2 = rig.client(s), rig.client(s)
    c1.hello(1, "n1")
    c2.hello(2, "n2")
    assert c1.send(_final_push(1, 1, rig.delta(s, 1))).header["status"] == "accepted"
    rig.crash(s)
    s2 = rig.make(quorum=0, grace=0.0, final_wait=3600.0)
    assert [p.final for p in s2.frags[0].pending] == [True]


def test_a_bad_final_flag_is_refused_naming_the_field(rig: Rig) -> None:
    s = rig.start(quorum=0, grace=0.0)
    c = rig.client(s)
    c.hello(1, "n1")
    reply = c.send(push_frame(1, 1, 1, rig.delta(s, 1), final=2))
    assert reply.type == wire.ERROR and "'final'" in str(reply.header), reply.header
