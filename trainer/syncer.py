"""The syncer: the outer optimizer of decoupled DiLoCo, as a TCP service.

It holds the global parameters Θ split into fragments, merges pushes from whichever
learners report (quorum K, grace window, token weights, staleness bound), and never waits
for any one learner. In sync mode it is instead the all-reduce point of a conventional
data-parallel baseline: every step waits for every live learner.

Threads: one accept loop, one handler per connection, one merge loop and one lease
reaper. All shared state is guarded by one condition variable; slow work (encoding,
durable writes of a merge) happens outside it where that is safe.
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
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from . import defects, wire
from .admission import Admission, Throttle
from .codec import decode, encode
from .config import SyncerConfig, TrainConfig
from .clock import boot_stamp, downtime_since
from .events import EventLog
from .fragments import Fragment, partition
from .global_eval import GlobalEvaluator, HeldOut, Snapshot
from .membership import Membership
from .merge_rule import (MERGE_TIMES_KEPT, Arrivals, Decision, MergeRule, Waiting, earliest,  # noqa: F401
                         grace_window, is_stale, predict_arrival, round_period)
from .signals import stop_on_signals
from .task import load_task
from .outer import (Contribution, OuterConfig, delayed_nesterov_step, final_average, merge, merge_weights,
                    nesterov_step, push_id, round_fraction, round_scale, staleness_factors)
from .protocol import MAX_POLL_MS, FrameType, ProtocolError, Reason, Status
from .quarantine import Quarantine
from .ranks import param_digest
from .served import DELTA_ENCODINGS, ServedFragment
from .validation import DEFAULT_MAX_STEP_TOKENS, NormGuard, PushBounds, check_position, tensor_norm
from .atomic import atomic_write_json
from .group_commit import GroupCommit, write_staged
from .state import StateDir, load_tensors, read_json, remove_stale_temporaries, with_metadata
from .storage import FILES, Storage, SyncFailed, describe_error, is_full
from .sync_state import SyncRound

REPLY_DEADLINE = 30.0
MERGE_RETRY_SECONDS = 0.5  # a merge that failed (its pushes stay pending) is tried again after this
# The syncer exits so after a failed sync (or a disk it cannot read at start), for a restart
# that reads its state back from disk; supervisors restart it (EX_TEMPFAIL).
DISK_FAILED_EXIT = 75
ADMISSION_REASONS = frozenset({Reason.HANDSHAKE_TIMEOUT, Reason.CONNECTION_LIMIT, Reason.UNAUTHENTICATED_LIMIT,
                               Reason.IDLE_TIMEOUT})


@dataclass
class PendingPush:
    contribution: Contribution
    steps: int
    encoding: str
    path: Path
    accepted_at: float
    final: bool = False  # its learner's last push of the fragment: it waits for the final round


@dataclass
class OuterStep:
    """A merge computed on copies of a fragment's state, not yet committed."""

    expected: float
    staleness: list[int]
    raw: list[float]
    factors: list[float]
    weights: list[float]
    params: dict[str, torch.Tensor]
    momentum: dict[str, torch.Tensor]
    accum: dict[str, torch.Tensor]
    accum_count: int
    outer: dict
    finite: bool


@dataclass
class FragmentState:
    spec: Fragment
    params: dict[str, torch.Tensor]
    momentum: dict[str, torch.Tensor]
    version: int = 0
    applied: list[str] = field(default_factory=list)
    applied_set: set[str] = field(default_factory=set)
    pending: list[PendingPush] = field(default_factory=list)
    merging: set[str] = field(default_factory=set)
    merge_times: list[float] = field(default_factory=list)
    accum: dict[str, torch.Tensor] = field(default_factory=dict)  # delayed Nesterov: Σ Δ since the last momentum step
    accum_count: int = 0                                          # ... and how many Δs that is
    tokens: int = 0                                               # raw tokens merged so far (durable)
    rounds: float = 0.0                                           # outer rounds merged so far (durable)
    arrivals: Arrivals = field(default_factory=Arrivals)  # recent push times: the adaptive grace's estimates
    writing: bool = False  # a merge is being written: its version will not hold pushes accepted meanwhile

    def waiting(self) -> list[Waiting]:
        """The pending pushes as the merge rule sees them."""
        return [Waiting(p.contribution.learner, p.contribution.base_version, p.accepted_at, p.final)
                for p in self.pending]

    def known(self, ident: str) -> bool:
        return ident in self.applied_set or ident in self.merging or any(
            p.contribution.ident == ident for p in self.pending)


