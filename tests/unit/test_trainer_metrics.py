"""trainer.metrics' fault-free learner rates: own compute, --speed, and --step-time."""
from __future__ import annotations

import pytest

from trainer.metrics import learner_rates


def _events(learner: int, computes: list[float], tokens: int = 512, **start) -> list[dict]:
    return [{"kind": "process_start", "role": "learner", "learner": learner, **start}] + [
        {"kind": "inner_step", "learner": learner, "tokens": tokens, "compute_s": c} for c in computes]


def test_the_rate_is_tokens_over_the_median_own_compute():
    assert learner_rates(_events(1, [0.004, 0.005, 0.100])) == {1: pytest.approx(512 / 0.005)}


def test_a_speed_factor_scales_the_rate():
    assert learner_rates(_events(1, [0.005], speed=0.25)) == {1: pytest.approx(512 / 0.02)}


def test_an_emulated_accelerator_sets_the_step_time_unless_compute_takes_longer():
    paced = _events(1, [0.006, 0.006], step_time=0.025)
    over = _events(2, [0.040, 0.040], step_time=0.025)  # the host cannot keep up: its own time counts
    assert learner_rates(paced + over) == {1: pytest.approx(512 / 0.025), 2: pytest.approx(512 / 0.040)}


def test_events_from_before_step_time_existed_read_as_no_pacing():
    assert learner_rates(_events(1, [0.005], step_time=None)) == {1: pytest.approx(512 / 0.005)}


def _cpu_bound_run(waits: dict[int, float], seconds: int = 10, step: float = 0.01, step_time: float = 0.0) -> list[dict]:
    """Two learners stepping every `step` s for `seconds` s, each waiting `waits[i]` s in all
    for a CPU (cumulative `cpu_wait` samples), and a merge of every token they processed."""
    events: list[dict] = []
    n = int(seconds / step)
    for i in (1, 2):
        events.append({"kind": "process_start", "role": "learner", "learner": i, "step_time": step_time, "t": 0.0})
        for k in range(n + 1):
            # Its wall time per step holds its share of the wait; its CPU time (cpu_s) does not.
            events.append({"kind": "inner_step", "learner": i, "incarnation": 1, "tokens": 10,
                           "compute_s": step, "cpu_s": step * (1 - waits[i] / seconds),
                           "t": k * step, "loss": 1.0, "cpu_wait": waits[i] * k / n})
    events.append({"kind": "merge", "fragment": 0, "version": 1, "t": seconds, "fragment_share": 1.0,
                   "contributors": [{"id": f"{i}:1:1", "learner": i, "tokens": 10 * (n + 1)} for i in (1, 2)]})
    return sorted(events, key=lambda e: e["t"])


def test_capacity_leaves_out_the_time_a_cpu_bound_learner_waited_for_a_core():
    """Issue 26: three learners on two cores each wait ~40% of the time for a core, and a
    capacity of their solo rates all run long capped goodput near 60% whatever the protocol
    did. The time a learner waited for a CPU is not capacity; goodput_solo keeps the old figure."""
    from trainer.metrics import summarize

    s = summarize(_cpu_bound_run({1: 4.0, 2: 4.0}), 2)
    # Solo, each learner would have stepped in 6 ms of CPU: its wall 10 ms held 4 ms of waiting.
    assert s["goodput_solo"] == pytest.approx(0.6, abs=0.01)
    assert s["cpu_wait_seconds"] == {"1": 4.0, "2": 4.0}
    assert s["capacity_tokens"] == pytest.approx(0.6 * s["capacity_solo_tokens"], rel=0.01)
    assert s["goodput"] == pytest.approx(1.0, abs=0.01), "the wait discounted twice (rate and time) inflates it"
    # An emulated accelerator's slot absorbs the host's waits: its capacity is the whole run.
    paced = summarize(_cpu_bound_run({1: 4.0, 2: 4.0}, step_time=0.01), 2)
    assert paced["capacity_tokens"] == pytest.approx(paced["capacity_solo_tokens"])


