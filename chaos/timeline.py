"""One timeline across hosts whose clocks disagree: each host's clock estimated against
the controller's from probes, with an error bound, and events placed through it.

A probe is Cristian's exchange: the controller notes its monotonic clock when the request
leaves (`sent`) and when the answer arrives (`received`); the host's answer holds its own
clock (`remote`), read somewhere in between. So at the controller time `c` of that read,
remote − c lies in [remote − received, remote − sent]: an interval of half-width RTT/2
around remote − midpoint. A host clock is modelled as offset plus drift (a straight line
in controller time, as an oscillator's error is over minutes); the line is fitted to the
probes with the shortest round trips (a queued answer says little), and its bound is the
largest distance from the line to the far edge of any kept probe's interval. Beyond the
probed span the bound grows by the slope the end probes still allow.

Pure: no socket, no clock. chaos/clock_probe.py makes the exchanges; the checkers read the
estimates a run directory keeps (CLOCKS_FILE).
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterable

from trainer.events import read_events

CLOCKS_FILE = "clocks.json"
SAMPLES_FILE = "clock_samples.jsonl"
# A host's clock gains or loses at most this (crystal oscillators: tens of ppm; 500 ppm is
# NTP's own limit), used for the slope of an estimate from one probe or one instant.
MAX_DRIFT = 500e-6
# The share of probes (shortest round trips first) a fit keeps; at least MIN_KEPT.
KEEP_SHARE = 0.5
MIN_KEPT = 3


@dataclass(frozen=True)
class ClockSample:
    """One exchange with `host`: controller times around the host's reading `remote`."""
    host: str
    sent: float
    received: float
    remote: float

    @property
    def rtt(self) -> float:
        return self.received - self.sent

    @property
    def midpoint(self) -> float:
        return (self.sent + self.received) / 2

    @property
    def offset(self) -> float:
        """remote − controller at the midpoint: the host's offset, ± rtt/2."""
        return self.remote - self.midpoint


@dataclass(frozen=True)
class HostClock:
    """host clock = c + offset + drift × (c − ref), for controller time c; `error` bounds the
    placement of a host time on the controller's timeline within [first, last] (the span
    probed), and grows by `slope_error` per second beyond it."""
    host: str
    offset: float
    drift: float
    ref: float
    error: float
    slope_error: float
    first: float
    last: float
    samples: int
    kept: int

    def to_controller(self, remote: float) -> float:
        """The controller time at which this host's clock read `remote`."""
        return (remote - self.offset + self.drift * self.ref) / (1.0 + self.drift)

    def to_host(self, controller: float) -> float:
        return controller + self.offset + self.drift * (controller - self.ref)

    def bound_at(self, controller: float) -> float:
        """The error bound of a host time placed at controller time `controller`."""
        outside = max(0.0, self.first - controller, controller - self.last)
        return self.error + self.slope_error * outside

    def as_json(self) -> dict:
        return asdict(self)


def estimate(host: str, samples: Iterable[ClockSample]) -> HostClock:
    """The host's clock from its probes (at least one); see the module's docstring."""
    every = sorted((s for s in samples if s.received >= s.sent), key=lambda s: s.midpoint)
    if not every:
        raise ValueError(f"no probe of host {host!r} came back: its clock cannot be estimated")
    by_rtt = sorted(every, key=lambda s: s.rtt)
    kept = sorted(by_rtt[:max(MIN_KEPT, int(len(by_rtt) * KEEP_SHARE))], key=lambda s: s.midpoint)
    xs = [s.midpoint for s in kept]
    ys = [s.offset for s in kept]
    ref = sum(xs) / len(xs)
    spread = sum((x - ref) ** 2 for x in xs)
    mean_y = sum(ys) / len(ys)
    # Too short a span to see drift: hold the offset, and let the bound carry MAX_DRIFT.
    drift = 0.0 if spread < 1e-9 else sum((x - ref) * (y - mean_y) for x, y in zip(xs, ys)) / spread
    error = max(abs(y - (mean_y + drift * (x - ref))) + s.rtt / 2 for x, y, s in zip(xs, ys, kept))
    span = xs[-1] - xs[0]
    # The true line is within `error` of the fit at the first and last kept probes, so its
    # slope is within 2·error/span of the fit's (a span too short says nothing: MAX_DRIFT).
    slope_error = min(2 * MAX_DRIFT, 2 * error / span) if span >= 1.0 else 2 * MAX_DRIFT
    return HostClock(host=host, offset=mean_y, drift=drift, ref=ref, error=error, slope_error=slope_error,
                     first=xs[0], last=xs[-1], samples=len(every), kept=len(kept))


