"""no_divergence on synthetic runs: Θ's held-out loss as the syncer samples it (global_eval events).

The curves copy shapes measured on real runs: before the momentum warm-up a fault-free run of
the property suite's model overshot for one version early on (to 6.6, 11.0 and 17.1 in three of
five runs); the divergences the issue met ended at 14.26 (learners reading 2.57) and at 4.33
against a best of ~2.
"""
from __future__ import annotations

import math

import pytest

from chaos.checkers import CHECKERS, FAIL, PASS, UNKNOWN, run_checkers
from chaos.divergence import RISE, check_no_divergence, samples, untrained_loss
from chaos.reference import ReferenceCurve

from .test_chaos_checkers import ev, global_eval, history_for, inner_step, view

UNTRAINED = 5.5329


def merge_event(t: float, version: int, learners=(1, 2), staleness: int = 0, weight: float = 0.5,
                fraction: float = 1.0, fragment: int = 0) -> dict:
    return ev(t, "merge", fragment=fragment, version=version, reason="quorum",
              outer={"step": "nesterov", "momentum_step": True, "round_fraction": fraction},
              contributors=[{"id": f"{i}:1:{version}", "learner": i, "staleness": staleness, "weight": weight,
                             "tokens": 5120} for i in learners], tokens=5120 * len(learners), finite=True)


