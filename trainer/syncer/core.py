"""The syncer's decisions, with no socket, thread, lock or clock of its own (sans-IO).

Inputs come in with the time (a clock handed in: the live one, or a simulator's), and
every answer goes out as a return value: the reply to a frame, a push ticket whose
durable write the caller makes, a merge plan whose fragment file the caller writes,
when to be ticked next. What it decides: a learner's HELLO and membership (leases,
incarnations), a push's admission and validation, the ledger and deduplication, the
merge decision (quorum, grace, staleness, the final round), the outer step, sync mode's
rounds, and recovery from durable state. Events go to the log it is handed.

Callers serialise their calls (the live service holds one lock around each; the
simulator has one thread). The durable state is read and written through one storage
seam (storage.py: files, or a simulated disk).
"""
from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from .. import defects, wire
from ..admission import Throttle
from ..clock import boot_stamp, downtime_since
from ..codec import decode, encode
from ..config import SyncerConfig, TrainConfig
from ..events import EventLog
from ..fragments import partition
from ..global_eval import Snapshot
from ..membership import Member, Membership
from ..merge_rule import MERGE_TIMES_KEPT, Decision, MergeRule, earliest, is_stale, round_period
from ..outer import Contribution, push_id, round_fraction, round_scale
from ..protocol import MAX_POLL_MS, FrameType, ProtocolError, Reason, Status
from ..quarantine import Quarantine
from ..ranks import param_digest
from ..served import DELTA_ENCODINGS, ServedFragment
from ..state import StateDir, load_tensors, read_json, remove_stale_temporaries
from ..storage import FILES, Storage, describe_error, is_full
from ..sync_state import SyncRound
from ..task import load_task
from ..validation import DEFAULT_MAX_STEP_TOKENS, NormGuard, PushBounds, check_position, tensor_norm
from .fragment_state import FragmentState, PendingPush
from .outer_step import OuterStep, OuterStepper

MERGE_RETRY_SECONDS = 0.5  # a merge that failed (its pushes stay pending) is tried again after this
ADMISSION_REASONS = frozenset({Reason.HANDSHAKE_TIMEOUT, Reason.CONNECTION_LIMIT, Reason.UNAUTHENTICATED_LIMIT,
                               Reason.IDLE_TIMEOUT})


@dataclass
class Joined:
    """A HELLO admitted: the member it made, and whether its incarnation must be made
    durable (meta.json) before it is welcomed."""

    learner: int
    incarnation: int
    rejoin: bool
    reconnect: bool
    must_persist: bool
    want_params: bool
    seeded: bool


@dataclass
class Poll:
    """A heartbeat's long poll: answer once a version passes `known`, or after `wait_ms`."""

    wait_ms: int
    known: list[int]


@dataclass
class PushRequest:
    """A push parsed and decoded (off the lock: nothing in it reads shared state)."""

    learner: int
    index: int
    incarnation: int
    seq: int
    base_version: int
    tokens: int
    steps: int
    position: int
    encoding: str
    final: bool
    step_tokens: float
    delta: dict[str, torch.Tensor]
    per_round_norm: float
    payload: bytes
    wire_bytes: int

    @property
    def ident(self) -> str:
        return push_id(self.learner, self.incarnation, self.seq)


@dataclass
class PushTicket:
    """A push decided: its status, and for an accepted one, the file to make durable
    (`path`, `meta` beside the payload) before `push_durable` enters it in memory."""

    request: PushRequest
    status: Status
    version: int
    path: Path | None = None
    meta: dict = field(default_factory=dict)
    write_first: bool = True  # False only under the ack_before_durable defect


@dataclass
class MergePlan:
    """A merge computed and reserved, to be written (off the lock) and then committed or
    aborted. `write` False: the ack_before_durable defect skips this write."""

    frag: FragmentState
    reason: str
    grace: dict
    final: bool
    taken: list[PendingPush]
    step: OuterStep
    params: dict[str, torch.Tensor]
    applied: list[str]
    tokens: int
    rounds: float
    version: int
    before: dict[str, torch.Tensor]
    started: float
    write: bool

    @property
    def contribs(self) -> list[Contribution]:
        return [p.contribution for p in self.taken]


@dataclass
class MergeWritten:
    """What writing a merge plan took: bytes, seconds, and how far Θ_f moved."""

    nbytes: int
    seconds: float
    moved: float


@dataclass
class RoundWait:
    """Sync mode: a gradient submitted for `round`, waiting for the round to complete."""

    learner: int
    member: Member
    round: int
    tokens: int
    deadline: float


