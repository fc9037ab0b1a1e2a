"""The pure parts of bench/recovery.py: the schedule, pairing kills with the syncer's
events, percentiles and the goals. Synthetic histories and event lists; no cluster."""
from __future__ import annotations

import pytest

from .bench_scripts import load_bench

rec = load_bench("recovery.py", "bench_recovery")


# ----------------------------------------------------------------------------- builders
def hist(event: str, index: int, learner: int, t: float, took: float = 0.0, ok: bool = True) -> dict:
    return {"t": t, "event": event, "index": index, "kind": "kill", "ok": ok, "took": took,
            "fault": {"kind": "kill", "at": 0, "duration": 2, "target": f"learner-{learner}"}}


def ev(kind: str, t: float, process: str = "syncer", **fields) -> dict:
    return {"t": t, "kind": kind, "process": process, **fields}


def join(t: float, learner: int, inc: int, rejoin: bool = False) -> dict:
    return ev("join", t, learner=learner, incarnation=inc, rejoin=rejoin)


def accepted(t: float, learner: int, inc: int, seq: int) -> dict:
    return ev("push_accepted", t, learner=learner, incarnation=inc, seq=seq, id=f"{learner}:{inc}:{seq}")


def merge(t: float, *contributors: tuple[int, int, int]) -> dict:
    return ev("merge", t, fragment=0, contributors=[
        {"id": f"{j}:{i}:{s}", "learner": j, "incarnation": i, "seq": s} for j, i, s in contributors])


# ----------------------------------------------------------------------------- schedule
def test_schedule_spreads_kills_round_robin_and_never_overlaps_on_a_learner():
    s = rec.build_schedule(learners=3, kills=24, interval=5.0, down=2.0)
    assert len(s.faults) == 24
    assert [f.target for f in s.faults[:4]] == ["learner-1", "learner-2", "learner-3", "learner-1"]
    assert all(f.kind == "kill" and f.restart and f.duration == 2.0 for f in s.faults)
    assert [f.at for f in s.faults[:3]] == [2.0, 7.0, 12.0]
    for j in (1, 2, 3):
        mine = [f for f in s.faults if f.target == f"learner-{j}"]
        assert all(b.at >= a.end for a, b in zip(mine, mine[1:]))
    assert s.horizon == 2.0 + 23 * 5.0 + 2.0


@pytest.mark.parametrize("down", [0.0, 15.0, 20.0])
def test_schedule_refuses_a_down_time_that_would_overlap_the_next_kill_of_a_learner(down):
    with pytest.raises(ValueError, match="--down"):
        rec.build_schedule(learners=3, kills=6, interval=5.0, down=down)


# ----------------------------------------------------------------------------- history
def test_kill_actions_take_the_action_start_time_and_pair_start_with_stop():
    history = [
        {"t": 1.0, "event": "begin"},
        hist("start", 0, 1, t=10.2, took=0.2), hist("stop", 0, 1, t=12.01, took=0.01),
        hist("start", 1, 2, t=15.1, took=0.1),  # not restarted (yet)
        {"t": 16.0, "event": "start", "index": 2, "kind": "pause", "fault": {"target": "learner-3"}},
        {"t": 17.0, "event": "start", "index": 3, "kind": "kill", "fault": {"target": "syncer"}, "took": 0},
    ]
    kills = rec.kill_actions(history)
    assert [(k["index"], k["learner"]) for k in kills] == [(0, 1), (1, 2)]
    assert kills[0]["killed_at"] == pytest.approx(10.0) and kills[0]["restarted_at"] == pytest.approx(12.0)
    assert kills[0]["reaped_s"] == pytest.approx(0.2)
    assert kills[1]["killed_at"] == pytest.approx(15.0) and kills[1]["restarted_at"] is None


