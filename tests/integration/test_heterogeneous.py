"""Heterogeneous learners: a 4x slower learner never slows a fast one in decoupled mode.

Two learners share this machine; learner-2 runs at --speed 0.25 (each step followed by a
sleep three times its compute). The fast learner's median step time is compared with a run
where both are fast: decoupled, it is no more than 10% slower (in practice it gets a little
faster: it merges and pulls less often). The same measurement in sync mode,
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
MEASURED_STEPS = 150
WARMUP_STEPS = 20


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


def _median_step_seconds(events: list[dict], learner: int) -> float:
    """Median wall time between consecutive steps of `learner`, in the measured window:
    learner-1's steps after its warm-up, while the other learner still trains."""
    fast = [e["t"] for e in _steps(events, 1)]
    end = min(fast[min(len(fast), WARMUP_STEPS + MEASURED_STEPS) - 1], _steps(events, 2)[-1]["t"])
    times = [e["t"] for e in _steps(events, learner) if fast[WARMUP_STEPS] <= e["t"] <= end]
    assert len(times) > 10, f"learner-{learner} made only {len(times)} steps in the measured window"
    return statistics.median(b - a for a, b in zip(times, times[1:]))


def test_a_4x_slower_learner_leaves_the_fast_learner_s_step_rate_unchanged(tmp_path: Path) -> None:
    even = _median_step_seconds(_train(tmp_path / "even", "decoupled", {}), 1)
    uneven_events = _train(tmp_path / "uneven", "decoupled", {2: 0.25})
    uneven = _median_step_seconds(uneven_events, 1)
    slow = _median_step_seconds(uneven_events, 2)
    assert slow > 2.5 * uneven, f"learner-2 was not slowed down (step {slow:.4f}s vs {uneven:.4f}s)"
    # One-sided: with a slow peer the fast learner also pulls and merges less often, so it may
    # well get faster; what must never happen is that it waits. bench/heterogeneous.py reports
    # the change both ways.
    assert uneven <= 1.10 * even, (
        f"the fast learner slowed down {uneven / even - 1:+.1%} with a 4x slower peer "
        f"({even * 1e3:.2f} ms -> {uneven * 1e3:.2f} ms per step)")

    # The control: in sync mode the same slow peer gates every step of the fast learner.
    coupled = _median_step_seconds(_train(tmp_path / "sync", "sync", {2: 0.25}), 1)
    assert coupled > 2 * even, f"sync mode should couple the learners ({even:.4f}s -> {coupled:.4f}s)"

    # Tokens: what the slow learner pushed is what it processed, and merges weigh by tokens.
    processed = {i: sum(e["tokens"] for e in _steps(uneven_events, i)) for i in (1, 2)}
    pushed = {i: sum(e["tokens"] for e in uneven_events if e["kind"] == "push" and e["learner"] == i
                     and e["status"] in ("accepted", "duplicate")) for i in (1, 2)}
    # With α = 0 the steps made between a push and adopting its merge are overwritten by the
    # global parameters: their tokens are discarded, and said so in the `apply` event.
    discarded = {i: sum(e["discarded_tokens"] for e in uneven_events if e["kind"] == "apply" and e["learner"] == i)
                 for i in (1, 2)}
    assert {i: pushed[i] + discarded[i] for i in (1, 2)} == processed, \
        f"tokens pushed {pushed} + discarded {discarded} differ from tokens processed {processed}"
    assert processed[2] < 0.5 * processed[1]
    both = [m for m in merges(uneven_events) if len({c["learner"] for c in m["contributors"]}) == 2]
    assert both, "no merge combined the fast and the slow learner"
    for m in both:  # README, "Merging": w_i = T_i / max(Σ T_k, L·H·tokens_per_step)
        total = max(sum(c["tokens"] for c in m["contributors"]), m["expected_tokens"])
        for c in m["contributors"]:
            assert c["weight"] == pytest.approx(c["tokens"] / total, abs=1e-3), \
                f"merge {m['fragment']}@{m['version']} weighs {c['learner']} by {c['weight']}, not its tokens"
