"""The clock nemesis: a process's wall clock skewed, stepped or drifting.

The trainer reads its wall clock in one place (trainer/clock.py), which follows a clock
file per role in the cluster's clock directory (`Cluster.clock_file`). This writes that
file; the process sees the change at its next clock read (a stat at most every 20 ms).
Only the wall clock moves: the monotonic clock never steps, and the event timeline is
read from it.

Faults on one target never overlap (faults/schedule.py), and their effects compose the
way a real clock's do: what a `jump` stepped, or a `drift` gained, stays after the fault
(`Cluster.clock_offsets`, per target), until the final heal sets every clock true again;
a `skew` is undone at its stop.
"""
from __future__ import annotations

import json
import os
import time
from typing import TYPE_CHECKING

from faults import Clock

from .base import Nemesis

if TYPE_CHECKING:
    from ..backends.base import Cluster


def write_clock(cluster: Cluster, target: str, offset: float, rate: float = 1.0, anchor: float = 0.0) -> None:
    """Set `target`'s wall clock to true + offset + (rate − 1) × (true − anchor), atomically."""
    path = cluster.clock_file(target)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"offset": offset, "rate": rate, "anchor": anchor}))
    os.replace(tmp, path)
    cluster.clock_file_written(target, path)  # a backend whose processes do not see the run dir hands it on


def _signed(seconds: float) -> str:
    return f"{seconds:+g} s"


class ClockNemesis(Nemesis):
    kind = "clock"
    color = "#9edae5"
    impairs_learner = False  # nothing the trainer decides reads the wall clock: it must not slow down

    def start(self, cluster: Cluster, fault: Clock) -> str:
        kept = cluster.clock_offsets.get(fault.target, 0.0)
        if fault.mode == "skew":
            write_clock(cluster, fault.target, kept + fault.offset_s)
            return f"skewed {fault.target}'s wall clock {_signed(fault.offset_s)}"
        if fault.mode == "jump":
            cluster.clock_offsets[fault.target] = kept + fault.offset_s
            write_clock(cluster, fault.target, kept + fault.offset_s)
            return f"stepped {fault.target}'s wall clock {_signed(fault.offset_s)}"
        anchor = time.time()
        cluster.clock_anchors[fault.target] = anchor
        write_clock(cluster, fault.target, kept, fault.rate, anchor)
        return f"{fault.target}'s wall clock runs at {fault.rate:g}x"

    def stop(self, cluster: Cluster, fault: Clock) -> str:
        kept = cluster.clock_offsets.get(fault.target, 0.0)
        if fault.mode == "skew":
            write_clock(cluster, fault.target, kept)
            return f"{fault.target}'s wall clock back by {_signed(-fault.offset_s)}"
        if fault.mode == "jump":
            return f"{fault.target}'s wall clock keeps its step ({_signed(kept)} in all) until the final heal"
        gained = (fault.rate - 1.0) * (time.time() - cluster.clock_anchors.pop(fault.target, time.time()))
        cluster.clock_offsets[fault.target] = kept + gained
        write_clock(cluster, fault.target, kept + gained)
        return f"{fault.target}'s wall clock stopped drifting, {_signed(kept + gained)} off until the final heal"
