"""A learner unit: inner AdamW steps on its own shard, pseudo-gradients pushed in the background.

Decoupled mode: every H steps (staggered per fragment) the learner computes
Δ_f = θ_ref_f − θ_local_f, the progress made since it last pushed or adopted fragment f,
queues it and moves on. A background thread sends pushes, heartbeats, and pulls new
global fragments (adoption.py's VersionBook holds them); the inner loop applies them at a step boundary, mixing
θ_f ← α·θ_f + (1−α)·Θ_f. The inner loop never touches the network.

One push of a fragment in flight (--push-window 1, the default): when fragment f falls due
while the learner's last push of f has been sent but the merge holding it not yet adopted,
the learner does not push again; it keeps training and pushes once it has adopted that
merge. Every push is then measured from a global version its learner adopted, so the outer
step sees the effect of its last move before the next one. Without it, a merge round trip
longer than H steps made pushes pipeline 4-5 versions deep: increments of a local path
that never saw Θ, each amplified by the outer momentum (Θ's held-out loss spiked from 2.6
to 13.8 at the start of a fault-free run). A push not yet sent still takes in the next one
(the queue coalesces them), so an unreachable syncer loses no progress.

A unit of several ranks (`--ranks R`, see ranks.py and unit.py) trains as one replica with
DDP over gloo; only rank 0 runs the network thread, and at every step boundary it tells the
other ranks which fragments it adopted and broadcasts their new values.

Sync mode (the baseline): every step's gradient goes to the syncer, which returns the
mean of all live learners; each learner applies it with its AdamW, as DDP would.
"""
from __future__ import annotations

import signal
import sys
import threading
import time
from dataclasses import dataclass

import torch

from . import defects, wire
from .adoption import VersionBook
from .codec import decode
from .served import DELTA_ENCODINGS, apply_steps
from .config import TrainConfig
from .device import autocast, resolve_device
from .events import EventLog
from .fragments import FragmentClock, fragment_distance, fragment_norm
from .link import FATAL_REASONS, TRANSIENT, Address, Link, Refusal
from .protocol import FrameFault, Reason
from .push_protocol import BACKOFF_MAX, POLL_FLOOR_MS, PushProtocol, Refused, backoff, poll_ms  # noqa: F401
from .task import BUILTIN_TASKS, CheckedTask, TaskError, load_task, move_batch, resolve_spec
from .pushes import OutgoingPush, PushQueue
from .cpuwait import CpuWait
from .pacing import StepPacer
from .ranks import Group, RankGroup, SoloGroup, param_digest
from .signals import set_on_signal
from .unit import FATAL_EXIT
from .sync_state import apply_mean_gradient, load_optimizer_tensors, make_inner_optimizer, warm_up_lr

RECONNECT_BUDGET = 30.0
TASK_EXIT = 4  # the user's task failed mid-run (an exception, a NaN loss): restarted with backoff


def heartbeat_due(link: Link, interval: float) -> float:
    """When the link next needs a heartbeat: any reply renews the lease at the syncer, so
    one falls due only after `interval` s without a reply."""
    return link.last_reply + interval
# A clean stop pushes the residual progress if the syncer answers this soon; one round
# trip takes ~50 ms, and a container's stop must stay under 2 s.
DRAIN_TIMEOUT = 1.5
BYE_WAIT = 1.0  # s a stop waits for the link to be free to say BYE (then it closes the socket)


@dataclass(frozen=True)
class LearnerOptions:
    learner: int
    address: Address
    run_dir: str | None
    max_steps: int | None = None
    threads: int = 1
    speed: float = 1.0            # < 1 slows this learner down artificially
    slowdown: str = "sleep"       # how: sleep (frees the CPU) or spin (keeps it busy, like a slower chip)
    step_time: float = 0.0        # > 0: an emulated accelerator, every step takes at least this long
    connect_timeout: float = 60.0
    drain_timeout: float = DRAIN_TIMEOUT
    rank: int = 0                 # this process's rank in its unit; only rank 0 talks to the syncer
    ranks: int = 1
    store_file: str | None = None  # the unit's gloo rendezvous (ranks > 1)
    collective_timeout: float = 60.0
    task: str = "gpt"             # must be the task the syncer trains (its WELCOME says which)
    data: str = "markov"          # the built-in task's data
    device: str = "auto"          # auto | cpu | cuda | cuda:N (trainer/device.py)

    @property
    def leader(self) -> bool:
        return self.rank == 0


