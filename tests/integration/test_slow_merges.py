"""Slow merges and learners leaving one by one do not make the outer step diverge (issue 13).

The reproduction, made deterministic: every learner is an emulated accelerator
(`--step-time 0.02`, so a round of H=10 steps takes 0.2 s whatever else the machine does)
behind a link with 150 ms of latency each way, so a push's acknowledgement and the pull of
its merge take at least 0.6 s: merges lag three rounds. Then the learners leave one at a
time, each one's residual push merging without the others, as at the end of any run.

Before the fix the learners pushed again before adopting the merge of their last push
(increments of a local path that never saw Θ, pipelining 3-5 versions deep), every merge
was a full Nesterov step whatever share of a round it held, and the momentum started at
0.9 from the first round: Θ's held-out loss spiked to 8-19 nats in the first rounds (above
the untrained model's 5.5), rose again by 0.3-0.5 for stretches of pipelined merges, and the
partial merges after the learners' BYE moved the final Θ away from its best. The same run
with those three behaviours restored (`--push-window 1000 --momentum-unit merge
--momentum-warmup 0`) is the control that shows the reproduction reproduces.
"""
from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from chaos.backends.local import LocalCluster
from chaos.runner import wait_until_training
from faults import Latency
from trainer.events import read_events

from .cluster_helpers import wait_for

pytestmark = pytest.mark.integration

FAST = ["--n-layer", "1", "--n-embd", "32", "--n-head", "2", "--batch-size", "8", "--sync-every", "10"]
STEP_TIME = "0.02"
LATENCY_MS = 150
LEARNERS = 3
ROUNDS = 25             # merges before the learners start leaving
BEFORE_THE_FIX = ["--push-window", "1000", "--momentum-unit", "merge", "--momentum-warmup", "0"]


def _run(run_dir: Path, trainer_args: list[str]) -> list[dict]:
    cluster = LocalCluster(run_dir, learners=LEARNERS, trainer_args=FAST + trainer_args,
                           learner_args={i: ["--step-time", STEP_TIME] for i in range(1, LEARNERS + 1)})
    try:
        cluster.start()
        wait_until_training(run_dir, LEARNERS)
        for i in range(1, LEARNERS + 1):
            target = f"learner-{i}"
            for spec in Latency(at=0, duration=1, target=target, latency_ms=LATENCY_MS).toxics():
                cluster.toxiproxy.add_toxic(cluster.link_proxy(target), **spec)
        wait_for(run_dir, f"{ROUNDS} merges behind {LATENCY_MS} ms links",
                 lambda ev: any(e["kind"] == "merge" and e["version"] >= ROUNDS for e in ev), timeout=240)
        for i in range(1, LEARNERS + 1):  # leave one by one, each residual push merging on its own
            proc = cluster.procs[f"learner-{i}"]
            proc.signal(signal.SIGTERM)
            proc.terminate(30.0)
            wait_for(run_dir, f"learner-{i}'s clean stop", lambda ev, i=i: any(
                e["kind"] == "process_stop" and e.get("learner") == i for e in ev), timeout=30)
            time.sleep(0.5)  # let its residual push merge before the next one leaves
    finally:
        cluster.stop()
    return read_events(run_dir)


def pipelined(events: list[dict]) -> list[dict]:
    """Pushes sent before their learner adopted the merge of its previous push of the same
    fragment: an accepted push answered with version v is merged into v+1, so the next push
    must be based on v+1 or later. Residual pushes at a clean stop are exempt."""
    last: dict[tuple, dict] = {}
    out = []
    for e in events:
        if e["kind"] != "push" or e.get("status") not in ("accepted", "duplicate", "stale") or e.get("residual"):
            continue
        key = (e["learner"], e["incarnation"], e["fragment"])
        prev = last.get(key)
        if prev is not None and prev["status"] == "accepted" and e["base_version"] <= prev["version"]:
            out.append({"learner": e["learner"], "fragment": e["fragment"], "seq": e["seq"],
                        "base_version": e["base_version"], "previous_merged_into": prev["version"] + 1})
        last[key] = e
    return out


def curve(events: list[dict]) -> list[tuple[int, float]]:
    return [(e["version"], e["loss"]) for e in events if e["kind"] == "global_eval"]


def rises(points: list[tuple[int, float]]) -> tuple[float, float]:
    """(the largest rise of Θ's held-out loss above its running best, the final loss above the best)."""
    best, worst_rise = float("inf"), 0.0
    for _, loss in points:
        worst_rise = max(worst_rise, loss - best)
        best = min(best, loss)
    return worst_rise, points[-1][1] - best


def test_slow_merges_and_leaving_learners_do_not_diverge(tmp_path: Path) -> None:
    events = _run(tmp_path / "run", [])
    assert not pipelined(events), f"pushes sent before adopting their predecessor's merge: {pipelined(events)[:5]}"
    points = curve(events)
    assert len(points) >= 5, f"the syncer sampled Θ only {len(points)} times"
    start = points[0][1]
    assert all(loss <= start for _, loss in points[1:]), (
        f"Θ's held-out loss rose above the untrained model's {start:.3f}: {points}")
    worst_rise, final_above_best = rises(points)
    assert worst_rise <= 0.3, f"Θ's held-out loss rose {worst_rise:.3f} above its running best: {points}"
    assert final_above_best <= 0.02, (
        f"the learners' departure moved the final Θ {final_above_best:.3f} above its best: {points[-8:]}")
    merges = [e for e in events if e["kind"] == "merge"]
    assert [m for m in merges if m["outer"].get("round_fraction", 1.0) < 1.0], "no partial merge at the end"


def test_control_before_the_fix_the_same_run_pipelines(tmp_path: Path) -> None:
    """The reproduction reproduces: with the three behaviours before the fix restored, the
    learners push ahead of their merges (deterministic at this latency); the divergence that
    follows is a matter of timing, so it is reported, not asserted."""
    events = _run(tmp_path / "run", BEFORE_THE_FIX)
    assert pipelined(events), "at 150 ms per direction the pre-fix learners must push ahead of their merges"
    worst_rise, final_above_best = rises(curve(events))
    print(f"before the fix: largest rise above the running best {worst_rise:.3f}, final above best "
          f"{final_above_best:.3f}, pipelined pushes {len(pipelined(events))}")