def test_where_the_tokens_went_adds_up_to_what_was_processed():
    """Every processed token has one fate: merged, thrown away at adoption (mix), dropped
    as stale, refused, acknowledged but unmerged, lost with a killed incarnation, unpushed
    at a clean stop."""
    from trainer.fates import token_fates

    def step(t, inc, tokens=100):
        return {"kind": "inner_step", "learner": 1, "incarnation": inc, "tokens": tokens, "t": t}

    events = [
        {"kind": "process_start", "role": "syncer", "config": {"fragments": 1}, "t": 0},
        *[step(t, 1) for t in range(1, 11)],                                            # 1000 tokens
        {"kind": "push", "learner": 1, "incarnation": 1, "id": "1:1:1", "fragment": 0, "status": "accepted",
         "tokens": 400, "t": 5},
        {"kind": "apply", "learner": 1, "incarnation": 1, "fragment": 0, "version": 1, "discarded_tokens": 200,
         "t": 6},
        {"kind": "push", "learner": 1, "incarnation": 1, "id": "1:1:2", "fragment": 0, "status": "stale",
         "tokens": 100, "t": 8},
        {"kind": "merge", "fragment": 0, "version": 1, "fragment_share": 1.0, "t": 5.5,
         "contributors": [{"id": "1:1:1", "learner": 1, "tokens": 400}]},
        *[step(t, 2) for t in range(12, 15)],                                           # 300 tokens
        {"kind": "push", "learner": 1, "incarnation": 2, "id": "1:2:1", "fragment": 0, "status": "accepted",
         "tokens": 200, "t": 14.5},
        {"kind": "process_stop", "role": "learner", "learner": 1, "incarnation": 2, "t": 15},
    ]
    fates = token_fates(events)
    assert fates == {"merged": 400.0, "discarded_at_adoption": 200.0, "dropped_stale": 100.0, "refused": 0.0,
                     "acknowledged_unmerged": 200.0, "lost_to_faults": 300.0, "unpushed_at_stop": 100.0}
    assert sum(fates.values()) == 1300.0


def test_the_summary_says_what_to_change_when_the_round_trip_outlasts_a_round():
    """A push that takes longer to its adoption than H steps take: the summary names the
    round trip and a --sync-every that covers two of them; thrown-away steps name rebase."""
    from trainer.fates import where_tokens_went

    events = [{"kind": "process_start", "role": "syncer", "config": {"sync_every": 20, "fragments": 1}, "t": 0}]
    events += [{"kind": "inner_step", "learner": 1, "incarnation": 1, "tokens": 10, "t": k * 0.001} for k in range(200)]
    events += [{"kind": "push", "learner": 1, "incarnation": 1, "fragment": 0, "id": "1:1:1", "status": "accepted",
                "version": 0, "latency": 0.01, "tokens": 200, "t": 0.03},
               {"kind": "apply", "learner": 1, "incarnation": 1, "fragment": 0, "version": 1,
                "discarded_tokens": 1500, "t": 0.12}]
    out = where_tokens_went(events, {}, 0.2)
    assert out["push_round_trip_seconds"] == pytest.approx(0.1)
    assert any("--adopt rebase" in line for line in out["advice"]), out["advice"]
    assert any("--sync-every 200" in line for line in out["advice"]), out["advice"]


def test_a_push_merged_after_its_learner_was_killed_counts_once():
    """A learner SIGKILLed before the acknowledgement of its push came back never logged
    the push; its syncer accepted and merged it. Merged, not also lost."""
    from trainer.fates import token_fates

    events = [{"kind": "process_start", "role": "syncer", "config": {"fragments": 1}, "t": 0},
              *[{"kind": "inner_step", "learner": 1, "incarnation": 1, "tokens": 100, "t": t} for t in range(1, 5)],
              {"kind": "push_accepted", "learner": 1, "incarnation": 1, "id": "1:1:1", "fragment": 0, "tokens": 400,
               "t": 5},
              {"kind": "merge", "fragment": 0, "version": 1, "fragment_share": 1.0, "t": 6,
               "contributors": [{"id": "1:1:1", "learner": 1, "tokens": 400}]}]
    fates = token_fates(events)
    assert fates["merged"] == 400.0 and fates["lost_to_faults"] == 0.0 and sum(fates.values()) == 400.0
