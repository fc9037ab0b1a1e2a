"""A schedule run end to end in the simulator, into a run directory the checkers read.

The world owns the virtual time, the links, the syncer host and the learners; it applies
each fault at its planned instant and records it in history.jsonl as the controller does
(in force exactly as planned: simulated time has no slow engine), heals whatever is still
in force at the end, lets the learners stop cleanly, and stops the syncer, whose final
state and evaluation are the last events. Everything is seeded: one seed, one run."""
from __future__ import annotations

import json
import random
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from faults import Schedule
from trainer import defects, wire
from trainer.config import SyncerConfig, TrainConfig
from trainer.events import MemoryEvents, read_events
from trainer.protocol import ProtocolError
from trainer.task import load_task

from ..controller import HISTORY_FILE, History, MemoryHistory, describe_fault, read_history
from .learner import Request, SimLearner
from .loop import EPOCH_MONOTONIC, VirtualTime
from .network import DOWN, UP, Link
from .syncer_host import SyncerHost, to_frame
from .task import BATCH, SPEC, LinearTask

SUPPORTED = ("kill", "pause", "partition", "latency", "power_loss")
PARTITION_MODES = ("blackhole", "refuse")
WARMUP = 1.0            # s from the start until t0: every learner has joined and stepped
SETTLE = 15.0           # after a final heal that undid something (chaos/controller.py)
TAIL = 20.0             # the default duration past the schedule's horizon (chaos/runner.py)
MAX_ACTIONS_PER_SECOND = 200_000


@dataclass(frozen=True)
class SimSettings:
    learners: int = 2
    sync_every: int = 10
    fragments: int = 1
    step_time: float = 0.1
    duration: float | None = None   # default: the schedule's horizon + TAIL


def unsupported(schedule: Schedule) -> list[str]:
    """What the simulator cannot model, by name (a run is refused rather than half-simulated)."""
    problems = []
    for i, f in enumerate(schedule.faults):
        if f.kind not in SUPPORTED:
            problems.append(f"faults[{i}]: kind {f.kind!r} is not simulated (simulated: {', '.join(SUPPORTED)})")
        elif f.kind == "partition" and f.mode not in PARTITION_MODES:
            problems.append(f"faults[{i}].mode: {f.mode!r} is not simulated (simulated: {', '.join(PARTITION_MODES)})")
        elif "/rank-" in getattr(f, "target", ""):
            problems.append(f"faults[{i}].target: ranks are not simulated")
    return problems


