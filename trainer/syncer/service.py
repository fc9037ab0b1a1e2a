"""The syncer as a TCP service: a thin I/O shell over SyncerCore (core.py).

It owns what the core must not: the listening socket and one thread per connection, the
merge and lease threads, the lock that serialises every call into the core, the group
commit that makes pushes and meta.json durable, the writes of merged fragments, and the
evaluator's thread. Every decision (who may join, whether a push is accepted, when a
fragment merges and how) is the core's; this module carries its answers out. A simulator
runs the same shell stepped, with no socket or thread (start_stepped, handle, tick).

Threads: one accept loop, one handler per connection, one merge loop and one lease
reaper. All shared state is guarded by one condition variable; slow work (decoding,
encoding, durable writes of a merge) happens outside it where that is safe.
"""
from __future__ import annotations

import errno
import json
import os
import select
import socket
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Callable

from .. import wire
from ..admission import Admission
from ..atomic import atomic_write_json
from ..clock import boot_stamp
from ..config import SyncerConfig, TrainConfig
from ..events import EventLog
from ..global_eval import GlobalEvaluator, HeldOut, Snapshot
from ..group_commit import GroupCommit, StillCommitting, write_staged
from ..merge_rule import earliest
from ..protocol import FrameType, ProtocolError, Reason
from ..signals import stop_on_signals
from ..state import with_metadata
from ..storage import FILES, Storage, SyncFailed, describe_error
from .core import MERGE_RETRY_SECONDS, MergePlan, MergeWritten, PushTicket, RoundWait, SyncerCore
from .fragment_state import FragmentState
from .outer_step import relative_change

REPLY_DEADLINE = 30.0
FINAL_WRITE_WAIT = 30.0  # stop(): how long a merge still being written is waited for
# The syncer exits so after a failed sync (or a disk it cannot read at start), for a restart
# that reads its state back from disk; supervisors restart it (EX_TEMPFAIL).
DISK_FAILED_EXIT = 75


