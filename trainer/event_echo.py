"""A readable copy of a process's events on stderr, for `docker compose logs`.

The roles tell their story only in `RUN_DIR/events/*.jsonl`; on stdout and stderr they
print next to nothing, so the logs of a container showed nothing while it trained. With
$ISLANDS_EVENTS_TO_STDERR=1 (compose.yaml sets it) each event is also written to stderr
as one line: every event of the rare kinds, and the frequent ones (an inner step, a state
write) at most once every ECHO_EVERY seconds, with how many were not shown. The event
files stay the record the checkers read; this is only a view of them.
"""
from __future__ import annotations

import json
import os
import sys
import time
from typing import Any, Callable, TextIO

ENV = "ISLANDS_EVENTS_TO_STDERR"
ECHO_EVERY = 10.0  # seconds between two lines of one frequent kind
FREQUENT = ("inner_step", "state_write")
MAX_VALUE_CHARS = 160
SKIP_FIELDS = ("t", "wall", "process", "pid", "learner", "kind")


def enabled() -> bool:
    return os.environ.get(ENV) == "1"


def _value(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (dict, list, tuple)):
        text = json.dumps(value, separators=(",", ":"), default=str)
    else:
        text = str(value)
    return text if len(text) <= MAX_VALUE_CHARS else text[: MAX_VALUE_CHARS - 1] + "…"


def format_event(record: dict, skipped: int = 0) -> str:
    """`12:03:04 learner-1 inner_step step=200 loss=2.314 (+41 not shown)`."""
    stamp = time.strftime("%H:%M:%S", time.localtime(record.get("wall", time.time())))
    fields = " ".join(f"{k}={_value(v)}" for k, v in record.items() if k not in SKIP_FIELDS)
    more = f" (+{skipped} not shown)" if skipped else ""
    return f"{stamp} {record.get('process')} {record.get('kind')} {fields}{more}".rstrip()


class EventEcho:
    """Writes the lines; one per process, called under the event log's lock."""

    def __init__(self, out: TextIO | None = None, every: float = ECHO_EVERY,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.out = out
        self.every = every
        self.clock = clock
        self._last: dict[str, float] = {}
        self._skipped: dict[str, int] = {}

    def __call__(self, record: dict) -> None:
        kind = str(record.get("kind"))
        if kind in FREQUENT:
            now = self.clock()
            last = self._last.get(kind)
            if last is not None and now - last < self.every:
                self._skipped[kind] = self._skipped.get(kind, 0) + 1
                return
            self._last[kind] = now
        out = self.out or sys.stderr
        try:
            out.write(format_event(record, self._skipped.pop(kind, 0)) + "\n")
            out.flush()
        except (OSError, ValueError):  # a closed or broken stderr must never stop training
            pass
