"""An explicit fault schedule replayed on a simulated Islands decoupled cluster.

It predicts what bench/goodput.py measures for the decoupled system under the same
schedule: goodput of the available capacity (the window, less the seconds the schedule
held each learner killed) and of all capacity (every learner, the whole window). A
discrete-event simulation of M learners and one syncer, following the trainer's rules:

learner (trainer/learner.py, fragments.py)
  * trains at one step per --step-time whenever it is up and not paused (--pace < 1: slower
    than the rate capacity credits it, as on a machine short of CPU);
  * pushes fragment f H steps after it last pushed or adopted it (staggered by H/P), then
    pushes f again only once it has adopted the merge holding that push (one push in
    flight); it adopts with rebase, so the steps made meanwhile ride on the new version;
  * a kill loses its unpushed steps and whatever it could not send; after the restart
    order it trains again after a --recovery-decoupled draw, with the current state;
  * a pause freezes it (and its network thread);
syncer (trainer/syncer/)
  * drops a push whose base version is more than --max-staleness merges old, and merges by
    the syncer's own rule, trainer/merge_rule.py (quorum min(K, live), the grace window in
    either policy, lone late pushes): the simulator asks it, it keeps no copy of it;
  * counts a learner dead --detection after a kill, or --heartbeat-timeout after its last
    frame when a pause or partition silences it; back when it is heard again;
links (links.py): partitions hold messages until they heal, latency delays them.
Merges, fsyncs and pulls take no time beyond the links' delays; a learner hears of a
merge half a heartbeat later on average, then pulls it.
"""
from __future__ import annotations

import heapq
import random
from dataclasses import dataclass, field
from itertools import count

from faults import Schedule
from faults.kinds import parse_target

from trainer.merge_rule import MERGE_TIMES_KEPT, Arrivals, MergeRule, Waiting, is_stale, round_period

from .dists import Dist, Fixed, LogNormal
from .links import DOWN, UP, Link
from .result import SystemResult

SUPPORTED = ("kill", "pause", "partition", "latency")
GAP_THRESHOLD = 1.0  # bench/goodput.py: global downtime counts merge gaps longer than this


@dataclass(frozen=True)
class RunInputs:
    """The goodput benchmark's settings (bench/goodput.py, trainer/config.py defaults)."""

    learners: int = 4
    duration: float = 150.0
    step_time: float = 0.025
    sync_every: int = 10
    fragments: int = 1
    quorum: int = 0
    grace: float = 0.5
    grace_policy: str = "fixed"
    max_staleness: int = 4
    heartbeat_interval: float = 0.2
    heartbeat_timeout: float = 1.0
    detection: Dist = Fixed(0.069)
    recovery: Dist = LogNormal(0.042, 0.71)  # warm spares: restart -> join (BENCHMARKS 'Recovery')
    pace: float = 1.0  # a learner's step rate while up, as a fraction of the rate capacity credits it
    seed: int = 0

    def problems(self) -> list[str]:
        """What is wrong with these inputs, each naming its flag."""
        out = []
        if self.fragments < 1 or self.sync_every % self.fragments:
            out.append(f"--fragments: {self.fragments} must divide --sync-every {self.sync_every}")
        if self.quorum > self.learners:
            out.append(f"--quorum: must be <= --learners ({self.learners}), got {self.quorum}")
        if self.heartbeat_timeout <= self.heartbeat_interval:
            out.append(f"--heartbeat-timeout: {self.heartbeat_timeout:g} must exceed --heartbeat-interval "
                       f"{self.heartbeat_interval:g}")
        if not 0 < self.pace <= 1:
            out.append(f"--pace: must be in (0, 1], got {self.pace:g}")
        return out


@dataclass
class Push:
    learner: int
    incarnation: int
    fragment: int
    work: float      # training seconds it carries
    base: int        # the version it was computed against
    stuck: bool      # sent while its link was cut: still in the learner's queue
    arrived: float = 0.0
    cancelled: bool = False


@dataclass
class Learner:
    alive: bool = True
    frozen_until: float = 0.0
    incarnation: int = 1
    last: float = 0.0
    unpushed: list[float] = field(default_factory=list)
    since_sync: list[float] = field(default_factory=list)
    awaiting: list[bool] = field(default_factory=list)
    adopted: list[int] = field(default_factory=list)
    epochs: list[int] = field(default_factory=list)
    stuck: list[Push] = field(default_factory=list)

    def training(self, t: float) -> bool:
        return self.alive and t >= self.frozen_until


