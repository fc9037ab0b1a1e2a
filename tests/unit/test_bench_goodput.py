"""The pure parts of bench/goodput.py: the schedule, downtime, throughput bins, goals, table,
and the torchft peer's final-parameters dump it evaluates.

No cluster is started here; bench/goodput.py itself runs the three systems.
"""
from __future__ import annotations

import statistics
from collections import defaultdict

import pytest

from faults import Schedule

from .bench_scripts import load_bench



goodput = load_bench("goodput.py", "bench_goodput")


# ----------------------------------------------------------------------------- the schedule
def _kills(schedule: Schedule) -> dict[str, list]:
    out = defaultdict(list)
    for f in schedule.faults:
        if f.kind == "kill":
            out[f.target].append(f)
    return out


def test_the_schedule_is_a_pure_function_of_the_seed():
    a, b = goodput.make_schedule(7, 150), goodput.make_schedule(7, 150)
    assert a == b and a.dumps() == b.dumps()
    assert goodput.make_schedule(8, 150) != a
    assert a.seed == 7 and a.learners == 4


@pytest.mark.parametrize("seed", range(12))
def test_the_schedule_has_the_issues_faults_and_is_valid(seed):
    duration = 150.0
    s = goodput.make_schedule(seed, duration)
    assert s.problems(4) == []
    kinds = [f.kind for f in s.faults]
    assert kinds.count("partition") == 1 and kinds.count("latency") == 1
    part = next(f for f in s.faults if f.kind == "partition")
    lat = next(f for f in s.faults if f.kind == "latency")
    assert part.duration == 10 and len(part.targets) == 1 and part.mode == "blackhole" and part.direction == "both"
    assert lat.latency_ms == 100 and lat.direction == "both" and lat.duration == 60
    assert part.targets[0] != lat.target  # two different links
    for target, kills in _kills(s).items():
        assert target in {f"learner-{i}" for i in range(1, 5)}
        assert all(k.restart and k.duration == 5 for k in kills)
        starts = [k.at for k in kills]
        assert starts == sorted(starts)
        assert all(b - a >= 5 for a, b in zip(starts, starts[1:]))  # never killed while down
    assert all(f.at >= goodput.FIRST_FAULT for f in s.faults)
    assert s.horizon <= duration - goodput.MARGIN
    assert [f.at for f in s.faults] == sorted(f.at for f in s.faults)


def test_kills_come_every_kill_mean_seconds_on_average():
    gaps = [b.at - a.at for seed in range(8) for kills in _kills(goodput.make_schedule(seed, 2500.0)).values()
            for a, b in zip(kills, kills[1:])]
    assert len(gaps) > 2000
    assert statistics.fmean(gaps) == pytest.approx(goodput.KILL_MEAN, rel=0.05)
    assert min(gaps) >= goodput.RESTART_AFTER


def test_the_latency_window_is_cut_to_fit_a_short_run():
    s = goodput.make_schedule(3, 30.0, latency_seconds=60)
    lat = next(f for f in s.faults if f.kind == "latency")
    assert lat.at >= goodput.FIRST_FAULT and lat.end <= 30.0 - goodput.MARGIN
    assert lat.duration == pytest.approx(30.0 - goodput.MARGIN - goodput.FIRST_FAULT)


@pytest.mark.parametrize("kwargs, match", [
    ({"duration": 20.0}, "too short"),
    ({"duration": 150.0, "learners": 1}, "two different links"),
    ({"duration": 150.0, "kill_mean": 5.0}, "must exceed the restart delay"),
])
def test_impossible_schedules_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        goodput.make_schedule(0, **kwargs)


def test_the_peer_without_link_proxies_gets_the_process_faults_only():
    s = goodput.make_schedule(7, 150)
    kills = goodput.process_faults_only(s)
    assert {f.kind for f in kills.faults} == {"kill"}
    assert len(kills.faults) == sum(1 for f in s.faults if f.kind == "kill")
    assert kills.problems(4) == [] and kills.seed == s.seed


def test_the_schedule_is_printed_with_a_one_line_summary():
    text = goodput.describe_schedule(goodput.make_schedule(7, 150))
    first = text.splitlines()[0]
    assert "kills" in first and "partition learner-" in first and "latency learner-" in first and "100 ms" in first
    assert "- {kind: kill" in text