class Syncer:
    def __init__(self, cfg: SyncerConfig, train: TrainConfig, secret: bytes,
                 run_dir: str | None = None, storage: Storage = FILES,
                 monotonic: Callable[[], float] = time.monotonic, events: EventLog | None = None,
                 stamp: Callable[[], dict] = boot_stamp) -> None:
        self.core = SyncerCore(cfg, train, storage, monotonic, events, stamp, run_dir)
        self.monotonic = monotonic
        self.cfg = cfg
        self.train = train
        self.secret = secret
        # Set once a sync failed (the core refuses pushes from then on): serve() exits for
        # a restart that reads the state back (docs/durability.md).
        self.disk_failed = threading.Event()
        self.cond = threading.Condition()
        # Tensor work of pushes (decode, norm, serialisation), a few at a time: with 64 pushes
        # decoding at once, each of their many short torch calls waited for the GIL behind the
        # others (a convoy), and one 3 MB decode took 0.9 s of wall time instead of 5 ms.
        self._tensor_work = threading.BoundedSemaphore(max(2, os.cpu_count() or 2))
        # meta.json and the pending files: one commit for the pushes that arrive together.
        self.durability = GroupCommit(self.store.root, self.store.meta_path, lambda: self.cond,
                                      self.core.meta_document, self.core.meta_written, storage=self.store.storage,
                                      sync_data=self.core.defect != "ack_before_sync")
        self._running = False
        self._threads: list[threading.Thread] = []
        self._conn_ids = 0
        self.admission = Admission(cfg.max_unauthenticated, cfg.max_connections)
        self._listener: socket.socket | None = None
        self.address: tuple[str, int] | None = None
        self._write_meta()
        self.evaluator = self._make_evaluator()

    # What tests and the simulator read of the state: the core's.
    @property
    def frags(self) -> list[FragmentState]:
        return self.core.frags

    @property
    def members(self):
        return self.core.members

    @property
    def counters(self):
        return self.core.counters

    @property
    def store(self):
        return self.core.store

    @property
    def events(self) -> EventLog:
        return self.core.events

    @property
    def sync(self):
        return self.core.sync

    @property
    def specs(self):
        return self.core.specs

    @property
    def shapes(self):
        return self.core.shapes

    @property
    def task(self):
        return self.core.task

    @property
    def defect(self) -> str | None:
        return self.core.defect

    @property
    def _conns(self) -> dict[int, socket.socket]:
        """Every open connection, authenticated or not."""
        return {s.conn_id: s.sock for s in self.admission.slots.values()}

    def _make_evaluator(self) -> GlobalEvaluator | None:
        if not self.cfg.eval_data:
            return None
        try:
            held_out = HeldOut(self.task, self.train.seed)
        except FileNotFoundError as exc:
            raise ValueError(f"eval-data: {exc}") from None
        return GlobalEvaluator(held_out, self.events, self._snapshot, self.cfg.eval_budget, self.monotonic)

    def _snapshot(self) -> Snapshot:
        """Θ as it stands, for the evaluator: copied under the lock, scored outside it."""
        with self.cond:
            return self.core.snapshot()

    def _write_meta(self) -> None:
        """Make the members and counters durable now (through the group commit; never under the lock)."""
        try:
            self.durability.commit()
        except OSError as exc:
            self._storage_error(exc, "meta.json")
            raise

    def _storage_error(self, exc: OSError, what: str) -> None:
        """Count and report a disk error (the core's); a failed sync also sets disk_failed."""
        failed = isinstance(exc, SyncFailed) or self.durability.failed is not None
        if isinstance(exc, SyncFailed):
            # A sync failed outside a group (a merge's fragment file, a new directory): the
            # group commit must not go on making pushes durable on a disk no longer trusted.
            self.durability.note_failed(exc)
        with self.cond:
            self.core.storage_error(exc, what, failed, self.durability.failed)
        if failed:
            self.disk_failed.set()

    # ----------------------------------------------------------------- lifecycle
    def start(self, listener: socket.socket | None = None) -> tuple[str, int]:
        """Serve on `listener` (bound by `bind_listener` before the state dir was touched),
        else on a socket bound now."""
        sock = listener if listener is not None else bind_listener(self.cfg.host, self.cfg.port)
        self._listener = sock
        self._begin(sock.getsockname()[:2], threaded=True)
        return self.address

    def start_stepped(self, address: tuple[str, int]) -> None:
        """Serve with no socket and no thread: the caller delivers frames with handle() and
        connection_closed(), and moves time on with tick() (chaos/sim's single thread)."""
        self._begin(address, threaded=False)

    def tick(self, now: float) -> float | None:
        """What the reaper and merge threads do, once, at `now`: expire leases, merge what
        is due, score Θ if a merge changed it. Returns when to tick next if no frame comes
        before (the earliest lease to run out, merge-rule window to close or score the
        budget allows), or None: the timer a stepped syncer's owner sets."""
        with self.cond:
            self.core.expire_leases(now)
            if self.sync is None:
                self.merge_due(now)
            due = self.core.next_due()
        if self.evaluator is not None:
            self.evaluator.score_merges()
            due = earliest(due, self.evaluator.due_at())
        return due

    def _begin(self, address: tuple[str, int], threaded: bool) -> None:
        self.address = address
        self._running = True
        for target, name in ((self._accept_loop, "accept"), (self._reaper_loop, "reaper"),
                             (self._merge_loop, "merge")) if threaded else ():
            t = threading.Thread(target=target, name=f"syncer-{name}", daemon=True)
            t.start()
            self._threads.append(t)
        if self.evaluator is not None:
            self.evaluator.start(threaded)
        self.core.started(self.address)

    def stop(self, reason: str = "stop") -> None:
        """Stop serving, merge what is pending, write the final state."""
        if not self._running:
            self.events.close()
            return
        self._running = False
        if self._listener is not None:
            self._listener.close()
        with self.cond:
            for sock in list(self._conns.values()):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            self.cond.notify_all()
        for t in self._threads:
            t.join(timeout=5.0)
        with self.cond:  # a merge thread that outlived its join may still be writing a fragment
            if not self.cond.wait_for(lambda: not any(f.writing for f in self.frags), timeout=FINAL_WRITE_WAIT):
                writing = [f.spec.index for f in self.frags if f.writing]
                print(f"syncer: fragment(s) {writing} still being written after {FINAL_WRITE_WAIT:g} s: not merged "
                      "again at stop (their pending pushes are durable, merged after a restart)", file=sys.stderr)
        if self.disk_failed.is_set():  # nothing more is written to a disk that failed a sync
            self._stopped(reason)
            return
        with self.cond:
            try:
                if self.sync is None:
                    for frag in self.core.final_merges():
                        self._merge(frag, reason="final", grace={"policy": self.cfg.grace_policy,
                                                                 "waited": None, "why": "final merge at stop"},
                                    final=any(p.final for p in frag.pending))
                else:
                    self.sync.checkpoint(self.store)
            except OSError as exc:  # what is pending stays durable on disk, merged after a restart
                self._storage_error(exc, "the final merge")
        try:
            self._write_meta()
        except OSError:
            pass  # reported (storage_error); the pushes' own files are durable
        self._stopped(reason)

    def _stopped(self, reason: str) -> None:
        """The end of stop(): the final evaluation and the final state, as events."""
        if self.evaluator is not None:
            self.evaluator.stop()  # scores the final parameters: the last point of Θ's curve
        with self.cond:
            self.core.final_state()
        self.events.emit("process_stop", role="syncer", reason=reason)
        self.events.close()

    # ----------------------------------------------------------------- network
    def _accept_loop(self) -> None:
        assert self._listener is not None
        while self._running:
            try:
                sock, peer = self._listener.accept()
            except (socket.timeout, OSError):
                continue
            with self.cond:
                self._conn_ids += 1
                conn_id = self._conn_ids
                evicted = self.admission.admit(conn_id, peer[0], sock)
            if evicted is not None:
                self._drop_connection(evicted.sock, Reason.UNAUTHENTICATED_LIMIT, (evicted.host, 0),
                                      f"evicted: {self.cfg.max_unauthenticated} connections were in their "
                                      f"handshake; this was the oldest of the busiest peer")
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(target=self._serve_connection, args=(sock, conn_id, peer),
                             name=f"syncer-conn-{conn_id}", daemon=True).start()

    def _drop_connection(self, sock: socket.socket, reason: Reason, peer: tuple, detail: str) -> None:
        """Close a connection the syncer will not serve, counted and reported (throttled)."""
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._refused_connection(reason, detail, peer)

    def _refused_connection(self, reason: Reason, detail: str, peer: tuple, learner: int | None = None) -> None:
        with self.cond:
            self.core.refused_connection(reason, detail, peer, learner)

    def _read_hello(self, channel: wire.Channel, conn_id: int, deadline: float) -> wire.Frame:
        """A verified HELLO before `deadline`; nothing larger than HELLO_MAX_HEADER is read
        before the secret is proven. Then the connection takes an authenticated slot."""
        try:
            hello = channel.recv(deadline, max_payload=0, max_header=wire.HELLO_MAX_HEADER)
        except wire.DeadlineExceeded as exc:
            raise ProtocolError(Reason.HANDSHAKE_TIMEOUT,
                                f"no verified HELLO within {self.cfg.handshake_timeout:g} s ({exc})") from exc
        except wire.FrameError as exc:
            if exc.reason != Reason.BAD_MAC:
                raise
            who = channel.session.identity
            raise wire.FrameError(Reason.BAD_MAC,
                                  f"the first frame of a connection opened as learner {who} does not verify under "
                                  f"learner {who}'s key (another learner's key, another run's secret, a replay, "
                                  "or tampered)") from exc
        if hello.type != FrameType.HELLO:
            raise wire.FrameError(Reason.PROTOCOL, f"first frame must be HELLO, got {hello.type!r}")
        self.core.check_identity(hello, channel.session.identity)
        with self.cond:
            admitted = self.admission.authenticate(conn_id)
        if not admitted:
            raise ProtocolError(Reason.CONNECTION_LIMIT,
                                f"{self.cfg.max_connections} authenticated connections are open (--max-connections)")
        return hello

    def _serve_connection(self, sock: socket.socket, conn_id: int, peer: tuple) -> None:
        """One connection, from handshake to close. Whatever a peer sends, the thread ends
        by closing its socket and releasing its slot: a refusal is answered (when the
        session allows it) and counted, never an uncaught exception."""
        learner: int | None = None
        channel: wire.Channel | None = None
        reason = "closed"
        try:
            # Socket deadlines are on the wire's clock (time.monotonic), never self.monotonic:
            # this thread is the I/O shell a simulator does not run.
            deadline = time.monotonic() + self.cfg.handshake_timeout
            try:
                channel = wire.Channel(sock, wire.server_handshake(sock, self.secret, deadline))
            except wire.DeadlineExceeded as exc:
                raise ProtocolError(Reason.HANDSHAKE_TIMEOUT,
                                    f"no handshake within {self.cfg.handshake_timeout:g} s ({exc})") from exc
            frame = self._read_hello(channel, conn_id, deadline)
            while self._running:
                self.counters["bytes_in"] += frame.wire_bytes
                try:
                    if frame.type == FrameType.HELLO:
                        self.core.check_identity(frame, channel.session.identity)
                except ProtocolError as exc:
                    reply, closes = self.refusal(exc, learner, peer), _close_reason(exc)
                else:
                    reply, learner, closes = self.handle(frame, conn_id, learner, peer, sock)
                if reply is not None:
                    self._send_reply(channel, reply, REPLY_DEADLINE if reply.type != FrameType.ERROR else 1.0)
                if closes is not None:
                    reason = closes
                    break
                frame = channel.recv(time.monotonic() + self.cfg.idle_timeout, self.cfg.max_payload)
        except wire.PeerClosed:
            reason = "peer closed"
        except ProtocolError as exc:
            self._refuse(channel, exc, learner, peer)
            reason = f"refused: {exc.reason}"
        except wire.DeadlineExceeded as exc:
            reason = f"{Reason.IDLE_TIMEOUT}: {exc}"
            self._refused_connection(Reason.IDLE_TIMEOUT, str(exc), peer, learner)
        except OSError as exc:
            reason = f"{type(exc).__name__}: {exc}"
        except Exception as exc:  # noqa: BLE001 - a bug of ours must not kill the thread silently
            self._refuse(channel, ProtocolError(Reason.INTERNAL, f"{type(exc).__name__}: {exc}"), learner, peer)
            traceback.print_exc()
            reason = f"internal error: {type(exc).__name__}"
        finally:
            sock.close()
            self.connection_closed(conn_id, learner, reason)

    def handle(self, frame: wire.Frame, conn_id: int, learner: int | None, peer: tuple = ("-", 0),
               sock: socket.socket | None = None) -> tuple[wire.Message | None, int | None, str | None]:
        """One authenticated frame of connection `conn_id`, answered: (the reply to send, or
        None; the learner the connection speaks for from now on; why the connection closes
        after it, or None). The thread that owns the socket only sends and receives; a
        simulator calls this with frames of its own network (chaos/sim)."""
        try:
            reply, learner = self._dispatch(frame, conn_id, learner, sock)
        except ProtocolError as exc:
            return self.refusal(exc, learner, peer), learner, _close_reason(exc)
        if reply is None:  # superseded by a newer connection of the same learner
            return None, learner, "superseded"
        return reply, learner, "bye" if frame.type == FrameType.BYE else None

    def connection_closed(self, conn_id: int, learner: int | None, reason: str) -> None:
        """A connection ended (its socket is closed): its slot is free, and the learner it
        spoke for is no longer connected through it."""
        with self.cond:
            self.admission.release(conn_id)
            self.core.connection_closed(conn_id, learner, reason)
            self.cond.notify_all()

    def refusal(self, exc: ProtocolError, learner: int | None, peer: tuple) -> wire.Message | None:
        """Count and report a refusal; the ERROR that answers it, when a session exists."""
        with self.cond:
            return self.core.refusal(exc, learner, peer)

    def _refuse(self, channel: wire.Channel | None, exc: ProtocolError, learner: int | None, peer: tuple) -> None:
        """Count and report a refusal, and answer it with ERROR when a session exists."""
        error = self.refusal(exc, learner, peer)
        if channel is not None and error is not None:
            self._send_reply(channel, error, 1.0)

    def _send_reply(self, channel: wire.Channel, reply: wire.Message, within: float) -> None:
        """Send `reply`; an ERROR whose peer is gone is not worth an exception."""
        try:
            self.counters["bytes_out"] += channel.send(reply, time.monotonic() + within)
        except (OSError, wire.DeadlineExceeded):
            if reply.type != FrameType.ERROR:
                raise

    def _dispatch(self, frame: wire.Frame, conn_id: int, learner: int | None,
                  sock: socket.socket | None) -> tuple[wire.Message | None, int | None]:
        if frame.type == FrameType.HELLO:
            return self._on_hello(frame, conn_id), wire.header_int(frame.header, "learner")
        if learner is None:
            raise wire.FrameError(Reason.PROTOCOL, f"{frame.type} before a HELLO was welcomed")
        with self.cond:
            if self.core.renew(learner, conn_id) is None:
                return None, learner
        if frame.type == wire.GRAD:
            return self._on_grad(frame, learner, conn_id, sock), learner
        handlers = {wire.HEARTBEAT: self._on_heartbeat, wire.PUSH: self._on_push,
                    wire.PULL: self._on_pull, wire.BYE: self._on_bye}
        if frame.type not in handlers:
            raise wire.FrameError(Reason.PROTOCOL, f"unexpected frame type {frame.type!r}")
        return handlers[frame.type](frame, learner), learner

    def versions(self) -> list[int]:
        """Every fragment's version, under the lock: what a long poll waits on."""
        with self.cond:
            return self.core.versions()

    # ----------------------------------------------------------------- handlers
    def _on_hello(self, frame: wire.Frame, conn_id: int) -> wire.Message:
        with self.cond:
            joined = self.core.hello(frame, conn_id)
        if joined.must_persist:
            try:
                self._write_meta()
            except OSError as exc:
                raise self.core.not_stored(exc, f"incarnation {joined.incarnation}") from exc
        with self.cond:
            header, tensors = self.core.welcome(joined)
            self.cond.notify_all()
        return wire.message(wire.WELCOME, header, tensors)

    def _on_heartbeat(self, frame: wire.Frame, learner: int) -> wire.Message:
        """A lease renewal, and the fragments' versions. With `wait_ms` and the `versions`
        the learner knows, a long poll: the answer comes as soon as a merge passes one of
        them (or after `wait_ms`, at most MAX_POLL_MS), so a learner awaiting the merge of
        its push adopts it at once instead of a heartbeat interval later (a small task's
        whole round took 0.3 s, 0.2 s of it the learner's polling)."""
        poll = self.core.poll(frame.header)
        with self.cond:
            if poll.wait_ms:
                m = self.members.members.get(learner)
                deadline = self.monotonic() + poll.wait_ms / 1000
                if m is not None:
                    m.busy = True  # the request holds its lease while it waits
                try:
                    while self._running and self.monotonic() < deadline and not self.core.passed(poll.known):
                        self.cond.wait(max(0.0, deadline - self.monotonic()))
                finally:
                    if m is not None:
                        m.busy, m.last_seen = False, self.monotonic()
            return self.core.beat(learner)

    def _on_bye(self, frame: wire.Frame, learner: int) -> wire.Message:
        with self.cond:
            return self.core.bye(learner)

    def _on_pull(self, frame: wire.Frame, learner: int) -> wire.Message:
        with self.cond:
            header, tensors, encoding = self.core.pull(frame)
        return self.core.pulled(header, tensors, encoding)

    def _on_push(self, frame: wire.Frame, learner: int) -> wire.Message:
        """The core decides the push; an accepted one is made durable (with the pushes that
        arrive together: one group commit) before the core enters it and it is ACKed."""
        with self._tensor_work:
            request = self.core.parse_push(frame, learner)
        with self.cond:
            ticket = self.core.admit_push(request)
        nbytes, group = 0, 0
        if ticket.path is not None:
            try:
                if not ticket.write_first:
                    with self.cond:
                        self.core.push_durable(ticket)
                else:
                    nbytes, group = self._store_push(ticket)
            except StillCommitting as exc:
                # Its group may yet make it durable: the id stays reserved until that group
                # ends, and a retry meanwhile hears "in flight", never "duplicate".
                raise self.core.still_storing(ticket, str(exc)) from exc
            except OSError as exc:  # the disk's, not the learner's: refused, kept by the learner
                self._storage_error(exc, f"push {ticket.request.ident}")
                raise self.core.not_stored(exc, f"push {ticket.request.ident}") from exc
        with self.cond:
            return self.core.push_answer(ticket, nbytes, group)

    def _store_push(self, ticket: PushTicket) -> tuple[int, int]:
        """Write an accepted push's file and commit it with its group; the core enters it
        in memory under the lock once it is durable, or releases its reserved id once it
        never will be (the commit decides which: group_commit.Staged). (bytes written, commit group)"""
        assert ticket.path is not None
        try:
            with self._tensor_work:
                head, body = with_metadata(ticket.request.payload, ticket.meta)
                staged = write_staged(ticket.path, head, body, storage=self.store.storage)
        except BaseException:
            with self.cond:
                self.core.push_failed(ticket)
            raise

        def accept() -> None:
            self.core.push_durable(ticket)
            self.cond.notify_all()

        staged.apply = accept
        staged.abandon = lambda: self.core.push_failed(ticket)
        group = self.durability.commit(staged)
        return len(head) + len(body), group

    def _on_grad(self, frame: wire.Frame, learner: int, conn_id: int,
                 sock: socket.socket | None) -> wire.Message | None:
        """Sync mode's barrier: the gradient waits here until every live learner's is in."""
        rnd, tokens, position, grads = self.core.parse_grad(frame)
        with self.cond:
            wait = self.core.submit_grad(learner, conn_id, rnd, tokens, position, grads)
            if not isinstance(wait, RoundWait):
                return wait
            try:
                while not self.core.round_over(wait):
                    if self.core.complete_round():
                        if self.evaluator is not None:
                            self.evaluator.note_merge()
                        self.cond.notify_all()
                        continue
                    if not self._running or self.monotonic() > wait.deadline:
                        raise wire.DeadlineExceeded(f"round {rnd} did not complete")
                    self.cond.wait(0.05)
                    if sock is not None and _peer_closed(sock):
                        raise wire.PeerClosed("learner closed while waiting in the barrier")
            finally:
                self.core.end_wait(wait)
            return self.core.round_answer(wait)

    # ----------------------------------------------------------------- leases
    def _reaper_loop(self) -> None:
        interval = self.train.heartbeat_interval / 2
        while self._running:
            time.sleep(interval)
            with self.cond:
                self.expire_leases(self.monotonic())

    def expire_leases(self, now: float) -> None:
        """Under the lock: every learner silent past its lease is no longer alive."""
        if self.core.expire_leases(now):
            self.cond.notify_all()

    # ----------------------------------------------------------------- merging
    def _merge_loop(self) -> None:
        if self.sync is not None:
            return
        while self._running:
            with self.cond:
                self.cond.wait(0.05)
                if not self.merge_due(self.monotonic()):
                    self.cond.wait(MERGE_RETRY_SECONDS)

    def merge_due(self, now: float) -> bool:
        """Under the lock: merge every fragment the core says is due now. False if a merge
        failed: its pushes stay pending, and the next call tries again."""
        ok = True
        self.core.begin_pass()
        for frag in self.frags:
            decision = self.core.due(frag, now) if self._running else None
            if decision is None:
                continue
            why = decision.reason
            try:
                self._merge(frag, reason=why, grace=decision.info, final=why.startswith("final"), only=decision.only)
                self.core.merged(now)
            except Exception as exc:  # noqa: BLE001 - the pushes stay pending; retried next tick
                ok = False
                self.core.merge_failed(frag, why, exc, now)
                if isinstance(exc, OSError):
                    self._storage_error(exc, f"fragment-{frag.spec.index}")
        return ok

    def _merge(self, frag: FragmentState, reason: str, grace: dict | None = None, final: bool = False,
               only: str | None = None) -> None:
        """Carry out one merge the core planned. Called under the lock, which it releases
        while the new fragment file is written: that durable write is the commit point;
        only after it are the pending files deleted and the new version served."""
        plan = self.core.begin_merge(frag, reason, grace, final, only)
        if plan is None:  # every push was quarantined: nothing to commit
            return
        self.cond.release()
        try:
            written = self._write_merge(plan)
        except BaseException:
            self.cond.acquire()
            self.core.abort_merge(plan)
            raise
        self.cond.acquire()
        self.core.commit_merge(plan, written)
        if self.evaluator is not None:
            self.evaluator.note_merge()
        self.cond.notify_all()

    def _write_merge(self, plan: MergePlan) -> MergeWritten:
        """Off the lock: write the plan's fragment file (the commit point), then delete its
        pending files, which recovery would drop anyway past that point."""
        # How far Θ_f really moved, measured on the tensors committed: a merge that moved
        # nothing has merged nothing, whatever its contributors.
        moved = relative_change(plan.before, plan.params)
        started = self.monotonic()
        nbytes = 0
        if plan.write:
            step = plan.step
            nbytes = self.store.write_fragment(plan.frag.spec.index, plan.params, step.momentum, plan.version,
                                               plan.applied, step.accum, step.accum_count, plan.tokens, plan.rounds)
        seconds = self.monotonic() - started
        for p in plan.taken:
            try:
                self.store.storage.unlink(p.path)
            except OSError:
                pass
        return MergeWritten(nbytes, seconds, moved)