def run_of(losses: list[float | str], train_loss: float = 2.0, fragments: int = 1) -> list[dict]:
    """A run whose version v (sum over fragments) merges at t = v s and is sampled at v + 0.1 s
    with losses[v - 1]; version 0 is the untrained start sample. Learners step between merges."""
    events = [global_eval(-1.0, 0, UNTRAINED, tokens=0.0, reason="start", versions=[0] * fragments)]
    for v, loss in enumerate(losses, start=1):
        versions = [v // fragments + (1 if f < v % fragments else 0) for f in range(fragments)]
        events.append(merge_event(float(v), versions[(v - 1) % fragments], fragment=(v - 1) % fragments))
        events.append(global_eval(v + 0.1, v, loss, versions=versions))
        events += [inner_step(v + 0.05 * k, i, 10 * v + k, loss=train_loss) for i in (1, 2) for k in range(10)]
    return events


def healthy(spike_at: int | None = None, spike: float = 17.13, n: int = 30) -> list[float]:
    curve = [3.53, 2.66, 2.60] + [max(1.72, 2.5 - 0.08 * k) for k in range(n - 3)]
    if spike_at is not None:
        curve[spike_at - 1] = spike
    return curve


def verdict_of(events: list[dict], **options):
    return check_no_divergence(view(events, history_for([])), **options)


def test_no_divergence_is_registered_and_unknown_without_samples():
    """A syncer started without --eval-data writes no global_eval: nothing to judge."""
    assert "no_divergence" in CHECKERS
    verdict = verdict_of([inner_step(1.0, 1, 1)])
    assert verdict.status == UNKNOWN
    assert "--eval-data" in verdict.detail


def test_a_healthy_curve_passes_and_names_its_best():
    verdict = verdict_of(run_of(healthy()))
    assert verdict.status == PASS, verdict.detail
    assert verdict.evidence["best"]["loss"] == pytest.approx(1.72)
    assert verdict.evidence["untrained"] == pytest.approx(UNTRAINED)


@pytest.mark.parametrize("spike", [6.63, 6.78, 11.03, 17.13])
def test_a_one_version_sample_above_the_untrained_loss_is_a_transient(spike: float):
    """One version worse than the untrained model, recovered at the next merge: before the
    momentum warm-up fault-free runs overshot like this (6.6, 11.0, 17.1); the default model's
    first merge, between the initial parameters and the learners', still can (6.78). Shown in
    the evidence, not failed."""
    verdict = verdict_of(run_of(healthy(spike_at=4, spike=spike)))
    assert verdict.status == PASS, verdict.detail
    assert verdict.evidence["worse_than_untrained"] == [{"version": 4, "loss": round(spike, 3)}]


def test_two_versions_in_a_row_worse_than_untrained_fail_naming_the_merges():
    curve = healthy()
    curve[5], curve[6] = 13.8, 9.0  # versions 6 and 7
    events = run_of(curve)
    verdict = verdict_of(events)
    assert verdict.status == FAIL
    finding = verdict.evidence["findings"][0]
    assert finding["rule"] == "worse_than_untrained"
    assert finding["sample"]["version"] == 7 and finding["high_since"]["version"] == 6
    assert finding["limit"] == pytest.approx(UNTRAINED)
    assert finding["best"]["version"] == 5
    merges = finding["merges_since_best"]
    assert [m["version"] for m in merges] == [6, 7]
    assert merges[0]["contributors"] == [{"learner": 1, "staleness": 0, "weight": 0.5},
                                         {"learner": 2, "staleness": 0, "weight": 0.5}]
    assert merges[0]["round_fraction"] == 1.0
    assert finding["training_loss"] == {"learner-1": 2.0, "learner-2": 2.0}
    assert "version 7" in verdict.detail


def test_an_overshoot_of_0_8_nats_for_two_versions_passes():
    """The calibration case: up to ~0.8 above the running best for one or two versions, then back."""
    curve = healthy()
    best = min(curve[:9])
    curve[9], curve[10] = best + 0.8, best + 0.75
    assert verdict_of(run_of(curve)).status == PASS


def test_a_rise_held_for_three_versions_fails_as_sustained():
    curve = healthy()
    best = min(curve[:9])
    for v in (10, 11, 12, 13):
        curve[v - 1] = best + RISE + 0.2
    verdict = verdict_of(run_of(curve))
    assert verdict.status == FAIL
    finding = verdict.evidence["findings"][0]
    assert finding["rule"] == "sustained_rise"
    assert finding["high_since"]["version"] == 10 and finding["sample"]["version"] == 13
    assert [m["version"] for m in finding["merges_since_best"]] == [10, 11, 12, 13]


def test_a_rise_that_recovers_after_two_versions_passes():
    curve = healthy()
    best = min(curve[:9])
    curve[9], curve[10], curve[11] = best + 1.5, best + 1.5, best + 1.5  # versions 10..12: 2 versions apart
    assert verdict_of(run_of(curve)).status == PASS


def test_a_run_that_ends_far_above_its_best_fails_with_the_learners_losses():
    """The compose replay of the issue: Θ 14.26 at the end while every learner read 2.57."""
    curve = healthy() + [14.26]
    verdict = verdict_of(run_of(curve, train_loss=2.57))
    assert verdict.status == FAIL
    finding = verdict.evidence["findings"][-1]
    assert finding["rule"] == "ended_high"
    assert finding["sample"]["loss"] == 14.26
    assert finding["training_loss"] == {"learner-1": 2.57, "learner-2": 2.57}


def test_a_final_of_4_33_against_a_best_near_2_fails():
    curve = [3.5, 2.7, 2.3, 2.1, 2.0, 2.05, 2.4, 3.1, 4.33]
    verdict = verdict_of(run_of(curve))
    assert verdict.status == FAIL
    assert {f["rule"] for f in verdict.evidence["findings"]} == {"ended_high"}


def test_a_non_finite_final_sample_fails():
    verdict = verdict_of(run_of(healthy() + ["nan"]))
    assert verdict.status == FAIL
    assert verdict.evidence["findings"][-1]["sample"]["loss"] == "nan"


def test_with_fragments_a_spike_lasts_until_its_fragment_merges_again():
    """P=4: a spike of fragment 0 stays in Θ while fragments 1-3 merge (versions +1..+3): a
    transient; still there when fragment 0 merged again (+4): a divergence."""
    curve = healthy(n=40)
    for v in range(12, 16):  # 4 samples: versions 12..15, span 3 < P
        curve[v - 1] = 9.0
    assert verdict_of(run_of(curve, fragments=4)).status == PASS
    curve[16 - 1] = 9.0  # span 4 = P
    verdict = verdict_of(run_of(curve, fragments=4))
    assert verdict.status == FAIL
    assert verdict.evidence["findings"][0]["rule"] == "worse_than_untrained"


def test_with_fragments_a_rise_is_sustained_once_every_fragment_merged_three_times():
    """P=4: a rise held while 3·P - 1 versions merge passes; held for 3·P versions it fails."""
    curve = healthy(n=60)
    high = 1.72 + RISE + 0.5  # above the best + rise, below the untrained loss
    for v in range(30, 41):  # 11 versions: span 10 < 12
        curve[v - 1] = high
    assert verdict_of(run_of(curve, fragments=4)).status == PASS
    curve[42 - 1] = curve[41 - 1] = high  # span 12 = 3·P
    verdict = verdict_of(run_of(curve, fragments=4))
    assert verdict.status == FAIL
    assert verdict.evidence["findings"][0]["rule"] == "sustained_rise"


def test_the_reference_at_equal_tokens_bounds_the_loss_too():
    """Above the fault-free reference's best by then (+ rise) for 3 versions: a divergence even
    though the run never beat its own early best by much. A spike in the reference excuses nothing."""
    curve = [3.5, 3.4, 3.35] + [3.3] * 12
    reference = ReferenceCurve("r", ((0.0, UNTRAINED), (10240.0, 3.5), (30720.0, 2.2), (40960.0, 12.0),
                                     (51200.0, 1.9), (400000.0, 1.75)))
    assert verdict_of(run_of(curve)).status == PASS
    verdict = verdict_of(run_of(curve), reference=reference)
    assert verdict.status == FAIL
    finding = verdict.evidence["findings"][0]
    assert finding["rule"] == "sustained_rise"
    assert "reference" in finding["why"]
    assert verdict.evidence["reference"]["key"] == "r"


def test_untrained_loss_falls_back_to_ln_vocab_without_a_version_0_sample():
    events = [ev(0.0, "process_start", role="syncer", config={"model": {"vocab_size": 256}}),
              global_eval(1.0, 7, 2.0, reason="start")]
    loss, source = untrained_loss(samples(events), events)
    assert loss == pytest.approx(math.log(256))
    assert "vocab" in source
    assert untrained_loss(samples(events[1:]), events[1:]) == (None, "unknown")


def test_run_checkers_passes_the_options_through():
    events = run_of(healthy()[:-1] + [min(healthy()) + 0.6])  # ends 0.6 above its best
    assert verdict_of(events).status == PASS
    verdicts = {v.name: v for v in run_checkers(view(events, history_for([])), {"no_divergence": {"rise": 0.5}})}
    assert verdicts["no_divergence"].status == FAIL


def test_a_users_task_is_judged_in_its_own_units_the_built_in_one_in_nats():
    """A rise of 1.6 over the best is a divergence of the byte-level GPT (1.0 nats per byte),
    but not of a task whose untrained loss is 11.09 (an MSE): there the margin is 1.0 x
    11.09 / ln 256 = 2.0. A rise of 2.6 is one for both."""
    def run(task: str, bump: float) -> list[dict]:
        base = [11.09 * f for f in (0.6, 0.4, 0.3)] + [3.0] * 12
        base[5:9] = [3.0 + bump] * 4  # four versions high: longer than SUSTAIN_VERSIONS
        events = run_of(base)
        events[0] = global_eval(-1.0, 0, 11.09, tokens=0.0, reason="start", versions=[0])
        return [ev(-2.0, "process_start", "syncer", role="syncer", config={"task": task})] + events

    assert verdict_of(run("/x.py:task", 1.6)).status == PASS
    assert verdict_of(run("gpt", 1.6)).status == FAIL
    assert verdict_of(run("/x.py:task", 2.6)).status == FAIL


def test_a_frozen_theta_is_unknown_not_a_pass():
    """A Θ that never moves (a syncer that merges nothing, a task that cannot learn) never
    diverges, and no_divergence must not pass it: unknown, saying why."""
    from chaos.checkers import UNKNOWN
    events = [global_eval(0.0, 0, 5.5, reason="start")] + [global_eval(float(v), v, 5.5) for v in range(1, 30)]
    verdict = check_no_divergence(view(events))
    assert verdict.status == UNKNOWN and "never improved on the untrained model" in verdict.detail
    only_start = check_no_divergence(view([global_eval(0.0, 0, 5.5, reason="start")]))
    assert only_start.status == UNKNOWN and "never sampled after a merge" in only_start.detail
