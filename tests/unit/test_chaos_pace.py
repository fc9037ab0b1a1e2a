"""Verdicts on the run's own clock (chaos/pace.py): the same events judged at two paces.

A loaded machine (two cores under busy loops: a round every 8 s, a cold start of 20 s) and a
fast one (a round every 0.5 s, a start of 5 s). A delay that is healthy on the first is a
sickness on the second; explicit numbers in the checker options still win.
"""
from __future__ import annotations

import pytest

from chaos.checkers import FAIL, PASS, UNKNOWN, RunView, check_converged, check_every_learner_contributes_at_end, \
    check_progress, check_self_heal
from chaos.pace import FALLBACK_STARTUP, RECONNECT_BACKOFF_CAP, measure, round_intervals

from .test_chaos_checkers import T0, action, begin, ev, final_params, h, heal, inner_step, kill, partition

LOADED = {"round_s": 8.0, "startup": 20.0}
FAST = {"round_s": 0.5, "startup": 5.0}
CONFIG = {"sync_every": 10, "fragments": 1, "heartbeat_timeout": 1.0, "request_timeout": 5.0,
          "model": {"vocab_size": 256}}


def syncer_start(t: float, grace: float = 0.5, **config) -> dict:
    return ev(t, "process_start", role="syncer", config={**CONFIG, **config}, syncer={"grace": grace, "quorum": 0})


def learner_start(t: float, learner: int, incarnation: int = 1) -> dict:
    return ev(t, "process_start", learner=learner, role="learner", incarnation=incarnation)


def paced_run(round_s: float, startup: float, until: float, absent: dict[int, tuple[float, float]] | None = None,
              learners=(1, 2, 3)) -> list[dict]:
    """A run at a pace: the cluster starts at -startup - 5 s, every learner's first process_start
    comes `startup` s later; a merge of fragment 0 every `round_s` with every present learner,
    ten inner steps per round. `absent` maps a learner to a span it takes no part in (a round
    that overlaps it merges without the learner)."""
    absent = absent or {}
    events = [syncer_start(-startup - 4.0)] + [learner_start(-5.0, i) for i in learners]
    version, t = 0, 0.0
    while t <= until:
        present = [i for i in learners if not (absent.get(i, (1e9, 1e9))[0] < t + round_s
                                                and absent.get(i, (1e9, 1e9))[1] > t)]
        for k in range(10):
            events += [inner_step(t + k * round_s / 10, i, int(t / round_s * 10) + k) for i in present]
        if present:
            version += 1
            events.append(ev(t + round_s * 0.99, "merge", fragment=0, version=version, reason="quorum",
                             contributors=[{"id": f"{i}:1:{version}", "learner": i, "staleness": 0, "weight": 1.0,
                                            "tokens": 100} for i in present], tokens=100, finite=True))
        t += round_s
    return sorted(events, key=lambda e: e["t"])


def history(faults: list[dict], startup: float, duration: float) -> list[dict]:
    entries = [h(-startup - 5.0, "cluster_start", backend="local", learners=3), begin(len(faults), duration)]
    for i, fault in enumerate(faults):
        entries += [action(fault["at"], "start", i, fault), action(fault["at"] + fault["duration"], "stop", i, fault)]
    return sorted(entries, key=lambda e: e["t"]) + [heal(duration)]


def test_measure_reads_the_round_the_step_the_start_up_and_the_configured_delays():
    events = paced_run(2.0, 7.0, 60.0)
    pace = RunView(events, history([], 7.0, 60.0)).pace
    assert pace.round_period == pytest.approx(2.0)
    assert pace.step_time == pytest.approx(0.2)
    assert pace.startup == pytest.approx(7.0) and pace.startup_measured
    assert (pace.heartbeat_timeout, pace.request_timeout, pace.grace, pace.sync_every) == (1.0, 5.0, 0.5, 10)
    assert pace.late_wait == pytest.approx(3.0)  # max(5 x 0.5, 1.5 rounds)
    assert pace.syncer_startup == pytest.approx(1.0)  # it starts alone, before the learners
    assert pace.reconnect("kill") == pytest.approx(1.0 + RECONNECT_BACKOFF_CAP)  # the connection closed at once
    assert pace.reconnect("partition") == pytest.approx(5.0 + 1.0 + RECONNECT_BACKOFF_CAP)  # a request hung
    assert pace.recovery("kill", "syncer") == pytest.approx(1.0 + 3.0)
    assert pace.recovery("kill") == pytest.approx(7.0 + 3.0)
    assert pace.recovery("latency") == pytest.approx(3.0)
    assert pace.to_dict()["round_period"] == 2.0