def estimate_all(samples: Iterable[ClockSample]) -> dict[str, HostClock]:
    by_host: dict[str, list[ClockSample]] = {}
    for s in samples:
        by_host.setdefault(s.host, []).append(s)
    return {host: estimate(host, group) for host, group in sorted(by_host.items())}


# ------------------------------------------------------------------ a run directory's record
def append_sample(run_dir: str | os.PathLike, sample: ClockSample) -> None:
    """One probe, appended as it comes back (a controller killed mid-run keeps the rest)."""
    with open(Path(run_dir) / SAMPLES_FILE, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(asdict(sample), separators=(",", ":")) + "\n")


def read_samples(run_dir: str | os.PathLike) -> list[ClockSample]:
    path = Path(run_dir) / SAMPLES_FILE
    if not path.exists():
        return []
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            out.append(ClockSample(**json.loads(line)))
        except (ValueError, TypeError):
            continue  # a line cut short when the controller stopped
    return out


def write_estimates(run_dir: str | os.PathLike, clocks: dict[str, HostClock]) -> Path:
    path = Path(run_dir) / CLOCKS_FILE
    path.write_text(json.dumps({h: c.as_json() for h, c in clocks.items()}, indent=2) + "\n")
    return path


def read_estimates(run_dir: str | os.PathLike) -> dict[str, HostClock]:
    """The run's host clocks: from clocks.json, else estimated from its probes."""
    path = Path(run_dir) / CLOCKS_FILE
    if path.exists():
        return {h: HostClock(**c) for h, c in json.loads(path.read_text()).items()}
    return estimate_all(read_samples(run_dir))


# ------------------------------------------------------------------ events on one timeline
@dataclass(frozen=True)
class Placement:
    """How a run's events were put on the controller's timeline: each host's estimate (and
    how many of its events), the hosts whose events could not be placed (no probe of them
    came back), and `error`, the largest bound of any placed event (0: one clock)."""
    aligned: bool
    hosts: dict[str, dict]
    unplaced: dict[str, int]
    error: float

    @property
    def one_clock(self) -> bool:
        return not self.hosts and not self.unplaced

    def as_json(self) -> dict:
        return {"aligned": self.aligned, "hosts": self.hosts, "unplaced": self.unplaced,
                "error_s": round(self.error, 6)}


ONE_CLOCK = Placement(aligned=True, hosts={}, unplaced={}, error=0.0)


def place(events: list[dict], clocks: dict[str, HostClock], align: bool = True) -> tuple[list[dict], Placement]:
    """`events` with each host's `t` moved to the controller's timeline (its own reading kept
    as `t_host`, its bound as `t_err`), sorted again. Events with no `host` are the
    controller machine's, on its clock already. With `align` False every `t` is left on
    its host's clock, as if they all shared one (what a harness without this does)."""
    counts: dict[str, int] = {}
    for e in events:
        if e.get("host") is not None:
            counts[e["host"]] = counts.get(e["host"], 0) + 1
    if not counts:
        return events, ONE_CLOCK
    hosts = {h: {**clocks[h].as_json(), "events": n} for h, n in sorted(counts.items()) if h in clocks}
    unplaced = {h: n for h, n in sorted(counts.items()) if h not in clocks}
    if not align:
        return events, Placement(aligned=False, hosts=hosts, unplaced=unplaced, error=0.0)
    out, error = [], 0.0
    for e in events:
        clock = clocks.get(e.get("host"))  # type: ignore[arg-type]
        if clock is None:
            out.append(e)
            continue
        t = clock.to_controller(e["t"])
        bound = clock.bound_at(t)
        error = max(error, bound)
        out.append({**e, "t": t, "t_host": e["t"], "t_err": round(bound, 6)})
    out.sort(key=lambda e: e["t"])
    return out, Placement(aligned=True, hosts=hosts, unplaced=unplaced, error=error)


def run_events(run_dir: str | os.PathLike, align: bool = True) -> tuple[list[dict], Placement]:
    """A run directory's events on the controller's timeline (trainer.events.read_events,
    placed through the run's clock probes)."""
    events = read_events(run_dir)
    if not any(e.get("host") is not None for e in events):
        return events, ONE_CLOCK
    samples = read_samples(run_dir)
    clocks = read_estimates(run_dir) if (Path(run_dir) / CLOCKS_FILE).exists() or samples else {}
    return place(events, clocks, align)