# ----------------------------------------------------------------------------- downtime
def test_downtime_counts_whole_gaps_over_the_threshold_with_head_and_tail():
    # window 100..120; progress at 100.5, 101, 101.8, 105, 105.5, 118
    d = goodput.downtime([100.5, 101.0, 101.8, 105.0, 105.5, 118.0], 100.0, 120.0, threshold=1.0)
    # gaps: head 0.5, 0.5, 0.8 (all <= 1), 101.8->105 (3.2), 0.5, 105.5->118 (12.5), tail 118->120 (2)
    assert d["seconds"] == pytest.approx(3.2 + 12.5 + 2.0)
    assert d["gaps"] == [(1.8, 5.0), (5.5, 18.0), (18.0, 20.0)]
    assert d["longest_gap"] == pytest.approx(12.5)
    assert d["window_seconds"] == 20.0 and d["fraction"] == pytest.approx(17.7 / 20)
    assert d["events"] == 6


def test_downtime_ignores_progress_outside_the_window_and_a_gap_equal_to_the_threshold():
    d = goodput.downtime([90.0, 101.0, 102.0, 125.0], 100.0, 103.0, threshold=1.0)
    assert d["seconds"] == 0.0 and d["gaps"] == [] and d["events"] == 2


def test_no_progress_at_all_is_one_gap_of_the_whole_window():
    d = goodput.downtime([], 10.0, 40.0)
    assert d["seconds"] == 30.0 and d["gaps"] == [(0.0, 30.0)] and d["fraction"] == 1.0


def test_a_window_that_ends_before_it_starts_is_an_error():
    with pytest.raises(ValueError):
        goodput.downtime([], 5.0, 4.0)


def test_progress_is_merges_or_sync_rounds():
    events = [{"t": 3.0, "kind": "merge"}, {"t": 1.0, "kind": "sync_step"}, {"t": 2.0, "kind": "merge"},
              {"t": 4.0, "kind": "inner_step"}]
    assert goodput.commit_times(events, "decoupled") == [2.0, 3.0]
    assert goodput.commit_times(events, "torchft") == [2.0, 3.0]
    assert goodput.commit_times(events, "sync") == [1.0]


def test_the_window_is_the_controllers_begin_to_its_final_heal():
    history = [{"t": 5.0, "event": "heal", "reason": "start"}, {"t": 5.1, "event": "begin"},
               {"t": 40.0, "event": "heal", "reason": "end"}, {"t": 55.0, "event": "end"}]
    assert goodput.schedule_window(history, [{"t": 1.0}, {"t": 60.0}]) == (5.1, 40.0)
    # no final heal recorded (a crash): the `end` entry; no history at all: the events
    assert goodput.schedule_window(history[:2] + history[3:], []) == (5.1, 55.0)
    assert goodput.schedule_window([], [{"t": 1.0}, {"t": 60.0}]) == (1.0, 60.0)


def _kill_history(start: float = 10.0, end: float = 110.0) -> list[dict]:
    return [{"t": start, "event": "begin"},
            {"t": 20.0, "event": "start", "index": 0, "kind": "kill", "ok": True,
             "fault": {"kind": "kill", "target": "learner-1"}},
            {"t": 25.0, "event": "stop", "index": 0, "kind": "kill", "fault": {"kind": "kill", "target": "learner-1"}},
            {"t": 105.0, "event": "start", "index": 1, "kind": "kill", "ok": True,
             "fault": {"kind": "kill", "target": "learner-2"}},  # its restart falls after the window
            {"t": 112.0, "event": "stop", "index": 1, "kind": "kill", "fault": {"kind": "kill", "target": "learner-2"}},
            {"t": 50.0, "event": "start", "index": 2, "kind": "kill", "ok": False,  # failed: not held down
             "fault": {"kind": "kill", "target": "learner-3"}},
            {"t": 60.0, "event": "start", "index": 3, "kind": "kill", "ok": True,  # a rank: the unit stays up
             "fault": {"kind": "kill", "target": "learner-4/rank-1"}},
            {"t": end, "event": "heal", "reason": "end"}]


def test_held_down_counts_each_kill_from_the_kill_to_the_restart_inside_the_window():
    assert goodput.held_down(_kill_history(), 10.0, 110.0) == {1: 5.0, 2: 5.0}
    assert goodput.held_down(_kill_history(), 22.0, 110.0) == {1: 3.0, 2: 5.0}


