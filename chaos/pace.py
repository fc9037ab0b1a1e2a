"""A run's own pace, measured from its events: the clock the time-window checks judge on.

A fixed number of seconds is wrong on every machine but one: on two loaded cores a
healthy learner restart took 20 s and an outer round 8 s, on an idle machine a round of
the property suite's model takes half a second. So `progress`, `self_heal`, `rejoined`
and `converged` allow a sum of what this run measured and what it was configured with:

- the outer round period: the median interval between two merges of one fragment,
  taken in the fault-free stretches of the run, and never less than H step times;
- the learners' step time: the median interval between two inner steps of one learner
  incarnation, fault-free;
- the cold start-up of a process on this machine in this run: the syncer's first
  `process_start` after the controller's `cluster_start` history entry, and the slowest
  learner's (the learners start together, competing for the cores);
- the configured delays, read from the syncer's `process_start`: heartbeat timeout,
  request timeout, grace (and the late-merge wait max(5·grace, 1.5 rounds) of
  trainer/merge_rule.py), plus the learner's reconnect backoff cap (trainer/link.py:
  `wait_exponential_jitter(max=2.0)`).

A fault's recovery is what its kind costs: a kill, the cold start of the role it killed;
every impairing fault, a lease expiry and one backoff; a partition or a pause, also a
request in flight that has to time out first (a killed peer's connection closes at once).

Nothing here reads a wall clock of its own: the figures come from event times.
"""
from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass
from typing import Callable, Iterable

from faults import OUTAGE_KINDS
from trainer.merge_rule import LATE_GRACES, LATE_ROUNDS

# trainer/link.py: HELLO retries use wait_exponential_jitter(multiplier=0.05, max=2.0, jitter=0.2);
# tenacity caps the wait (jitter included) at max.
RECONNECT_BACKOFF_CAP = 2.0
# trainer/config.py defaults, for runs whose syncer did not announce its config.
DEFAULT_HEARTBEAT_TIMEOUT = 1.0
DEFAULT_REQUEST_TIMEOUT = 5.0
DEFAULT_GRACE = 0.5
DEFAULT_SYNC_EVERY = 20
# When a run gives neither a merge interval nor a step to measure: H steps this long.
FALLBACK_STEP_TIME = 0.1
# Fewer fault-free merge intervals than this, and every interval counts.
MIN_INTERVALS = 3
# When no start-up could be measured (a cluster started by hand or by a pytest fixture):
# what two shared cores took for Python + torch + the handshake on the slowest start seen.
FALLBACK_STARTUP = 20.0
# Faults after which the target is a fresh process that has to start cold.
# exit: a process that exited on its own, restarted by the supervisor; node: its units were
# started again elsewhere (a node killed), or after a rebalance
RESTARTING = {*OUTAGE_KINDS, "exit", "node"}
# Faults during which a request can hang until its deadline (a killed peer closes at once).
HANGING = {"partition", "pause", "node"}  # a node cut off hangs the requests in flight


@dataclass(frozen=True)
class Pace:
    """What one run measured of itself, and what it was configured with (seconds)."""

    round_period: float          # median interval between merges of one fragment (sync: between rounds)
    round_measured: bool         # False: no merge interval to measure
    step_time: float | None      # median interval between two inner steps of one learner
    startup: float               # cold start of a learner on this machine in this run (the slowest)
    syncer_startup: float        # cold start of the syncer
    startup_measured: bool       # False: FALLBACK_STARTUP for both
    heartbeat_timeout: float
    request_timeout: float
    grace: float
    sync_every: int
    fragments: int
    quorum: int
    backoff_cap: float = RECONNECT_BACKOFF_CAP

    @property
    def late_wait(self) -> float:
        """How long the syncer holds a lone late push before merging it alone (MergeRule.decide)."""
        return max(LATE_GRACES * self.grace, LATE_ROUNDS * self.round_period)

    def restart(self, kind: str, target: str = "learner") -> float:
        """The cold start a fault of `kind` on `target` costs before the target can do anything."""
        if kind not in RESTARTING:
            return 0.0
        return self.syncer_startup if target == "syncer" else self.startup

    def reconnect(self, kind: str) -> float:
        """From the end of a fault of `kind` (and any restart) until the learners it cut off
        are connected again: a request in flight times out (a partition, a pause), the lease
        expires, then one backoff."""
        hung = self.request_timeout if kind in HANGING else 0.0
        return hung + self.heartbeat_timeout + self.backoff_cap

    def recovery(self, kind: str, target: str = "learner") -> float:
        return self.restart(kind, target) + self.reconnect(kind)

    def to_dict(self) -> dict:
        out = {k: (round(v, 3) if isinstance(v, float) else v) for k, v in asdict(self).items()}
        out["late_wait"] = round(self.late_wait, 3)
        return out


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _clear(a: float, b: float, spans: list[tuple[float, float]]) -> bool:
    """Whether [a, b] overlaps none of `spans`."""
    return not any(lo <= b and a <= hi for lo, hi in spans)