def test_the_round_is_measured_outside_faults_only():
    """Merges 20 s apart while the syncer was paused do not make the round look slow."""
    merges = [ev(t, "merge", fragment=0, version=i + 1, contributors=[]) for i, t in
              enumerate([0.0, 1.0, 2.0, 22.0, 23.0, 24.0])]
    assert sorted(round_intervals(merges, [])) == [1.0] * 4 + [20.0]
    assert round_intervals(merges, [(T0 + 2.5, T0 + 21.0)]) == [1.0] * 4


def test_without_a_cluster_start_or_merges_the_fallbacks_are_said():
    events = [syncer_start(0.0)] + [inner_step(0.1 * k, 1, k) for k in range(20)]
    pace = measure(events, [], [])
    assert not pace.startup_measured and pace.startup == FALLBACK_STARTUP
    assert not pace.round_measured and pace.round_period == pytest.approx(10 * 0.1)


def loaded_and_fast(build) -> tuple[RunView, RunView]:
    return build(**LOADED), build(**FAST)


def test_self_heal_allows_a_slow_restart_on_a_loaded_machine_only():
    """learner-1 killed 10..14 s contributes 45 s after the heal: within a loaded run's
    allowance (20 s start + 3 s reconnect + 12 s late wait + 3 rounds of 8 s), far outside a
    fast run's (5 + 3 + 2.5 + 1.5)."""
    fault = kill("learner-1", 10.0, 4.0)

    def build(round_s: float, startup: float) -> RunView:
        events = paced_run(round_s, startup, 160.0, absent={1: (10.0, 14.0 + 45.0 - round_s)})
        return RunView(events, history([fault], startup, 160.0))

    loaded, fast = loaded_and_fast(build)
    slow = check_self_heal(loaded)
    assert slow.status == PASS, slow.detail
    assert slow.evidence["within"]["0:kill"]["seconds"] == pytest.approx(20 + 3 + 12 + 24)
    assert slow.evidence["pace"]["round_period"] == pytest.approx(8.0)
    quick = check_self_heal(fast)
    assert quick.status == FAIL
    assert quick.evidence["failed"][0]["within"] == pytest.approx(5 + 3 + 2.5 + 1.5)
    assert check_self_heal(loaded, within=30.0).status == FAIL  # an explicit number wins


def test_a_learner_that_never_rejoins_fails_at_either_pace_once_the_run_went_on_long_enough():
    fault = kill("learner-2", 10.0, 4.0)
    for pace in (LOADED, FAST):
        events = paced_run(pace["round_s"], pace["startup"], 200.0, absent={2: (10.0, 1e9)})
        run = RunView(events, history([fault], pace["startup"], 200.0))
        assert check_self_heal(run).status == FAIL
        assert check_every_learner_contributes_at_end(run).status == FAIL


def test_rejoined_is_unknown_while_the_allowance_has_not_run_out():
    fault = kill("learner-2", 10.0, 4.0)
    events = paced_run(8.0, 20.0, 40.0, absent={2: (10.0, 1e9)})
    verdict = check_every_learner_contributes_at_end(RunView(events, history([fault], 20.0, 40.0)))
    assert verdict.status == UNKNOWN
    assert verdict.evidence["within"] == pytest.approx(59.0)


