"""The clocks a trainer process reads, in one place: which one each decision uses, and a
wall clock a chaos run can set wrong.

- The **monotonic** clock (time.monotonic) never steps. Leases, grace windows, deadlines
  and the event timeline are read from it.
- The **wall** clock (`wall()`) can be stepped by NTP or an operator, run fast or slow, or
  disagree with another host's. Nothing the syncer decides depends on it: it only stamps
  events (`wall`) for people. A clock file sets how wrong it is: $ISLANDS_CLOCK_FILE,
  else `$ISLANDS_CLOCK_DIR/<role>.json` once the process knows its role (`use_clock_of`:
  `syncer`, `learner-N`; one directory for a whole cluster, so every process of every
  backend starts with the same environment). The file holds a JSON object {"offset": s, "rate": r, "anchor": t} makes
  wall = now + offset + (rate − 1) × (now − anchor), `now` being the true wall time. The
  chaos harness's `clock` fault writes it (docs/schedules.md); the process rereads it
  when it changes (a stat at most every CHECK_EVERY s). A missing or unreadable file
  means the true clock.
- The **host** clock: on one machine every process reads the same CLOCK_MONOTONIC, but two
  machines' monotonic clocks start at different instants and tick at slightly different
  rates. `monotonic()` is the event timeline's clock: time.monotonic() as this host's
  oscillator reads it. $ISLANDS_HOST names the host (each event records it) and
  $ISLANDS_HOST_CLOCK_FILE, read once, holds {"offset": s, "rate": r, "anchor": t}:
  monotonic = m + offset + (rate − 1) × (m − anchor) for the kernel's m, and the wall clock
  moves with it (an unsynchronised host). Without the file, both are this kernel's. The
  harness gives swarm nodes (and local processes, to test with) clocks that disagree this
  way, and places their events on its own timeline (chaos/timeline.py).
- The **boot** clock (CLOCK_BOOTTIME with the kernel's boot id) measures how long a
  syncer was down between two processes on one machine, immune to wall-clock steps
  (`boot_stamp`, `downtime_since`): the push bounds credit that time (validation.py).
"""
from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

CLOCK_FILE_ENV = "ISLANDS_CLOCK_FILE"
HOST_ENV = "ISLANDS_HOST"
HOST_CLOCK_ENV = "ISLANDS_HOST_CLOCK_FILE"
CLOCK_DIR_ENV = "ISLANDS_CLOCK_DIR"
CHECK_EVERY = 0.02
BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


class HostOscillator:
    """This host's clock against the kernel's, from the file $ISLANDS_HOST_CLOCK_FILE names:
    read once per file (an oscillator does not change in a run), and looked up when first
    used, not at import (a warm spare imports this before it is told which host it is on).
    A missing or unreadable file is the kernel's own clock."""

    def __init__(self) -> None:
        self._path: str | None = None
        self._spec: tuple[float, float, float] = (0.0, 1.0, 0.0)
        self._read = False

    def spec(self) -> tuple[float, float, float]:
        path = os.environ.get(HOST_CLOCK_ENV) or None
        if not self._read or path != self._path:
            self._path, self._read = path, True
            offset, rate, anchor = 0.0, 1.0, 0.0
            if path is not None:
                try:
                    data = json.loads(Path(path).read_text())
                    offset, rate, anchor = float(data.get("offset", 0.0)), float(data.get("rate", 1.0)), \
                        float(data.get("anchor", 0.0))
                except (OSError, ValueError, TypeError, AttributeError):
                    offset, rate, anchor = 0.0, 1.0, 0.0
            self._spec = (offset, rate if rate > 0 else 1.0, anchor)
        return self._spec

    def shift(self, kernel_monotonic: float) -> float:
        """What this host's clocks add to the kernel's at `kernel_monotonic`."""
        offset, rate, anchor = self.spec()
        return offset + (rate - 1.0) * (kernel_monotonic - anchor)


_HOST = HostOscillator()


def monotonic() -> float:
    """This host's monotonic clock: the event timeline's (the kernel's without a host clock file)."""
    m = time.monotonic()
    return m + _HOST.shift(m)


def host() -> str | None:
    """The host this process runs on, as the harness named it ($ISLANDS_HOST), or None."""
    return os.environ.get(HOST_ENV) or None


class WallClock:
    """time.time(), shifted as the clock file says (if any)."""

    def __init__(self, path: str | os.PathLike | None = None) -> None:
        self.path = Path(path) if path else None
        self._lock = threading.Lock()
        self._checked = -1.0
        self._seen: tuple[int, int, int] | None = None
        self.offset, self.rate, self.anchor = 0.0, 1.0, 0.0

    def _refresh(self) -> None:
        now = time.monotonic()
        if self.path is None or now - self._checked < CHECK_EVERY:
            return
        with self._lock:
            self._checked = now
            try:
                st = self.path.stat()
            except OSError:
                self._seen, self.offset, self.rate, self.anchor = None, 0.0, 1.0, 0.0
                return
            if self._seen == (st.st_ino, st.st_mtime_ns, st.st_size):
                return
            try:
                spec = json.loads(self.path.read_text())
                offset, rate, anchor = float(spec.get("offset", 0.0)), float(spec.get("rate", 1.0)), \
                    float(spec.get("anchor", 0.0))
            except (OSError, ValueError, TypeError, AttributeError):
                return  # a file caught mid-write: the next check reads it whole
            self._seen = (st.st_ino, st.st_mtime_ns, st.st_size)
            self.offset, self.rate, self.anchor = offset, rate if rate > 0 else 1.0, anchor

    def __call__(self) -> float:
        self._refresh()
        now = time.time() + _HOST.shift(time.monotonic())
        return now + self.offset + (self.rate - 1.0) * (now - self.anchor)


_WALL = WallClock(os.environ.get(CLOCK_FILE_ENV) or None)


def use_clock_of(role: str) -> None:
    """This process is `role` (syncer, learner-N): read $ISLANDS_CLOCK_DIR/<role>.json, unless
    $ISLANDS_CLOCK_FILE names a file of its own."""
    directory = os.environ.get(CLOCK_DIR_ENV)
    if directory and not os.environ.get(CLOCK_FILE_ENV):
        with _WALL._lock:
            _WALL.path, _WALL._checked, _WALL._seen = Path(directory) / f"{role}.json", -1.0, None


def wall() -> float:
    """This process's wall clock (set wrong by $ISLANDS_CLOCK_FILE in a chaos run)."""
    return _WALL()


def boot_stamp() -> dict:
    """Where the boot clock stands: persisted beside state, to measure a later process's downtime."""
    try:
        boot_id = BOOT_ID.read_text().strip()
    except OSError:
        boot_id = ""
    return {"boot_id": boot_id, "boottime": time.clock_gettime(time.CLOCK_BOOTTIME)}


def downtime_since(stamp: object, now: dict | None = None) -> float:
    """Seconds since `stamp` (a boot_stamp()) by the boot clock, to `now` (boot_stamp() if
    None); 0 when it was taken on another boot or machine, or cannot be read: no wall clock
    is trusted for it."""
    if not isinstance(stamp, dict):
        return 0.0
    now = boot_stamp() if now is None else now
    try:
        then = float(stamp["boottime"])
    except (KeyError, TypeError, ValueError):
        return 0.0
    if not now["boot_id"] or stamp.get("boot_id") != now["boot_id"]:
        return 0.0
    return max(0.0, now["boottime"] - then)