class World:
    def __init__(self, schedule: Schedule, run_dir: Path, settings: SimSettings = SimSettings(),
                 memory: bool = False) -> None:
        """`memory`: keep the events and history in memory (`events()`, `history_entries()`)
        and write nothing under `run_dir`, for a search that judges a run and drops it."""
        problems = unsupported(schedule)
        if problems:
            raise ValueError("the simulator: " + "; ".join(problems))
        schedule.validate(settings.learners)
        self.schedule = schedule
        self.settings = settings
        self.seed = schedule.seed
        self.run_dir = run_dir
        self.duration = settings.duration if settings.duration is not None else schedule.horizon + TAIL
        if self.duration < schedule.horizon:
            raise ValueError(f"duration: {self.duration:g} s ends before the schedule's last fault, at "
                             f"{schedule.horizon:g} s")
        self.step_time = settings.step_time
        self.time = VirtualTime()
        self.rng = random.Random(self.seed)
        self.train = TrainConfig(task=SPEC, num_learners=settings.learners, sync_every=settings.sync_every,
                                 fragments=settings.fragments, seed=self.seed, batch_size=16,
                                 heartbeat_interval=0.2, heartbeat_timeout=1.0, request_timeout=5.0)
        self.learner_defect = defects.learner_active()  # $ISLANDS_LEARNER_DEFECT, as live learners read it
        self.task = load_task(SPEC)      # checked, as the syncer loads it
        self.trainer = LinearTask()      # the learners' closed-form steps
        self.task_tokens = BATCH
        self.memory = MemoryEvents() if memory else None
        if not memory:
            run_dir.mkdir(parents=True, exist_ok=True)
        self.syncer = SyncerHost(self.time, SyncerConfig(host="127.0.0.1", port=0, state_dir=str(run_dir / "state"),
                                                         eval_data="held-out", eval_budget=1.0),
                                 self.train, run_dir, self.memory)
        self.links = {n: Link(n, random.Random(self.rng.random())) for n in range(1, settings.learners + 1)}
        self.lives = {n: 0 for n in self.links}
        self.learners: dict[int, SimLearner] = {}
        self.down: set[str] = set()
        self.open: dict[int, int] = {}           # connection -> learner
        self.polls: list[tuple] = []             # long polls held: (learner, request, frame, known, deadline)
        self.speakers: dict[int, int | None] = {}  # connection -> the learner the syncer knows it speaks for
        self._conns = 0
        self._next_tick: float | None = None   # the syncer's earliest timer set
        self.t0 = EPOCH_MONOTONIC + WARMUP     # when faults may start (begin() runs up to it)
        self._injected = 0                     # faults inject() applied, for their history index
        self.history: History | MemoryHistory = (
            MemoryHistory(self.time.monotonic, self.time.wall) if memory
            else History(run_dir / HISTORY_FILE, self.time.monotonic, self.time.wall))

    def events(self) -> list[dict]:
        """The run's events as read_events() would read them from its directory."""
        return self.memory.events() if self.memory is not None else read_events(self.run_dir)

    def history_entries(self) -> list[dict]:
        """The run's history as read_history() would read it from its directory."""
        if isinstance(self.history, MemoryHistory):
            return self.history.entries
        return read_history(self.run_dir / HISTORY_FILE)

    # ------------------------------------------------------------ running
    def run(self) -> None:
        """The schedule, end to end: begin, every fault at its planned instant, finish."""
        t0 = self.begin()
        self.history.record(event="begin", seed=self.seed, faults=len(self.schedule.faults), duration=self.duration,
                            tolerance=0.001)
        for index, fault in enumerate(self.schedule.faults):
            self._plan(index, fault, t0)
        self._run_until(t0 + self.duration)
        self.finish()

    def begin(self) -> float:
        """Start the syncer and the learners and run the warm-up; t0, when faults may start."""
        torch.set_num_threads(1)
        if self.memory is None:
            self.schedule.dump(self.run_dir / "schedule.yaml")
            (self.run_dir / "run.json").write_text(json.dumps({
                "backend": "sim", "learners": self.settings.learners, "mode": "decoupled", "task": SPEC,
                "seed": self.seed, "duration": self.duration, "sync_every": self.settings.sync_every,
                "fragments": self.settings.fragments, "step_time": self.step_time}, indent=2))
        self.history.record(event="cluster_start", backend="sim", learners=self.settings.learners)
        self.syncer.start()
        for n in self.links:
            self._start_learner(n)
        self._tick()
        self.t0 = EPOCH_MONOTONIC + WARMUP
        self._run_until(self.t0)
        self.history.record(event="heal", reason="start", did=[], ok=True)
        return self.t0

    def inject(self, fault) -> None:
        """Apply `fault` now (its `at` is ignored) and heal it `duration` later: one step of a
        stateful test, which then moves time on with advance()."""
        at = round(self.time.now - self.t0, 4)
        self._plan(self._injected, replace(fault, at=at), self.t0)
        self._injected += 1

    def advance(self, seconds: float) -> None:
        self._run_until(self.time.now + seconds)

    def finish(self) -> None:
        """Heal what is still in force, let the learners stop cleanly, stop the syncer."""
        healed = self._heal_all()
        self.history.record(event="heal", reason="end", did=healed, ok=True)
        if healed:
            self._run_until(self.time.now + SETTLE)
        self.history.record(event="end", errors=[])
        for learner in list(self.learners.values()):
            learner.finish()
        self._run_until(self.time.now + 6.0)
        self.syncer.stop()
        self.history.close()

    def _plan(self, index: int, fault, t0: float) -> None:
        self.time.at(t0 + fault.at, lambda: self._fault("start", index, fault, t0))
        if getattr(fault, "restart", True) is not False:
            self.time.at(t0 + fault.at + fault.duration, lambda: self._fault("stop", index, fault, t0))

    def _run_until(self, end: float) -> None:
        """Time moves on to `end`; the action count is bounded by the simulated time (a livelock
        is an error, not a hang)."""
        self.time.run_until(end, int(MAX_ACTIONS_PER_SECOND * (end - EPOCH_MONOTONIC + SETTLE + 30)))

    def _tick(self) -> None:
        """The syncer's timers: tick it now (after an input, or when it asked), answer the
        polls its merges satisfied, and set the timer it asks for. A timer superseded by an
        earlier one still fires: a tick with nothing due changes nothing."""
        due = self.syncer.tick()
        self._answer_polls()
        if due is not None and (self._next_tick is None or due < self._next_tick or self._next_tick < self.time.now):
            self._next_tick = due
            self.time.at(due, self._timer)

    def _timer(self) -> None:
        if self._next_tick is not None and self._next_tick <= self.time.now:
            self._next_tick = None
        self._tick()

    def _start_learner(self, n: int) -> None:
        self.lives[n] += 1
        learner = SimLearner(self, n, self.lives[n])
        self.learners[n] = learner
        learner.start()

    # ------------------------------------------------------------- faults
    def _fault(self, action: str, index: int, fault, t0: float) -> None:
        did = (self._start_fault if action == "start" else self._stop_fault)(fault)
        self.history.record(event=action, index=index, kind=fault.kind, fault=describe_fault(fault),
                            planned=fault.at if action == "start" else fault.at + fault.duration,
                            at=round(self.time.now - t0, 4), took=0.0, did=did, ok=True, error=None)

    def _start_fault(self, fault) -> str:
        kind = fault.kind
        if kind in ("kill", "power_loss"):
            self._kill(fault.target, power_loss=kind == "power_loss")
            return f"{'power loss of' if kind == 'power_loss' else 'SIGKILL'} {fault.target}"
        if kind == "pause":
            self._process(fault.target).pause()
            return f"SIGSTOP {fault.target}"
        if kind == "partition":
            for target in fault.targets:
                self.links[_learner(target)].cut(fault.mode, fault.direction, +1)
                if fault.mode == "refuse":
                    self._reset(_learner(target), "connection refused (proxy disabled)")
            return f"{fault.mode} {', '.join(fault.targets)} ({fault.direction})"
        self.links[_learner(fault.target)].slow(fault.latency_ms, fault.jitter_ms, fault.direction, on=True)
        return f"latency {fault.latency_ms:g} ms on {fault.target}"

    def _stop_fault(self, fault) -> str:
        kind = fault.kind
        if kind in ("kill", "power_loss"):
            self._restart(fault.target)
            return f"restarted {fault.target}"
        if kind == "pause":
            self._process(fault.target).resume()
            self._tick()  # a resumed syncer's timers passed while it was stopped
            return f"SIGCONT {fault.target}"
        if kind == "partition":
            for target in fault.targets:
                self.links[_learner(target)].cut(fault.mode, fault.direction, -1)
            return f"healed {', '.join(fault.targets)}"
        self.links[_learner(fault.target)].slow(fault.latency_ms, fault.jitter_ms, fault.direction, on=False)
        return f"removed latency on {fault.target}"

    def _heal_all(self) -> list[str]:
        """The final heal: every link clean, every paused process running, every process up."""
        did = []
        for link in self.links.values():
            if link.heal():
                did.append(f"healed learner-{link.learner}")
        if self.syncer.paused:
            self.syncer.resume()
            self._tick()
            did.append("SIGCONT syncer")
        for learner in self.learners.values():
            if learner.paused:
                learner.resume()
                did.append(f"SIGCONT learner-{learner.n}")
        for target in sorted(self.down):
            self._restart(target)
            did.append(f"restarted {target}")
        return did

    def _process(self, target: str):
        return self.syncer if target == "syncer" else self.learners[_learner(target)]

    def _kill(self, target: str, power_loss: bool = False) -> None:
        self.down.add(target)
        if target == "syncer":
            self.syncer.kill(power_loss)
            for n in sorted(set(self.open.values())):
                self._reset(n, "connection reset (syncer killed)")
            self.open.clear()
            self.speakers.clear()
        else:
            self.learners[_learner(target)].kill()

    def _restart(self, target: str) -> None:
        if target not in self.down:
            return
        self.down.discard(target)
        if target == "syncer":
            self.syncer.start()
            self._tick()
        else:
            self._start_learner(_learner(target))

    def _reset(self, n: int, why: str) -> None:
        """The learner's connection is reset: it hears so at once (an RST)."""
        learner = self.learners.get(n)
        if learner is not None and learner.conn is not None:
            request = learner.in_flight
            conn = learner.conn
            self.open.pop(conn, None)
            if request is not None:
                learner.reply(request, None, why)
            elif learner.alive:
                learner._failed(why)

    # ------------------------------------------------------------ network
    def new_connection(self) -> int:
        self._conns += 1
        return self._conns

    def send_up(self, learner: SimLearner, request: Request, message: wire.Message) -> None:
        link = self.links[learner.n]
        if link.refusing or not self.syncer.up:
            self.time.after(2 * link.delay(UP), lambda: learner.reply(request, None, "connection refused"))
            return
        if request.kind == "hello":
            self.open[request.conn] = learner.n
        if not link.carries(UP):
            return  # held by a blackhole: the request's deadline will pass
        self.time.after(link.delay(UP), lambda: self._arrive(learner, request, message))

    def _arrive(self, learner: SimLearner, request: Request, message: wire.Message) -> None:
        if request.conn not in self.open:
            return  # the connection is gone (reset, killed, superseded)
        if not self.syncer.up:
            self._down(learner, request, None, "connection reset")
            return
        self.syncer.run(lambda: self._serve(learner, request, message))

    def _serve(self, learner: SimLearner, request: Request, message: wire.Message) -> None:
        if request.conn not in self.open or self.syncer.syncer is None:
            return
        frame = to_frame(message)
        if frame.type == wire.HEARTBEAT and "wait_ms" in frame.header:
            self._long_poll(learner, request, frame)
            return
        self._serve_frame(learner, request, frame)

    def _serve_frame(self, learner: SimLearner, request: Request, frame: wire.Frame) -> None:
        syncer = self.syncer.syncer
        changes = syncer.core.changes
        reply, speaker, closes = syncer.handle(frame, request.conn, self.speakers.get(request.conn),
                                               peer=("sim", learner.n))
        self.speakers[request.conn] = speaker
        if closes is not None:
            self.open.pop(request.conn, None)
            syncer.connection_closed(request.conn, speaker, closes)
        if closes is not None or syncer.core.changes != changes:
            # An input that changed what a decision reads (the core says: pending pushes, who
            # is alive): the live merge loop wakes at once on a push, within 50 ms else.
            self._tick()
        self._down(learner, request, to_frame(reply) if reply is not None else None, closes)

    def _long_poll(self, learner: SimLearner, request: Request, frame: wire.Frame) -> None:
        """A heartbeat that waits until a version passes the ones it knows, or `wait_ms`: the
        live syncer's handler waits on its condition; here the world holds the request and
        the handler answers it, as a plain heartbeat, when it is due (one thread cannot wait)."""
        try:
            poll = self.syncer.syncer.core.poll(frame.header)
        except ProtocolError:  # refused as the live handler refuses it
            self._serve_frame(learner, request, frame)
            return
        known, deadline = poll.known, self.time.now + poll.wait_ms / 1000
        plain = wire.Frame(frame.type, {k: v for k, v in frame.header.items() if k not in ("wait_ms", "versions")},
                           frame.payload)
        held = (learner, request, plain, known, deadline)
        self.polls.append(held)
        self.time.at(deadline, lambda: self._answer_polls(timed_out=held))
        self._answer_polls()

    def _answer_polls(self, timed_out: tuple | None = None) -> None:
        """Answer every held poll whose versions were passed (or whose time is up)."""
        if not self.polls or self.syncer.syncer is None or self.syncer.paused:
            return
        core = self.syncer.syncer.core
        due = [p for p in self.polls if p is timed_out or p[4] <= self.time.now or core.passed(p[3])]
        for poll in due:
            if poll not in self.polls:
                continue  # answered already, by a tick that an answer before it caused
            self.polls.remove(poll)
            learner, request, plain, _, _ = poll
            if request.conn in self.open:
                self._serve_frame(learner, request, plain)

    def _down(self, learner: SimLearner, request: Request, frame: wire.Frame | None, closes: str | None) -> None:
        link = self.links[learner.n]
        if not link.carries(DOWN) and not link.refusing:
            return  # the reply vanishes: the request's deadline will pass
        self.time.after(link.delay(DOWN), lambda: learner.reply(request, frame, closes))

    def closed_by_learner(self, n: int, conn: int, why: str) -> None:
        """The learner closed `conn` (a deadline passed, it stopped or was killed): the
        syncer sees the connection end."""
        if self.open.pop(conn, None) is None:
            return
        speaker = self.speakers.pop(conn, None)
        if self.syncer.syncer is not None:
            self.syncer.run(lambda: self._closed(conn, speaker, why))

    def _closed(self, conn: int, speaker: int | None, why: str) -> None:
        if self.syncer.syncer is not None:
            self.syncer.syncer.connection_closed(conn, speaker, why)
            self._tick()


