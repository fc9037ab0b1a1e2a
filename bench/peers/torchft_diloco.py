"""One torchft DiLoCo replica group: the peer Islands is compared against in bench/goodput.py.

Run by the python of torchft's own venv (bench/peers/torchft_env.py), one process per
replica group, everything on 127.0.0.1:

    torchft-venv/bin/python bench/peers/torchft_diloco.py --replica-group 1 --groups 4 \\
        --lighthouse http://127.0.0.1:PORT --run-dir RUN --data markov \\
        --n-layer 1 --n-embd 32 --n-head 2 --batch-size 8 --sync-every 10

It trains Islands' own model (trainer.model) on Islands' own data shards (trainer.data),
with Islands' inner AdamW (trainer.sync_state.make_inner_optimizer, grad clip as the
learner does) and the outer SGD(lr 0.7, momentum 0.9, nesterov) Islands' syncer applies,
and accepts Islands' training flags (trainer.cli_args), so one flag list drives both.

torchft API used (0.2.0):
  store   = torch.distributed.TCPStore("127.0.0.1", 0, is_master=True)   (one per group)
  manager = torchft.Manager(pg=torchft.ProcessGroupGloo(timeout), min_replica_size=1,
                use_async_quorum=False, load_state_dict=..., state_dict=..., replica_id=str(N),
                lighthouse_addr=..., store_addr="127.0.0.1", store_port=store.port, rank=0,
                world_size=1, hostname="127.0.0.1", port=0, heartbeat_interval, timeout,
                quorum_timeout, connect_timeout, init_sync=False)
  with torchft.local_sgd.DiLoCo(manager, [model], inner, outer, sync_every=H): inner.step() ...
DiLoCo syncs from the inner optimizer's step post-hook: every H steps it asks the
lighthouse for a quorum (healing from a peer if this group is behind), all-reduces the
pseudo-gradient over gloo, and steps the outer optimizer only if manager.should_commit().
This script wraps manager.start_quorum / should_commit and the checkpoint transport to
observe each sync; it changes none of their results.

Events (RUN_DIR/events/torchft-N.jsonl, Islands' schema, learner=N):
  process_start  role=learner, system=torchft, incarnation (persisted in RUN_DIR/torchft/)
  torchft_barrier  the start barrier (first incarnation only): groups joined, seconds waited
  inner_step     step, loss, tokens, compute_s (own compute only, the sync excluded), incarnation
  merge          a committed sync, written by each group for its own contribution:
                 contributors=[{learner, incarnation, tokens, steps}], tokens, participants,
                 version (= manager step after it), quorum_id, quorum_s, sync_s, healed.
                 trainer.metrics.merged_tokens sums these unchanged, so summarize() works;
                 its `merges` then counts group-commits (about participants × syncs).
  sync_failed    a sync that did not commit: the tokens of the H steps thrown away, error
  torchft_heal   this group copied state from a peer: fetch_s, bytes, src_rank; the H steps
                 it had made are replaced by the peer's (discarded_tokens), so that merge
                 counts 0 tokens; retracted_tokens = tokens this incarnation committed in
                 quorums of one since its last commit with a peer, whose lineage the heal
                 overwrote (e.g. it restarted while every other group was paused). Net merged
                 tokens = Σ merge tokens − Σ retracted_tokens (torchft_cluster.net_merged_tokens).
  process_stop   reason (signal, duration, max_steps, "signal during sync", error: ...), steps

With --final-params-dir DIR the group keeps an in-memory copy of the parameters right after
each committed sync (the global parameters of that quorum: torchft's DiLoCo has restored
the backup, applied the outer step and, with fragment_update_alpha 0, left them in the
model) and, when it stops (SIGTERM/SIGINT, --duration, --max-steps, or an error), writes
{"params", "manager_step", "step", "incarnation", "participants"} to DIR/group-N.pt with
torch.save. A SIGKILLed incarnation writes nothing; the next one overwrites the file when it stops.
bench/goodput.py evaluates the newest one (highest manager_step) with trainer.launch.evaluate.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from trainer.cli_args import add_syncer_args, add_train_args, train_config  # noqa: E402
from trainer.data import ShardSampler, load_corpus  # noqa: E402
from trainer.events import EventLog  # noqa: E402
from trainer.model import build_model, count_parameters  # noqa: E402
from trainer.pacing import StepPacer  # noqa: E402
from trainer.sync_state import make_inner_optimizer, warm_up_lr  # noqa: E402

STATE_DIR = "torchft"          # under RUN_DIR: incarnation counters, data positions, barrier
ERROR_EXIT = 1


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--replica-group", type=int, required=True, help="N >= 1: this group (Islands' learner-N)")
    p.add_argument("--groups", type=int, default=4, help="replica groups in the run: data shards and barrier size")
    p.add_argument("--lighthouse", required=True, help="http://127.0.0.1:PORT")
    p.add_argument("--run-dir", required=True)
    p.add_argument("--data", default="markov")
    p.add_argument("--mode", default="decoupled", help=argparse.SUPPRESS)  # add_train_args expects it
    p.add_argument("--max-steps", type=int, default=None, help="stop after this many inner steps")
    p.add_argument("--duration", type=float, default=None, help="stop after this many seconds of training")
    p.add_argument("--threads", type=int, default=1, help="torch threads (Islands learners use 1)")
    p.add_argument("--speed", type=float, default=1.0,
                   help="0 < S <= 1: after each step, sleep (1/S - 1) x its own compute time, as Islands' "
                        "`--speed S --slowdown sleep` does (an emulated accelerator that leaves the CPU free)")
    p.add_argument("--collective-timeout", type=float, default=None,
                   help="seconds for the all-reduce, should_commit and checkpoint fetch "
                        "(default: Islands' --request-timeout)")
    p.add_argument("--quorum-timeout", type=float, default=60.0, help="seconds to wait for a quorum")
    p.add_argument("--connect-timeout", type=float, default=10.0)
    p.add_argument("--quorum-retries", type=int, default=0,
                   help="torchft quorum_retries: lighthouse quorum calls retried before failing (torchft default 0)")
    p.add_argument("--barrier-timeout", type=float, default=60.0,
                   help="first incarnation: seconds to wait for all groups before training")
    p.add_argument("--no-barrier", action="store_true", help="train at once (the first group then syncs alone)")
    p.add_argument("--init-sync", action="store_true",
                   help="torchft init_sync: copy weights at step 0 (not needed: the seed makes them equal)")
    p.add_argument("--log-level", default="INFO", help="torchft's own logging (quorums, heals) to stderr")
    p.add_argument("--final-params-dir", default=None,
                   help="on stopping, torch.save the parameters of the last committed sync to DIR/group-N.pt")
    p.add_argument("--spawned-at", type=float, default=None,
                   help="time.monotonic() when the launcher spawned this process (start-up is measured from it)")
    add_train_args(p)
    add_syncer_args(p)
    p.add_argument("--step-time", type=float, default=0.0,
                   help="SECONDS: every inner step takes at least this long, as Islands' learner --step-time "
                        "(an emulated accelerator)")
    args = p.parse_args(argv)
    if not 0 < args.speed <= 1:
        p.error(f"--speed: must be in (0, 1], got {args.speed}")
    if args.step_time < 0:
        p.error(f"--step-time: must be >= 0, got {args.step_time}")
    if args.replica_group < 1 or args.replica_group > args.groups:
        p.error(f"--replica-group: must be in [1, {args.groups}], got {args.replica_group}")
    if args.fragments != 1 or args.overlap != 0 or args.alpha != 0.0 or args.encoding != "fp32":
        p.error("the torchft peer runs plain DiLoCo: --fragments 1, --overlap 0, --alpha 0, --encoding fp32")
    args.train = train_config(args, p, args.groups)
    return args


class GroupState:
    """This group's incarnation counter and data position, kept in RUN_DIR across restarts."""

    def __init__(self, run_dir: Path, group: int) -> None:
        self.path = run_dir / STATE_DIR / f"group-{group}.json"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            data = {}
        self.incarnation = int(data.get("incarnation", 0)) + 1
        self.position = int(data.get("position", 0))
        self.save(self.position)

    def save(self, position: int) -> None:
        self.position = position
        tmp = self.path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps({"incarnation": self.incarnation, "position": position}))
        os.replace(tmp, self.path)


