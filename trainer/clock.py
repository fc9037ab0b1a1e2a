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
CLOCK_DIR_ENV = "ISLANDS_CLOCK_DIR"
CHECK_EVERY = 0.02
BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


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
        now = time.time()
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