def _learner(target: str) -> int:
    return int(target.split("-")[1].split("/")[0])


def simulate(schedule: Schedule, run_dir: Path, settings: SimSettings = SimSettings(), memory: bool = False) -> World:
    """Run `schedule`; with `memory`, nothing is written (World.events() has the events)."""
    world = World(schedule, run_dir, settings, memory)
    world.run()
    return world


def event_digest(run_dir: Path) -> str:
    """SHA-256 of the run's event logs, file by file, with the run directory's own path
    taken out (it appears in the syncer's configuration): one seed, one digest."""
    import hashlib

    h = hashlib.sha256()
    for path in sorted((run_dir / "events").glob("*.jsonl")):
        h.update(path.name.encode())
        h.update(path.read_bytes().replace(str(run_dir).encode(), b"<run>"))
    return h.hexdigest()


def first_difference(a: Path, b: Path) -> str | None:
    """Where two runs' event logs part: the file and line, both versions; None if identical."""
    names = sorted({p.name for p in (a / "events").glob("*.jsonl")} | {p.name for p in (b / "events").glob("*.jsonl")})
    for name in names:
        left = (a / "events" / name).read_text().replace(str(a), "<run>").splitlines() \
            if (a / "events" / name).exists() else []
        right = (b / "events" / name).read_text().replace(str(b), "<run>").splitlines() \
            if (b / "events" / name).exists() else []
        for i, (x, y) in enumerate(zip(left, right)):
            if x != y:
                return f"{name} line {i + 1}:\n  {x[:300]}\n  {y[:300]}"
        if len(left) != len(right):
            return f"{name}: {len(left)} lines against {len(right)}"
    return None