# ----------------------------------------------------------------------------- pairing
def test_a_kill_is_paired_with_the_first_death_and_the_first_merge_of_the_new_incarnation():
    kills = [{"index": 0, "learner": 2, "killed_at": 10.0, "restarted_at": 12.0, "ok": True}]
    events = [
        join(1.0, 2, 1), join(1.1, 1, 1),
        accepted(5.0, 2, 1, 1), merge(5.1, (1, 1, 1), (2, 1, 1)),
        ev("leave", 10.004, learner=2, incarnation=1, reason="peer closed"),
        ev("heartbeat_lost", 11.1, learner=2, incarnation=1, silent_for=1.1),  # later: not the first
        merge(12.5, (1, 1, 2)),                  # before the new incarnation joined
        join(15.0, 2, 2, rejoin=True),
        ev("process_start", 15.3, process="learner-2", learner=2, role="learner", incarnation=2),
        merge(15.6, (1, 1, 3)),                  # without learner 2
        accepted(16.0, 2, 2, 1), merge(16.2, (1, 1, 4), (2, 2, 1)),
        accepted(17.0, 2, 2, 2), merge(17.1, (2, 2, 2)),
    ]
    [row] = rec.pair_recoveries(kills, events)
    assert row["incarnation"] == 1 and row["new_incarnation"] == 2
    assert row["detected_by"] == "leave" and row["detection_s"] == pytest.approx(0.004)
    assert row["startup_s"] == pytest.approx(3.0)
    assert row["process_start_s"] == pytest.approx(3.3)
    assert row["training_s"] == pytest.approx(1.0)
    assert row["merge_wait_s"] == pytest.approx(0.2)
    assert row["rejoin_s"] == pytest.approx(4.2)
    assert row["startup_s"] + row["training_s"] + row["merge_wait_s"] == pytest.approx(row["rejoin_s"])
    assert row["note"] == ""


def test_heartbeat_loss_counts_when_it_comes_before_the_leave():
    kills = [{"index": 0, "learner": 1, "killed_at": 10.0, "restarted_at": None, "ok": True}]
    events = [join(1.0, 1, 3), ev("heartbeat_lost", 11.05, learner=1, incarnation=3, silent_for=1.1)]
    [row] = rec.pair_recoveries(kills, events)
    assert row["detected_by"] == "heartbeat_lost" and row["detection_s"] == pytest.approx(1.05)
    assert row["rejoin_s"] is None and "not restarted" in row["note"]


def test_an_older_incarnation_or_another_learner_is_not_mistaken_for_the_killed_one():
    kills = [{"index": 4, "learner": 1, "killed_at": 20.0, "restarted_at": 22.0, "ok": True}]
    events = [
        join(1.0, 1, 1), ev("leave", 8.0, learner=1, incarnation=1),  # an earlier kill
        join(12.0, 1, 2, rejoin=True),
        ev("leave", 20.01, learner=3, incarnation=2),                   # someone else
        ev("leave", 20.02, learner=1, incarnation=2),
        join(24.0, 1, 3, rejoin=True), accepted(25.0, 1, 3, 1), merge(25.5, (1, 3, 1)),
    ]
    [row] = rec.pair_recoveries(kills, events)
    assert row["incarnation"] == 2 and row["detection_s"] == pytest.approx(0.02)
    assert row["new_incarnation"] == 3 and row["rejoin_s"] == pytest.approx(3.5)


def test_a_learner_already_marked_dead_and_one_never_merged_are_noted_not_guessed():
    kills = [{"index": 0, "learner": 1, "killed_at": 10.0, "restarted_at": 12.0, "ok": True}]
    events = [join(1.0, 1, 1), ev("heartbeat_lost", 9.0, learner=1, incarnation=1),
              join(13.0, 1, 2, rejoin=True)]
    [row] = rec.pair_recoveries(kills, events)
    assert row["detection_s"] is None and "already marked dead" in row["note"]
    assert row["startup_s"] == pytest.approx(1.0) and row["rejoin_s"] is None
    assert "no merge contained a push of incarnation 2" in row["note"]


def test_a_lease_revived_before_the_kill_is_detected_again():
    kills = [{"index": 0, "learner": 1, "killed_at": 10.0, "restarted_at": None, "ok": True}]
    events = [join(1.0, 1, 1), ev("heartbeat_lost", 5.0, learner=1, incarnation=1),
              join(5.5, 1, 1),  # "lease renewed": the same incarnation is back
              ev("leave", 10.1, learner=1, incarnation=1)]
    [row] = rec.pair_recoveries(kills, events)
    assert row["detected_by"] == "leave" and row["detection_s"] == pytest.approx(0.1)


