"""A stand-in learner: the real learner's protocol on a model that costs microseconds.

What it shares with trainer/learner.py is what decides: the versions protocol
(trainer.adoption.VersionBook: what to pull, what to adopt, when a push may go, following
a syncer that went back), the push queue (trainer.pushes.PushQueue: coalescing, claiming),
the push protocol (trainer.push_protocol: a push's message, its answer, the refusal
rules, backoff and the long poll's length) and the staggered fragment clock. What it does
not share is the I/O: one request in flight on one connection of the simulated network, a
deadline per request, reconnection with backoff and jitter from the run's seeded PRNG.
Its inner step is a real SGD step on the stand-in task (task.py)."""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import torch

from trainer import wire
from trainer.adoption import VersionBook
from trainer.codec import decode
from trainer.events import EventLog
from trainer.fragments import FragmentClock, fragment_distance, fragment_norm
from trainer.protocol import FrameType
from trainer.push_protocol import PushProtocol, Refused, backoff, poll_ms
from trainer.pushes import OutgoingPush, PushQueue

from .loop import Stoppable

if TYPE_CHECKING:
    from .world import World

LR = 0.05
DRAIN_TIMEOUT = 5.0


@dataclass
class Request:
    ident: int
    kind: str
    conn: int
    on_reply: Callable[[wire.Frame], None]