class Learner:
    def __init__(self, opts: LearnerOptions, secret: bytes, mode: str) -> None:
        self.opts = opts
        self.mode = mode
        self.device = resolve_device(opts.device, opts.rank)
        self.stop = threading.Event()
        self.pacer = StepPacer(opts.speed, opts.slowdown, opts.step_time)  # --speed / --step-time
        # Set once the loop has queued its last (residual) pushes: only then may the network
        # thread finish, when the queue is empty. Exiting on `stop` alone raced the residual push.
        self.closing = threading.Event()
        self.drain_over = threading.Event()  # the stop gave up waiting for the residual pushes
        name = f"learner-{opts.learner}" if opts.leader else f"learner-{opts.learner}-rank-{opts.rank}"
        self.events = EventLog(opts.run_dir, name, learner=opts.learner)
        self.group: Group = SoloGroup()
        # Once `stop` is set a connect makes one attempt, not a series: the network loop, which
        # goes on until the drain ends, backs off between them.
        self.link = Link(opts.address, secret, opts.learner, mode, self.events, 5.0, self.stop)
        self.failures_in_a_row = 0  # failed network attempts since the last success (the backoff grows with it)
        # Fragments pulled on the current connection: only their copy is known to be the one the
        # syncer serves now, so only they are pulled as steps from it (delta encodings). A
        # syncer restarted since rebuilt its served copy from its recovered Θ, and steps added
        # to the copy of its previous life would leave the learner off Θ for good.
        self.pulled_on_this_connection: set[int] = set()
        # Which versions to pull and adopt, when a push may go (adoption.py): the network
        # thread and the inner loop share it under _versions_lock.
        self.book = VersionBook.starting_at([])
        self.fatal: Exception | None = None
        self._versions_lock = threading.Lock()
        self.position = 0  # batches this learner's shard has given, across incarnations
        self.step_tokens = 0  # the unit's tokens in its last inner step: a round's weight at the syncer
        self.task: CheckedTask | None = None
        self.facts: dict = {}
        self.defect = defects.learner_active()  # a deliberate bug, for proving the checks (trainer/defects.py)
        self.cpu_wait = CpuWait()  # read on the inner loop's thread: its own wait for a CPU
        # The CPU is this learner's accelerator: one torch thread computes on the inner loop's own.
        self.cpu_bound = self.device.type == "cpu" and opts.threads == 1
        self.cpu_s = 0.0
        self._cpu_mark = 0.0
        self.step_seconds: float | None = None  # the inner loop's pace, for how long a long poll may wait

    # ----------------------------------------------------------------- setup
    def _welcome(self) -> wire.Frame:
        try:
            return self.link.connect(want_params=True, budget=self.opts.connect_timeout, seeded=True)
        except Refusal as exc:
            raise SystemExit(f"learner-{self.opts.learner}: syncer refused HELLO: {exc}") from exc
        except TRANSIENT as exc:
            raise SystemExit(
                f"learner-{self.opts.learner}: could not reach the syncer at {self.opts.address} "
                f"within {self.opts.connect_timeout:.0f}s: {exc}") from exc

    @staticmethod
    def _shared_setup(welcome: wire.Frame) -> dict:
        """What every rank of the unit needs from WELCOME (the tensors go through DDP)."""
        h = welcome.header
        return {key: h[key] for key in ("config", "incarnation", "fragments", "position", "rejoin",
                                        "versions", "adam_step", "round", "params_digest") if key in h}

    def _setup(self, h: dict, tensors: dict[str, torch.Tensor] | None) -> None:
        self.cfg = TrainConfig.from_dict(h["config"])
        self.link.request_timeout = self.cfg.request_timeout
        self.incarnation = int(h["incarnation"])
        self.fragment_names: list[list[str]] = [list(names) for names in h["fragments"]]
        torch.set_num_threads(self.opts.threads)
        if self.cfg.task != resolve_spec(self.opts.task):
            raise SystemExit(f"learner-{self.opts.learner}: --task {self.opts.task} but the syncer trains "
                             f"--task {self.cfg.task}; start both with the same task")
        if self.cfg.task in BUILTIN_TASKS:  # configured by the run's flags, which WELCOME carries
            loaded = getattr(self.task.task, "loaded", None) or getattr(self.task.task, "corpus", None)
            self.task = load_task(self.cfg.task, self.cfg.task_options(loaded or self.opts.data))
        self.model = self.task.model(self.cfg.seed).to(self.device)
        self.params = dict(self.model.named_parameters())
        tensors = tensors or None  # a WELCOME without tensors decodes to {}
        if tensors is None and "params_digest" in h and self.group.leader:  # the other ranks get rank 0's
            tensors = self._seeded_or_fetched(str(h["params_digest"]))
        self._check_shapes(tensors)
        if tensors is not None:
            tensors = {n: t.to(self.device) for n, t in tensors.items()}
        if self.mode == "sync":
            self.opt = make_inner_optimizer(self.model, self.cfg)
            self.default_optimizer = True  # the syncer mirrors every update with the same AdamW
            load_optimizer_tensors(self.model, self.opt, tensors, int(h["adam_step"]))
            self.round = int(h["round"])
        else:
            if tensors is not None:
                with torch.no_grad():
                    for name, p in self.params.items():
                        p.copy_(tensors[name])
            self.book = VersionBook.starting_at(list(h["versions"]))
        self.net = self.group.wrap(self.model)  # DDP makes every rank start from rank 0's values
        if self.mode != "sync":
            trainable = [p for p in self.model.parameters() if p.requires_grad]
            self.opt = self.task.inner_optimizer(trainable, lambda: make_inner_optimizer(self.model, self.cfg))
            self.default_optimizer = not self.task.has_inner_optimizer
        # Each rank of each unit reads its own shard; a restarted learner skips the batches
        # its predecessors consumed, so it resumes its data instead of replaying it.
        self.position = int(h["position"])
        size = self.group.size
        self.batch_iter = self.task.batches((self.opts.learner - 1) * size + self.group.rank,
                                            self.cfg.num_learners * size, self.cfg.seed, skip=self.position)
        fields = dict(incarnation=self.incarnation, position=self.position, threads=self.opts.threads,
                      speed=self.opts.speed, slowdown=self.opts.slowdown, step_time=self.opts.step_time,
                      ranks=self.group.size, device=str(self.device), precision=self.cfg.precision)
        if not self.group.leader:
            self.events.emit("rank_start", rank=self.group.rank, **fields)
            return
        self.events.emit("process_start", role="learner", rejoin=bool(h["rejoin"]), mode=self.mode, defect=self.defect,
                         push_window=self.cfg.push_window,
                         versions=self.book.adopted, task=self.cfg.task, corpus=self.facts.get("data"),
                         loss_floor=self.facts.get("loss_floor"), unigram_entropy=self.facts.get("unigram_entropy"),
                         loss_unit=self.facts.get("loss_unit"),
                         **fields)

    def _seeded_or_fetched(self, digest: str) -> dict[str, torch.Tensor] | None:
        """WELCOME sent a digest of the initial Θ instead of its tensors: keep the model just
        built from the seed if it is the same, else ask again for the tensors (a task whose
        model is not deterministic in its seed costs one more handshake, never a wrong start)."""
        mine = param_digest(self.params)
        if mine == digest:
            self.events.emit("seeded_start", digest=digest)
            return None
        welcome = self.link.connect(want_params=True, budget=self.opts.connect_timeout)
        self.events.emit("seeded_start", digest=digest, mismatch=mine, fetched=True)
        return welcome.tensors()

    def _check_shapes(self, tensors: dict[str, torch.Tensor] | None) -> None:
        """The task's model must be the one the syncer holds: same parameter names and shapes."""
        names = {n for names in self.fragment_names for n in names}
        if names != set(self.params):
            extra, missing = sorted(set(self.params) - names), sorted(names - set(self.params))
            raise SystemExit(f"learner-{self.opts.learner}: task {self.cfg.task}: its model's parameters differ "
                             f"from the syncer's (here only: {extra[:3]}; syncer only: {missing[:3]})")
        for name, t in (tensors or {}).items():
            if name in self.params and tuple(t.shape) != tuple(self.params[name].shape):
                raise SystemExit(f"learner-{self.opts.learner}: task {self.cfg.task}: parameter {name} has shape "
                                 f"{tuple(self.params[name].shape)} here, {tuple(t.shape)} at the syncer")

    # ----------------------------------------------------------------- inner step
    def _inner_step(self, step: int) -> tuple[float, float, int]:
        """Forward and backward of one batch: (loss, start time, the batch's tokens)."""
        batch = move_batch(next(self.batch_iter), self.device)
        self.position += 1
        started = time.perf_counter()
        self._cpu_mark = time.thread_time()
        with autocast(self.device, self.cfg.precision):
            loss = self.task.loss(self.net, batch)
        value = float(loss.detach())
        self.task.check_finite(value, step)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        return value, started, self.task.tokens(batch)

    def load_task(self) -> None:
        """Before HELLO: importing a user's task can take seconds, and a joined learner must
        not fall silent while it does (see warm_up_torch)."""
        self.task = load_task(self.opts.task, {"data": self.opts.data})
        self.facts = self.task.describe()

    def run(self) -> int:
        warm_up_torch(self.opts.threads, self.device)
        if self.opts.ranks > 1:
            self.group = RankGroup(self.opts.rank, self.opts.ranks, self.opts.store_file,
                                   self.opts.collective_timeout, self.device)
        try:
            if self.group.leader:
                welcome = self._welcome()
                self._setup(self.group.share_setup(self._shared_setup(welcome)), welcome.tensors())
            else:
                self._setup(self.group.share_setup(None), None)
            if self.mode == "sync":
                return self._run_sync()
            if not self.group.leader:
                return self._run_follower()
            return self._run_decoupled()
        finally:
            self.group.close()

    # ----------------------------------------------------------------- decoupled
    def _run_decoupled(self) -> int:
        cfg = self.cfg
        self.queue = PushQueue(cfg.max_unsent_pushes)
        # What a push says and what its answers and refusals do (push_protocol.py, shared
        # with the simulator's stand-in): called under _versions_lock, as the book is.
        self.pushes = PushProtocol(self.opts.learner, self.incarnation, self.book, self.queue, self.events,
                                   cfg.encoding, time.monotonic, defect=self.defect)
        refs = {f: {n: self.params[n].detach().clone() for n in names}
                for f, names in enumerate(self.fragment_names)}
        # The global parameters last adopted, per fragment: what convergence is measured against.
        self.globals = {f: {n: t.clone() for n, t in ref.items()} for f, ref in refs.items()}
        tokens_since = [0] * len(self.fragment_names)
        steps_since = [0] * len(self.fragment_names)
        last_push_step = [0] * len(self.fragment_names)
        clock = FragmentClock(cfg.sync_every, cfg.fragments)
        seq = 0
        worker = threading.Thread(target=self._network_loop, name="learner-net", daemon=True)
        worker.start()
        step = 0
        last_step_at: float | None = None

        def push(f: int, residual: bool = False, final: bool = False) -> None:
            nonlocal seq
            seq += 1
            with torch.no_grad():
                delta = {n: refs[f][n] - self.params[n].detach() for n in self.fragment_names[f]}
                refs[f] = {n: self.params[n].detach().clone() for n in self.fragment_names[f]}
            delta = {n: d.cpu() for n, d in delta.items()}  # encoded on the host
            self.queue.put(OutgoingPush(f, seq, self.book.push_base(f), tokens_since[f], steps_since[f],
                                        self.position, delta, created_step=step, residual=residual,
                                        final=final))
            tokens_since[f] = steps_since[f] = 0
            last_push_step[f] = step
            clock.synced(f, step)

        while True:
            stopping = (self.stop.is_set() or self.fatal is not None
                        or (self.opts.max_steps is not None and step >= self.opts.max_steps))
            with self._versions_lock:
                pulled = list(self.book.pulled)
            adopted = [] if stopping else [
                f for f in pulled
                if step >= last_push_step[f] + cfg.overlap and self._adopt(f, refs, tokens_since, steps_since)]
            for f in adopted:
                clock.synced(f, step)
            self._follow_leader(stopping, adopted)
            if stopping:
                break
            loss, compute_s, tokens = self._train_step(step + 1)
            self.step_tokens = tokens
            step += 1
            now = time.perf_counter()
            if last_step_at is not None:  # the pace a push falls due at (an EWMA of step intervals)
                gap = now - last_step_at
                self.step_seconds = gap if self.step_seconds is None else 0.9 * self.step_seconds + 0.1 * gap
            last_step_at = now
            for f in range(len(tokens_since)):
                tokens_since[f] += tokens
                steps_since[f] += 1
            self.events.emit("inner_step", step=step, loss=loss, tokens=tokens,
                             compute_s=round(compute_s, 5), incarnation=self.incarnation,
                             position=self.position, **self._cpu_fields())
            last_step = self.opts.max_steps is not None and step >= self.opts.max_steps
            for f in ([] if last_step and cfg.final_round else clock.due(step)):  # the final round pushes all
                with self._versions_lock:  # against _send_push marking a push of f as sent
                    if self.book.may_push(f, cfg.push_window) or self.defect == "ignore_push_window":
                        push(f)
            self.pacer.after_step(compute_s, self.stop)
        if self.fatal:
            raise self.fatal
        self._report_final_params()
        for f in range(len(self.fragment_names)):  # the residual progress is not thrown away
            if steps_since[f]:
                push(f, residual=True, final=cfg.final_round)
        self.closing.set()
        self.queue.notify()
        drained = self.queue.wait_empty(self.opts.drain_timeout)
        self.drain_over.set()
        self.stop.set()
        worker.join(timeout=self.opts.drain_timeout + 2)
        self._bye()
        self.events.emit("process_stop", role="learner", steps=step, drained=drained, unsent=len(self.queue),
                         incarnation=self.incarnation,
                         bytes_up=self.link.bytes_up, bytes_down=self.link.bytes_down)
        return 0

    def _train_step(self, step: int) -> tuple[float, float, int]:
        """One inner step (DDP-averaged across the unit's ranks): (unit mean loss, compute s, unit tokens)."""
        loss, started, tokens = self._inner_step(step)
        if self.cfg.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.grad_clip)
        if self.default_optimizer:  # a task's own optimizer keeps its own schedule
            warm_up_lr(self.opt, self.cfg, clock=self.position)
        self.opt.step()
        compute_s = time.perf_counter() - started
        self.cpu_s = time.thread_time() - self._cpu_mark
        return self.group.mean_loss(loss), compute_s, tokens * self.group.size

    def _follow_leader(self, stop: bool, adopted: list[int]) -> tuple[bool, list[int]]:
        """Step boundary of the unit: rank 0's decision, then the adopted fragments' new values."""
        stop, adopted = self.group.step_control(stop, adopted, len(self.fragment_names))
        if not stop:
            for f in adopted:
                self.group.broadcast([self.params[n] for n in self.fragment_names[f]])
        return stop, adopted

    def _run_follower(self) -> int:
        """Rank > 0: train in lockstep with rank 0 until it says stop; no network, no pushes."""
        step = 0
        while True:
            stop, adopted = self._follow_leader(False, [])
            if stop:
                break
            _, compute_s, _ = self._train_step(step + 1)
            step += 1
            self.pacer.after_step(compute_s, self.stop)
        self.events.emit("rank_stop", rank=self.group.rank, steps=step, incarnation=self.incarnation,
                         digest=param_digest(self.params))
        return 0

    def _adopt(self, f: int, refs: dict, tokens_since: list[int], steps_since: list[int]) -> bool:
        """Adopt the awaited global version of fragment f if it has arrived."""
        with self._versions_lock:
            adoption = self.book.take(f)
        if adoption is None:
            return False
        version, tensors, rollback_from = adoption
        tensors = {n: t.to(self.device) for n, t in tensors.items()}
        alpha = self.cfg.alpha
        names = self.fragment_names[f]
        # Where the rule puts θ relative to Θ, from the state before it acts: mix keeps α of
        # θ − Θ, rebase the steps made since the last push (θ − ref).
        expected = fragment_distance(self.params, refs[f], names) if self.cfg.adopt == "rebase" \
            else alpha * fragment_distance(self.params, tensors, names)
        skip = self.defect == "never_adopt"
        if self.cfg.adopt == "rebase":
            # θ ← Θ + (θ − ref): the steps made since the last push (ref) ride on the new
            # global version, and the next push, measured from Θ, carries them and their tokens.
            with torch.no_grad():
                for name in names if not skip else ():
                    self.params[name].add_(tensors[name] - refs[f][name])
                refs[f] = {n: tensors[n].detach().clone() for n in names}
            discarded = 0
        else:
            with torch.no_grad():
                for name in names if not skip else ():
                    p = self.params[name]
                    p.mul_(alpha).add_(tensors[name], alpha=1.0 - alpha)
                refs[f] = {n: self.params[n].detach().clone() for n in names}
            # Progress not yet pushed survives only in proportion α; its tokens are weighed alike.
            discarded = tokens_since[f] - int(alpha * tokens_since[f])
            tokens_since[f] = int(alpha * tokens_since[f])
            steps_since[f] = int(alpha * steps_since[f]) if alpha else 0
        with self._versions_lock:
            self.book.adopt(f, version)
            self.globals[f] = tensors  # with the version: a delta pull reads both together
        # Measured on the parameters as they now are: an adoption that did not reach the
        # model (a copy into a detached tensor, a skipped update) shows here, and the
        # `converged` check fails on it.
        norm = fragment_norm(tensors, names)
        self.events.emit("apply", fragment=f, version=version, alpha=alpha, adopt=self.cfg.adopt,
                         incarnation=self.incarnation, discarded_tokens=discarded,
                         **({"rollback_from": rollback_from} if rollback_from is not None else {}),
                         drift_after=round(fragment_distance(self.params, tensors, names) / norm, 7) if norm else 0.0,
                         expected_drift=round(expected / norm, 7) if norm else 0.0)
        return True

    def _report_final_params(self) -> None:
        """At a clean stop: how far this learner is from the global version it last adopted."""
        rows = []
        with torch.no_grad():
            for f, names in enumerate(self.fragment_names):
                diff = sum(float((self.params[n] - self.globals[f][n]).pow(2).sum()) for n in names) ** 0.5
                norm = sum(float(self.globals[f][n].pow(2).sum()) for n in names) ** 0.5
                rows.append({"fragment": f, "version": self.book.adopted[f],
                             "drift": diff / norm if norm > 0 else diff, "diff": diff, "norm": norm})
        self.events.emit("final_params", fragments=rows, incarnation=self.incarnation,
                         digest=param_digest(self.params))

    def _network_loop(self) -> None:
        """Send pushes, heartbeat, pull new versions; reconnect on any transport fault.

        Any frame renews the learner's lease at the syncer, so a heartbeat goes only on a
        link that has been quiet for a heartbeat interval: a learner that pushes at least
        that often sends none."""
        while not (self.closing.is_set() and (len(self.queue) == 0 or self.drain_over.is_set())):
            try:
                if not self.link.connected:
                    welcome = self.link.connect(want_params=False, budget=RECONNECT_BUDGET)
                    self.pulled_on_this_connection.clear()
                    self._note_versions(welcome.header.get("versions"))
                item = self.queue.peek()
                # After a "not now" refusal the head push waits out its backoff, while the link
                # goes on heartbeating and pulling: a backoff must not cost the learner its lease.
                deferred = item is not None and self.pushes.deferred(time.monotonic())
                if item is not None and not deferred:
                    try:
                        self._send_push(item)
                    except Refusal as exc:
                        if self._refused(exc, about_push=True):
                            return
                        continue
                    self.failures_in_a_row = 0
                    # With P fragments a push falls due every H/P steps and the queue is rarely
                    # empty: pulling only when idle would starve adoption.
                    self._pull_new_versions()
                    continue
                known = None if self.closing.is_set() else self._awaited()
                if known is not None or time.monotonic() >= heartbeat_due(self.link, self.cfg.heartbeat_interval):
                    # Awaiting a merge: a long poll, answered as soon as a version passes the ones known.
                    poll = {"wait_ms": self._poll_ms(), "versions": known} if known else {}
                    beat = self.link.request(wire.message(wire.HEARTBEAT, poll))
                    self._note_versions(beat.header.get("versions"), beat.header.get("waiting"))
                self._pull_new_versions()
                self.failures_in_a_row = 0
                due = heartbeat_due(self.link, self.cfg.heartbeat_interval)
                if deferred:
                    # Not `stop`: once it is set (a SIGTERM) the thread still drains the last pushes.
                    self.drain_over.wait(max(0.0, min(due, self.pushes.retry_at) - time.monotonic()))
                elif known is None:
                    self.queue.wait(max(0.0, due - time.monotonic()))
            except Refusal as exc:
                if self._refused(exc, about_push=False):
                    return
            except TRANSIENT as exc:
                # The thread ends when the drain does, not on `stop`: after a SIGTERM the final
                # round's pushes still go, over a link that may need reconnecting first.
                self.link.close(f"{type(exc).__name__}: {exc}")
                if self.drain_over.is_set():
                    return
                self._back_off()

    def _refused(self, exc: Refusal, about_push: bool) -> bool:
        """A refusal (ERROR) of the head push or of another request: what push_protocol
        says to do about it. True when the network thread must end (a fatal refusal)."""
        with self._versions_lock:
            outcome = self.pushes.refused(exc.reason, exc.detail, about_push=about_push)
        if outcome is Refused.FATAL:
            self.fatal = SystemExit(f"learner-{self.opts.learner}: syncer refused: {exc}")
            self.stop.set()
            return True
        # A deferred push (the syncer's disk, or `internal`) is kept and sent again, same id,
        # after its backoff; `internal` closed the syncer's end of the connection too.
        if not isinstance(exc.reason, Reason) or exc.reason.closes_connection:
            self.link.close(f"refused: {exc}")
        if outcome is Refused.IGNORED:
            # A refused HELLO, heartbeat or pull would be refused again at once: wait first.
            self._back_off()
        return False

    def _back_off(self) -> None:
        """Wait before the next attempt after `failures_in_a_row` failed ones: tenacity's
        exponential wait with jitter (push_protocol.backoff), 0.2 s doubling to 2 s."""
        self.failures_in_a_row += 1
        self.drain_over.wait(backoff(self.failures_in_a_row))

    def _poll_ms(self) -> int:
        """How long a long poll may wait (push_protocol.poll_ms), at this learner's pace."""
        cfg = self.cfg
        return poll_ms(cfg.heartbeat_interval, cfg.request_timeout, cfg.sync_every, cfg.fragments, self.step_seconds)

    def _awaited(self) -> list[int] | None:
        with self._versions_lock:
            return self.book.awaited()

    def _note_versions(self, versions: list[int] | None, waiting: list[int] | None = None) -> None:
        with self._versions_lock:
            self.pushes.note_versions(versions, waiting)

    def _pull_new_versions(self) -> None:
        with self._versions_lock:
            wanted = self.book.pulls_wanted()
        for f in wanted:
            request = {"fragment": f}
            delta = self.cfg.pull_encoding in DELTA_ENCODINGS and f in self.pulled_on_this_connection
            held = self._held(f) if delta else None
            if held is not None:
                request["have"] = held[0]
            reply = self.link.request(wire.message(wire.PULL, request))
            version = int(reply.header["version"])
            shapes = {n: self.params[n].shape for n in self.fragment_names[f]}
            encoding = str(reply.header.get("encoding", "fp32"))
            try:
                if "from" in reply.header:  # steps from the version held (served.py)
                    start = int(reply.header["from"])
                    if held is None or start != held[0]:
                        raise ValueError(f"steps from version {start}, but this learner holds {held and held[0]}")
                    tensors = apply_steps(held[1], reply.tensors(), encoding, start, version)
                else:
                    tensors = decode(reply.tensors(), encoding, shapes)
            except ValueError as exc:  # never adopt a fragment that does not match what it claims
                raise FrameFault(Reason.BAD_TENSOR, f"fragment {f} v{version}: {exc}") from exc
            with self._versions_lock:
                self.book.put_pulled(f, version, tensors)
            self.pulled_on_this_connection.add(f)
            self.events.emit("pull", fragment=f, version=version, wire_bytes=reply.wire_bytes, encoding=encoding,
                             **({"from": int(reply.header["from"])} if "from" in reply.header else {}))

    def _held(self, f: int) -> tuple[int, dict[str, torch.Tensor]] | None:
        """The newest served version of fragment f this learner holds exactly (pulled, or
        adopted), to pull only the steps after it."""
        with self._versions_lock:
            return self.book.pulled.get(f) or (self.book.adopted[f], self.globals[f])

    def _send_push(self, item: OutgoingPush) -> None:
        """Send the head push and take its answer (the rules: push_protocol.py). Its message
        is built off the lock, once: the inner loop never waits for an encoding."""
        with self._versions_lock:
            self.pushes.sent(item)
        message = self.pushes.message(item, self.step_tokens)
        started = time.monotonic()
        reply = self.link.request(message)
        with self._versions_lock:
            self.pushes.answered(item, reply, time.monotonic() - started)

    def _bye(self) -> None:
        """BYE, if the link is free within a second (a stop stays short: Link.bye)."""
        self.link.bye(wait=BYE_WAIT)

    # ----------------------------------------------------------------- sync
    def _run_sync(self) -> int:
        beat = threading.Thread(target=self._sync_heartbeat_loop, name="learner-beat", daemon=True)
        beat.start()
        step = 0
        while not self.stop.is_set() and (self.opts.max_steps is None or step < self.opts.max_steps):
            loss, started, tokens = self._inner_step(step + 1)
            compute_s = time.perf_counter() - started
            self.cpu_s = time.thread_time() - self._cpu_mark
            grads = {n: p.grad.detach().cpu() for n, p in self.params.items()}
            header = {"round": self.round, "tokens": tokens, "position": self.position}
            reply = self._sync_exchange(wire.message(wire.GRAD, header, grads))
            if reply is None:
                break
            if reply.header.get("resync"):
                load_optimizer_tensors(self.model, self.opt, self._on_device(reply.tensors()),
                                       int(reply.header["adam_step"]))
                self.round = int(reply.header["round"])
                self.events.emit("apply", fragment=None, version=self.round, resync=True, incarnation=self.incarnation)
                continue
            applied_at, cpu_at = time.perf_counter(), time.thread_time()
            apply_mean_gradient(self.model, self.opt, self._on_device(reply.tensors()), self.cfg)
            compute_s += time.perf_counter() - applied_at  # own work only; the wait is excluded
            self.cpu_s += time.thread_time() - cpu_at
            self.round += 1
            step += 1
            self.events.emit("inner_step", step=step, loss=loss, tokens=tokens,
                             compute_s=round(compute_s, 5), round=self.round, incarnation=self.incarnation,
                             position=self.position, **self._cpu_fields(),
                             dt=round(time.perf_counter() - started, 5), wire_bytes=reply.wire_bytes)
            self.pacer.after_step(compute_s, self.stop)
        self.stop.set()
        self._bye()
        self.events.emit("process_stop", role="learner", steps=step, incarnation=self.incarnation,
                         bytes_up=self.link.bytes_up, bytes_down=self.link.bytes_down)
        return 0

    def _cpu_fields(self) -> dict:
        """For a learner whose accelerator is the CPU (one torch thread on the CPU device):
        the last step's own CPU time (`cpu_s`: its compute without the time it was preempted)
        and, now and then, the cumulative time the loop waited for a CPU (`cpu_wait`).
        Goodput's capacity takes the rate from the first and leaves the second out of the time
        (trainer/metrics.py); a step's wall time (`compute_s`) holds both."""
        if not self.cpu_bound:
            return {}
        out = {"cpu_s": round(self.cpu_s, 5)}
        waited = self.cpu_wait.sample()
        if waited is not None:
            out["cpu_wait"] = waited
        return out

    def _on_device(self, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {n: t.to(self.device) for n, t in tensors.items()}

    def _sync_exchange(self, msg: wire.Message) -> wire.Frame | None:
        """Send a gradient until a MEAN comes back; reconnect as often as needed."""
        while not self.stop.is_set():
            try:
                if not self.link.connected:
                    self.link.connect(want_params=False, budget=RECONNECT_BUDGET)
                return self.link.request(msg)
            except Refusal as exc:
                if exc.reason in FATAL_REASONS:
                    raise SystemExit(f"learner-{self.opts.learner}: syncer refused: {exc}") from exc
                self.link.close(f"refused: {exc}")
            except TRANSIENT as exc:
                self.link.close(f"{type(exc).__name__}: {exc}")
                self.stop.wait(0.05)
        return None

    def _sync_heartbeat_loop(self) -> None:
        """Keeps the lease while the main thread computes; a waiting GRAD holds it otherwise.
        As in decoupled mode, only a link quiet for a heartbeat interval needs a heartbeat."""
        while not self.stop.wait(self.cfg.heartbeat_interval):
            if time.monotonic() < heartbeat_due(self.link, self.cfg.heartbeat_interval):
                continue  # a reply came within the interval: the lease is fresh
            if not self.link.lock.acquire(blocking=False):
                continue  # a request is in flight on the connection: it speaks for us
            try:
                if self.link.connected:
                    self.link.request(wire.message(wire.HEARTBEAT, {}))
            except (Refusal, *TRANSIENT):
                pass
            finally:
                self.link.lock.release()


def warm_up_torch(threads: int, device: torch.device = torch.device("cpu")) -> None:
    """Pay torch's lazy imports (the first optimizer costs ~2 s) and, on a GPU, the CUDA
    context and the first kernels (1-3 s) before saying HELLO, so the syncer never sees a
    joined learner fall silent while it initialises."""
    torch.set_num_threads(threads)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    p = torch.zeros(2, requires_grad=True, device=device)
    (p @ p.unsqueeze(1)).sum().backward()
    torch.optim.AdamW([p]).step()


def run_learner(opts: LearnerOptions, secret: bytes, mode: str) -> int:
    try:
        learner = Learner(opts, secret, mode)
    except ValueError as exc:  # e.g. --device cuda on a machine without one
        print(f"learner-{opts.learner}: error: {exc}", file=sys.stderr, flush=True)
        return FATAL_EXIT
    for sig in (signal.SIGTERM, signal.SIGINT):
        # Ranks > 0 stop when rank 0 says so, at a step boundary; leaving on their own would
        # break the collective rank 0 is in, and lose the residual push.
        signal.signal(sig, set_on_signal(learner.stop) if opts.leader else signal.SIG_IGN)
    try:
        learner.load_task()
    except TaskError as exc:  # the task cannot be loaded: restarting will not help
        report_task_error(exc, learner.events)
        learner.events.close()
        return FATAL_EXIT
    try:
        return learner.run()
    except TaskError as exc:  # the task failed mid-run: stop, say why; the unit restarts with backoff
        report_task_error(exc, learner.events, learner.position)
        return TASK_EXIT
    except SystemExit as exc:
        if opts.ranks > 1 and not isinstance(exc.code, int):  # refused or no syncer: the unit gives up
            print(exc.code, file=sys.stderr, flush=True)
            return FATAL_EXIT
        raise
    finally:
        learner.events.close()


def report_task_error(exc: TaskError, events: EventLog | None, position: int | None = None) -> None:
    """The message first, then the user's traceback, in the log; a task_error event for the checks."""
    print(f"error: {exc}", file=sys.stderr)
    if exc.details:
        print(exc.details, file=sys.stderr, end="")
    sys.stderr.flush()
    if events is not None:
        events.emit("task_error", task=exc.task, method=exc.method, error=str(exc), position=position)