def test_only_the_syncers_events_count():
    kills = [{"index": 0, "learner": 1, "killed_at": 10.0, "restarted_at": None, "ok": True}]
    events = [join(1.0, 1, 1), ev("leave", 10.1, process="learner-1", learner=1, incarnation=1)]
    [row] = rec.pair_recoveries(kills, events)
    assert row["detection_s"] is None and "never marked" in row["note"]


# ----------------------------------------------------------------------------- statistics
def test_percentile_interpolates_like_numpy():
    v = [1.0, 2.0, 3.0, 4.0, 10.0]
    assert rec.percentile(v, 50) == 3.0
    assert rec.percentile(v, 90) == pytest.approx(7.6)
    assert rec.percentile(v, 0) == 1.0 and rec.percentile(v, 100) == 10.0
    assert rec.percentile([5.0], 90) == 5.0
    with pytest.raises(ValueError):
        rec.percentile([], 50)


def test_distribution_skips_missing_values():
    d = rec.distribution([0.1, None, 0.3, 0.2])
    assert d["n"] == 3 and d["median"] == pytest.approx(0.2) and d["max"] == 0.3
    assert rec.distribution([None])["n"] == 0


def _row(det, rejoin, startup, by="leave"):
    return {"index": 0, "learner": 1, "detection_s": det, "detected_by": by if det is not None else None,
            "reaped_s": None,
            "rejoin_s": rejoin, "startup_s": startup, "training_s": None, "merge_wait_s": None,
            "process_start_s": None, "note": ""}


def test_summary_judges_the_goals_at_the_median_and_separates_start_up():
    rows = [_row(0.01, 4.0, 3.0), _row(0.02, 5.0, 3.5), _row(1.2, 6.0, 4.5, by="heartbeat_lost")]
    s = rec.summarize(rows)
    assert s["kills"] == 3 and s["detected_by"] == {"leave": 2, "heartbeat_lost": 1}
    assert s["goals"]["detection_median_le_1s"] is True
    assert s["goals"]["rejoin_median_le_2s"] is False
    assert s["rejoin_without_startup_s"]["median"] == pytest.approx(1.5)
    assert s["goals"]["rejoin_without_startup_median_le_2s"] is True
    table = rec.format_table(s)
    assert "failure detection" in table and "missed" in table and "heartbeat_lost 1" in table


def test_a_kill_that_hits_a_process_still_starting_up_says_so():
    kills = [{"index": 0, "learner": 1, "killed_at": 10.0, "restarted_at": 12.0, "ok": True},
             {"index": 3, "learner": 1, "killed_at": 16.0, "restarted_at": 18.0, "ok": True}]
    events = [join(1.0, 1, 1), ev("leave", 10.1, learner=1, incarnation=1),
              join(25.0, 1, 2, rejoin=True)]  # the process restarted at 12 never joined: killed at 16
    first, second = rec.pair_recoveries(kills, events)
    assert first["detection_s"] == pytest.approx(0.1)
    assert second["detection_s"] is None and "killed during start-up" in second["note"]
    assert second["new_incarnation"] == 2 and second["startup_s"] == pytest.approx(7.0)


# ----------------------------------------------------------------------------- adaptive pacing
def test_learner_ready_once_a_merge_holds_a_push_of_an_incarnation_joined_after_the_restart():
    events = [join(1.0, 1, 1), accepted(2.0, 1, 1, 1), merge(2.1, (1, 1, 1)),
              join(14.0, 1, 2, rejoin=True), merge(14.5, (2, 1, 5))]
    assert rec.learner_ready(events, 1, since=None)
    assert rec.learner_ready(events, 1, since=0.5)
    assert not rec.learner_ready(events, 1, since=12.0)  # restarted at 12: no merged push of incarnation 2 yet
    events += [accepted(15.0, 1, 2, 1), merge(15.2, (1, 2, 1), (2, 1, 6))]
    assert rec.learner_ready(events, 1, since=12.0)
    assert not rec.learner_ready(events, 2, since=15.0)


def test_startup_phases_split_the_time_from_the_spawn():
    phases = rec.startup_phases(10.0, [10.5, 13.0, 13.25, 13.5, 13.75])
    assert list(phases) == list(rec.STARTUP_PHASES)
    assert phases["interpreter"] == pytest.approx(0.5) and phases["import torch"] == pytest.approx(2.5)
    assert sum(phases.values()) == pytest.approx(3.75)
