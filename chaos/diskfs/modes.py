"""The fault mode in force and the counters: which operation fails with which errno.

One table (`ERRNOS`) says everything a mode does, so the docs, the FUSE layer and the
tests read the same thing. Thread-safe: FUSE calls come from several threads and the
control socket from another.
"""
from __future__ import annotations

import errno
import threading
import time
from collections import Counter, defaultdict
from typing import Any

MODES = ("none", "full", "eio", "slow")
DEFAULT_LATENCY_MS = 50.0
MAX_LATENCY_MS = 60_000.0

# mode -> {operation: errno}. `truncate` under `full` fails only when it would grow the file.
# `eio` is a disk whose writeback fails: a write() is taken (it reaches the page cache, as
# on a real disk) and the sync that would make it durable answers EIO (fsyncgate).
ERRNOS: dict[str, dict[str, int]] = {
    "none": {},
    "full": {"write": errno.ENOSPC, "create": errno.ENOSPC, "mknod": errno.ENOSPC,
             "mkdir": errno.ENOSPC, "truncate": errno.ENOSPC},
    "eio": {"fsync": errno.EIO, "fdatasync": errno.EIO, "fsyncdir": errno.EIO},
    "slow": {},
}


class FaultPolicy:
    """The mode, its latency, and what it has done."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.mode = "none"
        self.latency_ms = DEFAULT_LATENCY_MS
        self.since = time.monotonic()
        self._ops: Counter[str] = Counter()
        self._errors: defaultdict[str, Counter[str]] = defaultdict(Counter)

    def set_mode(self, mode: str, latency_ms: float = DEFAULT_LATENCY_MS) -> dict[str, Any]:
        if mode not in MODES:
            raise ValueError(f"mode: {mode!r} is not one of {', '.join(MODES)}")
        if not 0 <= latency_ms <= MAX_LATENCY_MS:
            raise ValueError(f"latency_ms: must be in [0, {MAX_LATENCY_MS:.0f}], got {latency_ms}")
        with self._lock:
            self.mode, self.latency_ms, self.since = mode, float(latency_ms), time.monotonic()
            return {"mode": self.mode, "latency_ms": self.latency_ms, "since": self.since}

    def enter(self, op: str) -> str:
        """Count `op`, wait out the latency under `slow` (the caller holds no lock), and
        return the mode the operation runs under."""
        with self._lock:
            self._ops[op] += 1
            mode, latency = self.mode, self.latency_ms
        if mode == "slow" and latency > 0:
            time.sleep(latency / 1000.0)
        return mode

    def errno_for(self, op: str, mode: str) -> int | None:
        return ERRNOS[mode].get(op)

    def fail(self, op: str, mode: str) -> None:
        """Raise the errno `mode` injects into `op`, if any (counted)."""
        code = ERRNOS[mode].get(op)
        if code is not None:
            with self._lock:
                self._errors[mode][op] += 1
            raise OSError(code, f"{errno.errorcode[code]} injected by diskfs (mode {mode})")

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {"mode": self.mode, "latency_ms": self.latency_ms, "since": self.since,
                    "counters": {"ops": dict(sorted(self._ops.items())),
                                 "errors": {m: dict(sorted(c.items())) for m, c in sorted(self._errors.items())}}}