def start_barrier(run_dir: Path, group: int, groups: int, timeout: float, stop: threading.Event) -> dict:
    """Say this group is up (its manager already heartbeats to the lighthouse), then wait
    until every group is, or `timeout`. Without it the first group to reach step H forms
    a quorum alone, since the others are not heartbeating yet, and trains alone a while."""
    folder = run_dir / STATE_DIR / "barrier"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"group-{group}").write_text(str(os.getpid()))
    started = time.monotonic()
    deadline = started + timeout
    joined = 0
    while not stop.is_set():
        joined = len(list(folder.glob("group-*")))
        if joined >= groups or time.monotonic() > deadline:
            break
        stop.wait(0.05)
    return {"joined": joined, "groups": groups, "waited_s": round(time.monotonic() - started, 3),
            "complete": joined >= groups}


def _warm_up_torch(threads: int) -> None:
    """As Islands' learner does: pay torch's lazy first-optimizer cost before heartbeating."""
    torch.set_num_threads(threads)
    p = torch.zeros(2, requires_grad=True)
    p.sum().backward()
    torch.optim.AdamW([p]).step()


def _short(exc: object) -> str:
    text = str(exc).strip().splitlines()
    return (f"{type(exc).__name__}: " + (text[0] if text else ""))[:300] if exc is not None else ""


