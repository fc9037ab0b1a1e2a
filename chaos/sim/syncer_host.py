"""The real syncer, driven from the simulator's one thread.

It is trainer.syncer.Syncer as the live process runs it, with the simulator's clock, event
log, boot stamp and disk handed in, started with no socket or thread: frames arrive through
`Syncer.handle`, closed connections through `connection_closed`, time through `tick`. A
kill drops the object (what it wrote stays on the SimDisk, as the page cache keeps it), a
power loss keeps only what was synced, a restart recovers from what is there."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

from trainer import wire
from trainer.config import SyncerConfig, TrainConfig
from trainer.events import EventLog, MemoryEvents, as_read
from trainer.simdisk import SimDisk
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


class SyncerHost(Stoppable):
    def __init__(self, time: VirtualTime, cfg: SyncerConfig, train: TrainConfig, run_dir: Path,
                 memory: MemoryEvents | None = None) -> None:
        super().__init__()
        self.time = time
        self.cfg = cfg
        self.train = train
        self.run_dir = run_dir
        self.memory = memory  # the events kept in memory instead of under run_dir
        self.disk: SimDisk = SimDisk(roots=(str(Path(cfg.state_dir).parent),), record=False)
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
