"""The merge rule (trainer/merge_rule.py): one pure decision that the syncer and the
goodput simulator both ask, with the time at which its answer changes."""
from __future__ import annotations

import pytest

from chaos.simulate import RunInputs, predict_schedule
from faults import Schedule
from trainer import merge_rule
from trainer.merge_rule import Decision, MergeRule, Waiting, is_stale, round_period


def w(learner: int, at: float, base: int = 0, final: bool = False) -> Waiting:
    return Waiting(learner, base, at, final)


def test_nothing_pending_never_merges_and_sets_no_timer() -> None:
    assert MergeRule().decide([], 0, [1, 2], 5.0) == Decision(None)


def test_quorum_of_every_live_learner_merges_at_once() -> None:
    d = MergeRule().decide([w(1, 1.0), w(2, 1.2)], 0, [1, 2], 1.2)
    assert d.reason == "quorum" and d.info["why"] == "2 of quorum 2 reported"


def test_below_quorum_waits_grace_after_the_first_fresh_push_and_says_when() -> None:
    rule = MergeRule(grace=0.5)
    d = rule.decide([w(1, 1.0)], 0, [1, 2], 1.2)
    assert d.reason is None and d.recheck_at == pytest.approx(1.5)
    assert rule.decide([w(1, 1.0)], 0, [1, 2], 1.5).reason == "grace"


def test_a_late_push_opens_no_window_of_its_own() -> None:
    rule = MergeRule(grace=0.5)
    late = [w(1, 1.0, base=2)]  # based on version 2, the fragment is at 3
    d = rule.decide(late, 3, [1, 2], 2.0, period=4.0)
    assert d.reason is None and d.recheck_at == pytest.approx(1.0 + 1.5 * 4.0)
    assert rule.decide(late, 3, [1, 2], 7.0, period=4.0).reason == "late"
    assert rule.decide(late, 3, [1, 2], 1.0 + 5 * 0.5, period=None).reason == "late"


def test_quorum_counts_only_live_learners_and_never_falls_below_one() -> None:
    rule = MergeRule(quorum=3)
    assert rule.effective_quorum(2) == 2 and rule.effective_quorum(0) == 1 and rule.effective_quorum(5) == 3
    assert rule.decide([w(1, 1.0)], 0, [], 1.0).reason == "quorum"


def test_adaptive_grace_waits_for_a_predicted_learner_up_to_the_cap() -> None:
    rule = MergeRule(grace=2.0, grace_policy="adaptive")
    predicted = {2: 1.8}.get
    d = rule.decide([w(1, 1.0)], 0, [1, 2], 1.0, predicted=predicted, period=None)
    assert d.reason is None  # below quorum 2: the fixed rule
    rule1 = MergeRule(quorum=1, grace=2.0, grace_policy="adaptive")
    d = rule1.decide([w(1, 1.0)], 0, [1, 2], 1.0, predicted=predicted)
    assert d.reason is None and d.recheck_at == pytest.approx(1.8)
    d = rule1.decide([w(1, 1.0)], 0, [1, 2], 1.8, predicted=predicted)
    assert d.reason == "grace" and d.info["missing"] == [2]
    far = rule1.decide([w(1, 1.0)], 0, [1, 2], 1.0, predicted={2: 9.0}.get)
    assert far.recheck_at == pytest.approx(3.0)  # the cap: quorum + grace


def test_the_final_round_waits_for_every_live_learners_last_push_or_the_timeout() -> None:
    rule = MergeRule(final_wait=10.0)
    pending = [w(1, 1.0, final=True)]
    d = rule.decide(pending, 0, [1, 2], 2.0)
    assert d.reason is None and d.recheck_at == pytest.approx(11.0)
    assert rule.decide(pending, 0, [1, 2], 11.0).reason == "final-timeout"
    assert rule.decide([*pending, w(2, 2.0, final=True)], 0, [1, 2], 2.0).reason == "final-round"
    assert rule.decide(pending, 0, [1], 2.0).reason == "final-round"  # learner 2 said BYE