class SyncProbe:
    """Observes torchft's sync from outside: wraps the manager's quorum and commit calls and
    the checkpoint transport, recording timings; results pass through unchanged."""

    def __init__(self, manager) -> None:
        self.manager = manager
        self.reset()
        self._wrap()

    def reset(self) -> None:
        self.quorum_s: float | None = None
        self.commit: bool | None = None
        self.participants: int | None = None
        self.quorum_id: int | None = None
        self.replica_rank: int | None = None
        self.error: str | None = None
        self.healed = False
        self.heal: dict | None = None
        self.sent_to: list[int] = []

    def _wrap(self) -> None:
        m = self.manager
        start_quorum, should_commit = m.start_quorum, m.should_commit
        transport = m._checkpoint_transport
        recv, send = transport.recv_checkpoint, transport.send_checkpoint

        def wrapped_start_quorum(*a, **k):
            started = time.perf_counter()
            try:
                return start_quorum(*a, **k)
            finally:
                self.quorum_s = time.perf_counter() - started
                self.quorum_id = m._quorum_id
                self.participants = m._participating_replica_world_size
                self.replica_rank = m._participating_replica_rank

        def wrapped_should_commit(*a, **k):
            result = should_commit(*a, **k)
            self.commit = bool(result)
            if m.errored() is not None:
                self.error = _short(m.errored().original_exception)
            return result

        def wrapped_recv(*a, **k):
            started = time.perf_counter()
            state = recv(*a, **k)
            self.heal = {"fetch_s": round(time.perf_counter() - started, 4), "src_rank": k.get("src_rank"),
                         "checkpoint_step": k.get("step"), "bytes": _tensor_bytes(state)}
            return state

        def wrapped_send(*a, **k):
            self.sent_to = list(k.get("dst_ranks") or [])
            return send(*a, **k)

        m.start_quorum, m.should_commit = wrapped_start_quorum, wrapped_should_commit
        transport.recv_checkpoint, transport.send_checkpoint = wrapped_recv, wrapped_send


def _tensor_bytes(obj) -> int:
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(_tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_tensor_bytes(v) for v in obj)
    return 0


