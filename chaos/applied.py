"""What the controller really did to each fault, read from its history: the one reading
the checkers, the report and the benchmarks share.

The history records every action as done: when it was planned, when it was issued (`at`,
on the schedule's clock) and how long it took. From those, each fault has

- a *window* on the monotonic clock, from the end of its start to the end of its stop (or
  the final heal, when it had no stop that worked): the time its target was impaired, as
  the checks judge recovery;
- an *in-force* interval on the schedule's clock, which is what `faults_applied` holds
  against the plan. It is the time the fault was surely in force: from the moment its
  start returned (a toxic is in place, a process stopped or sent SIGKILL) to the moment its stop
  was issued, and for a kill to the moment its target was back (the restart returned).

A fault started late, or in force for less than planned, is not what the schedule asked
for, whatever the other checks say. Jepsen's rule: the history is what was done, not what
was planned.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from faults import OUTAGE_KINDS

# Heals after which nothing the schedule started is still in force (not the one before it).
FINAL_HEALS = ("end", "signal", "exception")

# How far an action may deviate from the schedule on the local backend before
# `faults_applied` says so, in seconds: the time an action takes on the development
# machine (2 cores) plus the wake-up of the worker that issues it. Measured with
# bench/fault_timing.py (the issue-26 schedule and every local schedule of
# examples/schedules/, twice each, idle and beside two busy loops; BENCHMARKS.md, "Fault
# timing"): the worst fault in force 0.112 s late and 0.093 s short, at load 2; the proxy
# API's round trip at most 0.055 s. A backend whose actions take longer (a Docker engine
# call) says so with its `action_tolerance`, which the history records.
DEFAULT_TOLERANCE = 0.25


@dataclass
class FaultWindow:
    """One fault as the controller applied it; `start`/`stop` on the monotonic clock."""

    index: int | None
    kind: str
    targets: list[str]
    start_entry: dict
    stop_entry: dict | None
    start: float | None  # None when the start failed: nothing was in force
    stop: float | None
    stop_note: str = ""

    @property
    def ok(self) -> bool:
        return bool(self.start_entry.get("ok"))


def _num(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if value == value and abs(value) != float("inf") else None


def fault_targets(entry: dict) -> list[str]:
    """The targets a start entry's fault names (`?` when it names none); for a fault whose
    target is not a unit (a node), the units it hit when it started, as recorded."""
    units = entry.get("units")
    if isinstance(units, list) and units:
        return [str(u) for u in units]
    fault = entry.get("fault") if isinstance(entry.get("fault"), dict) else {}
    targets = fault.get("targets")
    if isinstance(targets, (list, tuple)) and targets:
        return [str(t) for t in targets]
    if fault.get("target") is not None:
        return [str(fault["target"])]
    return ["?"]


def fault_windows(history: list[dict], end: float) -> list[FaultWindow]:
    """Every start entry paired with its stop, or with the final heal that ended it (else
    `end`, the last moment the run knows of)."""
    stops: dict[object, dict] = {}
    for h in history:
        if h.get("event") == "stop" and h.get("index") is not None:
            stops.setdefault(h["index"], h)
    heals = sorted(float(h["t"]) for h in history
                   if h.get("event") == "heal" and h.get("reason") in FINAL_HEALS and _num(h.get("t")) is not None)
    out = []
    for h in history:
        if h.get("event") != "start":
            continue
        start = _num(h.get("t"))
        kind = str(h.get("kind") or (h.get("fault") or {}).get("kind") or "?")
        stop_entry = stops.get(h.get("index"))
        window = FaultWindow(index=h.get("index"), kind=kind, targets=fault_targets(h), start_entry=h,
                             stop_entry=stop_entry, start=start if h.get("ok") else None, stop=None)
        if window.start is not None:
            stop_t = _num(stop_entry.get("t")) if stop_entry is not None else None
            if stop_t is not None and stop_entry.get("ok", True):
                window.stop = stop_t
            else:
                later = [t for t in heals if t >= window.start]
                if later:
                    window.stop = later[0]
                    window.stop_note = ("stop failed; in force until the final heal" if stop_entry is not None
                                        else "no stop; in force until the final heal")
                else:
                    window.stop = max(end, window.start)
                    window.stop_note = "never healed in the recorded data"
        out.append(window)
    return out


EXIT = "exit"  # a process that exited on its own: the local backend's supervisor restarts it


def exit_windows(events: list[dict], end: float) -> list[tuple[str, float, float, dict]]:
    """(target, exited at, restarted at, the exit event) of every process the supervisor
    (chaos/supervisor.py) saw exit on its own; a process never restarted is down until `end`."""
    out = []
    mine = [e for e in events if e.get("process") == "supervisor" and e.get("kind") in ("exit", "restart")]
    for i, e in enumerate(mine):
        if e["kind"] != "exit":
            continue
        back = next((r["t"] for r in mine[i + 1:] if r["kind"] == "restart" and r.get("target") == e.get("target")),
                    None)
        out.append((str(e.get("target")), float(e["t"]), float(back) if back is not None else max(end, e["t"]), e))
    return out


@dataclass(frozen=True)
class Timing:
    """One fault's plan against what was done, on the schedule's clock (seconds from t0)."""

    index: int
    kind: str
    targets: tuple[str, ...]
    planned: tuple[float, float | None]      # (at, at + duration), shifted by any wait; None: a kill left down
    in_force: tuple[float, float | None]     # surely in force from, until (None: until the final heal)
    start_late: float                        # in force this long after planned (its start's wait and work)
    stop_late: float | None                  # over this long after planned (a kill: its restart issued)
    shortfall: float | None                  # planned duration − the time in force (negative: longer)
    waited_for: dict | None = None           # the fault on the same thing it had to wait for (and the shift)
    problems: tuple[str, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict:
        out = {"fault": self.index, "kind": self.kind, "targets": list(self.targets),
               "planned": [round(self.planned[0], 3), _round(self.planned[1])],
               "in_force": [round(self.in_force[0], 3), _round(self.in_force[1])],
               "start_late": round(self.start_late, 3), "stop_late": _round(self.stop_late),
               "shortfall": _round(self.shortfall)}
        if self.waited_for:
            out["waited_for"] = self.waited_for
        if self.problems:
            out["problems"] = list(self.problems)
        return out


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def _done(entry: dict) -> float:
    return float(entry.get("at") or 0.0) + float(entry.get("took") or 0.0)


def timings(history: list[dict], tolerance: float) -> list[Timing]:
    """Each started fault's plan beside what was done, with what exceeds `tolerance`."""
    stops = {h["index"]: h for h in history if h.get("event") == "stop" and h.get("ok") and "at" in h}
    out = []
    for h in history:
        if h.get("event") != "start" or not h.get("ok") or "at" not in h:
            continue
        fault = h.get("fault") or {}
        # A fault that had to wait for the one before it on the same target (still restarting,
        # say) is shifted by that wait, whole: it is judged from when its target was free.
        shift = float((h.get("waited_for") or {}).get("shifted_by") or 0.0)
        at = float(fault.get("at", h.get("planned", 0.0))) + shift
        duration = float(fault.get("duration", 0.0))
        down = h.get("kind") in OUTAGE_KINDS and fault.get("restart", True) is False
        planned_end = None if down else at + duration
        began = _done(h)
        stop = stops.get(h["index"])
        until = stop_late = shortfall = None
        if stop is not None:
            # A node powered off is an outage too: back when the node is, not when power-on is issued.
            kill = h.get("kind") in OUTAGE_KINDS or (h.get("kind") == "node" and fault.get("mode") == "kill")
            until = _done(stop) if kill else float(stop["at"])
            # Over when its stop returned (a toxic removed, a process resumed), or for a kill
            # when its restart was issued: the restart's own start-up is the kill's recovery.
            over = float(stop["at"]) if kill else _done(stop)
            stop_late = over - planned_end if planned_end is not None else None
            shortfall = duration - (until - began)
        problems = []
        if began - at > tolerance:
            # Which of the two it was: the worker woke late, or the action itself was slow.
            problems.append(f"in force {began - at:.2f} s after its planned start {at:g} s (issued "
                            f"{float(h['at']) - at:.2f} s late, took {float(h.get('took') or 0.0):.2f} s)")
        if shortfall is not None and shortfall > tolerance:
            problems.append(f"in force {until - began:.2f} s of the {duration:g} s planned")
        if stop_late is not None and stop_late > tolerance:
            problems.append(f"stopped {stop_late:.2f} s after its planned end {planned_end:g} s")
        out.append(Timing(h["index"], str(h.get("kind")), tuple(fault_targets(h)), (at, planned_end),
                          (began, until), began - at, stop_late, shortfall, h.get("waited_for"), tuple(problems)))
    return out