def test_a_learner_that_stops_while_others_train_on_does_not_hold_their_merges() -> None:
    """Learner 1 stopped cleanly mid-run (a scale-down, a node's learners moved back): its
    last push is in, and learners 2 and 3 keep pushing. Their regular pushes merge by the
    usual rule; the last push waits for the final round, or final_wait. Holding theirs too
    (the final round as it was) stalled every merge for final_wait: the multi-node swarm
    run found it, 10.3 s without a merge."""
    rule = MergeRule(final_wait=10.0)
    pending = [w(1, 1.0, final=True), w(2, 1.2), w(3, 1.3)]
    d = rule.decide(pending, 0, [2, 3], 1.3)   # learner 1 said BYE
    assert (d.reason, d.only) == ("quorum", "regular")
    # Below quorum (three live learners), the grace window of the regular pushes decides.
    d = rule.decide(pending[:2], 0, [2, 3, 4], 1.3)
    assert d.reason is None and d.recheck_at == pytest.approx(1.2 + rule.grace)
    # No final round comes within final_wait: the last push merges as a regular one, with
    # the regular pushes, by their rule (not alone at the final round's weight 1, and not
    # before the regular pushes whose ACKs promised them the next version).
    d = rule.decide(pending, 0, [2, 3], 11.0)
    assert (d.reason, d.only) == ("quorum", None) and "merged as regular pushes" in d.info["why"]
    d = rule.decide(pending[:2], 0, [2, 3, 4], 11.0)  # below quorum: the grace window of the fresh pushes
    assert (d.reason, d.only) == ("grace", None)
    # A push from a learner that is no longer live says nothing of who trains on.
    assert rule.decide([w(1, 1.0, final=True), w(4, 1.1)], 0, [2], 2.0).recheck_at == pytest.approx(11.0)
    # Every live learner's last push in: the final round, over everything pending.
    d = rule.decide([w(1, 1.0, final=True), w(2, 1.2, final=True), w(2, 1.1)], 0, [1, 2], 1.3)
    assert (d.reason, d.only) == ("final-round", None)


def test_staleness_and_round_period() -> None:
    assert not is_stale(4, 0, 4) and is_stale(5, 0, 4)
    assert round_period([0.0]) is None and round_period([0.0, 1.0, 3.0, 4.0]) == 1.0


def test_the_goodput_simulator_asks_the_syncers_rule_not_a_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    """A planted defect in the one rule (it never merges) must show in the simulator's
    prediction: nothing merged, where the real rule merges a round every few tenths of a second."""
    inputs = RunInputs(learners=2, duration=30.0)
    quiet = Schedule(seed=0, faults=(), learners=2)
    assert predict_schedule(quiet, inputs).info["merges"] > 50
    monkeypatch.setattr(merge_rule.MergeRule, "decide", lambda self, *a, **k: Decision(None))
    assert predict_schedule(quiet, inputs).info["merges"] == 0


@pytest.mark.parametrize("accepted_at", [1004.146484811549, 1000.1, 1023.7000000000003, 7.3])
def test_the_answer_changes_at_the_recheck_instant_it_names(accepted_at):
    """A stepped syncer is ticked exactly at recheck_at: if the rule still said "not yet"
    there (fresh + grace − fresh < grace in floating point), the simulator ticked at the
    same instant forever (found by tests/sim's property as a livelock)."""
    rule = MergeRule(3, 0.5, "fixed", 10.0)
    fresh = [w(1, accepted_at)]
    waiting = rule.decide(fresh, 0, [1, 2, 3], accepted_at)
    assert waiting.reason is None and waiting.recheck_at is not None
    assert rule.decide(fresh, 0, [1, 2, 3], waiting.recheck_at).reason == "grace"
    late = [w(1, accepted_at)]
    waiting = rule.decide(late, 1, [1, 2, 3], accepted_at, period=1.3)
    assert rule.decide(late, 1, [1, 2, 3], waiting.recheck_at, period=1.3).reason == "late"
    final = [w(1, accepted_at, final=True)]
    waiting = rule.decide(final, 0, [1, 2], accepted_at)
    assert rule.decide(final, 0, [1, 2], waiting.recheck_at).reason == "final-timeout"
