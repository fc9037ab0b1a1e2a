"""Data-parallel at scale: one job over every chip, elastic or not.

Non-elastic (`dp`): any failure stops everyone. The job restarts (recovery_dp: wait for
the failed slice, then restart) from its last checkpoint, so the progress since that
checkpoint is redone. Failures during the restart join it.

Elastic (`elastic-dp`): a failure stops everyone for one reconfiguration (downscale); the
job then runs without the failed slice, which returns after slice_return and is added back
by a second reconfiguration (upscale). Changes that arrive during a reconfiguration join
it. The step in progress when a chip fails is lost (its all-reduce cannot complete); an
upscale waits for a step boundary and loses nothing.
"""
from __future__ import annotations

import heapq

from .failures import Failures, draws
from .inputs import ScaleInputs
from .result import SystemResult


def simulate_dp(failures: Failures, inp: ScaleInputs, duration: float) -> SystemResult:
    result = SystemResult(seconds=duration, capacity=duration)
    restarts = draws(inp.dp_restart, len(failures.times), inp.seed, "dp")
    resumed = down_until = 0.0
    absorbed = 0
    for k, t in enumerate(failures.times):
        if t < down_until:
            absorbed += 1
            continue
        result.lost["rollback"] += (t - resumed) % inp.checkpoint_every
        down_until = resumed = t + restarts[k]
        result.lost["stall"] += min(down_until, duration) - t
    result.info = {"failures": len(failures.times), "absorbed": absorbed,
                   "global_downtime_s": result.lost["stall"]}
    return result


def simulate_elastic(failures: Failures, inp: ScaleInputs, duration: float) -> SystemResult:
    result, _ = elastic_run(failures.times, inp.chips, inp, duration, "elastic")
    return result


def elastic_run(times: list[float], chips: float, inp: ScaleInputs, duration: float,
                stream: str) -> tuple[SystemResult, list[tuple[float, float]]]:
    """One elastic data-parallel job of `chips` chips whose chips fail at `times`: its result
    (capacity: `duration` job-seconds) and the intervals it stood stalled. Elastic-dp is one
    such job over the whole cluster; the paper's decoupled learner is one per learner."""
    result = SystemResult(seconds=duration, capacity=duration)
    n = len(times)
    downscales = draws(inp.reconfigure, n, inp.seed, f"{stream}-down")
    upscales = draws(inp.reconfigure, n, inp.seed, f"{stream}-up")
    returns = draws(inp.slice_return, n, inp.seed, f"{stream}-return")
    share = inp.slice_chips / chips
    events = [(t, 0, k) for k, t in enumerate(times)]  # 0: a failure, 1: a slice returns
    heapq.heapify(events)
    stalls: list[tuple[float, float]] = []
    now = resumed = stalled_until = 0.0
    out = absorbed = 0
    while events and events[0][0] < duration:
        t, kind, k = heapq.heappop(events)
        _advance(result, now, t, stalled_until, min(1.0, out * share))
        now = t
        if kind == 0:
            heapq.heappush(events, (t + returns[k], 1, k))
        if t < stalled_until:
            absorbed += kind == 0
        else:
            if kind == 0:
                result.lost["rollback"] += ((t - resumed) % inp.step_time) * max(0.0, 1 - out * share)
            stalled_until = resumed = t + (downscales[k] if kind == 0 else upscales[k])
            stalls.append((t, min(stalled_until, duration)))
        out += 1 if kind == 0 else -1
    _advance(result, now, duration, stalled_until, min(1.0, out * share))
    result.info = {"failures": n, "absorbed": absorbed, "global_downtime_s": result.lost["stall"]}
    return result, stalls


def _advance(result: SystemResult, start: float, end: float, stalled_until: float, out_share: float) -> None:
    """Charge [start, end): stalled up to stalled_until, then running without the slices out."""
    stall_end = min(end, max(start, stalled_until))
    result.lost["stall"] += stall_end - start
    result.lost["recovery"] += (end - stall_end) * out_share
