"""Figures computed from a run's events only: goodput, tokens, bytes, losses.

Goodput = merged useful tokens ÷ the tokens the learners could have processed in the
same wall time.
- Merged useful tokens: in decoupled mode, the tokens of every push that entered a merge,
  weighted by the share of parameters its fragment holds (so P fragments do not count a
  token P times); in sync mode, the tokens of every completed all-reduce round.
- Capacity: Σ over learners of (its fault-free rate) × (the time it could have computed),
  where a learner's rate is its tokens per step over the median own compute time of a step
  (waiting on the network excluded; for a learner computing on one CPU thread, the step's
  CPU time, without the time it was preempted), scaled by its configured speed factor; with an
  emulated accelerator (--step-time T) the step time is T, or the median compute if longer.
  The time it could have computed is the run's wall time, less the time the learner was
  ready to step but waited for a CPU (trainer/cpuwait.py): learners sharing a machine's
  cores (three on two) cannot all run at their solo rate, and goodput must not read a full
  machine as a wasteful protocol. Time a learner was down, paused or cut off still counts.
  `goodput_solo` is the same tokens over every learner's solo rate for the whole run.
"""
from __future__ import annotations

import statistics
from collections import defaultdict
from typing import Iterable

from .fates import where_tokens_went


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def learner_rates(events: Iterable[dict]) -> dict[int, float]:
    """Fault-free tokens per second of each learner, from its own compute times."""
    compute: dict[int, list[float]] = defaultdict(list)
    tokens: dict[int, int] = {}
    speed: dict[int, float] = {}
    step_time: dict[int, float] = {}
    for e in events:
        if e["kind"] == "inner_step" and e.get("learner") is not None:
            # A CPU-bound learner's own CPU time per step (`cpu_s`), not its wall time, which
            # holds the time another process had its core: that time is left out of goodput's
            # capacity instead (learner_cpu_waits), and must not lower the rate as well.
            compute[e["learner"]].append(float(e["cpu_s"] if e.get("cpu_s") else e["compute_s"]))
            tokens[e["learner"]] = int(e["tokens"])
        elif e["kind"] == "process_start" and e.get("role") == "learner":
            speed[e["learner"]] = float(e.get("speed", 1.0))
            step_time[e["learner"]] = float(e.get("step_time") or 0.0)
    rates = {}
    for learner, values in compute.items():
        med = _median(values)
        if med and med > 0:
            seconds = max(step_time.get(learner, 0.0), med / speed.get(learner, 1.0))
            rates[learner] = tokens[learner] / seconds
    return rates


def learner_cpu_waits(events: Iterable[dict]) -> dict[int, float]:
    """Seconds each learner whose accelerator is the CPU (no --step-time) spent ready to
    step but waiting for a core (trainer/cpuwait.py), summed over its incarnations."""
    first: dict[tuple, float] = {}
    last: dict[tuple, float] = {}
    emulated: set[int] = set()
    for e in events:
        if e["kind"] == "process_start" and e.get("role") == "learner" and float(e.get("step_time") or 0.0) > 0:
            emulated.add(e["learner"])
        elif e["kind"] == "inner_step" and e.get("learner") is not None and "cpu_wait" in e:
            key = (e["learner"], e.get("incarnation"))
            first.setdefault(key, float(e["cpu_wait"]))
            last[key] = float(e["cpu_wait"])
    out: dict[int, float] = defaultdict(float)
    for key, value in last.items():
        if key[0] not in emulated:  # an emulated accelerator's slot absorbs the host's waits
            out[key[0]] += max(0.0, value - first[key])
    return dict(out)


def event_merged_tokens(event: dict) -> float:
    """Useful tokens one event merged: a merge's contributors weighted by its fragment's
    share of the parameters, or a sync round's tokens; 0 for any other event."""
    if event["kind"] == "merge":
        return sum(c["tokens"] for c in event["contributors"]) * float(event.get("fragment_share", 1.0))
    if event["kind"] == "sync_step":
        return float(event["tokens"])
    return 0.0


def merged_tokens(events: Iterable[dict]) -> float:
    return sum(event_merged_tokens(e) for e in events)


def summarize(events: list[dict], num_learners: int) -> dict:
    steps = [e for e in events if e["kind"] == "inner_step"]
    if not steps:
        return {"error": "no inner steps were recorded"}
    t0, t1 = steps[0]["t"], steps[-1]["t"]
    wall = max(t1 - t0, 1e-9)
    rates = learner_rates(events)
    mean_rate = statistics.fmean(rates.values()) if rates else 0.0
    solo = sum(rates.get(i, mean_rate) for i in range(1, num_learners + 1)) * wall
    waits = learner_cpu_waits(events)
    capacity = sum(rates.get(i, mean_rate) * max(0.0, wall - waits.get(i, 0.0)) for i in range(1, num_learners + 1))
    merged = merged_tokens(events)
    processed = sum(e["tokens"] for e in steps)
    merges = [e for e in events if e["kind"] == "merge"]
    sync_steps = [e for e in events if e["kind"] == "sync_step"]
    finals = [e for e in events if e["kind"] == "final_state"]
    counters = finals[-1]["counters"] if finals else {}
    wire = int(counters.get("bytes_in", 0)) + int(counters.get("bytes_out", 0))
    last = defaultdict(list)
    for e in steps:
        last[e["learner"]].append(float(e["loss"]))
    recent = [v for losses in last.values() for v in losses[-20:]]
    starts = [e for e in events if e["kind"] == "process_start" and e.get("role") == "learner"]
    return {
        "wall_seconds": round(wall, 3),
        "inner_steps": len(steps),
        "tokens_processed": processed,
        "tokens_merged": round(merged, 1),
        "capacity_tokens": round(capacity, 1),
        "goodput": round(merged / capacity, 4) if capacity > 0 else None,
        "capacity_solo_tokens": round(solo, 1),
        "goodput_solo": round(merged / solo, 4) if solo > 0 else None,
        "cpu_wait_seconds": {str(k): round(v, 2) for k, v in sorted(waits.items())},
        "merges": len(merges),
        "sync_rounds": len(sync_steps),
        "versions": max((e["version"] for e in merges), default=0),
        "bytes_on_wire": wire,
        "bytes_per_token": round(wire / processed, 3) if processed else None,
        "train_loss_recent": round(statistics.fmean(recent), 4) if recent else None,
        "learner_rates_tokens_per_s": {str(k): round(v, 1) for k, v in sorted(rates.items())},
        "learner_incarnations": len(starts),
        "rejected_frames": int(counters.get("rejected_frames", 0)),
        "dropped_stale": int(counters.get("dropped_stale", 0)),
        "duplicates": int(counters.get("duplicates", 0)),
        "heartbeats_lost": int(counters.get("heartbeats_lost", 0)),
        **(where_tokens_went(events, waits, wall) if merges else {}),
    }