def save_final(folder: str | None, group: int, committed: dict | None) -> None:
    """Write the last committed global parameters (see --final-params-dir); never raises."""
    if not folder or not committed:
        return
    path = Path(folder) / f"group-{group}.pt"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
        torch.save(committed, tmp)
        os.replace(tmp, path)
    except Exception as exc:  # noqa: BLE001 - stopping must go on
        print(f"--final-params-dir: could not write {path}: {_short(exc)}", file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    cfg = args.train
    group = args.replica_group
    run_dir = Path(args.run_dir)
    stop = threading.Event()
    signals = {"count": 0}
    box: dict = {}  # what the signal handler may need

    in_sync = threading.Event()  # set from the end of own compute until inner.step() returns

    def on_signal(signum, _frame):
        signals["count"] += 1
        stop.set()
        # Blocked in a sync (a quorum can wait up to --quorum-timeout): nothing there is
        # worth saving (uncommitted), so leave now. A second signal always leaves at once.
        if in_sync.is_set() or signals["count"] > 1:
            save_final(args.final_params_dir, group, box.get("committed"))
            if "events" in box:
                reason = "signal during sync" if in_sync.is_set() else "second signal"
                box["events"].emit("process_stop", role="learner", system="torchft", reason=reason,
                                   steps=box.get("step"), incarnation=box.get("incarnation"))
            os._exit(128 + signum)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)

    state = GroupState(run_dir, group)
    events = box["events"] = EventLog(run_dir, f"torchft-{group}", learner=group)
    box["incarnation"] = state.incarnation
    _warm_up_torch(args.threads)

    # Imported here so that --help and argument errors work without torchft.
    import torch.distributed as dist
    from torchft import Manager, ProcessGroupGloo
    from torchft.local_sgd import DiLoCo

    corpus = load_corpus(args.data)
    train, _ = corpus.split()
    sampler = ShardSampler(train, group - 1, args.groups, cfg.model.block_size, cfg.batch_size, cfg.seed,
                           state.incarnation, state.position)
    model = build_model(cfg.model, cfg.seed)
    inner = make_inner_optimizer(model, cfg)
    outer = torch.optim.SGD(model.parameters(), lr=args.outer_lr, momentum=args.outer_momentum, nesterov=True)
    probe_box: dict = {}

    def load_state_dict(sd: dict) -> None:  # called by torchft when this group heals from a peer
        model.load_state_dict(sd["model"])
        inner.load_state_dict(sd["inner_optim"])
        if "probe" in probe_box:
            probe_box["probe"].healed = True

    def state_dict() -> dict:
        return {"model": model.state_dict(), "inner_optim": inner.state_dict()}

    collective = args.collective_timeout if args.collective_timeout is not None else cfg.request_timeout
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    manager = Manager(
        pg=ProcessGroupGloo(timeout=timedelta(seconds=collective)),
        load_state_dict=load_state_dict,
        state_dict=state_dict,
        min_replica_size=1,
        use_async_quorum=False,
        replica_id=str(group),
        lighthouse_addr=args.lighthouse,
        store_addr="127.0.0.1",
        store_port=store.port,
        rank=0,
        world_size=1,
        hostname="127.0.0.1",
        port=0,
        heartbeat_interval=timedelta(seconds=cfg.heartbeat_interval),
        timeout=timedelta(seconds=collective),
        quorum_timeout=timedelta(seconds=args.quorum_timeout),
        connect_timeout=timedelta(seconds=args.connect_timeout),
        init_sync=args.init_sync,
        quorum_retries=args.quorum_retries,
    )
    probe = probe_box["probe"] = SyncProbe(manager)
    tokens_per_step = cfg.tokens_per_step
    events.emit("process_start", role="learner", system="torchft", mode="torchft-diloco",
                incarnation=state.incarnation, rejoin=state.incarnation > 1, position=sampler.position,
                threads=args.threads, speed=args.speed, slowdown="sleep", step_time=args.step_time, corpus=corpus.name, loss_floor=corpus.entropy_rate,
                unigram_entropy=corpus.unigram_entropy, spawned_at=args.spawned_at,
                startup_s=round(time.monotonic() - args.spawned_at, 3) if args.spawned_at else None,
                parameters=count_parameters(model), config=cfg.to_dict(),
                torchft={"lighthouse": args.lighthouse, "replica_id": str(group), "min_replica_size": 1,
                         "collective_timeout_s": collective, "quorum_timeout_s": args.quorum_timeout,
                         "heartbeat_interval_s": cfg.heartbeat_interval, "init_sync": args.init_sync,
                         "quorum_retries": args.quorum_retries,
                         "outer": {"lr": args.outer_lr, "momentum": args.outer_momentum, "nesterov": True}})
    if state.incarnation == 1 and not args.no_barrier:
        events.emit("torchft_barrier", **start_barrier(run_dir, group, args.groups, args.barrier_timeout, stop))

    marks: dict[str, float] = {}
    # Registered before DiLoCo's own post-hook, so it runs first: the end of own compute.
    def end_of_compute(*_):
        marks["computed"] = time.perf_counter()
        in_sync.set()

    inner.register_step_post_hook(end_of_compute)
    step = tokens_since = steps_since = 0
    # Tokens this incarnation committed in quorums of one since its last commit with a peer.
    # If it later heals, the peer's state overwrites that solo lineage: those tokens were
    # counted in `merge` events but are lost, and the heal event says how many
    # (`retracted_tokens`). Rule of thumb, exact when at most two lineages exist at once.
    solo_tokens: list[int] = []
    began = time.monotonic()
    pacer = StepPacer(args.speed, "sleep", args.step_time)
    reason = "stopped"
    code = 0
    try:
        with DiLoCo(manager, [model], inner, outer, sync_every=cfg.sync_every):
            while True:
                if stop.is_set():
                    reason = "signal"
                    break
                if args.max_steps is not None and step >= args.max_steps:
                    reason = "max_steps"
                    break
                if args.duration is not None and time.monotonic() - began >= args.duration:
                    reason = "duration"
                    break
                x, y = sampler.next_batch()
                started = time.perf_counter()
                _, loss = model(x, y)
                inner.zero_grad(set_to_none=True)
                loss.backward()
                if cfg.grad_clip > 0:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
                probe.reset()
                warm_up_lr(inner, cfg)  # Islands' inner schedule too, so the comparison is of the outer loop
                inner.step()  # DiLoCo's post-hook syncs here every H steps
                in_sync.clear()
                ended = time.perf_counter()
                step += 1
                box["step"] = step
                tokens_since += tokens_per_step
                steps_since += 1
                computed = marks.get("computed", ended)
                events.emit("inner_step", step=step, loss=float(loss.detach()), tokens=tokens_per_step,
                            compute_s=round(computed - started, 5), incarnation=state.incarnation,
                            position=sampler.position, manager_step=manager.current_step())
                pacer.after_step(computed - started, stop)  # --speed / --step-time, as Islands' learners
                if probe.commit is None:
                    continue
                sync = dict(quorum_id=probe.quorum_id, participants=probe.participants,
                            replica_rank=probe.replica_rank, quorum_s=round(probe.quorum_s or 0.0, 4),
                            sync_s=round(ended - computed, 4), incarnation=state.incarnation, step=step)
                if probe.sent_to:
                    sync["sent_checkpoint_to"] = probe.sent_to
                if probe.healed:
                    retracted, solo_tokens = sum(solo_tokens), []
                    events.emit("torchft_heal", incarnation=state.incarnation, step=step,
                                manager_step=manager.current_step(), discarded_tokens=tokens_since,
                                retracted_tokens=retracted,
                                since_spawn_s=round(time.monotonic() - args.spawned_at, 3)
                                if args.spawned_at else None, **(probe.heal or {}))
                useful = 0 if probe.healed else tokens_since  # a healed group's delta is its peer's copy
                if probe.commit:
                    events.emit("merge", system="torchft", fragment=0, version=manager.current_step(),
                                contributors=[{"learner": group, "incarnation": state.incarnation,
                                               "tokens": useful, "steps": steps_since}],
                                tokens=useful, fragment_share=1.0, healed=probe.healed, **sync)
                    if args.final_params_dir:  # the global parameters of this commit (module docstring)
                        box["committed"] = {
                            "params": {k: v.detach().clone() for k, v in model.state_dict().items()},
                            "manager_step": manager.current_step(), "step": step,
                            "incarnation": state.incarnation, "participants": probe.participants}
                    if (probe.participants or 0) > 1:
                        solo_tokens = []
                    elif useful:
                        solo_tokens.append(useful)
                else:
                    events.emit("sync_failed", system="torchft", fragment=0, version=manager.current_step(),
                                discarded_tokens=tokens_since, error=probe.error, **sync)
                tokens_since = steps_since = 0
                state.save(sampler.position)
    except Exception as exc:  # noqa: BLE001 - a failed quorum raises out of inner.step(); recorded, exit 1
        reason, code = f"error: {_short(exc)}", ERROR_EXIT
        print(f"torchft-{group}: {reason}", file=sys.stderr, flush=True)
    state.save(sampler.position)
    save_final(args.final_params_dir, group, box.get("committed"))
    events.emit("process_stop", role="learner", system="torchft", reason=reason, steps=step,
                incarnation=state.incarnation, manager_step=manager.current_step(),
                unsynced_tokens=tokens_since)
    events.close()
    try:
        manager.shutdown(wait=False)
    except Exception:  # noqa: BLE001 - leaving anyway
        pass
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # torchft's quorum thread may still block in an RPC: do not wait for it


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("TORCHFT_USE_OTEL", "false")
    logging.basicConfig(level=getattr(logging, args.log_level.upper(), logging.INFO),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