class ScheduleSim:
    def __init__(self, schedule: Schedule, inp: RunInputs) -> None:
        self.inp = inp
        self.rng = random.Random(f"{inp.seed}:schedule")
        self.queue: list[tuple[float, int, str, tuple]] = []
        self.order = count()
        self.links = [Link() for _ in range(inp.learners)]
        self.learners = [self._fresh(0.0, initial=True) for _ in range(inp.learners)]
        self.live = [True] * inp.learners
        self.version = [0] * inp.fragments
        self.pending: list[list[Push]] = [[] for _ in range(inp.fragments)]
        self.held = [0.0] * inp.learners
        self.start_token = [0] * inp.learners
        self.waiting_since: list[float | None] = [None] * inp.learners
        self.merged = 0.0
        self.merge_times: list[float] = []
        self.rule = MergeRule(inp.quorum, inp.grace, inp.grace_policy)
        self.recent_merges: list[list[float]] = [[] for _ in range(inp.fragments)]
        self.arrivals = [Arrivals() for _ in range(inp.fragments)]
        self.checks: list[float | None] = [None] * inp.fragments
        self.result = SystemResult(seconds=inp.duration, capacity=0.0)
        self.quorum_wait = 0.0
        self.stale_count = 0
        self._load(schedule)

    # ------------------------------------------------------------ set-up
    def _fresh(self, t: float, initial: bool = False) -> Learner:
        """A learner starting at t: fragment f falls due (f+1)·H/P steps later. At t=0 the
        steps since each fragment's last push were made before the window opened."""
        inp, P = self.inp, self.inp.fragments
        period = inp.sync_every * inp.step_time
        since = [period - (f + 1) * period / P for f in range(P)]
        return Learner(last=t, unpushed=since[:] if initial else [0.0] * P, since_sync=since,
                       awaiting=[False] * P, adopted=[0] * P if initial else self.version[:], epochs=[0] * P)

    def _load(self, schedule: Schedule) -> None:
        for fault in schedule.faults:
            if fault.kind not in SUPPORTED:
                raise ValueError(f"fault {fault.kind!r} at {fault.at:g} s: the simulator models "
                                 f"{', '.join(SUPPORTED)}")
            for j in self._learners_of(fault):
                if fault.kind == "partition":
                    self.links[j].add_cut(fault.at, fault.end)
                    self._push_event(fault.at + self.inp.heartbeat_timeout, "lease", (j,))
                    self._push_event(fault.end, "heard", (j,))
                elif fault.kind == "latency":
                    self.links[j].delays.append((fault.at, fault.end, fault.latency_ms / 1000, fault.direction))
                else:
                    self._push_event(fault.at, fault.kind, (j, fault))
        for j in range(self.inp.learners):
            self._schedule_dues(j, 0.0)

    def _learners_of(self, fault) -> list[int]:
        names = fault.targets if fault.kind == "partition" else (fault.target,)
        out = []
        for name in names:
            learner = parse_target(name).learner
            if learner is None:
                raise ValueError(f"fault {fault.kind!r} at {fault.at:g} s targets the syncer: the simulator "
                                 "models learner faults only")
            if learner > self.inp.learners:
                raise ValueError(f"fault {fault.kind!r} at {fault.at:g} s targets {name}, beyond "
                                 f"--learners {self.inp.learners}")
            out.append(learner - 1)  # a rank's fault takes its whole unit down or silent
        return out

    # ------------------------------------------------------------ the loop
    def _push_event(self, t: float, kind: str, args: tuple) -> None:
        heapq.heappush(self.queue, (t, next(self.order), kind, args))

    def run(self) -> SystemResult:
        while self.queue and self.queue[0][0] <= self.inp.duration:
            t, _, kind, args = heapq.heappop(self.queue)
            getattr(self, f"_on_{kind}")(t, *args)
        return self._finish()

    def _accrue(self, j: int, t: float) -> None:
        lr = self.learners[j]
        if lr.training(lr.last):
            dt = (t - lr.last) * self.inp.pace
            lr.unpushed = [u + dt for u in lr.unpushed]
            lr.since_sync = [s + dt for s in lr.since_sync]
            self._lose_span("slow_steps", lr.last, t, 1 - self.inp.pace)
        lr.last = t

    def _schedule_dues(self, j: int, t: float, only: int | None = None) -> None:
        lr = self.learners[j]
        period = self.inp.sync_every * self.inp.step_time
        for f in range(self.inp.fragments) if only is None else (only,):
            lr.epochs[f] += 1
            if not lr.awaiting[f]:
                wait = max(0.0, period - lr.since_sync[f]) / self.inp.pace
                self._push_event(t + wait, "due", (j, f, lr.incarnation, lr.epochs[f]))

    def _notify(self, j: int, t: float) -> float:
        """When learner j holds a version merged at t: it hears of it (half a heartbeat on
        average, through its link), then pulls it (a request and its reply)."""
        link = self.links[j]
        heard = link.deliver(t + self.inp.heartbeat_interval / 2, DOWN)
        return link.deliver(link.deliver(heard, UP), DOWN)

    # ------------------------------------------------------------ learner events
    def _on_due(self, t: float, j: int, f: int, incarnation: int, epoch: int) -> None:
        lr = self.learners[j]
        if (incarnation, epoch) != (lr.incarnation, lr.epochs[f]) or not lr.training(t):
            return
        self._accrue(j, t)
        stuck = self.links[j].cut_until(t) is not None
        push = Push(j, lr.incarnation, f, lr.unpushed[f], lr.adopted[f], stuck)
        lr.unpushed[f], lr.since_sync[f], lr.awaiting[f] = 0.0, 0.0, True
        if stuck:
            lr.stuck.append(push)
        self._push_event(self.links[j].deliver(t, UP), "arrive", (push,))

    def _on_adopt(self, t: float, j: int, f: int, incarnation: int) -> None:
        """The pull's reply: the fragment's newest version, whichever merge announced it."""
        lr = self.learners[j]
        if incarnation != lr.incarnation or not lr.alive:
            return
        if t < lr.frozen_until:
            self._push_event(self._notify(j, lr.frozen_until), "adopt", (j, f, incarnation))
            return
        self._accrue(j, t)
        lr.adopted[f] = self.version[f]
        if lr.awaiting[f]:
            lr.awaiting[f], lr.since_sync[f] = False, 0.0
            self._schedule_dues(j, t, only=f)

    def _on_kill(self, t: float, j: int, fault) -> None:
        lr = self.learners[j]
        self.held[j] += min(fault.end if fault.restart else self.inp.duration, self.inp.duration) - t
        if lr.alive:
            self._accrue(j, t)
            lost = sum(lr.unpushed) + sum(p.work for p in lr.stuck if not p.cancelled)
            self._lose("lost_with_learner", t, lost / self.inp.fragments)
            for p in lr.stuck:
                p.cancelled = True
            lr.alive = False
            self._push_event(t + self.inp.detection.sample(self.rng), "dead", (j, lr.incarnation))
        elif self.waiting_since[j] is not None:  # killed again while starting up
            self._lose_span("recovery", self.waiting_since[j], t)
            self.waiting_since[j] = None
        self.start_token[j] += 1
        if fault.restart:
            self._push_event(fault.end, "order", (j, self.start_token[j]))

    def _on_order(self, t: float, j: int, token: int) -> None:
        """The restart order: the learner trains again after a recovery draw."""
        if token == self.start_token[j]:
            self.waiting_since[j] = t
            self._push_event(t + self.inp.recovery.sample(self.rng), "start", (j, token))

    def _on_start(self, t: float, j: int, token: int) -> None:
        if token != self.start_token[j]:
            return
        self._lose_span("recovery", self.waiting_since[j], t)
        self.waiting_since[j] = None
        incarnation = self.learners[j].incarnation + 1
        lr = self.learners[j] = self._fresh(t)
        lr.incarnation = incarnation
        self._schedule_dues(j, t)
        self._push_event(self.links[j].deliver(t, UP), "heard", (j,))

    def _on_pause(self, t: float, j: int, fault) -> None:
        lr = self.learners[j]
        if not lr.training(t):
            return
        self._accrue(j, t)
        lr.frozen_until = fault.end
        self._lose_span("paused", t, fault.end)
        self._push_event(t + self.inp.heartbeat_timeout, "lease", (j,))
        self._push_event(fault.end, "resume", (j,))

    def _on_resume(self, t: float, j: int) -> None:
        lr = self.learners[j]
        if lr.alive:
            lr.last = t
            self._schedule_dues(j, t)
            self._push_event(self.links[j].deliver(t, UP), "heard", (j,))

    # ------------------------------------------------------------ syncer events
    def _on_arrive(self, t: float, push: Push) -> None:
        if push.cancelled:
            return
        push.arrived = t
        f = push.fragment
        lr = self.learners[push.learner]
        if push.stuck and push in lr.stuck:
            lr.stuck.remove(push)
        if is_stale(self.version[f], push.base, self.inp.max_staleness):
            self.stale_count += 1
            self._lose("stale_pushes", t, push.work / self.inp.fragments)
            reply = self.links[push.learner].deliver(t, DOWN)
            self._push_event(self._notify(push.learner, reply), "adopt", (push.learner, f, push.incarnation))
            return
        self.pending[f].append(push)
        self.arrivals[f].note(push.learner, push.incarnation, t)
        self._try_merge(t, f)

    def _on_check(self, t: float, f: int) -> None:
        if self.checks[f] == t:
            self.checks[f] = None
            self._try_merge(t, f)

    def _on_dead(self, t: float, j: int, incarnation: int) -> None:
        if self.learners[j].incarnation == incarnation:
            self._set_live(t, j, False)

    def _on_lease(self, t: float, j: int) -> None:
        """A pause or a partition began a lease ago: dead if it still silences j."""
        lr = self.learners[j]
        if t < lr.frozen_until or self.links[j].cut_until(t) is not None:
            self._set_live(t, j, False)

    def _on_heard(self, t: float, j: int) -> None:
        lr = self.learners[j]
        if lr.alive and t >= lr.frozen_until and self.links[j].cut_until(t) is None:
            self._set_live(t, j, True)

    def _set_live(self, t: float, j: int, live: bool) -> None:
        if self.live[j] != live:
            self.live[j] = live
            for f in range(self.inp.fragments):
                self._try_merge(t, f)

    def _try_merge(self, t: float, f: int) -> None:
        """Merge fragment f if the syncer's merge rule says so, else check again when it says."""
        pending = self.pending[f]
        if not pending:
            return
        alive = [j for j, live in enumerate(self.live) if live]
        waiting = [Waiting(p.learner, p.base, p.arrived) for p in pending]
        decision = self.rule.decide(waiting, self.version[f], alive, t, self.arrivals[f].predicted,
                                    round_period(self.recent_merges[f]))
        if decision.reason is not None:
            if decision.reason != "quorum":
                self.quorum_wait += t - min(p.arrived for p in pending)
            self._merge(t, f)
        elif decision.recheck_at is not None and self.checks[f] != decision.recheck_at:
            self.checks[f] = decision.recheck_at
            self._push_event(decision.recheck_at, "check", (f,))

    def _merge(self, t: float, f: int) -> None:
        self.version[f] += 1
        self.merged += sum(p.work for p in self.pending[f]) / self.inp.fragments
        self.merge_times.append(t)
        self.recent_merges[f] = (self.recent_merges[f] + [t])[-MERGE_TIMES_KEPT:]
        self.checks[f] = None
        for p in self.pending[f]:
            self._push_event(self._notify(p.learner, t), "adopt", (p.learner, f, p.incarnation))
        self.pending[f] = []

    # ------------------------------------------------------------ accounting
    def _lose(self, category: str, t: float, seconds: float) -> None:
        if 0 <= t <= self.inp.duration:
            self.result.lost[category] += seconds

    def _lose_span(self, category: str, start: float, end: float, weight: float = 1.0) -> None:
        self.result.lost[category] += weight * max(0.0, min(end, self.inp.duration) - max(start, 0.0))

    def _finish(self) -> SystemResult:
        inp = self.inp
        for j in range(inp.learners):  # charge slow steps up to the window's end
            self._accrue(j, inp.duration)
        available = sum(inp.duration - h for h in self.held)
        result = self.result
        result.capacity = available
        named = sum(v for k, v in result.lost.items() if k != "edge")
        result.lost["edge"] = available - self.merged - named
        result.info = {"goodput_all": self.merged / (inp.learners * inp.duration),
                       "capacity_available_learner_s": available, "merged_learner_s": self.merged,
                       "held_down_s": sum(self.held), "merges": len(self.merge_times),
                       "stale_pushes": self.stale_count, "quorum_wait_s": self.quorum_wait,
                       "global_downtime_s": downtime(self.merge_times, inp.duration)}
        return result


def downtime(times: list[float], end: float, threshold: float = GAP_THRESHOLD) -> float:
    """bench/goodput.py's global downtime: gaps longer than `threshold` between merges in
    [0, end], head and tail included, each counted in full."""
    points = [0.0, *sorted(t for t in times if 0 <= t <= end), end]
    return sum(b - a for a, b in zip(points, points[1:]) if b - a > threshold)


def predict_schedule(schedule: Schedule, inp: RunInputs) -> SystemResult:
    """The decoupled system under `schedule`: goodput (of the available capacity), the
    losses by cause, and in `info` goodput_all (of all capacity) and the counts."""
    if schedule.learners is not None and schedule.learners > inp.learners:
        raise ValueError(f"--learners {inp.learners}: the schedule declares {schedule.learners}")
    return ScheduleSim(schedule, inp).run()