# A link fault's start or stop is a few calls to the proxy's API (one per toxic): a run
# whose API answers slowly (a loaded machine) gets this many of its measured round trips.
TOLERANCE_ROUND_TRIPS = 5


def tolerance_of(history: list[dict]) -> float:
    """The tolerance the run's backend declared (the history's `begin`, else the default),
    and never less than TOLERANCE_ROUND_TRIPS round trips of the proxy API as the run measured
    it at its start (`begin`'s `api`): the time an action really takes on the machine."""
    for h in history:
        if h.get("event") == "begin":
            value = _num(h.get("tolerance"))
            declared = value if value is not None and value > 0 else DEFAULT_TOLERANCE
            rtt = _num((h.get("api") or {}).get("round_trip")) or 0.0
            return round(max(declared, TOLERANCE_ROUND_TRIPS * rtt), 3)
    return DEFAULT_TOLERANCE


def summarize_timing(found: list[Timing]) -> dict:
    """The worst deviations over the run, for a verdict's detail and evidence."""
    if not found:
        return {}
    shortfalls = [t.shortfall for t in found if t.shortfall is not None]
    return {"shifted": [t.index for t in found if t.waited_for and t.waited_for.get("shifted_by")],
            "worst_start_late": round(max(t.start_late for t in found), 3),
            "median_start_late": round(statistics.median(t.start_late for t in found), 3),
            "worst_shortfall": round(max(shortfalls), 3) if shortfalls else None}
