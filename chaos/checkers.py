"""Checkers: verdicts from the controller's history, the processes' event logs and the
syncer's state files (chaos/durable.py) only.

Each checker answers pass, fail or unknown (when the run did not give it enough to
decide), with evidence: times, learners, versions; a check with nothing to judge in the
run's mode answers n/a. Times in evidence are seconds since the schedule began (the
history's `begin` entry), on the shared monotonic clock.

The safety checks (SAFETY_CHECKS) are required: a run passes only when each of them that
applies passes. Unknown is not pass for safety: a run that cannot show it lost no
acknowledged push has not shown it is safe.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Callable

from .applied import EXIT, exit_windows, fault_windows, summarize_timing, timings, tolerance_of
from .divergence import check_no_divergence
from .durable import DurableState, canonical_id, read_durable_state
from .nemesis import NEMESES
from .pace import Pace, measure
from .reference import ReferenceCurve
from .timeline import ONE_CLOCK, Placement

PASS, FAIL, UNKNOWN = "pass", "fail", "unknown"
NOT_APPLICABLE = "n/a"  # nothing to judge in this run's mode
# Required to pass (where they apply); every other check only may not fail.
SAFETY_CHECKS = ("no_lost_acks", "no_double_apply", "monotonic_versions", "finite")
# Kinds after which a learner cannot contribute (kill, pause, partition): each nemesis says so.
LEARNER_IMPAIRING = NEMESES.impairing() | {EXIT}  # and a process that exited on its own

# Time windows on the run's own clock (chaos/pace.py): each allowance is the fixed delays
# the configuration imposes plus this many outer round periods measured in the run itself.
# One round is what the mechanism needs at least (a merge per round; a rejoined learner
# trains H steps, then its push waits for its peers'), plus one of slack. Measured on 26
# healthy runs (2 cores at load averages 1-13, rounds of 0.2-17 s, cold starts of 6-41 s;
# docs/checks.md): the longest merge gap used 43% of its allowance, the slowest healing
# 69% (a chain of three syncer kills; a lone fault at most 53%, always within its recovery
# and late wait alone), and no learner held a superseded version for more than 26%.
GAP_ROUNDS = 2.0      # progress: rounds without a merge while enough of the cluster is up
HEAL_ROUNDS = 3.0     # self_heal / rejoined: rounds after a heal (and any restart) to a merged push
# A merge of a learner's push costs it this many round trips on its link: the push, the
# request that hears of the merge, the pull of the merged version. A latency toxic adds its
# delay to each, so while every learner that keeps a run going is slowed, progress may lag
# by that much more (the simulator's schedule property found a 1.6 s latency on the only
# learner left, merges every 9.6 s, judged by a 4.9 s allowance).
MERGE_ROUND_TRIPS = 3
# progress: a stretch that a merge ends may also take that merge's own duration (its outer
# step and its fragment file's write and sync: the disk's pace, on the run's own clock; a
# 3.5 s fsync stall under a loaded suite once failed a 3.96 s allowance), at most the
# allowance once more, so a syncer frozen in the middle of a merge is still caught.
MERGE_TIME_CAP = 1.0  # of max_gap
BEHIND_ROUNDS = 3.0   # converged: rounds a learner may hold a superseded version at its stop
# final_loss against a fault-free reference at equal merged tokens: the largest deviation
# of a fault-free run's loss from another's best by the same tokens, past 100k merged
# tokens, was 0.165 (7 runs of the property suite's model, 2 learners) and 0.185 (7 of the
# default model, 3 learners); 0.25 leaves a third on top (docs/checks.md).
REFERENCE_MARGIN = 0.25


@dataclass
class Verdict:
    name: str
    status: str
    detail: str
    evidence: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Window:
    """When a fault was really in force: from its start to its stop (or the final heal)."""

    index: int | None  # None: no fault of the schedule (a process that exited on its own)
    kind: str
    targets: tuple[str, ...]
    start: float
    stop: float


@dataclass(frozen=True)
class RunView:
    """A finished run as the checks read it. Its events and history do not change once it
    is made, so what every check asks of them (t0, end, the windows, the learners) is
    worked out once, not once per check (the simulator's search judges thousands of runs)."""

    events: list[dict]
    history: list[dict]
    state_dir: Path | None = None  # the syncer's state directory, read when it wrote no final state
    # How the events were put on the controller's timeline (chaos/timeline.py): one clock
    # unless hosts' clocks disagree. Every fault window is widened by its error bound.
    placement: Placement = ONE_CLOCK
    # Nodes whose event files could not be copied at the run's end (backends/collect.py):
    # node -> what the collector recorded. What they held after their last copy is unseen.
    incomplete: dict = field(default_factory=dict)

    @property
    def clock_error(self) -> float:
        return self.placement.error

    def uncertain(self, a: float, b: float) -> bool:
        """Whether the clocks' bound leaves the order of times a and b open."""
        return self.clock_error > 0 and abs(a - b) <= self.clock_error

    @cached_property
    def t0(self) -> float:
        begins = [h["t"] for h in self.history if h.get("event") == "begin"]
        if begins:
            return begins[0]
        return self.events[0]["t"] if self.events else 0.0

    @cached_property
    def end(self) -> float:
        stops = [e["t"] for e in self.events if e["kind"] in ("inner_step", "merge", "sync_step")]
        return max(stops) if stops else self.t0

    def rel(self, t: float) -> float:
        return round(t - self.t0, 3)

    def windows(self) -> list[Window]:
        """Each fault that started, from its start to its stop (or the final heal that ended
        it), then each exit of a process on its own until the supervisor restarted it (kind
        `exit`, no index: no schedule asked for it, and every check judges its recovery)."""
        return list(self._windows)

    @cached_property
    def _windows(self) -> tuple[Window, ...]:
        # A fault's window is on the controller's clock; an event placed from another host's
        # may be off by the bound either way, so the window is widened by it.
        err = self.clock_error
        faults = [Window(w.index, w.kind, tuple(w.targets), w.start - err, w.stop + err)
                  for w in sorted(fault_windows(self.history, self.end), key=lambda w: w.index)
                  if w.start is not None and w.index is not None]
        exits = [Window(None, EXIT, (target,), start, stop) for target, start, stop, _ in
                 exit_windows(self.events, self.end) if target == "syncer" or target.startswith("learner-")]
        return tuple(faults + exits)

    def progress_times(self) -> list[float]:
        """When the global model moved: every sync round, every merge that changed Θ (a merge
        event with `moved` 0 merged nothing, whatever it lists: a lost outer step)."""
        return [e["t"] for e in self.events if e["kind"] == "sync_step" or (e["kind"] == "merge" and _moved(e))]

    def learners(self) -> list[int]:
        return list(self._learners)

    @cached_property
    def _learners(self) -> tuple[int, ...]:
        return tuple(sorted({e["learner"] for e in self.events if e.get("learner") is not None
                             and e["process"].startswith("learner")}))

    def final_state(self) -> dict | None:
        finals = [e for e in self.events if e["kind"] == "final_state"]
        return finals[-1] if finals else None

    def last_final_state(self) -> dict | None:
        """The final state of the syncer's last incarnation, if it stopped cleanly: None when a
        syncer started after it (and then died, say SIGKILLed at the very end)."""
        final = self.final_state()
        if final is None:
            return None
        restarted = any(e["kind"] == "process_start" and e.get("role") == "syncer" and e["t"] > final["t"]
                        for e in self.events)
        return None if restarted else final

    @cached_property
    def durable(self) -> DurableState | None:
        """The syncer's state directory, read from its files (None without one)."""
        return read_durable_state(self.state_dir)

    @cached_property
    def mode(self) -> str:
        """decoupled or sync, as the syncer said (else a learner); decoupled when none did."""
        said = [e for e in self.events if e["kind"] in ("process_start", "final_state")
                and e.get("mode") in ("decoupled", "sync")]
        syncer = [e for e in said if e.get("process") == "syncer" or e.get("role") == "syncer"]
        return (syncer or said or [{"mode": "decoupled"}])[0]["mode"]

    @cached_property
    def pace(self) -> Pace:
        """The run's own pace (chaos/pace.py), measured outside every fault and its recovery."""
        # The others go on merging while a killed learner starts again: only the fault and the
        # reconnect after it are left out, not the restart.
        rough = measure(self.events, self.history, [])
        faulted = [(w.start, w.stop + rough.reconnect(w.kind)) for w in self.windows()]
        return measure(self.events, self.history, faulted)

    def recovery(self, window: Window) -> float:
        """After `window` ends, until its target can take part again: a cold start if the
        fault killed it, then a reconnect (chaos/pace.py)."""
        return self.pace.recovery(window.kind, _role(window))

    def heal_allowance(self, window: Window | None) -> tuple[float, dict]:
        """Seconds from the end of `window` to a merged push of each learner it impaired, and
        how they add up: its recovery, the syncer's late-merge wait, HEAL_ROUNDS rounds."""
        p = self.pace
        kind, role = (window.kind, _role(window)) if window is not None else ("", "learner")
        parts = {"restart": p.restart(kind, role), "reconnect": p.reconnect(kind), "late_wait": p.late_wait,
                 "rounds": HEAL_ROUNDS * p.round_period}
        return sum(parts.values()), {k: round(v, 3) for k, v in parts.items()}


def _moved(merge: dict) -> bool:
    """Whether a merge changed Θ (events from before `moved` was recorded count as moving)."""
    moved = merge.get("moved", 1.0)
    try:
        return float(moved) > 0  # NaN and Inf arrive as strings; NaN > 0 is False, Inf moved
    except (TypeError, ValueError):
        return False


def _unit(target: str) -> str:
    return target.split("/", 1)[0]


def _role(window: Window) -> str:
    """"syncer" if the fault hit the syncer, else "learner"."""
    return "syncer" if any(_unit(t) == "syncer" for t in window.targets) else "learner"


def impaired_intervals(view: RunView, recovery: float | None = None) -> dict[str, list[tuple[float, float]]]:
    """Per target (syncer, learner-N): intervals during which it could not contribute, each
    fault's window extended by `recovery` s (default: the run's own, view.recovery)."""
    out: dict[str, list[tuple[float, float]]] = {}
    for w in view.windows():
        if w.kind not in LEARNER_IMPAIRING:
            continue
        extra = view.recovery(w) if recovery is None else recovery
        for target in w.targets:
            out.setdefault(_unit(target), []).append((w.start, w.stop + extra))
    return out


def _covered(t: float, intervals: list[tuple[float, float]]) -> bool:
    return any(a <= t <= b for a, b in intervals)


def check_faults_applied(view: RunView, tolerance: float | None = None) -> Verdict:
    """The controller did what the schedule said: every fault started and stopped without
    an error, every heal succeeded, and every fault was in force when and for as long as
    planned, within `tolerance` s (by default the backend's, which the history's `begin`
    records: chaos/applied.py). Without this, a fault that silently failed to apply, or
    that a slow action elsewhere shortened to nothing, would let every other check pass on
    a run that was never disturbed as the schedule says."""
    begin = next((h for h in view.history if h.get("event") == "begin"), None)
    if begin is None:
        return Verdict("faults_applied", UNKNOWN, "no schedule began (no `begin` in the history)")
    tolerance = tolerance_of(view.history) if tolerance is None else tolerance
    actions = [h for h in view.history if h.get("event") in ("start", "stop")]
    errors = [{"fault": h["index"], "action": h["event"], "at": h.get("at"), "error": h.get("error")}
              for h in actions if not h.get("ok")]
    errors += [{"heal": h.get("reason"), "error": h.get("error"),
                **({"unhealed": h["unhealed"]} if h.get("unhealed") else {})}
               for h in view.history if h.get("event") == "heal" and not h.get("ok")]
    errors += [{"proxy_server": "exited", "at": view.rel(start), "back_at": view.rel(stop),
                "error": f"the proxy server exited on its own (exit code {e.get('exit_code')}) at "
                         f"t={view.rel(start):.1f} s: every toxic in force was lost and the links were cut until "
                         f"it was back at t={view.rel(stop):.1f} s"}
               for target, start, stop, e in exit_windows(view.events, view.end) if target == "toxiproxy"]
    started = {h["index"] for h in actions if h["event"] == "start" and h.get("ok")}
    missing = sorted(set(range(begin.get("faults", 0))) - started)
    found = timings(view.history, tolerance)
    off = [t for t in found if t.problems]
    evidence = {"faults": begin.get("faults", 0), "actions": len(actions), "errors": errors, "never_started": missing,
                "tolerance": tolerance, "timing": [t.to_dict() for t in found], **summarize_timing(found)}
    if errors:
        def named(e: dict) -> str:
            where = (f"faults[{e['fault']}] {e['action']}" if "fault" in e else
                     f"heal ({e['heal']})" if "heal" in e else "")
            return f"{where}: {e.get('error')}" if where else str(e.get("error"))
        return Verdict("faults_applied", FAIL, f"{len(errors)} fault action(s) or heal(s) failed: "
                       + "; ".join(named(e) for e in errors[:3]), evidence)
    ended = any(h.get("event") == "end" for h in view.history)
    if missing and ended:
        return Verdict("faults_applied", FAIL, f"fault(s) {missing} never started", evidence)
    if off:
        def said(t) -> str:
            end = "down" if t.planned[1] is None else f"{t.planned[1]:g}"
            until = "the final heal" if t.in_force[1] is None else f"{t.in_force[1]:.2f}"
            why = f", after waiting {t.waited_for['seconds']:.2f} s for faults[{t.waited_for['fault']}]" \
                if t.waited_for else ""
            return (f"faults[{t.index}] {t.kind} {', '.join(t.targets)}: planned {t.planned[0]:g}-{end} s, in force "
                    f"{t.in_force[0]:.2f}-{until} s ({'; '.join(t.problems)}{why})")
        return Verdict("faults_applied", FAIL, f"{len(off)} fault(s) not applied as scheduled (tolerance "
                       f"{tolerance:g} s): " + "; ".join(said(t) for t in off[:3]), evidence)
    worst = evidence.get("worst_start_late")
    shortfall = evidence.get("worst_shortfall")
    deviation = (f"; in force at most {worst:.3f} s late" + (f" and {max(shortfall, 0.0):.3f} s short"
                                                             if shortfall is not None else "")
                 + f" (tolerance {tolerance:g} s)") if worst is not None else ""
    shifted = evidence.get("shifted") or []
    later = (f"; faults {shifted} shifted whole past the fault before them on the same target, which still held "
             f"it" if shifted else "")
    return Verdict("faults_applied", PASS, f"{len(started)} fault(s) applied and healed without error{deviation}"
                   f"{later}", evidence)


def link_delays(view: RunView) -> dict[str, list[tuple[float, float, float]]]:
    """Per learner link: (start, stop, seconds a latency toxic adds to each round trip)."""
    params = {h["index"]: h.get("fault") or {} for h in view.history if h.get("event") == "start" and h.get("ok")}
    out: dict[str, list[tuple[float, float, float]]] = {}
    for w in view.windows():
        if w.kind != "latency":
            continue
        fault = params.get(w.index, {})
        one_way = (float(fault.get("latency_ms", 0.0)) + float(fault.get("jitter_ms", 0.0))) / 1000.0
        ways = 2 if fault.get("direction", "both") == "both" else 1
        for target in w.targets:
            out.setdefault(target, []).append((w.start, w.stop, one_way * ways))
    return out


def merge_durations(view: RunView) -> dict[float, float]:
    """When each merge that moved Θ committed -> how long it took (its `seconds`: the outer
    step, the fragment file's write and sync), the longest where several share a time."""
    took: dict[float, float] = {}
    for e in view.events:
        if e["kind"] == "merge" and _moved(e):
            took[e["t"]] = max(took.get(e["t"], 0.0), float(e.get("seconds") or 0.0))
    return took


def _delay(t: float, windows: list[tuple[float, float, float]]) -> float:
    return sum(d for a, b, d in windows if a <= t <= b)


def check_progress(view: RunView, max_gap: float | None = None, quorum: int = 1,
                   recovery: float | None = None) -> Verdict:
    """While the syncer and >= quorum learners are unimpaired, progress comes at least every
    max_gap s. By default max_gap is on the run's own clock: the syncer's late-merge wait,
    a heartbeat timeout (a dead learner still counts towards quorum until its lease
    expires) and GAP_ROUNDS measured round periods; a fault's target counts as impaired
    until its recovery (a cold start if it was killed, then a reconnect) is over. While
    every learner up is slowed by a latency toxic, a stretch may also take MERGE_ROUND_TRIPS
    times the least of their added round-trip delays (a given max_gap too: it is the
    fault's own cost). Explicit numbers replace either."""
    times = view.progress_times()
    if not times:
        merges = sum(1 for e in view.events if e["kind"] == "merge")
        if merges:
            return Verdict("progress", FAIL, f"{merges} merge(s) happened, and not one moved Θ: nothing was merged",
                           {"merges": merges})
        return Verdict("progress", FAIL, "no merge or sync step happened at all")
    pace = view.pace
    allowance = {"late_wait": round(pace.late_wait, 3), "heartbeat_timeout": pace.heartbeat_timeout,
                 "rounds": round(GAP_ROUNDS * pace.round_period, 3)}
    given = max_gap is not None
    if max_gap is None:
        max_gap = round(sum(allowance.values()), 2)
    how = "given" if given else f"{GAP_ROUNDS:g} rounds of {pace.round_period:.2f}s + fixed waits"
    impaired = impaired_intervals(view, recovery)
    delays = link_delays(view)
    took = merge_durations(view)
    learners = view.learners()
    step = 0.25
    violations = []
    # At t0 every learner trains (the runner waited for it); the first merge is a round away.
    warmup = recovery if recovery is not None else pace.reconnect("") + pace.round_period
    marks = [view.t0 + warmup] + [t for t in times if t > view.t0 + warmup] + [view.end]
    for a, b in zip(marks, marks[1:]):
        healthy = slowed = 0.0
        t = a
        while t < b:
            ok_syncer = not _covered(t, impaired.get("syncer", []))
            up = [i for i in learners if not _covered(t, impaired.get(f"learner-{i}", []))]
            if ok_syncer and len(up) >= quorum:
                healthy += step
                if delays:
                    slowed = max(slowed, min(_delay(t, delays.get(f"learner-{i}", [])) for i in up) if up else 0.0)
            t += step
        merging = min(took.get(b, 0.0), MERGE_TIME_CAP * max_gap)
        allowed = max_gap + MERGE_ROUND_TRIPS * slowed + merging
        if healthy > allowed:
            violations.append({"from": view.rel(a), "to": view.rel(b), "healthy_seconds": round(healthy, 2),
                               **({"allowed_with_latency": round(allowed, 2)} if slowed else {}),
                               **({"closing_merge_seconds": round(merging, 3)} if merging else {})})
    evidence = {"progress_events": len(times), "max_gap": max_gap, "violations": violations,
                "first": view.rel(times[0]), "last": view.rel(times[-1]), "pace": pace.to_dict(),
                "max_gap_from": "given" if given else allowance}
    if violations:
        return Verdict("progress", FAIL, f"{len(violations)} healthy stretch(es) longer than {max_gap}s ({how}) "
                                         f"without a merge", evidence)
    return Verdict("progress", PASS, f"{len(times)} merges/rounds; no healthy gap over {max_gap}s ({how})", evidence)


def _contributions(view: RunView) -> dict[int, list[tuple[float, float]]]:
    """Per learner: (merged at, pushed at) of each contribution, in merge order.

    `pushed at` is when the syncer accepted the push, so a syncer that restarts and merges
    pushes it accepted before it was killed does not make their learners look recovered.
    A sync-mode round has no separate push: both times are the round's."""
    accepted = {e["id"]: e["t"] for e in view.events if e["kind"] == "push_accepted" and "id" in e}
    out: dict[int, list[tuple[float, float]]] = {}
    for e in view.events:
        if e["kind"] == "merge" and _moved(e):  # one that moved nothing merged no one's work
            for c in e["contributors"]:
                out.setdefault(c["learner"], []).append((e["t"], accepted.get(c.get("id"), e["t"])))
        elif e["kind"] == "sync_step":
            for learner in e["contributors"]:
                out.setdefault(learner, []).append((e["t"], e["t"]))
    return out


def _first_contribution_since(contributions: list[tuple[float, float]], since: float) -> float | None:
    """When the first update pushed at or after `since` was merged."""
    merged = [m for m, pushed in contributions if pushed >= since]
    return min(merged) if merged else None


def _hits(window: Window, learner: int) -> bool:
    """Whether `window` kept `learner` from contributing (a fault on it, or on the syncer)."""
    return window.kind in LEARNER_IMPAIRING and bool({_unit(t) for t in window.targets}
                                                     & {"syncer", f"learner-{learner}"})


def _heal_deadline(view: RunView, w: Window, learner: int, windows: list[Window], base: float,
                   allowance: Callable[[Window], float]) -> tuple[float, list[int | None]]:
    """When `learner` must have contributed after `w` heals, and the faults that moved it:
    `base` s after `w` ends, moved to another fault's own deadline when that fault starts
    before the time is up, or still holds the learner (or its recovery does) when `w` ends.
    A fixed point: a move can bring a fault that starts later into the time, whatever the
    order the windows come in (the process exits come after the scheduled faults)."""
    deadline, moved = w.stop + base, []
    pending = [other for other in windows if other is not w and _hits(other, learner)]
    for _ in range(len(pending)):
        moving = [other for other in pending
                  if w.stop < other.start <= deadline
                  # Still holding the learner, or its recovery is (a unit's cold restart outlasts a pause after it).
                  or other.start <= w.stop < other.stop + view.recovery(other)]
        if not moving:
            break
        for other in moving:
            deadline = max(deadline, other.stop + allowance(other))
            moved.append(other)
            pending.remove(other)
    return deadline, [other.index for other in windows if other in moved]  # in the windows' order


def check_self_heal(view: RunView, within: float | None = None) -> Verdict:
    """Every learner a fault killed, paused or cut off contributes a merged update within
    `within` seconds after that fault healed (a syncer fault counts for every learner).
    By default `within` is on the run's own clock, per fault: a cold start-up if the fault
    killed a process, a reconnect (heartbeat timeout, backoff cap, and for a partition or a
    pause a request timeout), the syncer's late-merge wait and HEAL_ROUNDS measured round
    periods. A later fault that hits the learner (or the syncer) before that time is up
    moves its deadline to that fault's own (a syncer killed again 0.2 s after its restart
    leaves nothing to contribute to), and so does another fault still holding the learner
    down when this one heals (a learner killed without a restart is not expected back when
    a syncer pause ends; its own kill is judged when that ends). A latency toxic on the
    learner's link while it recovers adds MERGE_ROUND_TRIPS of its added round trip."""
    contributions = _contributions(view)
    windows = view.windows()
    delays = link_delays(view)
    results, failed, unknown = [], [], []
    allowances: dict[str, dict] = {}

    def allowance(w: Window) -> float:
        limit, parts = (within, {}) if within is not None else view.heal_allowance(w)
        allowances[f"{w.index}:{w.kind}"] = {"seconds": round(limit, 2), **parts}
        return limit

    for w in windows:
        if w.kind not in LEARNER_IMPAIRING:
            continue
        base = allowance(w)
        units = {_unit(t) for t in w.targets}
        # In learner order: a set of names iterates in an order that changes with the hash seed.
        learners = view.learners() if "syncer" in units else sorted(int(u.split("-")[1]) for u in units)
        for learner in learners:
            deadline, extended_by = _heal_deadline(view, w, learner, windows, base, allowance)
            # A latency toxic on the learner's link during its recovery slows each round trip
            # of it (the reconnect, the push, hearing of the merge) by what it adds: the
            # simulator's long run found a recovery 1.2 s late behind 3 s of latency each way.
            slowed = max((d for a, b, d in delays.get(f"learner-{learner}", []) if a <= deadline and b >= w.stop),
                         default=0.0)
            deadline += MERGE_ROUND_TRIPS * slowed
            limit = deadline - w.stop
            first = _first_contribution_since(contributions.get(learner, []), w.stop)
            row = {"fault": w.index, "kind": w.kind, "learner": learner, "healed_at": view.rel(w.stop),
                   "within": round(limit, 2)}
            if extended_by:
                row["extended_by_faults"] = extended_by
            if slowed:
                row["slowed_by_latency"] = round(MERGE_ROUND_TRIPS * slowed, 3)
            if first is not None and first <= deadline:
                row["contributed_after"] = round(first - w.stop, 3)
                if view.uncertain(first, deadline):
                    row["order"] = f"within the clocks' ±{view.clock_error:.3f}s of the deadline"
            elif view.end < deadline and first is None:
                unknown.append(row)
                row["status"] = "run ended too soon"
            elif first is not None and view.uncertain(first, deadline):
                # Whether it came before its deadline is within what the clocks can tell.
                row["contributed_after"] = round(first - w.stop, 3)
                row["status"] = f"within the clocks' ±{view.clock_error:.3f}s of the deadline"
                unknown.append(row)
            else:
                row["contributed_after"] = round(first - w.stop, 3) if first is not None else None
                failed.append(row)
            results.append(row)
    evidence = {"within": within if within is not None else allowances, "healings": results,
                "pace": view.pace.to_dict()}
    if failed:
        worst = failed[0]
        after = worst["contributed_after"]
        return Verdict("self_heal", FAIL, f"{len(failed)} learner(s) did not contribute within the allowance after "
                                          f"healing (learner-{worst['learner']} after {worst['kind']}: "
                                          f"{'never' if after is None else f'{after}s'}, allowed {worst['within']}s)",
                       {**evidence, "failed": failed})
    if unknown:
        return Verdict("self_heal", UNKNOWN, f"{len(unknown)} healing(s) too close to the end, or to their deadline "
                                             f"within the clocks' bound, to judge ({unknown[0]['status']})", evidence)
    if not results:
        return Verdict("self_heal", PASS, "no learner was impaired", evidence)
    worst = max(results, key=lambda r: r["contributed_after"])
    return Verdict("self_heal", PASS, f"{len(results)} healing(s); slowest contribution {worst['contributed_after']:.1f}s "
                                      f"after heal (allowed {worst['within']:.1f}s)", evidence)


def check_every_learner_contributes_at_end(view: RunView, within: float | None = None) -> Verdict:
    """After the last fault ends, every learner pushes an update that gets merged. When a
    learner has not, yet the run ended less than `within` s after that fault (default: the
    self_heal allowance of that fault, on the run's own clock), it is unknown."""
    windows = view.windows()
    last = max(windows, key=lambda w: w.stop, default=None)
    since = last.stop if last is not None else view.t0
    if within is None:
        # The latest any fault's recovery may end: a kill's cold restart may outlast a later,
        # shorter fault on the same learner.
        within = max([view.heal_allowance(last)[0]] + [w.stop + view.heal_allowance(w)[0] - since for w in windows
                                                        if w.kind in LEARNER_IMPAIRING])
    contributions = _contributions(view)
    missing = [i for i in view.learners() if _first_contribution_since(contributions.get(i, []), since) is None]
    unmoved = sum(1 for e in view.events if e["kind"] == "merge" and e["t"] >= since and not _moved(e))
    evidence = {"since": view.rel(since), "learners": view.learners(), "missing": missing,
                "within": round(within, 2), "pace": view.pace.to_dict(), "merges_that_moved_nothing": unmoved}
    if missing and view.end - since < within:
        return Verdict("rejoined", UNKNOWN, f"learner(s) {missing} not back yet, {view.end - since:.1f}s after the "
                                            f"last fault ended (less than the {within:.1f}s allowed)", evidence)
    if missing:
        nothing = f"; {unmoved} merge(s) listed their pushes but moved Θ by nothing" if unmoved else ""
        return Verdict("rejoined", FAIL, f"learner(s) {missing} never contributed in the {view.end - since:.1f}s "
                                         f"after the faults (allowed {within:.1f}s){nothing}", evidence)
    return Verdict("rejoined", PASS, "every learner contributed after the last fault", evidence)


def _acked(view: RunView) -> set[str]:
    # `duplicate` acknowledges too: the first answer was lost, and the learner forgets the push.
    return {e["id"] for e in view.events if e["kind"] == "push" and e.get("status") in ("accepted", "duplicate")}


SYNC_NOTHING_TO_JUDGE = {
    "no_lost_acks": "sync mode acknowledges no push: a round's gradients are averaged in a barrier and "
                    "never stored as pushes",
    "no_double_apply": "sync mode merges no pushes and keeps no ledger of them",
    "push_window": "sync mode pushes no fragments: every learner's gradient waits in one barrier per round",
    "monotonic_versions": "sync mode has no fragment versions, and its rounds go back legitimately after a "
                          "syncer restart, to its last checkpoint (--sync-checkpoint-every)",
}


def _not_applicable(view: RunView, name: str) -> Verdict | None:
    """An n/a verdict when `name` has nothing to judge in the run's mode (then it is not required)."""
    if view.mode == "sync" and name in SYNC_NOTHING_TO_JUDGE:
        return Verdict(name, NOT_APPLICABLE, f"not applicable in sync mode: {SYNC_NOTHING_TO_JUDGE[name]}",
                       {"mode": "sync"})
    return None


@dataclass(frozen=True)
class Ledger:
    """What the syncer applied, and what it holds durably to apply on a restart."""

    applied: list[str]             # every merged push id, all fragments (duplicates kept)
    pending: dict[str, str]        # push id -> fragment: accepted, durable, not merged yet
    source: str
    unreadable: tuple[str, ...] = ()


def _ledger(view: RunView) -> Ledger | None:
    """The clean final state of the syncer's last incarnation, else its state directory's
    files (a syncer SIGKILLed at the end), else None."""
    final = view.last_final_state()
    if final is not None and "applied" in final:
        return Ledger([i for ids in final["applied"].values() for i in ids], {}, "the syncer's final state")
    durable = view.durable
    if durable is not None:
        return Ledger([i for ids in durable.applied.values() for i in ids], dict(durable.pending),
                      f"the state dir {durable.root} (no final state from the syncer's last incarnation)",
                      tuple(durable.unreadable))
    return None


def _quarantined(view: RunView) -> dict[str, str]:
    """Push id -> why the syncer quarantined it (`push_quarantined` events, and the notes in
    the state dir's quarantine/ for a syncer killed before it could say so)."""
    out = {canonical_id(str(e["id"])): str(e.get("reason") or "unknown reason")
           for e in view.events if e["kind"] == "push_quarantined" and e.get("id") is not None}
    for ident, note in (view.durable.quarantined.items() if view.durable is not None else ()):
        out.setdefault(ident, str(note.get("reason") or "unknown reason"))
    return out


def check_no_lost_acks(view: RunView) -> Verdict:
    """Every acknowledged push (accepted, or duplicate on a retry) is applied: in a merged
    ledger, or still pending durably, which a restart merges. One the syncer quarantined
    was acknowledged yet never applied: lost, with its reason. Without a clean final state
    the syncer's state directory decides (chaos/durable.py)."""
    skip = _not_applicable(view, "no_lost_acks")
    if skip is not None:
        return skip
    acked = _acked(view)
    ledger = _ledger(view)
    if ledger is None:
        return Verdict("no_lost_acks", UNKNOWN, "no final state from the syncer (it did not stop cleanly) and no "
                                                "state dir to read", {"acked": len(acked)})
    quarantined = _quarantined(view)
    applied = set(ledger.applied)
    lost_to_quarantine = {i: quarantined[i] for i in sorted(acked & set(quarantined))}
    missing = sorted(acked - applied - set(ledger.pending) - set(quarantined))
    pending = sorted((acked & set(ledger.pending)) - applied - set(quarantined))
    evidence = {"acked": len(acked), "applied": len(applied), "source": ledger.source,
                "pending_durably": pending[:50], "quarantined": lost_to_quarantine, "lost": missing[:50]}
    if ledger.unreadable:
        evidence["unreadable_pending"] = list(ledger.unreadable[:20])
    if missing or lost_to_quarantine:
        parts = [f"{len(missing)} never applied nor pending"] if missing else []
        if lost_to_quarantine:
            parts.append("quarantined, so never applied: " + ", ".join(
                f"{i} ({why})" for i, why in list(lost_to_quarantine.items())[:5]))
        return Verdict("no_lost_acks", FAIL, f"{len(missing) + len(lost_to_quarantine)} acknowledged push(es) lost "
                                             f"({'; '.join(parts)}), judged from {ledger.source}", evidence)
    held = (f"; {len(pending)} of them are still pending durably, which a restart would merge"
            if pending else "")
    return Verdict("no_lost_acks", PASS, f"all {len(acked)} acknowledged pushes were applied{held} (from "
                                         f"{ledger.source})", evidence)


def check_no_double_apply(view: RunView) -> Verdict:
    """No push id is merged twice, no ledger holds an id twice, and no learner's progress is
    merged twice under two ids: each push claims the data position its learner had reached
    (windows consumed), so two merged pushes of one incarnation and fragment at the same
    position carry the same steps. Ids alone miss a learner that sends a push again under a
    new id (the fresh_id_on_retry defect). Two incarnations may claim one position: a
    learner started again trains from where the syncer last heard it, and that is new work."""
    skip = _not_applicable(view, "no_double_apply")
    if skip is not None:
        return skip
    claimed: dict[str, tuple] = {}  # id -> (learner, incarnation, fragment, position), from the acceptances
    for e in view.events:
        if e["kind"] == "push_accepted" and e.get("position") is not None and (e.get("steps") or 0) > 0:
            claimed[e["id"]] = (e["learner"], e["incarnation"], e["fragment"], e["position"])
    seen: dict[str, float] = {}
    progress: dict[tuple, str] = {}
    doubles = []
    for e in view.events:
        if e["kind"] != "merge":
            continue
        for c in e["contributors"]:
            if c["id"] in seen:
                doubles.append({"id": c["id"], "first": view.rel(seen[c["id"]]), "again": view.rel(e["t"])})
            seen.setdefault(c["id"], e["t"])
            key = claimed.get(c["id"])
            if key is not None and progress.setdefault(key, c["id"]) != c["id"]:
                doubles.append({"id": c["id"], "same_progress_as": progress[key], "learner": key[0],
                                "fragment": key[2], "position": key[3], "again": view.rel(e["t"])})
    final = view.last_final_state()
    ledgers = final["applied"] if final is not None and "applied" in final else \
        (view.durable.applied if view.durable is not None else {})
    for frag, ids in ledgers.items():
        if len(ids) != len(set(ids)):
            doubles.append({"fragment": frag, "ledger_duplicates": len(ids) - len(set(ids))})
    if doubles:
        return Verdict("no_double_apply", FAIL, f"{len(doubles)} push(es) applied twice", {"doubles": doubles[:50]})
    return Verdict("no_double_apply", PASS, f"{len(seen)} merged pushes, each applied once", {"merged": len(seen)})


def _holding_versions(view: RunView) -> dict[str, int]:
    """Push id -> the version of the first merge that held it (the syncer's merge events)."""
    held: dict[str, int] = {}
    for e in view.events:
        if e["kind"] == "merge":
            for c in e["contributors"]:
                held.setdefault(c["id"], e["version"])
    return held


def check_push_window(view: RunView) -> Verdict:
    """A learner pushes a fragment again only while fewer than --push-window of its pushes
    of that fragment are out: sent, and the version that holds them not yet adopted. A push
    carries the version its learner held when it was made (`base_version`), so push j was
    made with every earlier push i of its incarnation and fragment out whose merge version
    is above it: at most window - 1 of them. A learner released early by a wrong answer
    (a `duplicate` naming the current version of a push still pending, a merge that left a
    promised push out) pushes on a version without its own last push, which the syncer then
    merges as a pipelined push. Its residual push at a stop is exempt (it goes regardless),
    as is a fragment after the learner followed its syncer back (versions are numbered anew)."""
    skip = _not_applicable(view, "push_window")
    if skip is not None:
        return skip
    windows = {e["learner"]: int(e["push_window"]) for e in view.events
               if e["kind"] == "process_start" and e.get("role") == "learner" and e.get("push_window")}
    if not windows:
        return Verdict("push_window", NOT_APPLICABLE, "no learner said its --push-window")
    held = _holding_versions(view)
    rolled_back: dict[tuple, float] = {}  # (learner, incarnation, fragment) -> when it first followed its syncer back
    for e in view.events:
        if e["kind"] == "syncer_rollback":
            rolled_back.setdefault((e["learner"], e.get("incarnation"), e.get("fragment")), e["t"])
    streams: dict[tuple, list[dict]] = {}
    for e in view.events:
        if e["kind"] == "push" and e.get("base_version") is not None and e["learner"] in windows:
            streams.setdefault((e["learner"], e.get("incarnation"), e["fragment"]), []).append(e)
    early, judged = [], 0
    for key, pushes in streams.items():
        # In the order they were answered, which is the order they were made: one request in
        # flight, the queue first in first out. Not by seq: a push sent again under a new seq
        # (the fresh_id_on_retry defect) is still the push made then, on the version of then.
        pushes.sort(key=lambda e: e["t"])
        since = rolled_back.get(key)
        window = windows[key[0]]
        for j, push in enumerate(pushes):
            if push.get("residual") or (since is not None and push["t"] >= since):
                continue
            judged += 1
            out = [i for i in pushes[:j] if held.get(i["id"], -1) > push["base_version"]]
            if len(out) >= window:
                early.append({"learner": key[0], "incarnation": key[1], "fragment": key[2], "id": push["id"],
                              "base_version": push["base_version"], "window": window,
                              "out": [{"id": i["id"], "status": i.get("status"), "merged_in": held[i["id"]]}
                                      for i in out[-3:]], "at": view.rel(push["t"])})
    if early:
        first = early[0]
        return Verdict("push_window", FAIL, f"{len(early)} push(es) made with the window full: learner "
                                            f"{first['learner']}'s push {first['id']} of fragment {first['fragment']} "
                                            f"was made on version {first['base_version']} while "
                                            f"{len(first['out'])} of its earlier pushes were out (window "
                                            f"{first['window']}), the first merged in version "
                                            f"{first['out'][0]['merged_in']}", {"early": early[:20]})
    return Verdict("push_window", PASS, f"{judged} push(es) each made with fewer than --push-window of its "
                                        f"fragment's pushes out", {"judged": judged, "windows": windows})


def check_monotonic_versions(view: RunView) -> Verdict:
    skip = _not_applicable(view, "monotonic_versions")
    if skip is not None:
        return skip
    last: dict[int, int] = {}
    backwards = []
    for e in view.events:
        if e["kind"] == "merge":
            f = e["fragment"]
            if e["version"] <= last.get(f, 0):
                backwards.append({"fragment": f, "version": e["version"], "after": last[f], "at": view.rel(e["t"])})
            last[f] = max(last.get(f, 0), e["version"])
    adopted: dict[tuple, int] = {}
    for e in view.events:
        if e["kind"] == "apply" and e.get("fragment") is not None:
            key = (e["learner"], e.get("incarnation"), e["fragment"])
            if e["version"] < adopted.get(key, -1):
                backwards.append({"learner": e["learner"], "fragment": e["fragment"], "version": e["version"],
                                  "after": adopted[key], "at": view.rel(e["t"])})
            adopted[key] = max(adopted.get(key, -1), e["version"])
    if backwards:
        return Verdict("monotonic_versions", FAIL, f"{len(backwards)} version(s) went back", {"backwards": backwards})
    adoptions = len(adopted)
    return Verdict("monotonic_versions", PASS, f"{_reached(last)}, never going back; every learner adopted only "
                                               f"newer versions ({adoptions} learner fragment(s) checked)",
                   {"final_versions": last})


def _reached(versions: dict[int, int]) -> str:
    """`fragment 0 reached version 15` / `fragments 0-3 reached versions 15, 14, 15, 15`."""
    if not versions:
        return "no merge happened"
    items = sorted(versions.items())
    if len(items) == 1:
        (f, v), = items
        return f"fragment {f} reached version {v}"
    names = f"{items[0][0]}-{items[-1][0]}" if [f for f, _ in items] == list(range(items[0][0], items[-1][0] + 1)) \
        else ", ".join(str(f) for f, _ in items)
    return f"fragments {names} reached versions {', '.join(str(v) for _, v in items)}"


def check_finite(view: RunView) -> Verdict:
    bad_merges = [view.rel(e["t"]) for e in view.events if e["kind"] == "merge" and not e.get("finite", True)]
    bad_losses = [(e["learner"], view.rel(e["t"])) for e in view.events if e["kind"] == "inner_step"
                  and (isinstance(e["loss"], str) or not math.isfinite(e["loss"]))]
    final = view.final_state()
    final_ok = final.get("finite", True) if final else True
    evidence = {"nonfinite_merges": bad_merges[:20], "nonfinite_losses": bad_losses[:20], "final_finite": final_ok}
    if bad_merges or not final_ok:
        return Verdict("finite", FAIL, "the global parameters held NaN or Inf", evidence)
    if bad_losses:
        return Verdict("finite", FAIL, f"{len(bad_losses)} inner step(s) had a non-finite loss", evidence)
    return Verdict("finite", PASS, "no NaN or Inf in global parameters or losses", evidence)


def check_task_healthy(view: RunView) -> Verdict:
    """The user's task never failed: no learner stopped on an exception or a NaN loss in
    its task (a `task_error` event; the traceback is in that learner's log)."""
    errors = [e for e in view.events if e["kind"] == "task_error"]
    evidence = {"task_errors": [{"learner": e.get("learner"), "at": round(view.rel(e["t"]), 2),
                                 "method": e.get("method"), "error": e.get("error")} for e in errors[:20]]}
    if errors:
        learners = sorted({e.get("learner") for e in errors}, key=str)
        first = errors[0]
        return Verdict("task_healthy", FAIL, f"the task failed {len(errors)} time(s) on learner(s) "
                       f"{', '.join(map(str, learners))}; first, on learner-{first.get('learner')}: "
                       f"{first.get('error')} (traceback in logs/learner-{first.get('learner')}.log)", evidence)
    return Verdict("task_healthy", PASS, "no learner's task raised or returned a non-finite loss", evidence)


def _model_drift(fragments: list[dict]) -> float | None:
    """The relative L2 distance of the whole model from the global versions last adopted, from
    each fragment's absolute `diff` and `norm`; None when a fragment lacks them."""
    if not fragments or not all("diff" in f and "norm" in f for f in fragments):
        return None
    diff = math.sqrt(sum(float(f["diff"]) ** 2 for f in fragments))  # NaN and Inf arrive as strings
    norm = math.sqrt(sum(float(f["norm"]) ** 2 for f in fragments))
    return diff / norm if norm > 0 else diff


def _impaired_until(view: RunView, learner: int) -> float | None:
    """When the last fault that kept `learner` from adopting (on it, or on the syncer) was
    over, its recovery included."""
    ends = [w.stop + view.recovery(w) for w in view.windows() if _hits(w, learner)]
    return max(ends) if ends else None


def check_converged(view: RunView, tolerance: float = 0.5, max_behind: float | None = None) -> Verdict:
    """After the final heal, every learner still running at the end holds parameters
    within `tolerance` (relative L2) of the global version it last adopted, and that
    version had been superseded for at most `max_behind` seconds when the learner
    stopped (a learner that stopped adopting would fall further and further behind).
    Within one round a young model moves up to ~20% of its norm, hence the loose
    default; one that stopped adopting drifts without bound.
    Read from each learner's `final_params` event at its clean stop.

    `max_behind` is by default on the run's own clock: the syncer's late-merge wait, a
    reconnect and BEHIND_ROUNDS measured round periods (a learner adopts the merge of its
    own next push, a round or so after a newer version appears). Time a fault kept the
    learner (or the syncer) down, and its recovery, does not count as behind.

    The tolerance is calibrated on the whole model, whose norm the LayerNorm gains dominate.
    With P > 1 fragments (streaming) a fragment without them (an embedding, a projection)
    has a several times smaller norm, so its own relative drift after the same inner steps
    is several times larger. When the learner reports each fragment's absolute `diff` and
    `norm`, the drift judged is therefore the whole model's, sqrt(Σ diff²) / sqrt(Σ norm²),
    as with P=1 (and identical to it when P=1); otherwise each fragment's `drift`. How long
    each fragment's version had been superseded is judged per fragment either way."""
    merges = [e for e in view.events if e["kind"] == "merge"]
    if not merges:
        return Verdict("converged", UNKNOWN, "no merges (sync mode, or nothing was merged)")
    missed = missed_adoptions(view)
    if missed:
        first = missed[0]
        return Verdict("converged", FAIL, f"{len(missed)} adoption(s) did not bring the learner onto the global "
                                          f"version: learner-{first['learner']} fragment {first['fragment']} "
                                          f"v{first['version']} was {first['drift_after']:.4f} from it after adopting "
                                          f"(relative L2), where {first['rule']} puts it at "
                                          f"{first['expected_drift']:.4f}", {"missed_adoptions": missed[:20]})
    pace = view.pace
    given = max_behind is not None
    if max_behind is None:
        max_behind = round(pace.late_wait + pace.reconnect("") + BEHIND_ROUNDS * pace.round_period, 2)
    finals: dict[int, dict] = {}
    for e in view.events:
        if e["kind"] == "final_params":
            finals[e["learner"]] = e
    rows, bad, models = [], [], {}
    for learner in view.learners():
        e = finals.get(learner)
        if e is None:
            rows.append({"learner": learner, "status": "no clean stop"})
            continue
        whole = _model_drift(e["fragments"])
        if whole is not None:
            models[learner] = round(whole, 5)
            if not whole <= tolerance:
                bad.append({"learner": learner, "model_drift": models[learner]})
        down_until = _impaired_until(view, learner)
        for frag in e["fragments"]:
            newer = [m["t"] for m in merges if m["fragment"] == frag["fragment"] and m["version"] > frag["version"]
                     and m["t"] <= e["t"]]
            since = max([min(newer), down_until or -math.inf]) if newer else e["t"]
            behind = max(0.0, e["t"] - since)
            drift = float(frag["drift"])  # the event log writes NaN and Inf as strings
            row = {"learner": learner, "fragment": frag["fragment"], "version": frag["version"],
                   "behind_seconds": round(behind, 3), "drift": round(drift, 5)}
            rows.append(row)
            if behind > max_behind or (whole is None and not drift <= tolerance):
                bad.append(row)
    evidence = {"tolerance": tolerance, "max_behind": max_behind, "learners": rows, "pace": pace.to_dict(),
                "max_behind_from": "given" if given else
                {"late_wait": round(pace.late_wait, 3), "reconnect": pace.reconnect(""),
                 "rounds": round(BEHIND_ROUNDS * pace.round_period, 3)}}
    if models:
        evidence["model_drift"] = models
    if bad:
        what = "learner fragment(s) or model(s)" if models else "learner fragment(s)"
        return Verdict("converged", FAIL, f"{len(bad)} {what} far from the global parameters",
                       {**evidence, "failed": bad})
    if any(r.get("status") for r in rows):
        return Verdict("converged", UNKNOWN, "some learners did not stop cleanly", evidence)
    worst = max(models.values()) if models else max((r["drift"] for r in rows), default=0.0)
    behind = max((r["behind_seconds"] for r in rows), default=0.0)
    stale = (f"the oldest had been superseded {behind:.1f}s before its stop (allowed {max_behind:.1f}s)"
             if behind >= 0.05 else "each held the newest version of every fragment at its stop")
    return Verdict("converged", PASS, f"every learner within {worst:.1%} (relative L2) of the global parameters it "
                                      f"last adopted; {stale}", evidence)


# How far a learner may be from where its adoption rule puts it, relative to ||Θ_f||: float
# rounding of `θ + (Θ − ref)` is ~1e-7 of it; a missed adoption is the learner's whole
# drift from Θ, 1e-2 and more within a round.
ADOPTION_SLACK = 1e-4


def missed_adoptions(view: RunView) -> list[dict]:
    """The `apply` events after which the learner was not where its rule puts it: mix keeps
    α of its distance from Θ, rebase the steps since its push. Each learner measures this on
    its parameters after the update (trainer/learner.py), so an update that never reached
    the model (a copy into a detached tensor, a skipped step) shows, whatever the versions
    say; a learner that adopts nothing would otherwise pass as long as its own drift stayed
    under the tolerance."""
    out = []
    for e in view.events:
        if e["kind"] != "apply" or e.get("fragment") is None or "drift_after" not in e:
            continue
        try:
            after, expected = float(e["drift_after"]), float(e.get("expected_drift") or 0.0)
        except (TypeError, ValueError):
            continue
        if not after <= expected + ADOPTION_SLACK:
            rule = "rebase" if e.get("adopt") == "rebase" else f"mix with alpha {e.get('alpha', 0)}"
            out.append({"learner": e.get("learner"), "incarnation": e.get("incarnation"), "fragment": e["fragment"],
                        "version": e.get("version"), "at": view.rel(e["t"]), "drift_after": after,
                        "expected_drift": expected, "rule": rule})
    return out


def final_tokens(view: RunView) -> float:
    """Tokens merged into the final Θ: the syncer's last `global_eval` (durable across its
    restarts), else the sum over merge events (trainer.metrics)."""
    samples = [e for e in view.events if e["kind"] == "global_eval"]
    if samples:
        return float(max(samples, key=lambda e: e["t"]).get("tokens") or 0.0)
    from trainer.metrics import merged_tokens

    return merged_tokens(view.events)


def learning_margin(view: RunView) -> float:
    """How far below the untrained model's loss a model must end to have learned anything:
    REFERENCE_MARGIN in this task's units (0.25 nats per byte for the built-in task, else
    scaled by the untrained loss over ln 256: chaos/divergence.py's loss_scale)."""
    from .divergence import loss_scale
    return round(REFERENCE_MARGIN * loss_scale(view.events)[0], 6)


def untrained(view: RunView) -> tuple[float | None, str]:
    """Θ₀'s held-out loss (the syncer's version-0 `global_eval`), else ln(vocab_size)."""
    from .divergence import samples, untrained_loss
    return untrained_loss(samples(view.events), view.events)


def check_final_loss(view: RunView, threshold: float | None = None,
                     reference: float | ReferenceCurve | None = None, margin: float | None = None) -> Verdict:
    """The final global parameters learned, and learned enough.

    Learned: their held-out loss is below the untrained model's (Θ₀'s, which the syncer
    scores as it starts) by at least `learning_margin` (REFERENCE_MARGIN in the task's
    units). A model that learned nothing fails here whatever it is compared with: a task
    whose inner optimizer had lr 0 ended at its untrained 1.6570, and `<=` let it pass.

    Enough: within `margin` of a fault-free reference run of the same configuration at the
    same number of merged tokens (the best its `global_eval` curve had reached by then;
    chaos/reference.py), and below the unigram entropy, a sanity floor that a model which
    learned anything beats. A reference counts only if it learned by the same rule (it
    shares the run's untrained model): one that did not would excuse a run that did not
    either. Without a usable reference: below `threshold` (default: the unigram entropy −
    0.3, i.e. clearly learned), else the learning rule alone. A plain number as
    `reference` is compared as it is.

    REFERENCE_MARGIN is the spread of fault-free runs of one configuration at equal tokens
    (docs/checks.md); a faulted run that merged the same tokens may end that much higher."""
    evals = [e for e in view.events if e["kind"] == "eval"]
    if not evals:
        return Verdict("final_loss", UNKNOWN, "no evaluation of the final parameters")
    e = evals[-1]
    loss = e["final_loss"]
    learn = learning_margin(view)
    if margin is None:  # in this task's units (0.25 nats per byte for the built-in task)
        margin = learn
    unigram = e.get("unigram_entropy")
    start, start_source = untrained(view)
    evidence: dict = {"final_loss": loss, "loss_floor": e.get("loss_floor"), "unigram_entropy": unigram,
                      "untrained_loss": start, "untrained_from": start_source, "learning_margin": learn}
    if start is None and unigram is None and not isinstance(reference, (int, float, ReferenceCurve)) \
            and threshold is None:
        return Verdict("final_loss", UNKNOWN, "no score of the untrained model, no unigram entropy and no "
                                              "fault-free reference to compare with", evidence)
    curve = reference if isinstance(reference, ReferenceCurve) else None
    if curve is not None and curve.unusable:
        evidence["reference_refused"] = {**curve.describe(), "why": f"the reference run itself failed {curve.unusable}"}
        curve = None
    if curve is not None and start is not None and curve.points:
        best = curve.best_by(curve.final_tokens)
        if not best <= start - learn:
            evidence["reference_refused"] = {**curve.describe(), "why": f"the reference learned nothing: its best "
                                             f"{best:.4f} is not below the untrained {start:.4f} by {learn:.4g}"}
            curve = None
    if start is not None:
        learned_below = round(start - learn, 6)
        evidence["learned_below"] = learned_below
        if not (isinstance(loss, float) and loss <= learned_below):
            return Verdict("final_loss", FAIL, f"the model learned nothing: final loss {loss} is not below the "
                                               f"untrained model's {start:.4f} by the learning margin {learn:.4g} "
                                               f"(at most {learned_below:.4f}; {start_source})", evidence)
    if curve is not None:
        tokens = final_tokens(view)
        at = curve.best_by(tokens)
        limit, rule = at + margin, f"reference {at:.4f} by {tokens:.0f} merged tokens + {margin}"
        if unigram is not None and unigram < limit:
            limit, rule = unigram, f"unigram entropy {unigram:.4f} (the sanity floor, below reference {at:.4f} + {margin})"
        evidence.update(tokens=tokens, reference=curve.describe(), reference_loss=round(at, 4))
    elif isinstance(reference, (int, float)):
        limit, rule = reference + margin, f"reference {reference:.4f} + {margin}"
    elif threshold is not None:
        limit, rule = threshold, f"threshold {threshold:.4f}"
    elif unigram is not None:
        limit, rule = unigram - 0.3, f"unigram entropy {unigram:.4f} − 0.3 (no fault-free reference)"
    else:  # a user's task says nothing of its data: learning is what can be shown
        refused = " (the reference was refused)" if "reference_refused" in evidence else " (no fault-free reference)"
        limit, rule = learned_below, f"the untrained model's {start:.4f} − the learning margin {learn}{refused}"
    evidence.update(limit=limit, rule=rule)
    if not (isinstance(loss, float) and loss <= limit):
        return Verdict("final_loss", FAIL, f"final loss {loss} above {rule}", evidence)
    return Verdict("final_loss", PASS, f"final loss {loss:.4f} <= {limit:.4f} ({rule})", evidence)


def check_timeline(view: RunView) -> Verdict:
    """Every event is on the controller's timeline within the run's fault-timing tolerance:
    events stamped on other hosts' clocks (swarm nodes, or processes given clocks of their
    own) were placed through estimates of those clocks (chaos/timeline.py). n/a on one
    clock. Unknown when a host's events could not be placed (no probe of its clock came
    back), when placing was turned off, or when the bound is wider than the tolerance:
    then every check that compares times judged on a timeline that may not have happened."""
    placement = view.placement
    if placement.one_clock:
        return Verdict("timeline", NOT_APPLICABLE, "every event is on the controller machine's clock")
    tolerance = tolerance_of(view.history)
    evidence = {**placement.as_json(), "tolerance_s": tolerance}
    hosts = ", ".join(f"{h} {c['offset']:+.3f}s {c['drift'] * 1e6:+.0f}ppm ±{c['error'] * 1000:.1f}ms"
                      for h, c in placement.hosts.items())
    if not placement.aligned:
        return Verdict("timeline", UNKNOWN, f"placing events on one timeline was turned off: the events of "
                                            f"{len(placement.hosts) + len(placement.unplaced)} host(s) were judged "
                                            f"on their own clocks ({hosts})", evidence)
    if placement.unplaced:
        names = ", ".join(f"{h} ({n} events)" for h, n in placement.unplaced.items())
        return Verdict("timeline", UNKNOWN, f"no probe of the clock of {names} came back: their events are on "
                                            f"clocks this run could not place", evidence)
    if placement.error > tolerance:
        return Verdict("timeline", UNKNOWN, f"the clocks' bound ±{placement.error:.3f}s is wider than the fault "
                                            f"timing tolerance {tolerance:.3f}s: {hosts}", evidence)
    return Verdict("timeline", PASS, f"{len(placement.hosts)} host(s) placed within ±{placement.error * 1000:.1f}ms: "
                                     f"{hosts}", evidence)


CHECKERS: dict[str, Callable[..., Verdict]] = {
    "timeline": check_timeline,
    "faults_applied": check_faults_applied,
    "progress": check_progress,
    "self_heal": check_self_heal,
    "rejoined": check_every_learner_contributes_at_end,
    "no_lost_acks": check_no_lost_acks,
    "no_double_apply": check_no_double_apply,
    "push_window": check_push_window,
    "monotonic_versions": check_monotonic_versions,
    "finite": check_finite,
    "task_healthy": check_task_healthy,
    "no_divergence": check_no_divergence,
    "converged": check_converged,
    "final_loss": check_final_loss,
}


# Checks that read only the controller's own records (or only how the evidence was placed):
# a node's missing events cannot change them.
HISTORY_ONLY = ("timeline", "faults_applied")


def run_checkers(view: RunView, options: dict[str, dict] | None = None) -> list[Verdict]:
    options = options or {}
    verdicts = [fn(view, **options.get(name, {})) for name, fn in CHECKERS.items()]
    return [incomplete_evidence(v, view.incomplete) for v in verdicts] if view.incomplete else verdicts


def incomplete_evidence(verdict: Verdict, incomplete: dict) -> Verdict:
    """A pass that rests on events some node never handed over is unknown, naming the node
    (a failure stands: the events that were seen already show it)."""
    if verdict.status != PASS or verdict.name in HISTORY_ONLY:
        return verdict
    nodes = ", ".join(f"{node} ({record.get('error') or 'no copy at the end'})" for node, record in incomplete.items())
    return Verdict(verdict.name, UNKNOWN, f"{verdict.detail}; but the events of node(s) {nodes} after their last "
                                          f"copy are missing, and they may say otherwise",
                   {**verdict.evidence, "incomplete_nodes": incomplete})


def required_checks(verdicts: list[Verdict]) -> list[str]:
    """The checks this run must pass: the safety checks that apply in its mode."""
    return [v.name for v in verdicts if v.name in SAFETY_CHECKS and v.status != NOT_APPLICABLE]


def failing(verdicts: list[Verdict]) -> list[Verdict]:
    """The verdicts that fail a run: every failed check, and each required one left unknown."""
    required = set(required_checks(verdicts))
    return [v for v in verdicts if v.status == FAIL or (v.name in required and v.status == UNKNOWN)]


def verdict_document(verdicts: list[Verdict]) -> dict:
    """The run's verdict: it passes when no check failed and every required check passed.
    `undecided` names the required checks that answered unknown (they fail the run too)."""
    required = required_checks(verdicts)
    undecided = [v.name for v in verdicts if v.name in required and v.status == UNKNOWN]
    failed = [v.name for v in verdicts if v.status == FAIL]
    return {"passed": not failing(verdicts),
            "failed": failed,
            "unknown": [v.name for v in verdicts if v.status == UNKNOWN],
            "required": required,
            "undecided": undecided,
            "not_applicable": [v.name for v in verdicts if v.status == NOT_APPLICABLE],
            "checks": [v.to_dict() for v in verdicts]}


def describe_required(document: dict) -> str:
    """One line: which checks the run had to pass, which did not apply, which were left unknown."""
    if "required" not in document:
        return "required checks: not recorded (a verdict from before they were)"
    line = "required to pass: " + (", ".join(document["required"]) or "none")
    if document.get("not_applicable"):
        line += f"; not applicable in this mode: {', '.join(document['not_applicable'])}"
    if document.get("undecided"):
        line += f"; unknown, which fails the run: {', '.join(document['undecided'])}"
    return line


def not_passed(document: dict) -> list[str]:
    """Why a verdict failed, by check: the failed ones, then the required ones left unknown."""
    return [*document.get("failed", []), *(f"{n} (unknown, required)" for n in document.get("undecided", []))]
