"""The pure parts of bench/goodput_scale.py: the write-up's schedule, the merged ratio, the
memory summary and the CLI. No cluster is started here."""
from __future__ import annotations

import pytest

from .bench_scripts import load_bench

scale = load_bench("goodput_scale.py", "bench_goodput_scale")


def _busy(f) -> tuple[str, float, float]:
    target = f.targets[0] if f.kind == "partition" else f.target
    return target, f.at, f.at + f.duration


def test_the_full_schedule_has_the_writeups_faults_and_our_latencies():
    s = scale.make_scale_schedule(17, 32, 1800)
    counts = scale.fault_counts(s)
    assert counts == {"kill": 27, "pause": 18, "partition": 17, "latency": 4}
    assert len(s.faults) >= 60
    assert {int(_busy(f)[0].split("-")[1]) for f in s.faults} <= set(range(1, 33))
    assert len({_busy(f)[0] for f in s.faults}) >= 20, "faults are spread over the learners"


def test_faults_of_one_learner_never_overlap_and_all_end_before_the_margin():
    s = scale.make_scale_schedule(3, 32, 1800)
    by_target: dict[str, list[tuple[float, float]]] = {}
    for f in s.faults:
        target, a, b = _busy(f)
        assert b <= 1800 - scale.goodput.MARGIN + 1e-6
        by_target.setdefault(target, []).append((a, b))
    for spans in by_target.values():
        spans.sort()
        for (_, end), (start, _) in zip(spans, spans[1:]):
            assert start >= end + scale.REST - 1e-6


def test_faults_come_about_every_29_seconds():
    s = scale.make_scale_schedule(5, 32, 1800, latency_faults=0)
    starts = sorted(f.at for f in s.faults)
    gaps = [b - a for a, b in zip(starts, starts[1:])]
    assert 25 < sum(gaps) / len(gaps) < 31


def test_the_schedule_is_a_function_of_its_seed():
    assert scale.make_scale_schedule(9, 32, 1800).dumps() == scale.make_scale_schedule(9, 32, 1800).dumps()
    assert scale.make_scale_schedule(9, 32, 1800).dumps() != scale.make_scale_schedule(10, 32, 1800).dumps()


def test_too_many_faults_for_the_learners_is_refused_with_the_reason():
    with pytest.raises(ValueError, match="no learner is free"):
        scale.make_scale_schedule(1, 2, 300, counts={"partition": 40}, latency_faults=0,
                                  partition_seconds=(20.0, 25.0))
    with pytest.raises(ValueError, match="learners"):
        scale.make_scale_schedule(1, 1, 1800)


def test_merged_in_counts_only_the_window_and_the_ratio():
    events = [{"kind": "merge", "t": t, "contributors": [{"tokens": 100, "id": f"1:1:{t}"}], "tokens": 100}
              for t in (0.5, 1.0, 5.0, 11.5)]
    got = scale.merged_in(events, 1.0, 10.0)
    assert got == 200.0, "the merges at 1.0 and 5.0 s only"
    assert scale.merged_ratio(97.7, 100.0) == 0.977
    assert scale.merged_ratio(1.0, 0.0) is None


def test_roles_and_memory_summary():
    assert scale.role_of(" python -m trainer syncer --learners 32") == "syncer"
    assert scale.role_of(" python -m trainer learner --learner 3") == "learner"
    assert scale.role_of(" python -m chaos toxiproxy --port 1") == "proxy"
    samples = [{"machine_used_mib": 1000.0, "roles": {"learner": [300.0, 320.0, 310.0], "syncer": [250.0]}},
               {"machine_used_mib": 1200.0, "roles": {"learner": [330.0, 340.0], "syncer": [260.0]}}]
    m = scale.summarize_memory(samples)
    assert m["machine_used_mib"] == {"peak": 1200.0, "median": 1100.0}
    assert m["learner"]["largest_process_mib"]["peak"] == 340.0
    assert m["learner"]["total_mib"]["peak"] == 930.0
    assert m["cluster_total_mib"]["peak"] == 1180.0
    assert scale.summarize_memory([]) == {}


def test_cli_errors_name_the_flag(capsys):
    with pytest.raises(SystemExit):
        scale.parse_args(["--systems", "chaos,bogus"])
    assert "--systems" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        scale.parse_args(["--step-time", "0"])
    assert "--step-time" in capsys.readouterr().err
    quick = scale.parse_args(["--quick"])
    assert quick.learners == 8 and quick.duration == 120.0


def test_within_keeps_the_faults_that_end_before_a_shorter_run():
    s = scale.make_scale_schedule(17, 32, 1800)
    short = scale.within(s, 600)
    assert short.faults and all(f.at + f.duration <= 600 - scale.goodput.MARGIN for f in short.faults)
    assert len(short.faults) == sum(1 for f in s.faults if f.at + f.duration <= 600 - scale.goodput.MARGIN)
    assert short.faults[-1] == [f for f in s.faults if f.at + f.duration <= 600 - scale.goodput.MARGIN][-1]
