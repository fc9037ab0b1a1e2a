"""The real syncer, driven from the simulator's one thread.

It is trainer.syncer.Syncer as the live process runs it, with the simulator's clock, event
log, boot stamp and disk handed in, started with no socket or thread: frames arrive through
`Syncer.handle`, closed connections through `connection_closed`, time through `tick`. A
kill drops the object (what it wrote stays on the SimDisk, as the page cache keeps it), a
power loss keeps only what was synced, a restart recovers from what is there."""
from __future__ import annotations

import json
import random
from functools import lru_cache
from pathlib import Path, PurePosixPath
from typing import Callable

from trainer import wire
from trainer.config import SyncerConfig, TrainConfig
from trainer.events import EventLog, MemoryEvents, as_read
from trainer.simdisk import SimDisk, _key, _parent
from trainer.syncer import Syncer

from .loop import Stoppable, VirtualTime

SECRET = b"islands-simulation-secret-000000"
ADDRESS = ("sim", 1)
SYNCER_PID = 1


HEADER_CACHE = 4096
_HEADERS: dict[bytes, dict] = {}   # a header's bytes -> what JSON reads of them


def to_frame(message: wire.Message) -> wire.Frame:
    """What the other end reads of a message: its header and payload, through JSON as on
    the wire (tuples become lists, keys strings). The wire's framing, MAC, CRC and its
    guards against hostile headers (depth, number sizes: parse_header) are tested on their
    own; the simulated network carries whole frames from our own code, so it reads them
    with the plain parser, at C speed. Most headers recur (a heartbeat, its answer at one
    version): each distinct one is parsed once per process, and every frame gets its own copy."""
    header = _HEADERS.get(message.head)
    if header is None:
        if len(_HEADERS) >= HEADER_CACHE:
            _HEADERS.clear()
        header = _HEADERS[message.head] = json.loads(message.head)
    return wire.Frame(message.type, as_read(header), message.payload)


@lru_cache(maxsize=1 << 16)
def _text(path: PurePosixPath) -> str:
    return str(path)


@lru_cache(maxsize=1 << 16)
def _parent_text(path: PurePosixPath) -> str:
    """A name's directory as text: equal texts, equal posix paths."""
    return str(_parent(path))


class HostDisk(SimDisk):
    """The SimDisk, with `mkdir` of a directory that exists answered at once: the syncer asks
    it of its state directories before every write, and SimDisk walks every ancestor of the
    path first. Every ancestor of a directory it holds is there too (mkdir makes the missing
    ones, a power loss keeps the reachable ones), so there is nothing to make: the same disk,
    the same ops count."""

    def mkdir(self, path: Path) -> None:
        if _key(path) in self._dirs:
            return
        super().mkdir(path)

    def fsync_dir(self, path: Path) -> None:
        """SimDisk.fsync_dir, the same steps in the same order, with each name's directory
        compared as text: pathlib compares paths in Python, and a simulated run asks this
        of every name on the disk tens of thousands of times."""
        key = _key(path)
        text = str(key)
        with self.lock:
            self._tick("fsync_dir", path)
            self._need_dir(key)
            changed = False
            names, durable_names = self._names, self._durable_names
            for name in [n for n in durable_names if _parent_text(n) == text]:
                if names.get(name) != durable_names[name]:
                    del durable_names[name]
                    changed = True
            for name, ino in names.items():
                if _parent_text(name) == text and durable_names.get(name) != ino:
                    durable_names[name] = ino
                    changed = True
            dirs, durable_dirs = self._dirs, self._durable_dirs
            for d in list(durable_dirs):
                if _parent_text(d) == text and _text(d) != text and d not in dirs:
                    durable_dirs.discard(d)
                    changed = True
            for d in dirs:
                if _parent_text(d) == text and _text(d) != text and d not in durable_dirs:
                    durable_dirs.add(d)
                    changed = True
            if changed:
                self._durable_changed()

    def crash(self, rng: random.Random | None = None) -> "HostDisk":
        disk = super().crash(rng)
        disk.__class__ = HostDisk  # SimDisk.from_image made the base class: the same fields
        return disk


class SyncerHost(Stoppable):
    def __init__(self, time: VirtualTime, cfg: SyncerConfig, train: TrainConfig, run_dir: Path,
                 memory: MemoryEvents | None = None) -> None:
        super().__init__()
        self.time = time
        self.cfg = cfg
        self.train = train
        self.run_dir = run_dir
        self.memory = memory  # the events kept in memory instead of under run_dir
        self.disk: SimDisk = HostDisk(roots=(str(Path(cfg.state_dir).parent),), record=False)
        self.syncer: Syncer | None = None
        self.incarnation = 0

    @property
    def up(self) -> bool:
        return self.syncer is not None

    def start(self) -> None:
        self.incarnation += 1
        events = EventLog(self.run_dir, "syncer", monotonic=self.time.monotonic, wall_clock=self.time.wall,
                          pid=SYNCER_PID + self.incarnation, buffering=-1, memory=self.memory)
        self.syncer = Syncer(self.cfg, self.train, SECRET, str(self.run_dir), storage=self.disk,
                             monotonic=self.time.monotonic, events=events, stamp=lambda: {"boot_id": "", "boottime": 0})
        self.syncer.start_stepped(ADDRESS)

    def kill(self, power_loss: bool = False) -> None:
        """SIGKILL (or a power loss: the disk keeps only what was synced)."""
        if self.syncer is not None:
            self.syncer.events.close()
            self.syncer = None
        self.forget_held()
        if power_loss:
            self.disk = self.disk.crash()

    def stop(self) -> None:
        if self.syncer is not None:
            self.syncer.stop("end of the simulated run")
            self.syncer = None

    def running(self) -> bool:
        return self.syncer is not None

    def run(self, action: Callable[[], None]) -> None:
        """Run `action` on the syncer now, or when it is resumed."""
        self.when_running(action)

    def tick(self) -> float | None:
        """Tick the syncer now; when it asks to be ticked next (None: not until an input)."""
        if self.syncer is not None and not self.paused:
            return self.syncer.tick(self.time.now)
        return None
