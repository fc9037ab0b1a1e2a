"""Heterogeneous learners: a 4x slower learner never holds back a fast one in decoupled mode.

Two learners share this machine; learner-2 runs at --speed 0.25 (each step followed by
three times its compute of spinning). Decoupled, the fast learner runs ahead of the slow one
(it made at least twice its steps over the same stretch: its inner loop never waits, though
with one push in flight its pushes follow the merges the slow learner completes within the
grace window); in sync mode, the control, every round waits for both, so they step in lockstep.
Every assertion is on the run's own structure (step counts within one run, who is in which
merge or round), none on seconds: how fast the fast learner steps on this machine, and the
10% target, are speed figures and live in bench/heterogeneous.py (BENCHMARKS.md).
The slow learner spins rather than sleeps (`--slowdown spin`), so it keeps its core as busy
as a fast one would and CPU sharing on one machine does not pose as (de)coupling; two
learners, so that both fit on two cores. The slow learner's pushes carry the tokens it really
processed, and every merge weighs each push by its tokens.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from trainer.launch import ClusterSpec, LocalCluster
from trainer.runspec import RunSpec

from .cluster_helpers import merges, wait_for

pytestmark = pytest.mark.integration

FAST = ["--n-layer", "1", "--n-embd", "32", "--n-head", "2", "--batch-size", "8", "--sync-every", "10"]
MEASURED_STEPS = 300
WARMUP_STEPS = 20


def _steps(events: list[dict], learner: int) -> list[dict]:
    return [e for e in events if e["kind"] == "inner_step" and e["learner"] == learner]


def _train(run_dir: Path, mode: str, speeds: dict[int, float]) -> list[dict]:
    """Run two learners until learner-1 has made its measured steps; the events of the run."""
    run = RunSpec(learners=2, mode=mode, trainer_args=FAST).with_learner_flags(["--slowdown", "spin"])
    cluster = LocalCluster(ClusterSpec(run_dir, run, speeds=speeds))
    try:
        cluster.start()
        wait_for(run_dir, f"learner-1 to make {WARMUP_STEPS + MEASURED_STEPS} {mode} steps",
                 lambda ev: len(_steps(ev, 1)) >= WARMUP_STEPS + MEASURED_STEPS and len(_steps(ev, 2)) > 0,
                 timeout=180)
    finally:
        cluster.stop()
    from trainer.events import read_events
    return read_events(run_dir)


def _window(events: list[dict]) -> tuple[float, float]:
    """While both learners were training, after learner-1's warm-up."""
    fast = [e["t"] for e in _steps(events, 1)]
    start = max(fast[WARMUP_STEPS], _steps(events, 2)[0]["t"])
    return start, min(fast[-1], _steps(events, 2)[-1]["t"])


def _window_steps(events: list[dict], learner: int) -> int:
    start, end = _window(events)
    return sum(1 for e in _steps(events, learner) if start <= e["t"] <= end)


def test_a_4x_slower_learner_does_not_hold_back_the_fast_one(tmp_path: Path) -> None:
    uneven_events = _train(tmp_path / "uneven", "decoupled", {2: 0.25})
    fast, slow = _window_steps(uneven_events, 1), _window_steps(uneven_events, 2)
    assert slow > 10, f"learner-2 made only {slow} steps while learner-1 trained"
    # Coupled, the fast learner would make one step per step of the slow one (sync mode,
    # below); decoupled it runs ahead, by about the 4x of the configured speeds.
    assert fast >= 2 * slow, f"the fast learner made {fast} steps while the 4x slower one made {slow}"

    # The control: in sync mode the same slow peer gates every step of the fast learner.
    sync_events = _train(tmp_path / "sync", "sync", {2: 0.25})
    start, end = _window(sync_events)
    rounds = [e for e in sync_events if e["kind"] == "sync_step" and start <= e["t"] <= end]
    both = [r for r in rounds if sorted(r["contributors"]) == [1, 2]]
    assert len(both) >= len(rounds) - 2, f"only {len(both)} of {len(rounds)} sync rounds waited for both learners"
    coupled_fast, coupled_slow = _window_steps(sync_events, 1), _window_steps(sync_events, 2)
    assert abs(coupled_fast - coupled_slow) <= 2, (
        f"sync mode should step the learners in lockstep ({coupled_fast} vs {coupled_slow} steps)")

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
    for m in both:  # docs/algorithm.md, "Merging": w_i = T_i / max(Σ T_k, the round's expected tokens)
        total = max(sum(c["tokens"] for c in m["contributors"]), m["expected_tokens"])
        for c in m["contributors"]:
            # The final round weighs learners, not pushes: each push of learner l carries l's
            # share of the round's tokens (docs/wire.md), its pushes summed.
            tokens = sum(o["tokens"] for o in m["contributors"] if o["learner"] == c["learner"]) \
                if m.get("final") else c["tokens"]
            assert c["weight"] == pytest.approx(tokens / total, abs=1e-3), \
                f"merge {m['fragment']}@{m['version']} weighs {c['learner']} by {c['weight']}, not its tokens"