def _close_reason(exc: ProtocolError) -> str | None:
    """Why a refusal closes its connection (frame-level and handshake faults do), or None:
    a refused request was authenticated and in step, so the next one can be read."""
    closes = not isinstance(exc.reason, Reason) or exc.reason.closes_connection
    return f"refused: {exc.reason}" if closes else None


def _peer_closed(sock: socket.socket) -> bool:
    """True if the peer closed its side (EOF is readable without blocking).

    select() first: a Python socket with a timeout polls for up to that timeout inside
    recv(), whatever MSG_DONTWAIT says, and this is called with the lock held.
    """
    try:
        readable, _, _ = select.select([sock], [], [], 0)
        if not readable:
            return False
        return sock.recv(1, socket.MSG_PEEK) == b""
    except (OSError, ValueError):
        return True


def write_address_file(path: str | Path, host: str, port: int) -> None:
    atomic_write_json(path, {"host": host, "port": port})


class PortInUse(ValueError):
    """The syncer's address is taken: said before anything is written to the state dir."""


def bind_listener(host: str, port: int) -> socket.socket:
    """The syncer's listening socket; PortInUse (or another OSError's ValueError) naming the
    address when it cannot be had."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(64)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise PortInUse(f"port: {host}:{port} is in use by another process; pick another --port "
                            f"(0 picks a free one)") from None
        raise ValueError(f"host: cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    sock.settimeout(0.2)
    return sock


def serve(cfg: SyncerConfig, train: TrainConfig, secret: bytes, run_dir: str | None,
          address_file: str | None) -> int:
    """Run a syncer until SIGTERM or SIGINT, then stop cleanly. The port is bound before the
    state dir is read or written: a syncer that cannot listen leaves nothing behind."""
    listener = bind_listener(cfg.host, cfg.port)
    try:
        syncer = Syncer(cfg, train, secret, run_dir)
    except OSError as exc:  # the state dir's disk: say which call failed, exit for a restart
        listener.close()
        print(f"syncer: error: state-dir {cfg.state_dir}: cannot read or write its state: "
              f"{describe_error(exc)}", file=sys.stderr)
        return DISK_FAILED_EXIT
    except BaseException:
        listener.close()
        raise
    host, port = syncer.start(listener)
    if address_file:
        write_address_file(address_file, host, port)
    print(json.dumps({"syncer": f"{host}:{port}", "mode": train.mode}), flush=True)
    stop = threading.Event()
    stop_on_signals(stop)
    while not stop.wait(0.5):
        if syncer.disk_failed.is_set():
            syncer.stop(reason="disk failed")
            print(f"syncer: error: state-dir {cfg.state_dir}: a sync failed, so what is on disk is unknown; "
                  f"exiting with {DISK_FAILED_EXIT} for a restart that reads it back", file=sys.stderr)
            return DISK_FAILED_EXIT
    syncer.stop(reason="signal")
    return 0