def test_available_goodput_charges_a_system_only_for_the_learners_it_had():
    history = _kill_history()
    rates = {"1": 100.0, "2": 100.0, "3": 100.0, "4": 100.0}
    events = [{"t": 5.0, "kind": "merge", "contributors": [{"tokens": 999}]},  # before the window: not counted
              {"t": 50.0, "kind": "merge", "contributors": [{"tokens": 30000}, {"tokens": 9000}],
               "fragment_share": 1.0},
              {"t": 109.0, "kind": "merge", "contributors": [{"tokens": 4000}], "fragment_share": 0.5}]
    window = goodput.schedule_window(history, events)
    assert window == (10.0, 110.0)
    row = goodput.available_goodput(events, history, {"learner_rates_tokens_per_s": rates}, window)
    # window 100 s; learners 1 and 2 held down 5 s each: 100 * (100 + 100 + 95 + 95) = 39,000
    assert row["capacity_available_tokens"] == 39000.0
    assert row["tokens_merged_in_window"] == 41000.0
    assert row["goodput_available"] == pytest.approx(41000 / 39000, abs=1e-4)
    assert row["goodput_cap"] == pytest.approx(39000 / 40000, abs=1e-4)
    assert row["held_down_seconds"] == {"1": 5.0, "2": 5.0}
    empty = goodput.available_goodput(events, history, {}, window)
    assert empty["goodput_available"] is None


def test_merged_tokens_count_merges_by_fragment_share_and_sync_rounds_whole():
    from trainer.metrics import event_merged_tokens, merged_tokens
    events = [{"t": 1.0, "kind": "merge", "contributors": [{"tokens": 10}, {"tokens": 30}], "fragment_share": 0.25},
              {"t": 2.0, "kind": "sync_step", "tokens": 7}, {"t": 3.0, "kind": "inner_step", "tokens": 5}]
    assert [event_merged_tokens(e) for e in events] == [10.0, 7.0, 0.0]
    assert merged_tokens(events) == 17.0


def test_thrown_away_tokens_are_summed_by_cause():
    events = [{"kind": "apply", "discarded_tokens": 1024}, {"kind": "apply", "discarded_tokens": 0},
              {"kind": "push_dropped", "tokens": 5120}, {"kind": "sync_failed", "discarded_tokens": 512},
              {"kind": "torchft_heal", "discarded_tokens": 2048}, {"kind": "apply"},
              {"kind": "inner_step", "tokens": 512}]
    assert goodput.thrown_away(events) == {"apply": 1024, "stale_push": 5120, "sync_failed": 512, "heal": 2048,
                                           "total": 8704}


# ----------------------------------------------------------------------------- throughput
def test_throughput_bins_processed_and_merged_tokens_per_second():
    events = [
        {"t": 10.5, "kind": "inner_step", "learner": 1, "tokens": 100},
        {"t": 11.0, "kind": "inner_step", "learner": 2, "tokens": 100},
        {"t": 13.0, "kind": "inner_step", "learner": 1, "tokens": 100},
        {"t": 9.0, "kind": "inner_step", "learner": 1, "tokens": 100},  # before the window
        {"t": 11.5, "kind": "merge", "contributors": [{"tokens": 400}, {"tokens": 200}], "fragment_share": 0.5},
        {"t": 14.9, "kind": "sync_step", "tokens": 40},
    ]
    tp = goodput.throughput_series(events, 10.0, 16.0, width=2.0)
    assert tp["edges"] == [0.0, 2.0, 4.0, 6.0]
    assert tp["processed"] == [100.0, 50.0, 0.0]
    assert tp["per_learner"] == {"1": [50.0, 50.0, 0.0], "2": [50.0, 0.0, 0.0]}
    assert tp["merged"] == [150.0, 0.0, 20.0]


def test_a_short_last_bin_joins_the_one_before():
    events = [{"t": 6.2, "kind": "inner_step", "learner": 1, "tokens": 60}]
    tp = goodput.throughput_series(events, 0.0, 6.3, width=2.0)
    assert tp["edges"] == [0.0, 2.0, 4.0, 6.3]
    assert tp["processed"] == [0.0, 0.0, pytest.approx(60 / 2.3, abs=0.1)]


# ----------------------------------------------------------------------------- goals and table
def _row(goodput_value, **extra):
    """Goals are judged on goodput of the available capacity; `goodput` (all capacity) is lower."""
    return {"goodput_available": goodput_value, "goodput": goodput_value * 0.8, "goodput_cap": 0.85, **extra}


def test_goals_are_met_or_not_and_na_when_a_system_did_not_run():
    met = goodput.goals({"decoupled": _row(0.95), "sync": _row(0.2), "torchft": _row(0.5)})
    assert [g["met"] for g in met] == [True, True, True]
    missed = goodput.goals({"decoupled": _row(0.6), "sync": _row(0.35), "torchft": _row(0.5)})
    assert [g["met"] for g in missed] == [False, False, False]
    assert "1.20x" in missed[2]["detail"]
    partial = goodput.goals({"decoupled": _row(0.6), "torchft": {"error": "RuntimeError: no torchft"}})
    assert [g["met"] for g in partial] == [False, None, None]


