"""The one JSONL event schema that every Islands process writes.

Each line: {"t": monotonic seconds, "wall": unix seconds, "process": "learner-2",
"pid": 123, "learner": 2 | null, "kind": "...", ...fields}, and "host" when the harness
named the host ($ISLANDS_HOST). CLOCK_MONOTONIC is shared by every process on one machine
(and by its containers), so events from one host order on one clock; events from hosts
whose clocks disagree are placed on the controller's timeline by chaos/timeline.py, from
probes of each host's clock (`t` is trainer.clock.monotonic(): the host's). Checkers and
reports read only these files.
"""
from __future__ import annotations

import json
import math
import os
import threading
from pathlib import Path
from typing import Any, Callable, Iterator

from .clock import host as host_name
from .clock import monotonic as host_monotonic
from .clock import wall
from .compact_json import compact, compact_strict
from .event_echo import EventEcho
from .event_echo import enabled as echo_enabled

EVENTS_DIR = "events"

# Event kinds, documented in one place so writers and readers agree.
KINDS = {
    "process_start": "a process started (role, incarnation when known, config)",
    "process_stop": "a process is exiting cleanly (reason)",
    "seeded_start": "a learner started from the model built from the run's seed, its digest matching the "
                    "syncer's initial parameters (else fetched: it asked for the tensors)",
    "inner_step": "a learner's inner step (step, loss, tokens, dt)",
    "push": "a learner's push was answered (fragment, seq, base_version, tokens, wire_bytes, status)",
    "push_accepted": "the syncer made a push durable and acknowledged it",
    "push_duplicate": "the syncer saw a retried (learner, incarnation, seq) and did not apply it again",
    "push_dropped": "the syncer dropped a push (reason: stale)",
    "merge": "the syncer applied an outer step (fragment, version, contributors, tokens, staleness)",
    "apply": "a learner adopted a global fragment (fragment, version, alpha, discarded_tokens: unpushed work it overwrote)",
    "syncer_rollback": "a learner saw the syncer report a version below the one it held (fragment, held, "
                       "syncer_version, rebased: the seqs of its queued pushes now said to be made on the "
                       "syncer's version): it adopts the syncer's version next, and pushes the fragment after",
    "join": "a learner incarnation joined (learner, incarnation, rejoin)",
    "leave": "a learner's connection closed",
    "heartbeat_lost": "a learner's lease expired and it was marked dead",
    "frame_rejected": "a frame or request was refused (reason: a protocol.Reason; suppressed: held back before it)",
    "connection_refused": "a connection was evicted, refused or timed out (reason: a protocol.Reason)",
    "push_quarantined": "a pending push that cannot be merged was moved to state/quarantine/ (id, reason, detail)",
    "events_suppressed": "refusal events held back by the throttle and never reported, per kind/reason",
    "state_write": "durable state written (what, bytes, seconds)",
    "state_loaded": "the syncer resumed from durable state (versions, applied ledger)",
    "final_state": "the syncer's state at a clean stop (versions, applied ledger, counters)",
    "sync_step": "sync mode: a gradient all-reduce completed (round, contributors, tokens)",
    "connect": "a learner (re)connected to the syncer",
    "disconnect": "a learner lost its connection (error)",
    "restart": "a launcher restarted a process",
    "rank_start": "a rank > 0 of a learner unit started (rank, ranks, incarnation)",
    "rank_stop": "a rank > 0 of a learner unit stopped when rank 0 said so (steps, parameter digest)",
    "unit_start": "a learner unit started a generation of its ranks (generation, rank PIDs)",
    "unit_failed": "a rank of a learner unit died; the unit kills the others (rank, exit code)",
    "unit_restart": "a learner unit starts all its ranks again after a failure",
    "unit_stop": "a learner unit is exiting (reason)",
    "eval": "validation loss of parameters",
    "pull": "a learner fetched a fragment's global version (fragment, version, wire_bytes, encoding)",
    "push_deferred": "a learner holds its head push back for a while (reason, detail, retry_in)",
    "final_params": "a learner's parameters at a clean stop, per fragment (its distance from Θ)",
    "task_error": "a user's task raised (task, method, error, position)",
    "merge_failed": "a merge could not be made durable; the fragment is retried (fragment, reason)",
    "storage_error": "a write or sync of the syncer's state failed (what, detail, sync_failed)",
    "disk_failed": "a failed sync: the syncer refuses every push and exits for a restart that reads the state back",
    "global_eval": "Θ's held-out loss, sampled by the syncer off the merge path (versions, loss)",
    "restart_failed": "the harness's supervisor could not restart a process (target, error)",
    "exit": "the harness's supervisor saw a process exit on its own (target, exit_code, lived)",
}