class SimLearner(Stoppable):
    """One incarnation of learner `n`: a kill ends it, a restart makes the next."""

    def __init__(self, world: "World", n: int, life: int) -> None:
        super().__init__()
        self.world = world
        self.n = n
        self.time = world.time
        self.cfg = world.train
        self.rng = random.Random(world.seed * 7_919 + n * 104_729 + life)
        self.events = EventLog(world.run_dir, f"learner-{n}", learner=n, monotonic=self.time.monotonic,
                               wall_clock=self.time.wall, pid=100 * n + life, buffering=-1,
                               memory=world.memory)
        self.nonce = f"{n:04x}{life:08x}{world.seed & 0xffffffff:08x}"
        self.step_time = world.step_time * (1.0 + 0.1 * self.rng.random())
        self.alive, self.finishing, self.finished = True, False, False
        self.incarnation: int | None = None
        self.book: VersionBook | None = None
        self.pushes: PushProtocol | None = None
        self.queue = PushQueue(self.cfg.max_unsent_pushes)
        self.conn: int | None = None
        self.connecting = False
        self.in_flight: Request | None = None
        self.requests = 0
        self.connections = 0
        self.failures_in_a_row = 0
        self.last_sent = 0.0
        self.step = 0
        self.seq = 0
        self.model: torch.nn.Module | None = None
        self._pump_due: float | None = None

    # ------------------------------------------------------------------ life
    def start(self) -> None:
        self.events.emit("process_start", role="learner", mode=self.cfg.mode, defect=self.world.learner_defect,
                         push_window=self.cfg.push_window, simulated=True)
        self._connect()

    def kill(self) -> None:
        self.alive = False
        self._close("killed", tell_syncer=True)
        self.events.close()

    def running(self) -> bool:
        return self.alive

    def resume(self) -> None:
        super().resume()
        if self.model is not None and not self.finishing:
            self.time.after(0.0, self._step)
        self._pump()

    # ----------------------------------------------------------- training
    def _setup(self, welcome: wire.Frame) -> None:
        h = welcome.header
        task = self.world.task
        self.model = task.model(self.cfg.seed)
        tensors = welcome.tensors()
        if tensors:
            with torch.no_grad():
                for name, p in self.model.named_parameters():
                    p.copy_(tensors[name])
        self.params = dict(self.model.named_parameters())
        self.views = self.world.trainer.views(self.params)  # every change to params is in place
        self.fragment_names = [list(names) for names in h["fragments"]]
        self.book = VersionBook.starting_at(list(h["versions"]))
        self.pushes = PushProtocol(self.n, self.incarnation, self.book, self.queue, self.events, "fp32",
                                   self.time.monotonic, self.rng, defect=self.world.learner_defect)
        self.position = int(h["position"])
        # The raw task's numpy batches, for its closed-form steps (the syncer scores Θ through the checked task).
        self.batches = self.world.trainer.batches(self.n - 1, self.cfg.num_learners, self.cfg.seed,
                                                  start=self.position)
        self.refs = {f: {n: self.params[n].detach().clone() for n in names}
                     for f, names in enumerate(self.fragment_names)}
        self.globals = {f: {n: t.clone() for n, t in ref.items()} for f, ref in self.refs.items()}
        self.tokens_since = [0] * len(self.fragment_names)
        self.steps_since = [0] * len(self.fragment_names)
        self.last_push_step = [0] * len(self.fragment_names)
        self.clock = FragmentClock(self.cfg.sync_every, self.cfg.fragments)
        self.time.after(self.step_time, self._step)

    def _step(self) -> None:
        if not self.alive or self.finishing:
            return
        if self.paused:
            return  # resume() steps again
        for f in list(self.book.pulled):
            if self.step >= self.last_push_step[f] + self.cfg.overlap:
                self._adopt(f)
        batch = next(self.batches)
        loss = self.world.trainer.sgd_step_views(*self.views, batch, LR)
        tokens = self.world.task_tokens
        self.step += 1
        self.position += 1
        for f in range(len(self.fragment_names)):
            self.tokens_since[f] += tokens
            self.steps_since[f] += 1
        self.events.emit("inner_step", step=self.step, loss=loss, tokens=tokens,
                         compute_s=round(self.step_time, 5), incarnation=self.incarnation, position=self.position)
        for f in self.clock.due(self.step):
            if self.book.may_push(f, self.cfg.push_window) or self.world.learner_defect == "ignore_push_window":
                self._push(f)
        self._pump()
        self.time.after(self.step_time, self._step)

    def _push(self, f: int, residual: bool = False, final: bool = False) -> None:
        self.seq += 1
        with torch.no_grad():
            delta = {n: self.refs[f][n] - self.params[n].detach() for n in self.fragment_names[f]}
            self.refs[f] = {n: self.params[n].detach().clone() for n in self.fragment_names[f]}
        self.queue.put(OutgoingPush(f, self.seq, self.book.push_base(f), self.tokens_since[f], self.steps_since[f],
                                    self.position, delta, created_step=self.step, residual=residual, final=final))
        self.tokens_since[f] = self.steps_since[f] = 0
        self.last_push_step[f] = self.step
        self.clock.synced(f, self.step)

    def _adopt(self, f: int) -> None:
        adoption = self.book.take(f)
        if adoption is None:
            return
        version, tensors, rollback_from = adoption
        names = self.fragment_names[f]
        norm = fragment_norm(tensors, names)
        expected = fragment_distance(self.params, self.refs[f], names)
        with torch.no_grad():  # rebase: θ ← Θ + (θ − ref)
            for name in names if self.world.learner_defect != "never_adopt" else ():
                self.params[name].add_(tensors[name] - self.refs[f][name])
            self.refs[f] = {n: tensors[n].detach().clone() for n in names}
        self.book.adopt(f, version)
        self.globals[f] = tensors
        self.clock.synced(f, self.step)
        self.events.emit("apply", fragment=f, version=version, alpha=0.0, adopt="rebase", incarnation=self.incarnation,
                         discarded_tokens=0, **({"rollback_from": rollback_from} if rollback_from is not None else {}),
                         drift_after=round(fragment_distance(self.params, tensors, names) / norm, 7) if norm else 0.0,
                         expected_drift=round(expected / norm, 7) if norm else 0.0)

    # ------------------------------------------------------------- the end
    def finish(self) -> None:
        """A clean stop: the residual progress pushed as the final round, the queue drained
        for at most DRAIN_TIMEOUT s, then the final parameters reported."""
        if not self.alive or self.model is None:
            self.finished = True
            return
        self.finishing = True
        for f in range(len(self.fragment_names)):
            if self.steps_since[f]:
                self._push(f, residual=True, final=self.cfg.final_round)
        self.time.after(DRAIN_TIMEOUT, self._stop)
        self._pump()

    def _stop(self) -> None:
        if self.finished or not self.alive:
            return
        self.finished = True
        rows = []
        for f, names in enumerate(self.fragment_names):
            diff = fragment_distance(self.params, self.globals[f], names)
            norm = fragment_norm(self.globals[f], names)
            rows.append({"fragment": f, "version": self.book.adopted[f], "drift": diff / norm if norm > 0 else diff,
                         "diff": diff, "norm": norm})
        self.events.emit("final_params", fragments=rows, incarnation=self.incarnation)
        if self.conn is not None:
            self._close("bye", tell_syncer=True)
        self.events.emit("process_stop", role="learner", steps=self.step, drained=len(self.queue) == 0,
                         unsent=len(self.queue), incarnation=self.incarnation)
        self.events.close()

    # ------------------------------------------------------------ network
    def _connect(self) -> None:
        if not self.alive or self.conn is not None or self.connecting:
            return
        self.connecting = True
        self.conn = self.world.new_connection()
        header = {"learner": self.n, "nonce": self.nonce, "mode": self.cfg.mode,
                  "want_params": self.model is None}
        self._send("hello", wire.message(FrameType.HELLO, header), self._welcomed)

    def _welcomed(self, welcome: wire.Frame) -> None:
        self.connecting = False
        if welcome.type != FrameType.WELCOME:
            self._failed(f"expected WELCOME, got {welcome.type}")
            return
        self.failures_in_a_row = 0
        self.connections += 1
        if self.incarnation is None:  # the learner's own, for life (trainer/learner.py)
            self.incarnation = int(welcome.header["incarnation"])
        self.events.emit("connect", address="sim", incarnation=self.incarnation, connections=self.connections,
                         wire_bytes=welcome.wire_bytes)
        if self.model is None:
            self._setup(welcome)
        else:
            self._note_versions(welcome.header.get("versions"))
        self._pump()

    def _failed(self, why: str) -> None:
        """A connection attempt or a request failed: close, back off, try again."""
        self.connecting = False
        self._close(why, tell_syncer=True)
        self.failures_in_a_row += 1
        self.time.after(self._backoff(), lambda: self.when_running(self._connect))

    def _backoff(self) -> float:
        """The live learner's wait after `failures_in_a_row` failures, on the run's PRNG."""
        return backoff(self.failures_in_a_row, self.rng)

    def _close(self, why: str, tell_syncer: bool) -> None:
        conn, self.conn, self.in_flight = self.conn, None, None
        if conn is None:
            return
        self.events.emit("disconnect", error=why)
        if tell_syncer:
            self.world.closed_by_learner(self.n, conn, why)

    def _pump(self) -> None:
        """Send the next request if none is out: the head push, a pull, or a heartbeat."""
        if not self.alive or self.paused or self.in_flight is not None or self.pushes is None:
            return
        if self.conn is None or self.connecting:
            if self.conn is None and not self.connecting:
                self._connect()
            return
        item = self.queue.peek()
        if item is not None and not self.pushes.deferred(self.time.now):
            self._send_push(item)
            return
        wanted = self.book.pulls_wanted()
        if wanted:
            self._send_pull(wanted[0])
            return
        if self.finishing and len(self.queue) == 0:
            self._stop()
            return
        due = self.last_sent + self.cfg.heartbeat_interval
        known = self.book.awaited()
        if known is not None or self.time.now >= due:
            # Awaiting a merge: a long poll, answered once a version passes the ones known
            # (the live learner's; the world holds it, chaos/sim/world.py).
            poll = {"wait_ms": self._poll_ms(), "versions": known} if known else {}
            self._send("heartbeat", wire.message(wire.HEARTBEAT, poll), lambda r: self._note_versions(
                r.header.get("versions"), r.header.get("waiting")))
        else:
            retry_at = self.pushes.retry_at
            self._pump_at(min(due, retry_at) if retry_at > self.time.now else due)

    def _pump_at(self, when: float) -> None:
        """One pump timer pending at a time, the earliest wanted (a step asks every time)."""
        if self._pump_due is not None and self.time.now <= self._pump_due <= when:
            return
        self._pump_due = when
        self.time.at(when, self._pump_timer)

    def _pump_timer(self) -> None:
        if self._pump_due is not None and self._pump_due <= self.time.now:
            self._pump_due = None
        self.when_running(self._pump)

    def _poll_ms(self) -> int:
        cfg = self.cfg
        return poll_ms(cfg.heartbeat_interval, cfg.request_timeout, cfg.sync_every, cfg.fragments, self.step_time)

    def _send(self, kind: str, message: wire.Message, on_reply: Callable[[wire.Frame], None]) -> None:
        self.requests += 1
        request = Request(self.requests, kind, self.conn, on_reply)
        self.in_flight = request
        self.last_sent = self.time.now
        self.time.after(self.cfg.request_timeout, lambda: self._timed_out(request))
        self.world.send_up(self, request, message)

    def _timed_out(self, request: Request) -> None:
        if self.in_flight is request and self.alive:
            if self.paused:  # a stopped process's deadline passes when it runs again
                self.when_running(lambda: self._timed_out(request))
                return
            self._failed(f"{request.kind}: no reply within {self.cfg.request_timeout:g} s")

    def reply(self, request: Request, frame: wire.Frame | None, closes: str | None) -> None:
        """The answer to `request` reached this learner (None: the connection was reset)."""
        self.when_running(lambda: self._on_reply(request, frame, closes))

    def _on_reply(self, request: Request, frame: wire.Frame | None, closes: str | None) -> None:
        if self.in_flight is not request:
            return  # timed out, or the connection is gone
        self.in_flight = None
        if frame is None:
            self._failed(f"{request.kind}: {closes or 'connection reset'}")
            return
        if frame.type == FrameType.ERROR and request.kind == "hello":
            self._failed(f"hello refused: {frame.header.get('reason')}")
            return
        if frame.type == FrameType.ERROR:
            self._refused(request, frame)
            if not self.alive:
                return
        else:
            request.on_reply(frame)
        if closes is not None and self.conn == request.conn:
            self._failed(closes)
            return
        self._pump()

    def _refused(self, request: Request, frame: wire.Frame) -> None:
        assert self.pushes is not None
        reason = str(frame.header.get("reason"))
        outcome = self.pushes.refused(reason, str(frame.header.get("detail", "")), about_push=request.kind == "push")
        if outcome is Refused.FATAL:
            self.events.emit("process_stop", role="learner", reason=f"refused: {reason}", incarnation=self.incarnation)
            self.alive = False

    def _send_push(self, item: OutgoingPush) -> None:
        assert self.pushes is not None
        pushes = self.pushes
        pushes.sent(item)
        started = self.time.now

        def answered(reply: wire.Frame) -> None:
            self.failures_in_a_row = 0
            pushes.answered(item, reply, self.time.now - started)

        self._send("push", pushes.message(item, self.world.task_tokens), answered)

    def _send_pull(self, f: int) -> None:
        def pulled(reply: wire.Frame) -> None:
            version = int(reply.header["version"])
            shapes = {n: self.params[n].shape for n in self.fragment_names[f]}
            tensors = decode(reply.tensors(), str(reply.header.get("encoding", "fp32")), shapes)
            self.book.put_pulled(f, version, tensors)
            self.events.emit("pull", fragment=f, version=version, wire_bytes=reply.wire_bytes, encoding="fp32")

        self._send("pull", wire.message(wire.PULL, {"fragment": f}), pulled)

    def _note_versions(self, versions: list[int] | None, waiting: list[int] | None = None) -> None:
        assert self.pushes is not None
        self.pushes.note_versions(versions, waiting)