def test_goal_details_give_both_definitions():
    met = goodput.goals({"decoupled": _row(0.95), "sync": _row(0.2)})
    assert met[0]["detail"] == "95.0% of available capacity (of all capacity: 76.0%, capped at 85.0%)"
    assert met[1]["detail"].startswith("20.0% of available capacity")


def test_the_torchft_goal_says_it_took_the_kills_only():
    g = goodput.goals({"decoupled": _row(0.6), "torchft": _row(0.3, faults_applied="kills only")})[2]
    assert g["met"] is True and "kills only" in g["detail"]


def _full_row(system, **extra):
    row = {"system": system, "goodput": 0.5, "downtime": goodput.downtime([1.0, 2.0], 0.0, 10.0),
           "final_loss": 1.75, "tokens_processed": 1234567, "tokens_merged": 1000000.0, "commits": 42,
           "kills_applied": 5, "faults_applied": "all", "incarnations": 9, "checks": "pass",
           "elapsed_seconds": 200.0}
    row.update(extra)
    return row


def test_the_table_puts_the_systems_side_by_side():
    rows = {"decoupled": _full_row("decoupled"), "sync": _full_row("sync", goodput=0.2, checks="FAIL: progress"),
            "torchft": {"system": "torchft", "error": "RuntimeError: torchft could not be installed"}}
    text = goodput.format_table(rows)
    head = text.splitlines()[0]
    assert head.index("decoupled") < head.index("sync") < head.index("torchft")
    assert "50.0%" in text and "20.0%" in text and "1,234,567" in text and "8.0 / 10" in text
    assert "FAIL: progress" in text and "not run" in text and "tokens thrown away" in text
    assert "torchft: RuntimeError: torchft could not be installed" in text
    assert "net goodput" not in text  # only shown when a torchft row has one
    rows["torchft"] = _full_row("torchft", net_goodput=0.41, faults_applied="kills only")
    text = goodput.format_table(rows)
    assert "net goodput" in text and "41.0%" in text and "kills only" in text


def test_goals_print_yes_no_na():
    text = goodput.format_goals([{"goal": "a", "met": True, "detail": "x"}, {"goal": "b", "met": False, "detail": "y"},
                                 {"goal": "c", "met": None, "detail": "not run"}])
    assert [line.split()[0] for line in text.splitlines()] == ["yes", "no", "n/a"]


# ----------------------------------------------------------------------------- options
def test_quick_shortens_the_run_and_explicit_values_win():
    quick = goodput.parse_args(["--quick"])
    assert quick.duration == goodput.QUICK["duration"] and quick.systems == list(goodput.SYSTEMS)
    assert goodput.parse_args(["--quick", "--duration", "45"]).duration == 45.0
    assert goodput.parse_args([]).duration == goodput.DEFAULTS["duration"]
    assert goodput.parse_args(["--systems", "torchft,decoupled"]).systems == ["decoupled", "torchft"]


def test_the_emulated_accelerator_spares_and_adoption_have_defaults_and_flags():
    args = goodput.parse_args([])
    assert (args.step_time, args.warm_spares, args.adopt) == (goodput.STEP_TIME, goodput.WARM_SPARES, "rebase")
    bare = goodput.parse_args(["--step-time", "0", "--warm-spares", "0", "--adopt", "mix"])
    assert (bare.step_time, bare.warm_spares, bare.adopt) == (0.0, 0, "mix")
    assert goodput.step_time_flags(0.0) == [] and goodput.step_time_flags(0.025) == ["--step-time", "0.025"]


@pytest.mark.parametrize("argv", [["--systems", "decoupled,nope"], ["--systems", ","], ["--duration", "10"],
                                  ["--step-time", "-1"], ["--warm-spares", "-1"], ["--adopt", "merge"]])
def test_bad_options_are_refused(argv, capsys):
    with pytest.raises(SystemExit):
        goodput.parse_args(argv)