def test_progress_tolerates_a_gap_of_a_few_slow_rounds_but_not_of_many_fast_ones():
    """No merge for 24 s (16 s) while everyone is up: 3 rounds when a round takes 8 s, 32 when it takes
    0.5 s; the loaded run's limit is 12 s late wait + 1 s lease + 2 rounds = 29 s."""
    def build(round_s: float, startup: float) -> RunView:
        events = [e for e in paced_run(round_s, startup, 100.0)
                  if not (e["kind"] == "merge" and T0 + 40.0 < e["t"] < T0 + 56.0)]
        return RunView(events, history([], startup, 100.0))

    loaded, fast = loaded_and_fast(build)
    assert check_progress(loaded).status == PASS
    verdict = check_progress(fast)
    assert verdict.status == FAIL
    assert verdict.evidence["max_gap_from"] == {"late_wait": 2.5, "heartbeat_timeout": 1.0, "rounds": 1.0}
    assert check_progress(loaded, max_gap=20.0).status == FAIL


def test_converged_judges_how_long_a_version_was_superseded_on_the_runs_clock():
    """learner-2 stops holding a version superseded at least 15 s before."""
    def build(round_s: float, startup: float) -> RunView:
        events = paced_run(round_s, startup, 100.0, learners=(1, 2))
        merges = [e for e in events if e["kind"] == "merge"]
        stop = merges[-1]["t"] - T0 + 0.1
        behind = [m for m in merges if m["t"] - T0 <= stop - 15.0][-1]["version"] - 1  # superseded >= 15 s
        events += [final_params(stop, 1, [(0, merges[-1]["version"], 0.01)]),
                   final_params(stop, 2, [(0, behind, 0.01)])]
        return RunView(events, history([], startup, 100.0))

    loaded, fast = loaded_and_fast(build)
    assert check_converged(loaded).status == PASS
    verdict = check_converged(fast)
    assert verdict.status == FAIL
    assert verdict.evidence["max_behind"] == pytest.approx(2.5 + 3 + 1.5)
    assert check_converged(loaded, max_behind=10.0).status == FAIL


def test_converged_does_not_count_time_a_fault_kept_the_learner_from_adopting():
    """learner-2 partitioned until 6 s before its stop, behind since long before: its clock
    starts when the partition and its recovery were over."""
    events = paced_run(0.5, 5.0, 60.0, learners=(1, 2))
    merges = [e for e in events if e["kind"] == "merge"]
    fault = partition(["learner-2"], 20.0, 34.0)  # healed at 54 s
    events += [final_params(60.0, 1, [(0, merges[-1]["version"], 0.01)]),
               final_params(60.0, 2, [(0, 30, 0.01)])]  # version 30: superseded at ~15.5 s
    run = RunView(sorted(events, key=lambda e: e["t"]), history([fault], 5.0, 60.0))
    verdict = check_converged(run)
    assert verdict.status == PASS, verdict.detail
    assert check_converged(RunView(run.events, history([], 5.0, 60.0))).status == FAIL


def test_a_syncer_killed_again_before_the_learners_could_rejoin_moves_their_deadline():
    """Under load the syncer's restart took 10 s and the next kill came 0.2 s after it: the
    learners contribute 16 s after the first heal, 4 s after the second: within the second
    kill's allowance (a 1 s cold start, 3 s reconnect, 2.5 s late wait, 3 rounds of 0.5 s)."""
    first, second = kill("syncer", 2.0, 10.0), kill("syncer", 12.2, 10.0)

    def run(second_kill: bool) -> RunView:
        events = paced_run(0.5, 5.0, 60.0, absent={i: (2.0, 28.0) for i in (1, 2, 3)})
        return RunView(events, history([first, second] if second_kill else [first], 5.0, 60.0))

    verdict = check_self_heal(run(True))
    assert verdict.status == PASS, verdict.detail
    row = verdict.evidence["healings"][0]
    assert row["extended_by_faults"] == [1] and row["contributed_after"] == pytest.approx(16.5, abs=0.5)
    assert check_self_heal(run(False)).status == FAIL  # the same delay after a lone kill