def _clean(value: Any) -> Any:
    """JSON has no NaN/Inf: write them as strings so a checker can still see them."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


class _NotPlain(Exception):
    """A value the JSON round trip would change (a tuple, an enum, NaN, a non-string key)."""


_SCALARS = frozenset((str, int, bool, type(None)))


def _plain(value: Any) -> Any:
    """A deep copy of `value` when it is plain JSON data, which reads back unchanged."""
    t = type(value)
    if t in _SCALARS:
        return value
    if t is float:
        if math.isfinite(value):
            return value
        raise _NotPlain
    if t is list:
        return [v if type(v) in _SCALARS else _plain(v) for v in value]
    if t is dict:
        return _plain_dict(value)
    raise _NotPlain


def _plain_dict(value: dict) -> dict:
    """_plain of a dict: most values of an event are strings and ints, copied as they are."""
    out = {}
    for k, v in value.items():
        if type(k) is not str:
            raise _NotPlain
        out[k] = v if type(v) in _SCALARS else _plain(v)
    return out


def as_read(record: dict) -> dict:
    """`record` as read_events() returns it once written: the JSON round trip's result
    (tuples become lists, NaN a string), without the round trip where that changes
    nothing (a simulator keeping its events in memory writes tens of thousands a second)."""
    try:
        return _plain_dict(record)
    except _NotPlain:
        try:
            line = compact_strict(record)
        except ValueError:
            line = compact(_clean(record))
        return json.loads(line)


class MemoryEvents:
    """A run's event logs kept in memory, one list per file a log would have written; read
    back as read_events() reads the files (the simulator's exploration reads them once and
    throws them away: no file is written or parsed)."""

    def __init__(self) -> None:
        self._files: dict[str, list[dict]] = {}

    def file(self, process: str) -> list[dict]:
        """The list that stands for `process`'s file: every log of it appends there."""
        return self._files.setdefault(f"{process}.jsonl", [])

    def events(self) -> list[dict]:
        """Every event, ordered as read_events() orders a run directory's: file by file in
        name order, then by monotonic time (a stable sort)."""
        out: list[dict] = []
        for name in sorted(self._files):
            out.extend(self._files[name])
        out.sort(key=lambda e: e["t"])
        return out


class EventLog:
    """Append-only, thread-safe, one line per event, flushed at once.

    Flushing every line costs little at our event rates (tens per second) and means a
    SIGKILLed process leaves every event it wrote readable.
    """

    def __init__(self, run_dir: str | os.PathLike | None, process: str, learner: int | None = None, *,
                 monotonic: Callable[[], float] = host_monotonic, wall_clock: Callable[[], float] = wall,
                 pid: int | None = None, buffering: int = 1, memory: MemoryEvents | None = None) -> None:
        """The clocks and pid are this process's unless a simulator hands in its own (its
        logs are then byte-identical from one run of a seed to the next). With `memory`,
        the events go there, as read back, instead of to a file under `run_dir`."""
        self.process = process
        self.learner = learner
        self._monotonic = monotonic
        self.wall_clock = wall_clock
        self._pid = pid
        self.host = host_name()  # whose clock `t` is read from (None: the controller's machine)
        self._lock = threading.Lock()
        self._file = None
        self._memory = memory.file(process) if memory is not None else None
        # A readable copy on stderr for container logs ($ISLANDS_EVENTS_TO_STDERR=1, event_echo.py).
        self._echo = EventEcho() if echo_enabled() else None
        if self._memory is not None:
            self.path: Path | None = None
        elif run_dir is not None:
            path = Path(run_dir) / EVENTS_DIR / f"{process}.jsonl"
            path.parent.mkdir(parents=True, exist_ok=True)
            # Line-buffered: a SIGKILLed process leaves every event it wrote. A simulator,
            # whose processes die only on purpose, may buffer (-1) and close.
            self._file = open(path, "a", encoding="utf-8", buffering=buffering)
            self.path = path
        else:
            self.path = None

    def emit(self, kind: str, **fields: Any) -> dict:
        record = {
            "t": self._monotonic(),
            "wall": self.wall_clock(),
            "process": self.process,
            "pid": os.getpid() if self._pid is None else self._pid,
            "learner": self.learner,
            "kind": kind,
        }
        if self.host is not None:
            record["host"] = self.host
        record.update(fields)
        if self._memory is not None:
            read = as_read(record)
            with self._lock:
                self._memory.append(read)
                if self._echo is not None:
                    self._echo(record)
            return record
        try:  # the common case: nothing to clean (a NaN or Inf is rare, and refused here)
            line = compact_strict(record)
        except ValueError:
            line = compact(_clean(record))
        with self._lock:
            if self._file is not None:
                self._file.write(line + "\n")
            if self._echo is not None:
                self._echo(record)
        return record

    def close(self) -> None:
        with self._lock:
            self._memory = None  # a closed log keeps nothing more, in memory as in a file
            if self._file is not None:
                self._file.close()
                self._file = None


def read_events(run_dir: str | os.PathLike) -> list[dict]:
    """Every event of a run, ordered by monotonic time. A torn last line is skipped."""
    out: list[dict] = []
    for path in sorted((Path(run_dir) / EVENTS_DIR).glob("*.jsonl")):
        out.extend(iter_file(path))
    out.sort(key=lambda e: e["t"])
    return out


def iter_file(path: Path) -> Iterator[dict]:
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            if not line.endswith("\n"):
                return  # a process was killed mid-write: the tail is incomplete
            try:
                yield json.loads(line)
            except json.JSONDecodeError:
                continue