class Syncer:
    def __init__(self, cfg: SyncerConfig, train: TrainConfig, secret: bytes,
                 run_dir: str | None = None, storage: Storage = FILES,
                 monotonic: Callable[[], float] = time.monotonic, events: EventLog | None = None,
                 stamp: Callable[[], dict] = boot_stamp) -> None:
        # Every reading of elapsed time (leases, grace, rate bounds, deadlines) comes from
        # here, every event goes to `events`, and the boot clock's stamp from `stamp`: a
        # simulator hands in its virtual clock and its own log (chaos/sim).
        self.monotonic = monotonic
        self.stamp = stamp
        self.cfg = cfg
        self.train = train
        self.secret = secret
        self.outer = OuterConfig(cfg.outer_lr, cfg.outer_momentum)
        self.rule = MergeRule(cfg.quorum, cfg.grace, cfg.grace_policy, cfg.final_wait)
        self._recheck_at: float | None = None  # when the merge rule's answer next changes with no input
        self.events = events or EventLog(run_dir, "syncer")
        self.defect = defects.active()
        self.store = StateDir(cfg.state_dir, storage)
        # Set once a sync failed: the disk is not trusted, and the process exits for a restart
        # that reads the state back (serve(); docs/durability.md).
        self.disk_failed = threading.Event()
        self.cond = threading.Condition()
        # Tensor work of pushes (decode, norm, serialisation), a few at a time: with 64 pushes
        # decoding at once, each of their many short torch calls waited for the GIL behind the
        # others (a convoy), and one 3 MB decode took 0.9 s of wall time instead of 5 ms.
        self._tensor_work = threading.BoundedSemaphore(max(2, os.cpu_count() or 2))
        # meta.json and the pending files: one commit for the pushes that arrive together.
        self.durability = GroupCommit(self.store.root, self.store.meta_path, lambda: self.cond,
                                      self._meta_document, self._meta_written, storage=self.store.storage,
                                      sync_data=self.defect != "ack_before_sync")
        self.members = Membership(train.num_learners, self.events.wall_clock)
        self.counters: Counter[str] = Counter()
        # The task's model only holds Θ: the syncer never trains it (nor reads its data,
        # except the held-out set with --eval-data).
        self.task = load_task(train.task, train.task_options(cfg.eval_data or "markov"))
        model = self.task.model(train.seed)
        self.step_tokens: dict[int, float] = {}  # learner → tokens per inner step of its pushes
        self.shapes = {n: p.shape for n, p in model.named_parameters()}
        self.specs = partition(self.shapes, train.fragments, train.fragment_layout)
        self._last_flush = self.monotonic()  # the ack_before_durable defect's batch starts now
        self.fragment_of = {n: s.index for s in self.specs for n in s.names}
        self.frags: list[FragmentState] = []
        self._seeded_digest: str | None = None
        self._first_grad_at: float | None = None  # sync mode: when the first round began to wait
        self.sync: SyncRound | None = None
        self._running = False
        self._threads: list[threading.Thread] = []
        self._conn_ids = 0
        self.admission = Admission(cfg.max_unauthenticated, cfg.max_connections)
        self.report = Throttle(self.events.emit)
        self.bounds = PushBounds(cfg.max_step_rate, cfg.max_step_tokens or DEFAULT_MAX_STEP_TOKENS, train.sync_every)
        self.quarantine = Quarantine(self.store.root / "quarantine", self.events, self.counters, self.store.storage)
        self._listener: socket.socket | None = None
        self.address: tuple[str, int] | None = None
        self._recover(model)
        # Delta pulls (served.py): Φ per fragment, from the recovered Θ (nothing of it is durable).
        self.served = [ServedFragment(f.params, f.version, train.pull_encoding) for f in self.frags] \
            if train.pull_encoding in DELTA_ENCODINGS else None
        self.norms = [NormGuard(cfg.max_norm_ratio) for _ in self.specs]
        self.evaluator = self._make_evaluator()

    @property
    def _conns(self) -> dict[int, socket.socket]:
        """Every open connection, authenticated or not."""
        return {s.conn_id: s.sock for s in self.admission.slots.values()}

    # ----------------------------------------------------------------- recovery
    def _fingerprint(self) -> dict:
        return {"mode": self.train.mode, "model": self.train.model.to_dict(), "task": self.train.task,
                "fragments": self.train.fragments, "seed": self.train.seed,
                # Only when not the default, so state dirs written before the layout existed still match.
                **({"fragment_layout": self.train.fragment_layout}
                   if self.train.fragment_layout != "balanced" else {})}

    def _recover(self, model: torch.nn.Module) -> None:
        removed = remove_stale_temporaries(self.store.root, self.store.storage)
        meta = read_json(self.store.meta_path, self.store.storage)
        if meta is not None:
            stored = {"task": "gpt", **(meta.get("fingerprint") or {})}  # state written before tasks: gpt
            if stored != self._fingerprint():
                raise ValueError(
                    f"state-dir {self.store.root}: holds state of a different run "
                    f"({meta.get('fingerprint')}); use a fresh --state-dir")
            # Each incarnation's age goes on from where it was written, plus the time this
            # syncer was down by the boot clock (0 after a reboot or on another machine).
            if self.defect != "forget_members":
                self.members.restore(meta.get("members", {}), self.monotonic(),
                                     downtime_since(meta.get("clock"), self.stamp()))
            self.counters.update(meta.get("counters", {}))
        initial = {n: p.detach().clone() for n, p in model.named_parameters()}
        if self.train.mode == "sync":
            self.sync = SyncRound.restore_or_init(self.store, model, self.train)
            self.events.emit("state_loaded", mode="sync", round=self.sync.round,
                             members=self.members.persistent(), removed_temporaries=removed)
        else:
            self._recover_fragments(initial)
            presumed = self.members.presume_alive(self.monotonic())
            self.events.emit("state_loaded", mode="decoupled", presumed_alive=presumed,
                             versions=[f.version for f in self.frags],
                             accum_counts=[f.accum_count for f in self.frags],
                             accumulators_discarded=self.counters["accumulators_discarded"],
                             applied={str(f.spec.index): f.applied for f in self.frags},
                             pending=sum(len(f.pending) for f in self.frags),
                             members=self.members.persistent(), removed_temporaries=removed)
        self._write_meta()

    def _recover_fragments(self, initial: dict[str, torch.Tensor]) -> None:
        for spec in self.specs:
            stored = self.store.read_fragment_file(spec.index)
            if stored is None:
                params = {n: initial[n] for n in spec.names}
                momentum = {n: torch.zeros_like(initial[n]) for n in spec.names}
                self.store.write_fragment(spec.index, params, momentum, 0, [])
                frag = FragmentState(spec, params, momentum)
            else:
                applied = [] if self.defect == "forget_ledger" else stored.applied
                version = 0 if self.defect == "version_from_zero" else stored.version
                frag = FragmentState(spec, stored.params, stored.momentum, version, applied,
                                     set(applied), accum=stored.accum, accum_count=stored.accum_count,
                                     tokens=stored.tokens, rounds=stored.rounds)
                if frag.accum_count and self.cfg.staleness_policy != "delayed-nesterov":
                    # Those Δs were applied already (SGD steps); only their momentum share is lost.
                    self.counters["accumulators_discarded"] += 1
                    frag.accum, frag.accum_count = {}, 0
            for path in self.store.pending_files(spec.index) if self.defect != "drop_pending" else ():
                try:
                    push = self._load_pending(path)
                except Exception as exc:  # noqa: BLE001 - an unreadable push must not stop recovery
                    self.quarantine.put(path, path.stem, spec.index, None, Reason.BAD_PENDING,
                                        f"{type(exc).__name__}: {exc}", acknowledged=True)
                    continue
                if push.contribution.ident in frag.applied_set:
                    self.store.storage.unlink(path)  # merged before the crash; never apply twice
                else:
                    frag.pending.append(push)
            self.frags.append(frag)

    def _load_pending(self, path: Path) -> PendingPush:
        parts, meta = load_tensors(path, self.store.storage)
        for key in ("fragment", "learner", "incarnation", "seq", "tokens", "base_version", "steps"):
            wire.header_int(meta, key)  # the bounds a push had on the wire (a file from before them may not)
        spec = self.specs[int(meta["fragment"])]
        delta = decode(parts, str(meta["encoding"]), {n: self.shapes[n] for n in spec.names})
        c = Contribution(int(meta["learner"]), int(meta["incarnation"]), int(meta["seq"]),
                         int(meta["tokens"]), int(meta["base_version"]), delta, int(meta["steps"]))
        return PendingPush(c, int(meta["steps"]), meta["encoding"], path, self.monotonic(),
                           final=bool(wire.header_int(meta, "final", 0, 1)) if "final" in meta else False)

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
            if self.sync is not None:
                params = {n: p.detach().clone() for n, p in self.sync.model.named_parameters()}
                return Snapshot(params, [self.sync.round], float(sum(m.tokens for m in self.members.members.values())))
            params = {n: t.clone() for f in self.frags for n, t in f.params.items()}
            total = sum(s.numel for s in self.specs)
            tokens = sum(f.tokens * f.spec.numel / total for f in self.frags)
            return Snapshot(params, self._versions(), tokens)

    def _meta_document(self) -> dict:
        """meta.json's content (under the lock): members and counters."""
        return {"fingerprint": self._fingerprint(), "members": self.members.persistent(self.monotonic()),
                "counters": dict(self.counters), "clock": self.stamp()}

    def _meta_written(self, nbytes: int, files: int, document: dict) -> None:
        self.members.note_durable(document["members"])
        self.counters["state_writes"] += 1
        self.counters["state_bytes"] += nbytes
        if files:
            self.counters["commit_groups"] += 1

    def _write_meta(self) -> None:
        """Make the members and counters durable now (through the group commit; never under the lock)."""
        try:
            self.durability.commit()
        except OSError as exc:
            self._storage_error(exc, "meta.json")
            raise

    def _storage_error(self, exc: OSError, what: str) -> None:
        """Count and report a disk error; a failed sync also marks the disk failed, once."""
        reason = Reason.STORAGE_FULL if is_full(exc) else Reason.STORAGE_IO
        failed = isinstance(exc, SyncFailed) or self.durability.failed is not None
        with self.cond:
            self.counters[f"storage_{'full' if reason == Reason.STORAGE_FULL else 'error'}"] += 1
        self.report("storage_error", reason, what=what, detail=describe_error(exc), sync_failed=failed)
        if failed and not self.disk_failed.is_set():
            self.disk_failed.set()
            with self.cond:
                self.counters["disk_failed"] += 1
            self.events.emit("disk_failed", what=what, detail=describe_error(self.durability.failed or exc),
                             action="refuse every push and exit for a restart that reads the state back")

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
            self.expire_leases(now)
            due = self.members.next_expiry(self.train.heartbeat_timeout)
            if self.sync is None:
                self.merge_due(now)
                due = earliest(due, self._recheck_at)
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
        self.events.emit("process_start", role="syncer", mode=self.train.mode, defect=self.defect,
                         address=list(self.address), config=self.train.to_dict(),
                         syncer={"quorum": self.cfg.quorum, "grace": self.cfg.grace,
                                 "grace_policy": self.cfg.grace_policy,
                                 "max_staleness": self.cfg.max_staleness,
                                 "staleness_policy": self.cfg.staleness_policy,
                                 "nesterov_delay": self.cfg.nesterov_delay,
                                 "momentum_unit": self.cfg.momentum_unit,
                                 "momentum_warmup": self.cfg.warmup_rounds,
                                 "outer_lr": self.cfg.outer_lr, "outer_momentum": self.cfg.outer_momentum,
                                 "eval_data": self.cfg.eval_data or None, "eval_budget": self.cfg.eval_budget})

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
        if self.disk_failed.is_set():  # nothing more is written to a disk that failed a sync
            self._stopped(reason)
            return
        with self.cond:
            try:
                if self.sync is None:
                    for frag in self.frags:
                        if frag.pending:
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
            final = {"mode": self.train.mode, "counters": dict(self.counters),
                     "members": self.members.persistent()}
            if self.sync is None:
                final["versions"] = [f.version for f in self.frags]
                final["applied"] = {str(f.spec.index): f.applied for f in self.frags}
                final["finite"] = all(bool(torch.isfinite(t).all()) for f in self.frags for t in f.params.values())
            else:
                final["round"] = self.sync.round
            self.events.emit("final_state", **final)
        held = self.report.flush()
        if held:
            self.events.emit("events_suppressed", counts=held)
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
        """Count an admission refusal or timeout, and report it (throttled)."""
        with self.cond:
            self.counters[f"refused_{reason}"] += 1
            self.counters["refused_connections"] += 1
        self.report("connection_refused", reason, detail=detail, from_learner=learner, peer=f"{peer[0]}:{peer[1]}")

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
        self._check_identity(hello, channel)
        with self.cond:
            admitted = self.admission.authenticate(conn_id)
        if not admitted:
            raise ProtocolError(Reason.CONNECTION_LIMIT,
                                f"{self.cfg.max_connections} authenticated connections are open (--max-connections)")
        return hello

    @staticmethod
    def _check_identity(hello: wire.Frame, channel: wire.Channel) -> None:
        """A HELLO speaks only for the learner whose key keyed the connection (keys.py)."""
        named = wire.header_int(hello.header, "learner")
        if named != channel.session.identity:
            raise ProtocolError(Reason.BAD_IDENTITY,
                                f"HELLO as learner {named} on a connection opened with learner "
                                f"{channel.session.identity}'s key: a learner speaks only as itself")

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
                        self._check_identity(frame, channel)
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
        """One authenticated frame of connection `conn_id`, decided: (the reply to send, or
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
            if learner is not None:
                m = self.members.disconnect(learner, conn_id)
                if m is not None:
                    self.events.emit("leave", learner=learner, incarnation=m.incarnation, reason=reason)
            self.cond.notify_all()

    def refusal(self, exc: ProtocolError, learner: int | None, peer: tuple) -> wire.Message | None:
        """Count and report a refusal; the ERROR that answers it, when a session exists."""
        if exc.reason in ADMISSION_REASONS:
            self._refused_connection(exc.reason, exc.detail, peer, learner)
        else:
            self._reject(exc.reason, exc.detail, learner, peer)
        if exc.reason == Reason.HANDSHAKE_TIMEOUT:
            return None
        return wire.message(FrameType.ERROR, {"reason": str(exc.reason), "detail": exc.detail[:1000]})

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

    def _reject(self, reason: Reason | str, detail: str, learner: int | None, peer: tuple) -> None:
        with self.cond:
            self.counters[f"rejected_{reason}"] += 1
            self.counters["rejected_frames"] += 1
        self.report("frame_rejected", reason, detail=detail, from_learner=learner, peer=f"{peer[0]}:{peer[1]}")

    def _dispatch(self, frame: wire.Frame, conn_id: int, learner: int | None,
                  sock: socket.socket) -> tuple[wire.Message | None, int | None]:
        if frame.type == FrameType.HELLO:
            return self._on_hello(frame, conn_id), wire.header_int(frame.header, "learner")
        if learner is None:
            raise wire.FrameError(Reason.PROTOCOL, f"{frame.type} before a HELLO was welcomed")
        with self.cond:
            m = self.members.current(learner, conn_id)
            if m is None:
                return None, learner
            if self.members.touch(m, self.monotonic()):
                self.events.emit("join", learner=learner, incarnation=m.incarnation, rejoin=False,
                                 reason="lease renewed")
        handlers = {wire.HEARTBEAT: self._on_heartbeat, wire.PUSH: self._on_push,
                    wire.PULL: self._on_pull, wire.BYE: self._on_bye}
        if frame.type == wire.GRAD:
            return self._on_grad(frame, learner, conn_id, sock), learner
        if frame.type not in handlers:
            raise wire.FrameError(Reason.PROTOCOL, f"unexpected frame type {frame.type!r}")
        return handlers[frame.type](frame, learner), learner

    def _reply(self, ftype: FrameType, header: dict, tensors: dict[str, torch.Tensor] | None = None) -> wire.Message:
        return wire.message(ftype, header, tensors)

    def _versions(self) -> list[int]:
        return [f.version for f in self.frags]

    def versions(self) -> list[int]:
        """Every fragment's version, under the lock: what a long poll waits on."""
        with self.cond:
            return self._versions()

    # ----------------------------------------------------------------- handlers
    def _on_hello(self, frame: wire.Frame, conn_id: int) -> wire.Message:
        h = frame.header
        learner = wire.header_int(h, "learner")
        nonce = wire.header_str(h, "nonce")
        mode = wire.header_str(h, "mode")
        if mode != self.train.mode:
            raise ProtocolError(Reason.MODE_MISMATCH, f"syncer runs in {self.train.mode} mode, learner asked for {mode}")
        problem = self.members.check_learner(learner)
        if problem:
            raise ProtocolError(Reason.BAD_LEARNER, problem)
        want_params = bool(h.get("want_params", True))
        seeded = h.get("seeded", False) is True
        with self.cond:
            joined = self.members.join(learner, nonce, conn_id, self.monotonic())
        # A new incarnation's number is never reused, even after a crash: it is durable before
        # it is welcomed. A reconnect changes nothing durable (no fsync per reconnect), unless
        # the write of its incarnation failed and it was never welcomed.
        if not joined.reconnect or not self.members.is_durable(learner):
            try:
                self._write_meta()
            except OSError as exc:
                raise ProtocolError(Reason.STORAGE_FULL if is_full(exc) else Reason.STORAGE_IO,
                                    f"incarnation {joined.incarnation} not stored: {describe_error(exc)}") from exc
        with self.cond:
            m = self.members.members[learner]
            header = {"learner": learner, "incarnation": joined.incarnation, "rejoin": joined.rejoin,
                      "position": m.position, "config": self.train.to_dict(),
                      "fragments": [list(s.names) for s in self.specs]}
            if self.sync is None:
                header["versions"] = self._versions()
                tensors = {n: t.clone() for f in self._served_params() for n, t in f.items()} if want_params else None
                if tensors is not None and seeded and not any(header["versions"]):
                    # Θ is still the seeded initial model: a digest instead of 4 B/param. The
                    # learner builds the same model from the seed, or asks again for the tensors.
                    header["params_digest"] = self._initial_digest(tensors)
                    tensors = None
            else:
                header["round"] = self.sync.round
                header["adam_step"] = self.sync.adam_step()
                tensors = self.sync.state_tensors() if want_params else None
            self.cond.notify_all()
        self.events.emit("join", learner=learner, incarnation=joined.incarnation, rejoin=joined.rejoin,
                         reconnect=joined.reconnect, position=m.position)
        return self._reply(wire.WELCOME, header, tensors)

    def _served_params(self) -> list[dict[str, torch.Tensor]]:
        """What a learner starts from, per fragment: Θ, or Φ with delta pulls (it must hold
        exactly what the steps it pulls later are measured from)."""
        return [f.params for f in self.served] if self.served is not None else [f.params for f in self.frags]

    def _initial_digest(self, params: dict[str, torch.Tensor]) -> str:
        """The digest of Θ at version 0 (computed once: Θ changes only by a merge)."""
        if self._seeded_digest is None:
            self._seeded_digest = param_digest(params)
        return self._seeded_digest

    def _on_heartbeat(self, frame: wire.Frame, learner: int) -> wire.Message:
        """A lease renewal, and the fragments' versions. With `wait_ms` and the `versions`
        the learner knows, a long poll: the answer comes as soon as a merge passes one of
        them (or after `wait_ms`, at most MAX_POLL_MS), so a learner awaiting the merge of
        its push adopts it at once instead of a heartbeat interval later (a small task's
        whole round took 0.3 s, 0.2 s of it the learner's polling)."""
        wait_ms, known = self._poll_request(frame.header)
        with self.cond:
            if wait_ms:
                m = self.members.members.get(learner)
                deadline = self.monotonic() + wait_ms / 1000
                if m is not None:
                    m.busy = True  # the request holds its lease while it waits
                try:
                    while self._running and self.monotonic() < deadline and \
                            not any(v > k for v, k in zip(self._versions(), known)):
                        self.cond.wait(max(0.0, deadline - self.monotonic()))
                finally:
                    if m is not None:
                        m.busy, m.last_seen = False, self.monotonic()
            header = {"versions": self._versions(), "alive": len(self.members.alive())}
            if self.sync is not None:
                header["round"] = self.sync.round
        return self._reply(wire.BEAT, header)

    def _poll_request(self, header: dict) -> tuple[int, list[int]]:
        """A heartbeat's long-poll fields, checked: (wait in ms, versions known); (0, []) for
        a plain heartbeat (and in sync mode, which has no versions to wait for)."""
        if "wait_ms" not in header or self.sync is not None:
            return 0, []
        wait_ms = min(MAX_POLL_MS, wire.header_int(header, "wait_ms"))  # a longer ask waits the cap
        known = header.get("versions")
        if not isinstance(known, list) or len(known) != len(self.frags) or not all(
                isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= wire.MAX_SAFE_INT for v in known):
            raise wire.FrameFault(Reason.BAD_HEADER, f"header field 'versions' must list {len(self.frags)} "
                                                     f"integers >= 0 (one per fragment), got {known!r:.80}")
        return wait_ms, known

    def _on_bye(self, frame: wire.Frame, learner: int) -> wire.Message:
        with self.cond:
            m = self.members.members.get(learner)
            if m is not None:
                self.members.finish(m)
        return self._reply(FrameType.ACK, {"status": Status.BYE})

    def _on_pull(self, frame: wire.Frame, learner: int) -> wire.Message:
        if self.sync is not None:
            raise ProtocolError(Reason.PROTOCOL, "PULL is for decoupled mode")
        index = wire.header_int(frame.header, "fragment")
        if index >= len(self.frags):
            raise ProtocolError(Reason.BAD_FRAGMENT, f"fragment {index} does not exist (0..{len(self.frags) - 1})")
        have = wire.header_int(frame.header, "have") if "have" in frame.header else None
        with self.cond:
            frag = self.frags[index]
            if self.served is not None:
                encoding, start, tensors = self.served[index].reply(have)
                header = {"fragment": index, "version": self.served[index].version, "encoding": encoding}
                if start is not None:
                    header["from"] = start
                return self._reply(wire.FRAGMENT, header, tensors if start is not None else encode(tensors, encoding))
            header = {"fragment": index, "version": frag.version, "encoding": self.train.pull_encoding}
            params = {n: t.clone() for n, t in frag.params.items()}
        return self._reply(wire.FRAGMENT, header, encode(params, self.train.pull_encoding))

    def _on_push(self, frame: wire.Frame, learner: int) -> wire.Message:
        """Validate a push against the run (validation.py), make it durable, then ACK it.
        Nothing a push claims is acknowledged before it is checked."""
        if self.sync is not None:
            raise ProtocolError(Reason.PROTOCOL, "PUSH is for decoupled mode")
        if self.disk_failed.is_set():
            raise ProtocolError(Reason.STORAGE_IO, "the syncer's disk failed a sync: nothing is stored until it "
                                                   "restarts and reads its state back")
        h = frame.header
        index = wire.header_int(h, "fragment")
        if index >= len(self.frags):
            raise ProtocolError(Reason.BAD_FRAGMENT, f"fragment {index} does not exist (0..{len(self.frags) - 1})")
        incarnation = wire.header_int(h, "incarnation", 1)
        seq = wire.header_int(h, "seq", 1)
        base_version = wire.header_int(h, "base_version")
        tokens = wire.header_int(h, "tokens")
        steps = wire.header_int(h, "steps")
        position = wire.header_int(h, "position")
        encoding = wire.header_str(h, "encoding")
        final = bool(wire.header_int(h, "final", 0, 1)) if "final" in h else False
        # Tokens per inner step, as the task counts them (optional: else the push's own mean).
        step_tokens = wire.header_int(h, "step_tokens", 1) if "step_tokens" in h else (tokens / steps if steps else 0)
        spec = self.specs[index]
        with self._tensor_work:
            try:
                delta = decode(frame.tensors(), encoding, {n: self.shapes[n] for n in spec.names})
            except ValueError as exc:
                raise ProtocolError(Reason.BAD_TENSOR, str(exc)) from exc
            per_round_norm = tensor_norm(delta) * round_scale(steps, self.train.sync_every)
        ident = push_id(learner, incarnation, seq)
        with self.cond:
            m = self.members.members[learner]
            if incarnation != m.incarnation:
                raise ProtocolError(Reason.BAD_INCARNATION,
                                    f"push from incarnation {incarnation}, current is {m.incarnation}")
            frag = self.frags[index]
            if base_version > frag.version:
                raise ProtocolError(Reason.OUT_OF_BOUNDS,
                                    f"base_version={base_version} is ahead of fragment {index}'s version {frag.version}")
            known = frag.known(ident)
            if not known:
                elapsed = m.elapsed(self.monotonic())
                self.bounds.check_counts(steps=steps, tokens=tokens, step_tokens=step_tokens,
                                         claimed=m.claimed.get(index, 0), elapsed=elapsed)
                check_position(position, m.start, elapsed, self.bounds.max_step_rate, self.train.sync_every)
                self.norms[index].check(per_round_norm, lambda: tensor_norm(frag.params))
            if known and self.defect != "double_apply":
                self.counters["duplicates"] += 1
                status = Status.DUPLICATE
            elif is_stale(frag.version, base_version, self.cfg.max_staleness):
                self.counters["dropped_stale"] += 1
                status = Status.STALE
            else:
                status = Status.ACCEPTED
                frag.merging.add(ident)  # reserve the id while its file is written
                m.claimed[index] = m.claimed.get(index, 0) + steps
                self.norms[index].note(per_round_norm)
            version = frag.version
        if status == Status.ACCEPTED:
            contribution = Contribution(learner, incarnation, seq, tokens, base_version, delta, steps)
            meta = {"fragment": index, "learner": learner, "incarnation": incarnation, "seq": seq,
                    "tokens": tokens, "steps": steps, "base_version": base_version, "encoding": encoding,
                    "final": int(final)}
            path = self.store.pending_path(index, ident)
            accepted: dict[str, int] = {}

            def accept() -> None:
                """The push enters memory (under the lock) once its file is durable and in place."""
                # The id moves from reserved to pending in one step: a retry never finds it in neither.
                frag.merging.discard(ident)
                # The next merge of this fragment will include this push: the one after a merge
                # being written now, which took its pushes before this one arrived.
                accepted["version"] = frag.version + (1 if frag.writing else 0)
                accepted_at = self.monotonic()
                frag.pending.append(PendingPush(contribution, steps, encoding, path, accepted_at, final))
                frag.arrivals.note(learner, incarnation, accepted_at)
                m.position = max(m.position, position)
                m.tokens += tokens
                if step_tokens > 0:
                    self.step_tokens[learner] = float(step_tokens)
                self.counters["accepted"] += 1
                self.cond.notify_all()

            nbytes, group = 0, 0
            try:
                if self.defect == "ack_before_durable":
                    with self.cond:
                        accept()
                else:
                    with self._tensor_work:
                        head, body = with_metadata(frame.payload, meta)
                        staged = write_staged(path, head, body, storage=self.store.storage)
                    nbytes = len(head) + len(body)
                    staged.apply = accept
                    group = self.durability.commit(staged)
            except BaseException as exc:
                with self.cond:
                    frag.merging.discard(ident)
                if isinstance(exc, OSError):  # the disk's, not the learner's: refused, kept by the learner
                    self._storage_error(exc, f"push {ident}")
                    raise ProtocolError(Reason.STORAGE_FULL if is_full(exc) else Reason.STORAGE_IO,
                                        f"push {ident} not stored: {describe_error(exc)}") from exc
                raise
            version = accepted["version"]
            self.events.emit("push_accepted", learner=learner, incarnation=incarnation, seq=seq, id=ident,
                             fragment=index, base_version=base_version, version=version, tokens=tokens,
                             steps=steps, encoding=encoding, wire_bytes=frame.wire_bytes, state_bytes=nbytes,
                             commit_group=group, final=final)
        elif status == Status.DUPLICATE:
            self.events.emit("push_duplicate", learner=learner, incarnation=incarnation, seq=seq, id=ident,
                             fragment=index)
        else:
            self.events.emit("push_dropped", learner=learner, incarnation=incarnation, seq=seq, id=ident,
                             fragment=index, reason=Status.STALE, staleness=version - base_version,
                             max_staleness=self.cfg.max_staleness, tokens=tokens)
        with self.cond:
            versions = self._versions()
        return self._reply(wire.ACK, {"seq": seq, "fragment": index, "status": status, "version": version,
                                      "versions": versions})

    def _on_grad(self, frame: wire.Frame, learner: int, conn_id: int, sock: socket.socket) -> wire.Message | None:
        if self.sync is None:
            raise ProtocolError(Reason.PROTOCOL, "GRAD is for sync mode")
        h = frame.header
        rnd = wire.header_int(h, "round")
        tokens = wire.header_int(h, "tokens", maximum=self.bounds.max_step_tokens)
        position = wire.header_int(h, "position")
        try:
            grads = decode(frame.tensors(), "fp32", self.shapes)
        except ValueError as exc:
            raise ProtocolError(Reason.BAD_TENSOR, str(exc)) from exc
        with self.cond:
            m = self.members.current(learner, conn_id)
            if m is None:
                return None
            check_position(position, m.start, m.elapsed(self.monotonic()), self.bounds.max_step_rate,
                           self.train.sync_every)
            m.position = max(m.position, position)
            if rnd != self.sync.round:
                self.counters["resyncs"] += 1
                header = {"round": self.sync.round, "resync": True, "adam_step": self.sync.adam_step()}
                return self._reply(wire.MEAN, header, self.sync.state_tensors())
            self.sync.submit(learner, grads, tokens)
            m.busy = True
            deadline = self.monotonic() + self.cfg.idle_timeout
            try:
                while self.sync.round == rnd:
                    self._maybe_complete_round()
                    if self.sync.round != rnd:
                        break
                    if not self._running or self.monotonic() > deadline:
                        raise wire.DeadlineExceeded(f"round {rnd} did not complete")
                    self.cond.wait(0.05)
                    if _peer_closed(sock):
                        raise wire.PeerClosed("learner closed while waiting in the barrier")
            finally:
                m.busy = False
                m.last_seen = self.monotonic()
            mean = self.sync.mean_of(rnd)
            m.tokens += tokens
            if mean is None:  # evicted and overtaken meanwhile: hand over the current state
                self.counters["resyncs"] += 1
                header = {"round": self.sync.round, "resync": True, "adam_step": self.sync.adam_step()}
                return self._reply(wire.MEAN, header, self.sync.state_tensors())
        return self._reply(wire.MEAN, {"round": rnd, "resync": False}, mean)

    def _maybe_complete_round(self) -> None:
        """Sync mode, under the lock: reduce once every live learner has submitted."""
        assert self.sync is not None
        alive = {m.learner for m in self.members.alive()}
        if not self.sync.ready(alive) or self._waiting_for_start():
            return
        started = self.monotonic()
        info = self.sync.complete(self.train)
        self.events.emit("sync_step", round=info["round"], contributors=info["contributors"],
                         tokens=info["tokens"], seconds=self.monotonic() - started)
        if self.sync.round % self.cfg.sync_checkpoint_every == 0:
            nbytes, seconds = self.sync.checkpoint(self.store)
            self.events.emit("state_write", what="sync", bytes=nbytes, seconds=seconds, round=self.sync.round)
        if self.evaluator is not None:
            self.evaluator.note_merge()
        self.cond.notify_all()

    def _waiting_for_start(self) -> bool:
        """Sync mode, before the first round of a fresh run: wait (at most --start-wait s after
        the first gradient) until every configured learner has joined. A learner whose
        process started a second later would otherwise miss the first rounds and step
        alone at the end, and sync DP's result would hang on process start-up times."""
        assert self.sync is not None
        if self.sync.round > 0 or len(self.members.members) >= self.train.num_learners:
            return False
        if self._first_grad_at is None:
            self._first_grad_at = self.monotonic()
        return self.monotonic() - self._first_grad_at < self.cfg.start_wait

    # ----------------------------------------------------------------- leases
    def _reaper_loop(self) -> None:
        interval = self.train.heartbeat_interval / 2
        while self._running:
            time.sleep(interval)
            with self.cond:
                self.expire_leases(self.monotonic())

    def expire_leases(self, now: float) -> None:
        """Under the lock: every learner silent past its lease is no longer alive."""
        for m, silent in self.members.expire(now, self.train.heartbeat_timeout):
            self.counters["heartbeats_lost"] += 1
            self.events.emit("heartbeat_lost", learner=m.learner, incarnation=m.incarnation,
                             silent_for=round(silent, 3))
            self.cond.notify_all()

    # ----------------------------------------------------------------- merging
    def _effective_quorum(self) -> int:
        return self.rule.effective_quorum(len(self.members.alive()))

    def _decide(self, frag: FragmentState, now: float) -> Decision:
        """Why this fragment should merge now (reason None: not yet, until recheck_at), and
        what the grace window did: the merge rule asked with this fragment's state."""
        return self.rule.decide(frag.waiting(), frag.version, [m.learner for m in self.members.alive()], now,
                                frag.arrivals.predicted, round_period(frag.merge_times))

    def _merge_loop(self) -> None:
        if self.sync is not None:
            return
        while self._running:
            with self.cond:
                self.cond.wait(0.05)
                if not self.merge_due(self.monotonic()):
                    self.cond.wait(MERGE_RETRY_SECONDS)

    def merge_due(self, now: float) -> bool:
        """Under the lock: merge every fragment the merge rule says is due now. False if a
        merge failed: its pushes stay pending, and the next call tries again."""
        ok = True
        self._recheck_at = None
        for frag in self.frags:
            decision = self._decide(frag, now)
            why, grace = decision.reason, decision.info
            if not why or not self._running:
                self._recheck_at = earliest(self._recheck_at, decision.recheck_at)
                continue
            try:
                self._merge(frag, reason=why, grace=grace, final=why.startswith("final"))
                self._recheck_at = now  # the next decision may merge again (what is left pending)
            except Exception as exc:  # noqa: BLE001 - the pushes stay pending; retried next tick
                ok = False
                self._recheck_at = earliest(self._recheck_at, now + MERGE_RETRY_SECONDS)
                self.counters["merge_errors"] += 1
                self.events.emit("merge_failed", fragment=frag.spec.index, reason=why,
                                 error=describe_error(exc) if isinstance(exc, OSError)
                                 else f"{type(exc).__name__}: {exc}")
                if isinstance(exc, OSError):
                    self._storage_error(exc, f"fragment-{frag.spec.index}")
        return ok

    def _momentum_now(self, rounds: float) -> float:
        """The outer momentum after `rounds` merged rounds: ramped up over --momentum-warmup."""
        warmup = self.cfg.warmup_rounds
        return self.outer.momentum * (min(1.0, rounds / warmup) if warmup > 0 else 1.0)

    def _round_tokens(self, contribs: list[Contribution]) -> float:
        """The weight denominator of a merge: the tokens of a full round, in which every
        weighed learner would have reported. The learners that did report count with the
        tokens they pushed; each one missing counts with as many steps as the reporters'
        pushes span (at most H) at its own tokens per step (a task decides what a step
        weighs; a learner not heard from yet counts at the mean of the others).

        So a round in which everyone reported has weights summing to 1 however many steps
        its pushes span: the first, staggered push of fragment f spans (f+1)·H/P steps and a
        final push only the last stretch, and weighing them by steps/H instead threw most of
        that progress away (issue 18: the first round moved fragment 0 by a quarter of the
        learners' progress). A lone push of one of two learners still weighs 1/2."""
        reported: dict[int, tuple[int, int]] = {}
        for c in contribs:
            tokens, steps = reported.get(c.learner, (0, 0))
            reported[c.learner] = (tokens + max(0, c.tokens), steps + max(0, c.steps))
        total = float(sum(t for t, _ in reported.values()))
        missing = [m.learner for m in self.members.weighed() if m.learner not in reported]
        if not missing:
            return total
        known = list(self.step_tokens.values()) or [c.tokens / c.steps for c in contribs if c.steps > 0]
        if not known:
            return total
        mean = sum(known) / len(known)
        span = min(float(self.train.sync_every), sum(s for _, s in reported.values()) / len(reported))
        return total + span * sum(self.step_tokens.get(learner, mean) for learner in missing)

    def _outer_step(self, frag: FragmentState, contribs: list[Contribution], final: bool = False) -> "OuterStep":
        """The new state of a fragment after merging `contribs`, computed on copies."""
        if final:
            return self._final_step(frag, contribs)
        expected = self._round_tokens(contribs)
        policy = self.cfg.staleness_policy
        staleness = [frag.version - c.base_version for c in contribs]
        raw = merge_weights(contribs, expected)
        factors = staleness_factors(policy, staleness)
        delta, weights = merge(contribs, expected, self.train.sync_every, factors)
        params = {n: t.clone() for n, t in frag.params.items()}
        momentum = {n: t.clone() for n, t in frag.momentum.items()}
        accum = {n: t.clone() for n, t in frag.accum.items()}
        accum_count = frag.accum_count
        if policy == "delayed-nesterov":
            averaged = accum_count + 1
            accum_count, stepped = delayed_nesterov_step(params, momentum, accum, accum_count, delta, self.outer,
                                                         self.cfg.nesterov_delay)
            outer = {"step": "delayed-nesterov", "delay": self.cfg.nesterov_delay, "momentum_step": stepped,
                     "accum_count": accum_count, "averaged": averaged if stepped else 0}
        else:
            fraction = round_fraction(weights) if self.cfg.momentum_unit == "round" else 1.0
            mu = self._momentum_now(frag.rounds)
            nesterov_step(params, momentum, delta, OuterConfig(self.outer.lr, mu), fraction)
            outer = {"step": "nesterov", "momentum_step": True, "round_fraction": round(fraction, 4),
                     "momentum": round(mu, 4)}
        finite = all(bool(torch.isfinite(t).all()) for t in (*params.values(), *momentum.values(), *accum.values()))
        return OuterStep(expected, staleness, raw, factors, weights, params, momentum, accum, accum_count, outer,
                         finite)

    def _final_step(self, frag: FragmentState, contribs: list[Contribution]) -> "OuterStep":
        """The final round: Θ ← Θ − Σ_l w_l·D_l, where D_l is all of learner l's progress not
        yet merged (the sum of its pending pushes) and w_l its share of their tokens. With
        every learner in, Θ becomes the token-weighted mean of the learners' last models.
        No outer momentum or learning rate: nothing comes after this step to correct an
        extrapolation, and a weight per round (steps/H) would apply only part of a short
        last stretch, leaving fragments at different points of training."""
        delta, weights = final_average(contribs)
        params = {n: t.clone() for n, t in frag.params.items()}
        with torch.no_grad():
            for name, d in delta.items():
                params[name].sub_(d)
        momentum = {n: t.clone() for n, t in frag.momentum.items()}
        accum = {n: t.clone() for n, t in frag.accum.items()}
        staleness = [frag.version - c.base_version for c in contribs]
        finite = all(bool(torch.isfinite(t).all()) for t in params.values())
        return OuterStep(0.0, staleness, weights, [1.0] * len(contribs), weights, params, momentum, accum,
                         frag.accum_count, {"step": "final-average", "momentum_step": False}, finite)

    def _mergeable_step(self, frag: FragmentState, taken: list[PendingPush],
                        final: bool = False) -> tuple["OuterStep | None", list[PendingPush]]:
        """The outer step over the pushes that can be merged, and those pushes. A push that
        makes the merge raise or turn Θ non-finite is quarantined, and the merge goes on
        with the others: one bad push never takes the good ones down with it, and a
        non-finite Θ is never committed."""
        kept = list(taken)
        for _ in range(len(taken)):
            try:
                step = self._outer_step(frag, [p.contribution for p in kept], final)
                if step.finite:
                    return step, kept
                reason, detail = Reason.NONFINITE_MERGE, "merging it would make the global parameters non-finite"
            except Exception as exc:  # noqa: BLE001 - whatever a push holds, the others still merge
                reason, detail = Reason.MERGE_ERROR, f"{type(exc).__name__}: {exc}"
            culprit = self._culprit(frag, kept)
            self.quarantine.put(culprit.path, culprit.contribution.ident, frag.spec.index,
                                culprit.contribution.learner, reason, detail, acknowledged=True)
            frag.merging.discard(culprit.contribution.ident)
            kept.remove(culprit)
            if not kept:
                break
        return None, []

    def _culprit(self, frag: FragmentState, kept: list[PendingPush]) -> PendingPush:
        """The push that cannot be merged even alone, else the one with the largest norm."""
        for p in kept:
            try:
                if not self._outer_step(frag, [p.contribution]).finite:
                    return p
            except Exception:  # noqa: BLE001
                return p
        return max(kept, key=lambda p: tensor_norm(p.contribution.delta))

    def _merge(self, frag: FragmentState, reason: str, grace: dict | None = None, final: bool = False) -> None:
        """Apply one outer step to a fragment. Called under the lock, which it releases
        while the new state is written.

        The durable write of the new fragment file is the commit point: only after it
        are the pending files deleted and the new version served. Pushes accepted during
        the write stay pending for the next merge.
        """
        started = self.monotonic()
        taken = list(frag.pending)
        frag.pending = []
        frag.merging.update(p.contribution.ident for p in taken)
        step, taken = self._mergeable_step(frag, taken, final)
        if step is None:  # every push was quarantined: nothing to commit
            return
        contribs = [p.contribution for p in taken]
        expected, staleness, raw, factors, weights = step.expected, step.staleness, step.raw, step.factors, step.weights
        params, momentum, accum, accum_count, outer = step.params, step.momentum, step.accum, step.accum_count, step.outer
        if self.defect == "merge_nothing":  # the outer step is lost; everything else goes on as usual
            params = {n: t.clone() for n, t in frag.params.items()}
        policy = self.cfg.staleness_policy
        finite = True
        applied = frag.applied + [c.ident for c in contribs]
        tokens = frag.tokens + sum(max(0, c.tokens) for c in contribs)
        rounds = frag.rounds + round_fraction(weights)
        version = frag.version + 1
        frag.writing = True
        before = frag.params  # nothing replaces it while this merge is written
        self.cond.release()
        try:
            # How far Θ_f really moved, measured on the tensors committed (off the lock): a
            # merge that moved nothing has merged nothing, whatever its contributors.
            moved = _relative_change(before, params)
            write_started = self.monotonic()
            if self.defect == "ack_before_durable" and self.monotonic() - self._last_flush < defects.FLUSH_EVERY:
                nbytes = 0
            else:
                nbytes = self.store.write_fragment(frag.spec.index, params, momentum, version, applied,
                                                   accum, accum_count, tokens, rounds)
                self._last_flush = self.monotonic()
            write_seconds = self.monotonic() - write_started
        except BaseException:
            self.cond.acquire()
            frag.writing = False
            frag.pending = taken + frag.pending  # nothing was committed: keep them pending
            frag.merging.difference_update(c.ident for c in contribs)
            raise
        # Past the commit point (the fragment file's ledger holds every id) the pending files
        # are redundant, and recovery drops any left; deleting N of them is kept off the lock.
        for p in taken:
            try:
                self.store.storage.unlink(p.path)
            except OSError:
                pass
        self.cond.acquire()
        frag.writing = False
        frag.params, frag.momentum = params, momentum
        frag.accum, frag.accum_count = accum, accum_count
        frag.version = version
        frag.tokens = tokens
        frag.rounds = rounds
        frag.merge_times = (frag.merge_times + [self.monotonic()])[-MERGE_TIMES_KEPT:]
        frag.applied = applied
        if self.served is not None:
            self.served[frag.spec.index].advance(params, version)
        frag.applied_set.update(c.ident for c in contribs)
        frag.merging.difference_update(c.ident for c in contribs)
        self.counters["merges"] += 1
        self.events.emit(
            "merge", fragment=frag.spec.index, version=version, reason=reason, final=final,
            quorum=self._effective_quorum(), alive=[m.learner for m in self.members.alive()],
            staleness_policy=policy, grace_policy=self.cfg.grace_policy,
            grace=grace or {"policy": self.cfg.grace_policy, "waited": None, "why": "merged directly"},
            outer=outer,
            contributors=[{"id": c.ident, "learner": c.learner, "incarnation": c.incarnation, "seq": c.seq,
                           "tokens": c.tokens, "base_version": c.base_version,
                           "staleness": s, "raw_weight": round(r, 4), "discount": round(f, 4),
                           "weight": round(w, 4), "steps": c.steps}
                          for c, s, r, f, w in zip(contribs, staleness, raw, factors, weights)],
            tokens=sum(c.tokens for c in contribs), expected_tokens=expected, moved=moved,
            fragment_share=frag.spec.numel / sum(s.numel for s in self.specs),
            finite=finite, state_bytes=nbytes, seconds=round(self.monotonic() - started, 4))
        self.events.emit("state_write", what=f"fragment-{frag.spec.index}", bytes=nbytes,
                         seconds=round(write_seconds, 4), version=version)
        if self.evaluator is not None:
            self.evaluator.note_merge()
        self.cond.notify_all()


def _relative_change(before: dict[str, torch.Tensor], after: dict[str, torch.Tensor]) -> float:
    """||after − before|| / ||before|| over a fragment's tensors (||after − before|| when
    `before` is all zero); 7 significant digits, so that a real step never rounds to 0."""
    with torch.no_grad():
        diff = sum(float(torch.linalg.vector_norm(after[n] - before[n])) ** 2 for n in before) ** 0.5
        norm = sum(float(torch.linalg.vector_norm(before[n])) ** 2 for n in before) ** 0.5
    value = diff / norm if norm > 0 else diff
    return float(f"{value:.7g}") if value == value else value


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