def syncer_settings(events: Iterable[dict]) -> dict:
    """The syncer's announced config (TrainConfig) and syncer settings, from its first process_start."""
    for e in events:
        if e["kind"] == "process_start" and e.get("role") == "syncer":
            return {**(e.get("config") or {}), **(e.get("syncer") or {})}
    return {}


def _intervals(events: list[dict], key_of: Callable[[dict], object], faulted: list[tuple[float, float]]) -> list[float]:
    """Intervals between consecutive events of one key (`key_of` gives None for an event that
    does not count), kept when they overlap no faulted span."""
    last: dict[object, float] = {}
    out = []
    for e in events:
        key = key_of(e)
        if key is None:
            continue
        t = float(e["t"])
        prev = last.get(key)
        last[key] = t
        if prev is not None and _clear(prev, t, faulted):
            out.append(t - prev)
    return out


def _round_key(e: dict) -> object:
    if e["kind"] == "merge":
        return ("merge", e.get("fragment"))
    return "sync" if e["kind"] == "sync_step" else None


def _step_key(e: dict) -> object:
    if e["kind"] != "inner_step" or e.get("learner") is None:
        return None
    return (e["learner"], e.get("incarnation"))


def round_intervals(events: list[dict], faulted: list[tuple[float, float]]) -> list[float]:
    """Intervals between consecutive merges of each fragment (sync mode: between rounds),
    kept when they overlap no faulted span."""
    return _intervals(events, _round_key, faulted)


def step_intervals(events: list[dict], faulted: list[tuple[float, float]]) -> list[float]:
    """Intervals between consecutive inner steps of one learner incarnation that overlap no
    faulted span."""
    return _intervals(events, _step_key, faulted)


def cold_startups(events: list[dict], history: list[dict]) -> tuple[float, float] | None:
    """(slowest learner, syncer): each one's first `process_start` after the history's
    `cluster_start`. The learners start together then, competing for the cores as a restart
    does on a loaded machine, so theirs bounds a restart from above rather than below."""
    starts = [float(h["t"]) for h in history if h.get("event") == "cluster_start"]
    if not starts:
        return None
    t0 = starts[-1]
    first: dict[str, float] = {}
    for e in events:
        if e["kind"] == "process_start" and e.get("role") in ("learner", "syncer") and float(e["t"]) >= t0:
            first.setdefault("syncer" if e["role"] == "syncer" else f"learner-{e['learner']}", float(e["t"]) - t0)
    learners = [v for k, v in first.items() if k != "syncer"]
    if not learners:
        return None
    return max(learners), first.get("syncer", max(learners))


def measure(events: list[dict], history: list[dict], faulted: list[tuple[float, float]]) -> Pace:
    """The pace of a run from its events and history; `faulted` are the spans (monotonic
    times) to leave out of the round and step measurements."""
    cfg = syncer_settings(events)
    sync_every = int(cfg.get("sync_every") or DEFAULT_SYNC_EVERY)
    steps = step_intervals(events, faulted) or step_intervals(events, [])
    step_time = _median(steps)
    rounds = round_intervals(events, faulted)
    if len(rounds) < MIN_INTERVALS:
        rounds = round_intervals(events, [])
    merged = _median(rounds)
    # A round is at least H steps: merges closer than that are a round split in two (a late
    # push merged alone) or the flush at a clean stop, not a faster pace.
    floor = sync_every * step_time if step_time else None
    measured = merged is not None
    candidates = [v for v in (merged, floor) if v is not None]
    round_period = max(candidates) if candidates else sync_every * FALLBACK_STEP_TIME
    startups = cold_startups(events, history)
    learner_start, syncer_start = startups if startups is not None else (FALLBACK_STARTUP, FALLBACK_STARTUP)
    return Pace(round_period=round_period, round_measured=measured, step_time=step_time,
                startup=learner_start, syncer_startup=syncer_start, startup_measured=startups is not None,
                heartbeat_timeout=float(cfg.get("heartbeat_timeout") or DEFAULT_HEARTBEAT_TIMEOUT),
                request_timeout=float(cfg.get("request_timeout") or DEFAULT_REQUEST_TIMEOUT),
                grace=float(cfg["grace"]) if cfg.get("grace") is not None else DEFAULT_GRACE,
                sync_every=sync_every, fragments=int(cfg.get("fragments") or 1),
                quorum=int(cfg.get("quorum") or 0))