class SyncerCore:
    def __init__(self, cfg: SyncerConfig, train: TrainConfig, storage: Storage = FILES,
                 monotonic: Callable[[], float] = time.monotonic, events: EventLog | None = None,
                 stamp: Callable[[], dict] = boot_stamp, run_dir: str | None = None) -> None:
        # Every reading of elapsed time (leases, grace, rate bounds, deadlines) comes from
        # `monotonic`, every event goes to `events`, and the boot clock's stamp from `stamp`:
        # a simulator hands in its virtual clock and its own log (chaos/sim).
        self.monotonic = monotonic
        self.stamp = stamp
        self.cfg = cfg
        self.train = train
        self.rule = MergeRule(cfg.quorum, cfg.grace, cfg.grace_policy, cfg.final_wait)
        self.stepper = OuterStepper(cfg, train.sync_every)
        self.recheck_at: float | None = None  # when the merge rule's answer next changes with no input
        # Bumped by every input that can change a merge decision (who is alive, what is
        # pending, a version): a stepped owner ticks after those, and not after the rest
        # (a heartbeat that only renews a lease, a pull, a duplicate).
        self.changes = 0
        self.events = events or EventLog(run_dir, "syncer")
        self.defect = defects.active()
        self.store = StateDir(cfg.state_dir, storage)
        # Set once a sync failed: the disk is not trusted, and every push is refused until a
        # restart reads the state back (docs/durability.md).
        self.disk_failed = False
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
        self.frags: list[FragmentState] = []
        self._seeded_digest: str | None = None
        self._first_grad_at: float | None = None  # sync mode: when the first round began to wait
        self.sync: SyncRound | None = None
        self.report = Throttle(self.events.emit, clock=self.monotonic)
        self.bounds = PushBounds(cfg.max_step_rate, cfg.max_step_tokens or DEFAULT_MAX_STEP_TOKENS, train.sync_every)
        self.quarantine = Quarantine(self.store.root / "quarantine", self.events, self.counters, self.store.storage)
        self._recover(model)
        # Delta pulls (served.py): Φ per fragment, from the recovered Θ (nothing of it is durable).
        self.served = [ServedFragment(f.params, f.version, train.pull_encoding) for f in self.frags] \
            if train.pull_encoding in DELTA_ENCODINGS else None
        self.norms = [NormGuard(cfg.max_norm_ratio) for _ in self.specs]

    # ----------------------------------------------------------------- recovery
    def fingerprint(self) -> dict:
        return {"mode": self.train.mode, "model": self.train.model.to_dict(), "task": self.train.task,
                "fragments": self.train.fragments, "seed": self.train.seed,
                # Only when not the default, so state dirs written before the layout existed still match.
                **({"fragment_layout": self.train.fragment_layout}
                   if self.train.fragment_layout != "balanced" else {})}

    def _recover(self, model: torch.nn.Module) -> None:
        removed = remove_stale_temporaries(self.store.root, self.store.storage)
        if self.train.mode != "sync":
            # Made here, on one thread: two pushes that both found a fragment's directory
            # missing raced, and the one whose mkdir lost acknowledged its file in a directory
            # the other had not yet made durable in its parent.
            for spec in self.specs:
                self.store.storage.mkdir(self.store.pending_dir(spec.index))
        self.store.storage.sync_tree(self.store.root)  # what recovery reads is durable before it acts
        meta = read_json(self.store.meta_path, self.store.storage)
        if meta is not None:
            stored = {"task": "gpt", **(meta.get("fingerprint") or {})}  # state written before tasks: gpt
            if stored != self.fingerprint():
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

    # ----------------------------------------------------------------- durable meta
    def meta_document(self) -> dict:
        """meta.json's content: members and counters."""
        return {"fingerprint": self.fingerprint(), "members": self.members.persistent(self.monotonic()),
                "counters": dict(self.counters), "clock": self.stamp()}

    def meta_written(self, nbytes: int, files: int, document: dict) -> None:
        self.members.note_durable(document["members"])
        self.counters["state_writes"] += 1
        self.counters["state_bytes"] += nbytes
        if files:
            self.counters["commit_groups"] += 1

    def storage_error(self, exc: OSError, what: str, sync_failed: bool, cause: BaseException | None = None) -> bool:
        """Count and report a disk error; a failed sync also marks the disk failed, once.
        True when this call is the one that marked it."""
        reason = Reason.STORAGE_FULL if is_full(exc) else Reason.STORAGE_IO
        self.counters[f"storage_{'full' if reason == Reason.STORAGE_FULL else 'error'}"] += 1
        self.report("storage_error", reason, what=what, detail=describe_error(exc), sync_failed=sync_failed)
        if not sync_failed or self.disk_failed:
            return False
        self.disk_failed = True
        self.counters["disk_failed"] += 1
        self.events.emit("disk_failed", what=what, detail=describe_error(cause or exc),
                         action="refuse every push and exit for a restart that reads the state back")
        return True

    @staticmethod
    def not_stored(exc: OSError, what: str) -> ProtocolError:
        """The refusal of a request whose durable write failed: the disk's fault, not the learner's."""
        return ProtocolError(Reason.STORAGE_FULL if is_full(exc) else Reason.STORAGE_IO,
                             f"{what} not stored: {describe_error(exc)}")

    # ----------------------------------------------------------------- lifecycle events
    def started(self, address: tuple[str, int]) -> None:
        self.events.emit("process_start", role="syncer", mode=self.train.mode, defect=self.defect,
                         address=list(address), config=self.train.to_dict(),
                         syncer={"quorum": self.cfg.quorum, "grace": self.cfg.grace,
                                 "grace_policy": self.cfg.grace_policy,
                                 "max_staleness": self.cfg.max_staleness,
                                 "staleness_policy": self.cfg.staleness_policy,
                                 "nesterov_delay": self.cfg.nesterov_delay,
                                 "momentum_unit": self.cfg.momentum_unit,
                                 "momentum_warmup": self.cfg.warmup_rounds,
                                 "outer_lr": self.cfg.outer_lr, "outer_momentum": self.cfg.outer_momentum,
                                 "eval_data": self.cfg.eval_data or None, "eval_budget": self.cfg.eval_budget})

    def final_state(self) -> None:
        """The final state as an event, and the refusals the throttle held back."""
        final: dict = {"mode": self.train.mode, "counters": dict(self.counters), "members": self.members.persistent()}
        if self.sync is None:
            final["versions"] = self.versions()
            final["applied"] = {str(f.spec.index): f.applied for f in self.frags}
            final["finite"] = all(bool(torch.isfinite(t).all()) for f in self.frags for t in f.params.values())
        else:
            final["round"] = self.sync.round
        self.events.emit("final_state", **final)
        held = self.report.flush()
        if held:
            self.events.emit("events_suppressed", counts=held)

    def snapshot(self) -> Snapshot:
        """Θ as it stands, for the evaluator (copied: it is scored outside the caller's lock)."""
        if self.sync is not None:
            params = {n: p.detach().clone() for n, p in self.sync.model.named_parameters()}
            return Snapshot(params, [self.sync.round], float(sum(m.tokens for m in self.members.members.values())))
        params = {n: t.clone() for f in self.frags for n, t in f.params.items()}
        total = sum(s.numel for s in self.specs)
        tokens = sum(f.tokens * f.spec.numel / total for f in self.frags)
        return Snapshot(params, self.versions(), tokens)

    def versions(self) -> list[int]:
        return [f.version for f in self.frags]

    # ----------------------------------------------------------------- refusals
    def refused_connection(self, reason: Reason, detail: str, peer: tuple, learner: int | None = None) -> None:
        """Count an admission refusal or timeout, and report it (throttled)."""
        self.counters[f"refused_{reason}"] += 1
        self.counters["refused_connections"] += 1
        self.report("connection_refused", reason, detail=detail, from_learner=learner, peer=f"{peer[0]}:{peer[1]}")

    def refusal(self, exc: ProtocolError, learner: int | None, peer: tuple) -> wire.Message | None:
        """Count and report a refusal; the ERROR that answers it, when a session exists."""
        if exc.reason in ADMISSION_REASONS:
            self.refused_connection(exc.reason, exc.detail, peer, learner)
        else:
            self.counters[f"rejected_{exc.reason}"] += 1
            self.counters["rejected_frames"] += 1
            self.report("frame_rejected", exc.reason, detail=exc.detail, from_learner=learner,
                        peer=f"{peer[0]}:{peer[1]}")
        if exc.reason == Reason.HANDSHAKE_TIMEOUT:
            return None
        return wire.message(FrameType.ERROR, {"reason": str(exc.reason), "detail": exc.detail[:1000]})

    # ----------------------------------------------------------------- membership
    @staticmethod
    def check_identity(hello: wire.Frame, identity: int) -> None:
        """A HELLO speaks only for the learner whose key keyed the connection (keys.py)."""
        named = wire.header_int(hello.header, "learner")
        if named != identity:
            raise ProtocolError(Reason.BAD_IDENTITY,
                                f"HELLO as learner {named} on a connection opened with learner "
                                f"{identity}'s key: a learner speaks only as itself")

    def hello(self, frame: wire.Frame, conn_id: int) -> Joined:
        """Admit a HELLO: the learner joins (a new incarnation, a rejoin or a reconnect)."""
        h = frame.header
        learner = wire.header_int(h, "learner")
        nonce = wire.header_str(h, "nonce")
        mode = wire.header_str(h, "mode")
        if mode != self.train.mode:
            raise ProtocolError(Reason.MODE_MISMATCH, f"syncer runs in {self.train.mode} mode, learner asked for {mode}")
        problem = self.members.check_learner(learner)
        if problem:
            raise ProtocolError(Reason.BAD_LEARNER, problem)
        joined = self.members.join(learner, nonce, conn_id, self.monotonic())
        self.changes += 1
        # A new incarnation's number is never reused, even after a crash: it is durable before
        # it is welcomed. A reconnect changes nothing durable (no fsync per reconnect), unless
        # the write of its incarnation failed and it was never welcomed.
        must_persist = not joined.reconnect or not self.members.is_durable(learner)
        return Joined(learner, joined.incarnation, joined.rejoin, joined.reconnect, must_persist,
                      bool(h.get("want_params", True)), h.get("seeded", False) is True)

    def welcome(self, joined: Joined) -> tuple[dict, dict[str, torch.Tensor] | None]:
        """The WELCOME's header and tensors for a learner that joined (its incarnation durable)."""
        m = self.members.members[joined.learner]
        header = {"learner": joined.learner, "incarnation": joined.incarnation, "rejoin": joined.rejoin,
                  "position": m.position, "config": self.train.to_dict(),
                  "fragments": [list(s.names) for s in self.specs]}
        if self.sync is None:
            header["versions"] = self.versions()
            tensors = {n: t.clone() for f in self._served_params() for n, t in f.items()} \
                if joined.want_params else None
            if tensors is not None and joined.seeded and not any(header["versions"]):
                # Θ is still the seeded initial model: a digest instead of 4 B/param. The
                # learner builds the same model from the seed, or asks again for the tensors.
                header["params_digest"] = self._initial_digest(tensors)
                tensors = None
        else:
            header["round"] = self.sync.round
            header["adam_step"] = self.sync.adam_step()
            tensors = self.sync.state_tensors() if joined.want_params else None
        self.events.emit("join", learner=joined.learner, incarnation=joined.incarnation, rejoin=joined.rejoin,
                         reconnect=joined.reconnect, position=m.position)
        return header, tensors

    def _served_params(self) -> list[dict[str, torch.Tensor]]:
        """What a learner starts from, per fragment: Θ, or Φ with delta pulls (it must hold
        exactly what the steps it pulls later are measured from)."""
        return [f.params for f in self.served] if self.served is not None else [f.params for f in self.frags]

    def _initial_digest(self, params: dict[str, torch.Tensor]) -> str:
        """The digest of Θ at version 0 (computed once: Θ changes only by a merge)."""
        if self._seeded_digest is None:
            self._seeded_digest = param_digest(params)
        return self._seeded_digest

    def renew(self, learner: int, conn_id: int) -> Member | None:
        """A frame of a welcomed connection: its learner's lease is renewed. None when a newer
        connection of the same learner superseded this one (the frame is not served)."""
        m = self.members.current(learner, conn_id)
        if m is None:
            return None
        if self.members.touch(m, self.monotonic()):
            self.changes += 1
            self.events.emit("join", learner=learner, incarnation=m.incarnation, rejoin=False,
                             reason="lease renewed")
        return m

    def connection_closed(self, conn_id: int, learner: int | None, reason: str) -> None:
        """A connection ended: the learner it spoke for is no longer connected through it."""
        if learner is not None:
            m = self.members.disconnect(learner, conn_id)
            if m is not None:
                self.changes += 1
                self.events.emit("leave", learner=learner, incarnation=m.incarnation, reason=reason)

    def bye(self, learner: int) -> wire.Message:
        m = self.members.members.get(learner)
        if m is not None:
            self.members.finish(m)
            self.changes += 1
        return wire.message(FrameType.ACK, {"status": Status.BYE})

    def expire_leases(self, now: float) -> bool:
        """Every learner silent past its lease is no longer alive. True if one expired."""
        expired = False
        for m, silent in self.members.expire(now, self.train.heartbeat_timeout):
            expired = True
            self.changes += 1
            self.counters["heartbeats_lost"] += 1
            self.events.emit("heartbeat_lost", learner=m.learner, incarnation=m.incarnation,
                             silent_for=round(silent, 3))
        return expired

    def next_due(self) -> float | None:
        """When the core's answer next changes with no new input: the earliest lease to run
        out, or merge-rule window to close (decoupled mode)."""
        due = self.members.next_expiry(self.train.heartbeat_timeout)
        return due if self.sync is not None else earliest(due, self.recheck_at)

    # ----------------------------------------------------------------- heartbeats and pulls
    def poll(self, header: dict) -> Poll:
        """A heartbeat's long-poll fields, checked: Poll(0, []) for a plain heartbeat (and in
        sync mode, which has no versions to wait for). A longer ask waits MAX_POLL_MS."""
        if "wait_ms" not in header or self.sync is not None:
            return Poll(0, [])
        wait_ms = min(MAX_POLL_MS, wire.header_int(header, "wait_ms"))
        known = header.get("versions")
        if not isinstance(known, list) or len(known) != len(self.frags) or not all(
                isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= wire.MAX_SAFE_INT for v in known):
            raise wire.FrameFault(Reason.BAD_HEADER, f"header field 'versions' must list {len(self.frags)} "
                                                     f"integers >= 0 (one per fragment), got {known!r:.80}")
        return Poll(wait_ms, known)

    def passed(self, known: list[int]) -> bool:
        """A version has passed one a long poll knows: answer it now."""
        return any(f.version > k for f, k in zip(self.frags, known))

    def beat(self, learner: int | None = None) -> wire.Message:
        """A heartbeat's answer: the fragments' versions and how many learners are alive, and
        for the learner asking, how many of its pushes of each fragment are not merged yet."""
        header: dict = {"versions": self.versions(), "alive": len(self.members.alive())}
        if self.sync is not None:
            header["round"] = self.sync.round
        elif learner is not None:
            header["waiting"] = self.waiting(learner)
        return wire.message(wire.BEAT, header)

    def waiting(self, learner: int) -> list[int]:
        """Per fragment, the pushes of `learner` stored or being stored and not merged: none
        means each push it was answered for is in a version it can pull now (or quarantined).
        An ACK's promised version is not enough to wait on: a restarted syncer knows no
        promises, and merges every recovered push in its first merge, which can come a
        version before the one promised to a push accepted while a merge failed to be
        written (a learner awaiting that version waited for ever when it pushed alone)."""
        prefix = f"{learner}:"
        return [sum(1 for p in f.pending if p.contribution.learner == learner)
                + sum(1 for i in f.merging | f.reserved if i.startswith(prefix)) for f in self.frags]

    def pull(self, frame: wire.Frame) -> tuple[dict, dict[str, torch.Tensor], str | None]:
        """A PULL's answer: its header, tensors, and the encoding they still need (None: the
        tensors are encoded already, a delta pull's). Copies: encoded off the caller's lock."""
        if self.sync is not None:
            raise ProtocolError(Reason.PROTOCOL, "PULL is for decoupled mode")
        index = wire.header_int(frame.header, "fragment")
        if index >= len(self.frags):
            raise ProtocolError(Reason.BAD_FRAGMENT, f"fragment {index} does not exist (0..{len(self.frags) - 1})")
        have = wire.header_int(frame.header, "have") if "have" in frame.header else None
        if self.served is not None:
            encoding, start, tensors = self.served[index].reply(have)
            header = {"fragment": index, "version": self.served[index].version, "encoding": encoding}
            if start is not None:
                header["from"] = start
                return header, tensors, None
            return header, tensors, encoding
        frag = self.frags[index]
        header = {"fragment": index, "version": frag.version, "encoding": self.train.pull_encoding}
        return header, {n: t.clone() for n, t in frag.params.items()}, self.train.pull_encoding

    @staticmethod
    def pulled(header: dict, tensors: dict[str, torch.Tensor], encoding: str | None) -> wire.Message:
        return wire.message(wire.FRAGMENT, header, tensors if encoding is None else encode(tensors, encoding))

    # ----------------------------------------------------------------- pushes
    def parse_push(self, frame: wire.Frame, learner: int) -> PushRequest:
        """A PUSH's fields and tensors, checked and decoded. Reads nothing that changes (the
        fragments' specs and shapes only), so the caller runs it off its lock."""
        if self.sync is not None:
            raise ProtocolError(Reason.PROTOCOL, "PUSH is for decoupled mode")
        h = frame.header
        index = wire.header_int(h, "fragment")
        if index >= len(self.specs):
            raise ProtocolError(Reason.BAD_FRAGMENT, f"fragment {index} does not exist (0..{len(self.specs) - 1})")
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
        try:
            delta = decode(frame.tensors(), encoding, {n: self.shapes[n] for n in spec.names})
        except ValueError as exc:
            raise ProtocolError(Reason.BAD_TENSOR, str(exc)) from exc
        per_round_norm = tensor_norm(delta) * round_scale(steps, self.train.sync_every)
        return PushRequest(learner, index, incarnation, seq, base_version, tokens, steps, position, encoding, final,
                           step_tokens, delta, per_round_norm, frame.payload, frame.wire_bytes)

    def admit_push(self, req: PushRequest) -> PushTicket:
        """Validate a push against the run (validation.py) and the ledger: accepted (its id
        reserved while its file is written), a duplicate, or stale. Nothing a push claims
        is acknowledged before it is checked."""
        if self.disk_failed:
            raise ProtocolError(Reason.STORAGE_IO, "the syncer's disk failed a sync: nothing is stored until it "
                                                   "restarts and reads its state back")
        ident = req.ident
        m = self.members.members[req.learner]
        if req.incarnation != m.incarnation:
            raise ProtocolError(Reason.BAD_INCARNATION,
                                f"push from incarnation {req.incarnation}, current is {m.incarnation}")
        frag = self.frags[req.index]
        if ident in frag.reserved:
            # Its first attempt's file is still being written (a learner whose deadline passed
            # sent it again): "duplicate" would acknowledge a push that may not become durable.
            self.counters["in_flight_retries"] += 1
            raise ProtocolError(Reason.IN_FLIGHT, f"push {ident}: its first attempt is still being stored; "
                                                  "send it again later")
        known = frag.known(ident)
        if not known:
            # After the ledger: a push stored before this syncer went back is a duplicate, even
            # if its retry says it was made on a version since lost (its learner rebased it).
            if req.base_version > frag.version:
                raise ProtocolError(Reason.OUT_OF_BOUNDS, f"base_version={req.base_version} is ahead of fragment "
                                                          f"{req.index}'s version {frag.version}")
            elapsed = m.elapsed(self.monotonic())
            self.bounds.check_counts(steps=req.steps, tokens=req.tokens, step_tokens=req.step_tokens,
                                     claimed=m.claimed.get(req.index, 0), elapsed=elapsed)
            check_position(req.position, m.start, elapsed, self.bounds.max_step_rate, self.train.sync_every)
            self.norms[req.index].check(req.per_round_norm, lambda: tensor_norm(frag.params))
        if known and self.defect != "double_apply":
            self.counters["duplicates"] += 1
            # Answered with the version that holds it: the learner awaits that one, as for an
            # accepted push, and does not push the fragment again while this one is pending.
            return PushTicket(req, Status.DUPLICATE, frag.holding_version(ident))
        if is_stale(frag.version, req.base_version, self.cfg.max_staleness):
            self.counters["dropped_stale"] += 1
            return PushTicket(req, Status.STALE, frag.version)
        frag.reserved.add(ident)  # reserve the id while its file is written
        # Its steps are claimed now, so that a second push admitted while this one is written
        # is bounded with them; a write that fails gives them back (_unclaim).
        m.claimed[req.index] = m.claimed.get(req.index, 0) + req.steps
        meta = {"fragment": req.index, "learner": req.learner, "incarnation": req.incarnation, "seq": req.seq,
                "tokens": req.tokens, "steps": req.steps, "base_version": req.base_version,
                "encoding": req.encoding, "final": int(req.final)}
        return PushTicket(req, Status.ACCEPTED, frag.version, self.store.pending_path(req.index, ident), meta,
                          write_first=self.defect != "ack_before_durable")

    def push_durable(self, ticket: PushTicket) -> None:
        """An accepted push's file is durable and in place: it enters memory. The id moves
        from reserved to pending in one step: a retry never finds it in neither."""
        req, frag = ticket.request, self.frags[ticket.request.index]
        frag.reserved.discard(req.ident)
        # The next merge of this fragment will include this push: the one after a merge being
        # written now, which took its pushes before this one arrived.
        ticket.version = frag.version + (1 if frag.writing else 0)
        if frag.known(req.ident) and self.defect != "double_apply":
            # Durable under this id already (two attempts' files, at one path): entered once,
            # and its steps claimed once.
            self.counters["durable_again"] += 1
            self._unclaim(req)
            return
        self.norms[req.index].note(req.per_round_norm)  # a push the median learns from is stored
        accepted_at = self.monotonic()
        contribution = Contribution(req.learner, req.incarnation, req.seq, req.tokens, req.base_version, req.delta,
                                    req.steps)
        assert ticket.path is not None
        frag.pending.append(PendingPush(contribution, req.steps, req.encoding, ticket.path, accepted_at, req.final))
        frag.arrivals.note(req.learner, req.incarnation, accepted_at)
        m = self.members.members[req.learner]
        m.position = max(m.position, req.position)
        m.tokens += req.tokens
        if req.step_tokens > 0:
            self.step_tokens[req.learner] = float(req.step_tokens)
        self.counters["accepted"] += 1
        self.changes += 1

    def push_failed(self, ticket: PushTicket) -> None:
        """An accepted push's write failed, or will never be durable: its reserved id is
        released (the learner keeps it and retries)."""
        self.frags[ticket.request.index].reserved.discard(ticket.request.ident)
        self._unclaim(ticket.request)

    def _unclaim(self, req: PushRequest) -> None:
        """Give back the steps admission claimed for a push that was not entered: its retry
        claims them again, and must not be bounded by them twice."""
        m = self.members.members.get(req.learner)
        if m is None or m.incarnation != req.incarnation:
            return  # a new incarnation started its claims afresh
        left = m.claimed.get(req.index, 0) - req.steps
        if left > 0:
            m.claimed[req.index] = left
        else:
            m.claimed.pop(req.index, None)

    def still_storing(self, ticket: PushTicket, detail: str) -> ProtocolError:
        """The refusal of a push whose write outlived its wait: its group decides, and the
        learner retries the same id later (then a duplicate, or accepted anew)."""
        self.counters["store_waits_given_up"] += 1
        return ProtocolError(Reason.IN_FLIGHT, f"push {ticket.request.ident}: {detail}")

    def push_answer(self, ticket: PushTicket, nbytes: int = 0, group: int = 0) -> wire.Message:
        """The ACK of a decided push (an accepted one once durable), and its event."""
        req = ticket.request
        fields = dict(learner=req.learner, incarnation=req.incarnation, seq=req.seq, id=req.ident, fragment=req.index)
        if ticket.status == Status.ACCEPTED:
            self.events.emit("push_accepted", **fields, base_version=req.base_version, version=ticket.version,
                             tokens=req.tokens, steps=req.steps, position=req.position, encoding=req.encoding,
                             wire_bytes=req.wire_bytes,
                             state_bytes=nbytes, commit_group=group, final=req.final)
        elif ticket.status == Status.DUPLICATE:
            self.events.emit("push_duplicate", **fields)
        else:
            self.events.emit("push_dropped", **fields, reason=Status.STALE,
                             staleness=ticket.version - req.base_version, max_staleness=self.cfg.max_staleness,
                             tokens=req.tokens)
        return wire.message(wire.ACK, {"seq": req.seq, "fragment": req.index, "status": ticket.status,
                                       "version": ticket.version, "versions": self.versions()})

    # ----------------------------------------------------------------- sync mode
    def parse_grad(self, frame: wire.Frame) -> tuple[int, int, int, dict[str, torch.Tensor]]:
        """A GRAD's round, tokens, position and gradients, checked (off the caller's lock)."""
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
        return rnd, tokens, position, grads

    def submit_grad(self, learner: int, conn_id: int, rnd: int, tokens: int, position: int,
                    grads: dict[str, torch.Tensor]) -> wire.Message | RoundWait | None:
        """A gradient for round `rnd`: a resync when the learner is behind, else a wait for
        the round to complete (None: a newer connection superseded this one)."""
        assert self.sync is not None
        m = self.members.current(learner, conn_id)
        if m is None:
            return None
        check_position(position, m.start, m.elapsed(self.monotonic()), self.bounds.max_step_rate,
                       self.train.sync_every)
        m.position = max(m.position, position)
        if rnd != self.sync.round:
            return self._resync()
        self.sync.submit(learner, grads, tokens)
        m.busy = True
        return RoundWait(learner, m, rnd, tokens, self.monotonic() + self.cfg.idle_timeout)

    def round_over(self, wait: RoundWait) -> bool:
        assert self.sync is not None
        return self.sync.round != wait.round

    def round_answer(self, wait: RoundWait) -> wire.Message:
        """The mean of the round waited for (or, evicted and overtaken meanwhile, the state)."""
        assert self.sync is not None
        mean = self.sync.mean_of(wait.round)
        wait.member.tokens += wait.tokens
        if mean is None:
            return self._resync()
        return wire.message(wire.MEAN, {"round": wait.round, "resync": False}, mean)

    def end_wait(self, wait: RoundWait) -> None:
        """The learner no longer waits in the barrier (answered, timed out or gone)."""
        wait.member.busy = False
        wait.member.last_seen = self.monotonic()

    def _resync(self) -> wire.Message:
        assert self.sync is not None
        self.counters["resyncs"] += 1
        header = {"round": self.sync.round, "resync": True, "adam_step": self.sync.adam_step()}
        return wire.message(wire.MEAN, header, self.sync.state_tensors())

    def complete_round(self) -> bool:
        """Reduce the round once every live learner has submitted; True if it was reduced now."""
        assert self.sync is not None
        alive = {m.learner for m in self.members.alive()}
        if not self.sync.ready(alive) or self._waiting_for_start():
            return False
        started = self.monotonic()
        info = self.sync.complete(self.train)
        self.events.emit("sync_step", round=info["round"], contributors=info["contributors"],
                         tokens=info["tokens"], seconds=self.monotonic() - started)
        if self.sync.round % self.cfg.sync_checkpoint_every == 0:
            nbytes, seconds = self.sync.checkpoint(self.store)
            self.events.emit("state_write", what="sync", bytes=nbytes, seconds=seconds, round=self.sync.round)
        return True

    def _waiting_for_start(self) -> bool:
        """Before the first round of a fresh run: wait (at most --start-wait s after the first
        gradient) until every configured learner has joined. A learner whose process started
        a second later would otherwise miss the first rounds and step alone at the end, and
        sync DP's result would hang on process start-up times."""
        assert self.sync is not None
        if self.sync.round > 0 or len(self.members.members) >= self.train.num_learners:
            return False
        if self._first_grad_at is None:
            self._first_grad_at = self.monotonic()
        return self.monotonic() - self._first_grad_at < self.cfg.start_wait

    # ----------------------------------------------------------------- merging
    def effective_quorum(self) -> int:
        return self.rule.effective_quorum(len(self.members.alive()))

    def decide(self, frag: FragmentState, now: float) -> Decision:
        """Why this fragment should merge now (reason None: not yet, until recheck_at), and
        what the grace window did: the merge rule asked with this fragment's state."""
        return self.rule.decide(frag.waiting(), frag.version, [m.learner for m in self.members.alive()], now,
                                frag.arrivals.predicted, round_period(frag.merge_times))

    def due(self, frag: FragmentState, now: float) -> Decision | None:
        """The decision to merge this fragment now, or None (and when to ask again is noted
        in recheck_at). Call begin_pass first: recheck_at is the earliest of one pass."""
        if frag.writing:  # its merge is being written (off the lock): one at a time
            return None
        if self.disk_failed:  # nothing more is written to a disk that failed a sync: the restart merges
            return None
        decision = self.decide(frag, now)
        if not decision.reason:
            self.recheck_at = earliest(self.recheck_at, decision.recheck_at)
            return None
        return decision

    def begin_pass(self) -> None:
        self.recheck_at = None

    def merged(self, now: float) -> None:
        """A merge committed: the next decision may merge again (what is left pending)."""
        self.recheck_at = now

    def merge_failed(self, frag: FragmentState, why: str, exc: BaseException, now: float) -> None:
        """A merge raised: its pushes stay pending, and it is tried again MERGE_RETRY_SECONDS later."""
        self.recheck_at = earliest(self.recheck_at, now + MERGE_RETRY_SECONDS)
        self.counters["merge_errors"] += 1
        self.events.emit("merge_failed", fragment=frag.spec.index, reason=why,
                         error=describe_error(exc) if isinstance(exc, OSError) else f"{type(exc).__name__}: {exc}")

    def final_merges(self) -> list[FragmentState]:
        """At stop: the fragments with pushes still pending, merged before the final state.
        Never one whose merge is being written: two merges of one version would each leave
        the other's pushes out of the ledger (what stays pending is durable, merged after a restart)."""
        return [f for f in self.frags if f.pending and not f.writing]

    def _step(self, frag: FragmentState, contribs: list[Contribution], final: bool = False) -> OuterStep:
        return self.stepper.step(frag, contribs, [m.learner for m in self.members.weighed()], self.step_tokens,
                                 final)

    def _mergeable_step(self, frag: FragmentState, taken: list[PendingPush],
                        final: bool = False) -> tuple[OuterStep | None, list[PendingPush]]:
        """The outer step over the pushes that can be merged, and those pushes. A push that
        makes the merge raise or turn Θ non-finite is quarantined, and the merge goes on
        with the others: one bad push never takes the good ones down with it, and a
        non-finite Θ is never committed."""
        kept = list(taken)
        for _ in range(len(taken)):
            try:
                step = self._step(frag, [p.contribution for p in kept], final)
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
                if not self._step(frag, [p.contribution]).finite:
                    return p
            except Exception:  # noqa: BLE001
                return p
        return max(kept, key=lambda p: tensor_norm(p.contribution.delta))

    def begin_merge(self, frag: FragmentState, reason: str, grace: dict | None = None,
                    final: bool = False, only: str | None = None) -> MergePlan | None:
        """Take a fragment's pending pushes (`only`: "regular" or "final" ones, as the merge
        rule's Decision says; None: all) and compute their outer step: the plan whose
        fragment file the caller writes (the commit point), then commits. None when every
        push was quarantined: nothing to write. Pushes accepted while the plan is written
        stay pending for the next merge."""
        started = self.monotonic()
        if frag.retry is not None:
            # The pushes of a merge whose write failed, and only they, as that merge would
            # have: those accepted during its write were promised the version after it
            # (push_durable), so they wait for that one.
            ids, final = frag.retry
            taken = [p for p in frag.pending if p.contribution.ident in ids]
            frag.pending = [p for p in frag.pending if p.contribution.ident not in ids]
            frag.retry = None
        elif only is None:
            taken, frag.pending = list(frag.pending), []
        else:
            want = only == "final"
            taken = [p for p in frag.pending if p.final == want]
            frag.pending = [p for p in frag.pending if p.final != want]
        if self.defect == "living_quorum":  # a departed learner's acknowledged pushes are dropped
            counted = {m.learner for m in self.members.weighed()}
            taken = [p for p in taken if p.contribution.learner in counted]
        frag.merging.update(p.contribution.ident for p in taken)
        try:
            step, taken = self._mergeable_step(frag, taken, final)
        except BaseException:
            # A quarantine could not be written: what it had not moved aside stays pending.
            back = [p for p in taken if p.contribution.ident in frag.merging]
            frag.merging.difference_update(p.contribution.ident for p in back)
            frag.pending = back + frag.pending
            raise
        if step is None:
            return None
        params = step.params
        if self.defect == "merge_nothing":  # the outer step is lost; everything else goes on as usual
            params = {n: t.clone() for n, t in frag.params.items()}
        contribs = [p.contribution for p in taken]
        write = not (self.defect == "ack_before_durable" and started - self._last_flush < defects.FLUSH_EVERY)
        frag.writing = True
        grace = grace or {"policy": self.cfg.grace_policy, "waited": None, "why": "merged directly"}
        return MergePlan(frag, reason, grace, final, taken, step, params,
                         applied=frag.applied + [c.ident for c in contribs],
                         tokens=frag.tokens + sum(max(0, c.tokens) for c in contribs),
                         rounds=frag.rounds + round_fraction(step.weights), version=frag.version + 1,
                         before=frag.params, started=started, write=write)

    def abort_merge(self, plan: MergePlan) -> None:
        """The plan's write failed: nothing was committed, its pushes stay pending."""
        frag = plan.frag
        frag.writing = False
        frag.pending = plan.taken + frag.pending
        frag.retry = ({p.contribution.ident for p in plan.taken}, plan.final)  # the next merge of frag: this one again
        self.changes += 1
        frag.merging.difference_update(c.ident for c in plan.contribs)

    def commit_merge(self, plan: MergePlan, written: MergeWritten) -> None:
        """The plan's fragment file is durable (its ledger holds every id): it is Θ_f now."""
        frag, step, contribs = plan.frag, plan.step, plan.contribs
        if plan.write:
            self._last_flush = self.monotonic()
        frag.writing = False
        frag.params, frag.momentum = plan.params, step.momentum
        frag.accum, frag.accum_count = step.accum, step.accum_count
        frag.version = plan.version
        frag.tokens = plan.tokens
        frag.rounds = plan.rounds
        frag.merge_times = (frag.merge_times + [self.monotonic()])[-MERGE_TIMES_KEPT:]
        frag.applied = plan.applied
        if self.served is not None:
            self.served[frag.spec.index].advance(plan.params, plan.version)
        frag.applied_set.update(c.ident for c in contribs)
        frag.merging.difference_update(c.ident for c in contribs)
        self.counters["merges"] += 1
        self.changes += 1
        self.events.emit(
            "merge", fragment=frag.spec.index, version=plan.version, reason=plan.reason, final=plan.final,
            quorum=self.effective_quorum(), alive=[m.learner for m in self.members.alive()],
            staleness_policy=self.cfg.staleness_policy, grace_policy=self.cfg.grace_policy,
            grace=plan.grace, outer=step.outer,
            contributors=[{"id": c.ident, "learner": c.learner, "incarnation": c.incarnation, "seq": c.seq,
                           "tokens": c.tokens, "base_version": c.base_version,
                           "staleness": s, "raw_weight": round(r, 4), "discount": round(f, 4),
                           "weight": round(w, 4), "steps": c.steps}
                          for c, s, r, f, w in zip(contribs, step.staleness, step.raw, step.factors, step.weights)],
            tokens=sum(c.tokens for c in contribs), expected_tokens=step.expected, moved=written.moved,
            fragment_share=frag.spec.numel / sum(s.numel for s in self.specs),
            finite=True, state_bytes=written.nbytes, seconds=round(self.monotonic() - plan.started, 4))
        self.events.emit("state_write", what=f"fragment-{frag.spec.index}", bytes=written.nbytes,
                         seconds=round(written.seconds, 4), version=plan.version)
