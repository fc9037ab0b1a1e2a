"""Heterogeneous learners: a 4x slower learner never slows a fast one in decoupled mode.

Two learners share this machine; learner-2 runs at --speed 0.25 (each step followed by
three times its compute of spinning). The fast learner's median step time is compared with
runs where both are fast: decoupled, it does not wait for the slow one (bounded at 1.5x, where
a coupled learner is 4x slower; the 10% figure is bench/heterogeneous.py's, a benchmark). The same measurement in sync mode,
where every step waits for the slowest learner, shows the coupling it would catch.
The slow learner spins rather than sleeps (`--slowdown spin`), so it keeps its core as busy
as a fast one would and CPU sharing on one machine does not pose as (de)coupling; two
learners, so that both fit on two cores. The slow learner's pushes carry the tokens it really processed, and every merge
weighs each push by its tokens.
"""
from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from trainer.launch import ClusterSpec, LocalCluster

from .cluster_helpers import merges, wait_for

pytestmark = pytest.mark.integration

FAST = ["--n-layer", "1", "--n-embd", "32", "--n-head", "2", "--batch-size", "8", "--sync-every", "10"]
MEASURED_STEPS = 300
WARMUP_STEPS = 20
PAIRS = 2


def _steps(events: list[dict], learner: int) -> list[dict]:
    return [e for e in events if e["kind"] == "inner_step" and e["learner"] == learner]


def _train(run_dir: Path, mode: str, speeds: dict[int, float]) -> list[dict]:
    """Run two learners until learner-1 has made its measured steps; the events of the run."""
    cluster = LocalCluster(ClusterSpec(run_dir=run_dir, learners=2, mode=mode, data="markov",
                                       syncer_flags=["--mode", mode, *FAST], speeds=speeds,
                                       learner_flags=["--slowdown", "spin"]))
    try:
        cluster.start()
        wait_for(run_dir, f"learner-1 to make {WARMUP_STEPS + MEASURED_STEPS} {mode} steps",
                 lambda ev: len(_steps(ev, 1)) >= WARMUP_STEPS + MEASURED_STEPS and len(_steps(ev, 2)) > 0,
                 timeout=180)
    finally:
        cluster.stop()
    from trainer.events import read_events
    return read_events(run_dir)


def _step_intervals(events: list[dict], learner: int) -> list[float]:
    """Wall time between consecutive steps of `learner`, in the measured window: learner-1's
    steps after its warm-up, while the other learner still trains."""
    fast = [e["t"] for e in _steps(events, 1)]
    end = min(fast[min(len(fast), WARMUP_STEPS + MEASURED_STEPS) - 1], _steps(events, 2)[-1]["t"])
    times = [e["t"] for e in _steps(events, learner) if fast[WARMUP_STEPS] <= e["t"] <= end]
    assert len(times) > 10, f"learner-{learner} made only {len(times)} steps in the measured window"
    return [b - a for a, b in zip(times, times[1:])]


def _median_step_seconds(events: list[dict], learner: int) -> float:
    return statistics.median(_step_intervals(events, learner))


def test_a_4x_slower_learner_leaves_the_fast_learner_s_step_rate_unchanged(tmp_path: Path) -> None:
    # Two alternating pairs of runs, intervals pooled per condition: one run's median moves by
    # several percent with whatever else the machine does, a pooled median much less.
    even_intervals: list[float] = []
    uneven_intervals: list[float] = []
    for pair in range(PAIRS):
        even_intervals += _step_intervals(_train(tmp_path / f"even-{pair}", "decoupled", {}), 1)
        uneven_events = _train(tmp_path / f"uneven-{pair}", "decoupled", {2: 0.25})
        uneven_intervals += _step_intervals(uneven_events, 1)
    even, uneven = statistics.median(even_intervals), statistics.median(uneven_intervals)
    slow = _median_step_seconds(uneven_events, 2)
    assert slow > 2.5 * uneven, f"learner-2 was not slowed down (step {slow:.4f}s vs {uneven:.4f}s)"
    # A fast learner coupled to a 4x slower one steps 4x slower (sync mode, below, shows it).
    # Decoupled it must not wait at all; the bound leaves room for the noise of two shared
    # cores. The 10% target is a speed figure, measured where speed figures belong: in
    # bench/heterogeneous.py (median of alternating runs; -6.9% in BENCHMARKS.md).
    assert uneven <= 1.5 * even, (
        f"the fast learner slowed down {uneven / even - 1:+.1%} with a 4x slower peer "
        f"({even * 1e3:.2f} ms -> {uneven * 1e3:.2f} ms per step)")

    # The control: in sync mode the same slow peer gates every step of the fast learner.
    coupled = _median_step_seconds(_train(tmp_path / "sync", "sync", {2: 0.25}), 1)
    assert coupled > 2 * even, f"sync mode should couple the learners ({even:.4f}s -> {coupled:.4f}s)"

    # Tokens: what the slow learner pushed is what it processed, and merges weigh by tokens.
    processed = {i: sum(e["tokens"] for e in _steps(uneven_events, i)) for i in (1, 2)}
    def pushed_tokens(i: int, statuses: tuple[str, ...]) -> int:
        return sum(e["tokens"] for e in uneven_events
                   if e["kind"] == "push" and e["learner"] == i and e["status"] in statuses)

    pushed = {i: pushed_tokens(i, ("accepted", "duplicate")) for i in (1, 2)}
    stale = {i: pushed_tokens(i, ("stale",)) for i in (1, 2)}  # dropped by the syncer, and counted
    # With α = 0 the steps made between a push and adopting its merge are overwritten by the
    # global parameters: their tokens are discarded, and said so in the `apply` event.
    discarded = {i: sum(e["discarded_tokens"] for e in uneven_events if e["kind"] == "apply" and e["learner"] == i)
                 for i in (1, 2)}
    assert {i: pushed[i] + stale[i] + discarded[i] for i in (1, 2)} == processed, \
        f"tokens pushed {pushed} + stale {stale} + discarded {discarded} differ from tokens processed {processed}"
    assert processed[2] < 0.5 * processed[1]
    both = [m for m in merges(uneven_events) if len({c["learner"] for c in m["contributors"]}) == 2]
    assert both, "no merge combined the fast and the slow learner"
    for m in both:  # README, "Merging": w_i = T_i / max(Σ T_k, L·H·tokens_per_step)
        total = max(sum(c["tokens"] for c in m["contributors"]), m["expected_tokens"])
        for c in m["contributors"]:
            assert c["weight"] == pytest.approx(c["tokens"] / total, abs=1e-3), \
                f"merge {m['fragment']}@{m['version']} weighs {c['learner']} by {c['weight']}, not its tokens"