# ----------------------------------------------------------------------------- torchft's final parameters
def test_the_newest_committed_torchft_parameters_are_evaluated(tmp_path):
    torch = pytest.importorskip("torch")
    peer = load_bench("peers/torchft_diloco.py", "bench_torchft_diloco")
    from trainer.model import build_model

    train = goodput.eval_config(goodput.FAST_TRAINER_ARGS)
    assert (train.model.n_layer, train.model.n_embd, train.batch_size) == (1, 32, 16)  # `trainer eval`'s batch
    fresh = build_model(train.model, train.seed).state_dict()
    zeros = {k: torch.zeros_like(v) for k, v in fresh.items()}
    peer.save_final(str(tmp_path), 1, {"params": fresh, "manager_step": 7, "step": 70, "incarnation": 1,
                                       "participants": 4})
    peer.save_final(str(tmp_path), 2, {"params": zeros, "manager_step": 3, "step": 30, "incarnation": 2,
                                       "participants": None})
    peer.save_final(str(tmp_path), 3, None)  # never committed: writes nothing
    assert sorted(p.name for p in tmp_path.iterdir()) == ["group-1.pt", "group-2.pt"]
    out = goodput.torchft_final_loss(tmp_path)
    assert out["eval_of"] == "group-1.pt" and out["eval_manager_step"] == 7
    assert 0 < out["final_loss"] < 10
    assert goodput.torchft_final_loss(tmp_path / "none")["final_loss"] is None


# ----------------------------------------------------------------------------- medians of runs
def _run_doc(dec: float, syn: float, tft: float | None) -> dict:
    def row(system, value):
        return {"system": system, "goodput_available": value, "goodput": value * 0.8, "goodput_cap": 0.8,
                "final_loss": 1.7 + value / 100, "tokens_processed": int(value * 1000), "tokens_merged": value * 900,
                "commits": 10, "kills_applied": 24, "incarnations": 28, "elapsed_seconds": 160.0,
                "downtime": {"seconds": 1.0, "window_seconds": 150.0, "longest_gap": 1.0},
                "thrown_away": {"total": 5}, "faults_applied": "all", "checks": "pass"}
    systems = {"decoupled": row("decoupled", dec), "sync": row("sync", syn)}
    systems["torchft"] = row("torchft", tft) if tft is not None else {"system": "torchft", "error": "no torchft"}
    return {"config": {"seed": 7}, "systems": systems}


def test_the_median_of_runs_takes_each_figure_over_the_runs_that_succeeded():
    docs = [_run_doc(0.95, 0.72, 0.62), _run_doc(0.96, 0.70, None), _run_doc(0.94, 0.69, 0.59)]
    rows = goodput.median_rows(docs)
    assert rows["decoupled"]["goodput_available"] == 0.95 and rows["decoupled"]["runs"] == [0.95, 0.96, 0.94]
    assert rows["sync"]["goodput_available"] == 0.70
    assert rows["torchft"]["goodput_available"] == pytest.approx((0.62 + 0.59) / 2), "two runs: their mean"
    assert rows["decoupled"]["tokens_processed"] == 950 and rows["decoupled"]["checks"] == "pass"
    assert goodput.ratio_per_run(docs) == [pytest.approx(0.95 / 0.62, abs=1e-3), None,
                                           pytest.approx(0.94 / 0.59, abs=1e-3)]
    assert [g["met"] for g in goodput.goals(rows)] == [True, False, True]


def test_median_of_prints_the_table_and_refuses_an_unreadable_file(tmp_path, capsys):
    paths = []
    for i, doc in enumerate([_run_doc(0.95, 0.2, 0.5), _run_doc(0.91, 0.25, 0.5)]):
        path = tmp_path / f"r{i}.json"
        path.write_text(__import__("json").dumps(doc))
        paths.append(str(path))
    assert goodput.summarize_runs(paths, tmp_path / "median.json") == 0
    out = capsys.readouterr().out
    assert "median of 2 runs" in out and "93.0%" in out and "Islands / torchft per run: 1.90x, 1.82x" in out
    assert (tmp_path / "median.json").is_file()
    assert goodput.summarize_runs([str(tmp_path / "missing.json")], None) == 2
    assert "cannot read" in capsys.readouterr().err


def test_run_systems_starts_each_fresh_and_a_failure_hides_no_other(tmp_path, capsys):
    stale = tmp_path / "sync" / "state"
    stale.mkdir(parents=True)
    reported: list[str] = []

    def run_one(system, run_dir):
        assert not run_dir.exists(), "a system must start in a fresh run directory"
        if system == "sync":
            raise RuntimeError("boom")
        return {"system": system, "ok": True}

    rows = goodput.run_systems(["sync", "decoupled"], tmp_path, run_one, lambda s, row, d: reported.append(s))
    assert rows["sync"]["error"] == "RuntimeError: boom" and rows["decoupled"]["ok"]
    assert reported == ["decoupled"], "only a system that ran is reported"
    assert all(r["run_dir"] == str(tmp_path / s) and r["elapsed_seconds"] >= 0 for s, r in rows.items())
    assert "sync: RuntimeError: boom" in capsys.readouterr().out
