"""CLI: `python -m trainer {syncer,learner,eval,run}`. `--help` on each."""
from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from datetime import datetime
from pathlib import Path

from .clock import use_clock_of
from .cli_args import (add_common_args, add_device_arg, add_syncer_args, add_train_args, forward_flags,
                       non_negative_int, positive_float, positive_int, syncer_config, train_config)
from .argtypes import Parser, non_negative_float, parse_with_hints, subcommand_parser
from .link import Address


def _secret(args: argparse.Namespace, parser: argparse.ArgumentParser) -> bytes:
    from .wire import load_secret
    try:
        return load_secret(args.secret_file)
    except ValueError as exc:
        parser.error(str(exc))
        raise


def _learner_key(args: argparse.Namespace, parser: argparse.ArgumentParser) -> bytes:
    """This learner's own key (keys.py): --key-file, else derived from a run secret."""
    from .keys import load_learner_key
    try:
        return load_learner_key(args.learner, args.key_file, args.secret_file)
    except ValueError as exc:
        parser.error(str(exc))
        raise


def _preflight(train, data: str, parser: argparse.ArgumentParser, ranks: int = 1) -> dict:
    """Load the task and call each of its methods once: a broken task is refused here, with
    its clear error, before any process starts. Returns what the task says of its data."""
    from .task import TaskError, check_run_task
    try:
        return check_run_task(train, data, train.num_learners * ranks)  # every rank reads its own shard
    except TaskError as exc:
        if exc.details:
            print(exc.details, file=sys.stderr, end="")
        parser.error(str(exc))
    except (ValueError, FileNotFoundError) as exc:  # the built-in task's --data
        parser.error(str(exc))
    raise AssertionError("unreachable: parser.error exits")


def cmd_syncer(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from .syncer import serve
    use_clock_of("syncer")
    train = train_config(args, parser, args.learners)
    cfg = syncer_config(args, parser, args.state_dir, args.host, args.port, args.eval_data or "")
    secret = _secret(args, parser)
    from .task import TaskError
    try:
        return serve(cfg, train, secret, args.run_dir, args.address_file)
    except TaskError as exc:
        print(f"syncer: error: {exc}\n{exc.details}", file=sys.stderr)
        return 2
    except ValueError as exc:  # e.g. a state dir of another run
        print(f"syncer: error: {exc}", file=sys.stderr)
        return 2


def cmd_learner(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    use_clock_of(f"learner-{args.learner}")
    try:
        address = Address.parse(args.connect)
    except ValueError as exc:
        parser.error(str(exc))
    if not 0 < args.speed <= 1:
        parser.error(f"--speed: must be in (0, 1], got {args.speed}")
    if args.step_time and args.speed < 1:
        parser.error("--step-time: emulates an accelerator of a fixed step time; do not combine it with --speed")
    if args.ranks > 1 and args.mode == "sync":
        parser.error("--ranks: a unit of several ranks needs --mode decoupled (sync mode is the 1-rank baseline)")
    if args.rank is not None and (args.rank >= args.ranks or args.rendezvous is None):
        parser.error(f"--rank: must be below --ranks {args.ranks}, with --rendezvous")
    secret = _learner_key(args, parser)  # key_N: all this process may speak as
    if args.ranks > 1 and args.rank is None:
        from .unit import UnitOptions, run_unit
        return run_unit(UnitOptions(args.learner, args.ranks, args.run_dir), lambda r, store: rank_argv(args, r, store))
    from .learner import LearnerOptions, run_learner
    opts = LearnerOptions(learner=args.learner, address=address, run_dir=args.run_dir, max_steps=args.max_steps,
                          threads=args.threads, speed=args.speed, slowdown=args.slowdown,
                          step_time=args.step_time, connect_timeout=args.connect_timeout,
                          rank=args.rank or 0, ranks=args.ranks, store_file=args.rendezvous,
                          collective_timeout=args.collective_timeout, task=args.task, data=args.data,
                          device=args.device)
    return run_learner(opts, secret, args.mode)


def rank_argv(args: argparse.Namespace, rank: int, store: str) -> list[str]:
    """The command line of one rank of a unit: the unit's own flags plus --rank and --rendezvous."""
    argv = [sys.executable, "-m", "trainer", "learner", "--learner", str(args.learner), "--connect", args.connect,
            "--data", args.data, "--task", args.task, "--device", args.device,
            "--mode", args.mode, "--threads", str(args.threads), "--speed", str(args.speed),
            "--slowdown", args.slowdown, "--step-time", str(args.step_time),
            "--connect-timeout", str(args.connect_timeout), "--collective-timeout", str(args.collective_timeout),
            "--ranks", str(args.ranks), "--rank", str(rank), "--rendezvous", store]
    for flag, value in (("--run-dir", args.run_dir), ("--max-steps", args.max_steps),
                        ("--secret-file", args.secret_file), ("--key-file", args.key_file)):
        if value is not None:
            argv += [flag, str(value)]
    return argv


def _run_dir(out: str | None, parser: argparse.ArgumentParser) -> Path:
    """--out, unless it holds a run already; by default a fresh `runs/<time>` of this run's
    own, even beside another run started in the same second (trainer/rundir.py)."""
    from .rundir import claim_run_dir
    if out is None:
        return claim_run_dir(f"runs/{datetime.now():%Y%m%d-%H%M%S}")
    path = Path(out)
    if (path / "events").exists() and any((path / "events").iterdir()):
        parser.error(f"--out: {path} already holds a run; choose a new directory")
    return path


def cmd_run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from tqdm import tqdm

    from .launch import BAR_FORMAT, ClusterSpec, LocalCluster, ProgressTail, final_parameters, learner_logs_tail, score
    from .runspec import RunSpec
    from .metrics import summarize
    from .events import read_events
    from .signals import stop_on_signals

    train = train_config(args, parser, args.learners)
    syncer_config(args, parser, "unused")  # validate syncer flags before starting anything
    if args.ranks > 1 and args.mode == "sync":
        parser.error("--ranks: a unit of several ranks needs --mode decoupled (sync mode is the 1-rank baseline)")
    facts = _preflight(train, args.data, parser, args.ranks)  # also warms the synthetic-data cache for the learners
    out = _run_dir(args.out, parser)
    run = RunSpec(backend="local", learners=args.learners, ranks=args.ranks, mode=args.mode, task=train.task,
                  device=args.device, data=args.data, trainer_args=forward_flags(args)[2:],
                  duration=args.duration).with_learner_flags(["--threads", str(args.threads)])
    out.mkdir(parents=True, exist_ok=True)
    (out / "run.json").write_text(json.dumps(run.to_json(), indent=2))
    cluster = LocalCluster(ClusterSpec(out, run))
    data = f", data {facts['data']}" if facts.get("data") and facts["data"] != train.task else ""
    print(f"islands: {args.learners} learners, {args.mode} mode, task {train.task}{data}, "
          f"run dir {out}", flush=True)
    tail = ProgressTail(out, args.mode)
    started = elapsed = 0.0
    # ^C and SIGTERM both stop the cluster cleanly and still summarise. Installed by hand:
    # a run started in the background by a script inherits SIGINT ignored, and SIGTERM's
    # default would end the launcher alone, leaving its syncer and learners (each in a
    # session of its own) running.
    interrupted = threading.Event()
    stop_on_signals(interrupted)
    try:
        cluster.start()
        started = time.monotonic()
        with tqdm(total=int(args.duration), bar_format=BAR_FORMAT, disable=args.quiet, dynamic_ncols=True) as bar:
            while (elapsed := time.monotonic() - started) < args.duration and not interrupted.wait(0.5):
                if args.supervise:
                    cluster.supervise(args.restart_delay)
                tail.poll()
                bar.n = min(int(elapsed), int(args.duration))
                bar.set_postfix(tail.postfix(), refresh=True)
        if interrupted.is_set():
            print("interrupted: stopping the cluster", file=sys.stderr)
    except (RuntimeError, TimeoutError) as exc:
        cluster.kill()
        print(f"run: error: {exc}", file=sys.stderr)
        return 1
    finally:
        cluster.stop()
    events = read_events(out)
    summary = summarize(events, args.learners)
    summary.update({"mode": args.mode, "learners": args.learners, "task": train.task, **facts})
    summary.update(run_timing(events, started, elapsed))
    summary.update(task_failures(events))
    try:
        summary.update(score(final_parameters(out, train), train, args.data))
    except FileNotFoundError as exc:
        summary["final_loss"] = None
        summary["error"] = str(exc)
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    print_summary(summary, out)
    problems = learner_logs_tail(out)
    if problems:
        print("processes that failed:\n" + problems, file=sys.stderr)
    return 0 if summary.get("final_loss") is not None else 1


def cmd_eval(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Held-out loss of the global parameters in a syncer state directory, as JSON."""
    from .config import TrainConfig
    from .launch import final_parameters, score
    from .model import ModelConfig
    from .task import TaskError
    from .state import StateDir, read_json

    state = Path(args.state_dir)
    meta = read_json(StateDir(state).meta_path) if state.is_dir() else None
    if meta is None:
        parser.error(f"--state-dir: {state} holds no syncer state (no meta.json)")
    fp = meta["fingerprint"]
    train = TrainConfig(model=ModelConfig.from_dict(fp["model"]), task=fp.get("task", "gpt"), mode=fp["mode"],
                        seed=fp["seed"], fragments=fp["fragments"],
                        sync_every=max(fp["fragments"], TrainConfig.sync_every),
                        max_unsent_pushes=max(8, fp["fragments"] + 1))
    try:
        result = score(final_parameters(state, train, state_dir=state), train, args.data)
    except TaskError as exc:
        print(f"eval: error: {exc}\n{exc.details}", file=sys.stderr)
        return 2
    except (ValueError, FileNotFoundError) as exc:
        parser.error(str(exc))
    if args.run_dir:
        from .events import EventLog
        log = EventLog(args.run_dir, "evaluator")
        log.emit("eval", **result)
        log.close()
    print(json.dumps(result))
    return 0


def task_failures(events: list[dict]) -> dict:
    """What the task's failures were, for the summary: every learner's task_error, in order."""
    errors = [{"learner": e.get("learner"), "method": e.get("method"), "error": e.get("error")}
              for e in events if e["kind"] == "task_error"]
    return {"task_errors": errors} if errors else {}


def run_timing(events: list[dict], started: float, elapsed: float) -> dict:
    """How the run's seconds were spent: `wall_seconds` (summarize) spans only the first to
    the last inner step, so a 60 s run reads 52 s; this says where the rest went."""
    first = next((e["t"] for e in events if e["kind"] == "inner_step"), None)
    out = {"run_seconds": round(elapsed, 1)}
    if first is not None and started:
        out["startup_seconds"] = round(max(first - started, 0.0), 1)  # CLOCK_MONOTONIC, shared
    return out


def print_summary(s: dict, out: Path) -> None:
    floor = s.get("loss_floor")
    startup = f"; the first {s['startup_seconds']} s went to starting the learners" if "startup_seconds" in s else ""
    rows = [
        ("training time", f"{s.get('wall_seconds')} s of the run, first to last inner step{startup}"),
        ("final loss (held-out" + (f", {s['loss_unit']})" if s.get("loss_unit") else ")"), s.get("final_loss")),
        *((f"held-out {k}", v) for k, v in (s.get("metrics") or {}).items()),
        *((("loss floor (entropy rate)", round(floor, 4) if floor is not None else "unknown (real text)"),
           ("unigram entropy", round(s["unigram_entropy"], 4))) if "unigram_entropy" in s else ()),
        ("recent training loss", s.get("train_loss_recent")),
        ("goodput", f"{s['goodput']:.1%} of the time the learners could compute"
                    + (f" ({s['goodput_solo']:.1%} of their solo rate all run)"
                       if s.get("goodput_solo") is not None and s["goodput_solo"] < s["goodput"] - 0.005 else "")
         if s.get("goodput") is not None else None),
        ("tokens processed / merged", f"{s.get('tokens_processed')} / {int(s.get('tokens_merged', 0))}"),
        ("merges / sync rounds", f"{s.get('merges')} / {s.get('sync_rounds')}"),
        ("bytes on the wire", f"{s.get('bytes_on_wire', 0) / 1e6:.1f} MB ({s.get('bytes_per_token')} B/token)"),
        ("learner incarnations", s.get("learner_incarnations")),
        *((f"task error (learner-{e['learner']})", e["error"]) for e in s.get("task_errors", [])[:3]),
    ]
    width = max(len(k) for k, _ in rows)
    length = f"{s['run_seconds']:g} s run" if s.get("run_seconds") is not None else f"{s.get('wall_seconds')} s"
    print(f"\nsummary ({s.get('mode')}, {s.get('learners')} learners, {length}):")
    for k, v in rows:
        print(f"  {k:<{width}}  {v}")
    print(f"  {'run dir':<{width}}  {out}")
    from .fates import fates_lines
    for line in fates_lines(s):
        print(f"  {line}")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="python -m trainer", description="Islands' trainer: decoupled DiLoCo learners and "
                                                           "their syncer, as processes over TCP.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="{syncer,learner,eval,run}")

    p = sub.add_parser("syncer", help="run the syncer (outer optimizer) service")
    add_common_args(p)
    add_train_args(p)
    add_syncer_args(p)
    p.add_argument("--learners", type=positive_int, default=3, help="number of learners (data shards)")
    p.add_argument("--state-dir", required=True, help="durable state; the syncer resumes from it")
    p.add_argument("--run-dir", help="write events to RUN_DIR/events/syncer.jsonl")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (127.0.0.1: this machine only)")
    p.add_argument("--port", type=non_negative_int, default=0, help="0 picks a free port")
    p.add_argument("--address-file", help="write {host, port} here once listening")
    p.add_argument("--eval-data", default=None, metavar="DATA",
                   help="sample the global parameters' held-out loss on DATA ('markov[:...]' or a text path, as "
                        "the learners' --data) during the run: global_eval events (default: no sampling)")
    p.set_defaults(func=cmd_syncer)

    p = sub.add_parser("learner", help="run one learner unit")
    add_common_args(p)
    p.add_argument("--learner", type=positive_int, required=True, help="this learner's id, 1..N")
    p.add_argument("--key-file", default=None, metavar="FILE",
                   help="this learner's own key file ('islands-learner-key v1 learner=N ...', written by "
                        "`python -m trainer.keys`): with it the learner can speak only as --learner "
                        "(default: $ISLANDS_KEY_FILE, else a key derived from the run secret of --secret-file)")
    p.add_argument("--connect", required=True, help="HOST:PORT of the syncer (or of this learner's proxy)")
    p.add_argument("--data", default="markov", help="'markov[:k=v,...]' or a text file or folder")
    p.add_argument("--task", default="gpt", help="the task the syncer trains (it refuses another); loaded before "
                                                 "joining: FILE.py:NAME, MODULE:NAME or gpt (default)")
    add_device_arg(p)
    p.add_argument("--run-dir", help="write events to RUN_DIR/events/learner-N.jsonl")
    p.add_argument("--max-steps", type=positive_int, default=None,
                   help="stop cleanly after this many inner steps (default: run until SIGTERM)")
    p.add_argument("--threads", type=positive_int, default=1, help="torch threads")
    p.add_argument("--speed", type=positive_float, default=1.0, help="(0, 1]: artificial slowdown factor")
    p.add_argument("--slowdown", choices=("sleep", "spin"), default="sleep",
                   help="how --speed slows the learner: sleep (frees the CPU) or spin (keeps its core busy, "
                        "as a slower chip would; fair when learners share one machine's CPUs)")
    p.add_argument("--step-time", type=non_negative_float, default=0.0, metavar="SECONDS",
                   help="emulate an accelerator: every inner step takes at least SECONDS, the learner sleeping "
                        "out what its own work did not use (so learners sharing this machine's CPUs do not "
                        "slow each other); 0 = as fast as the CPU goes (default)")
    p.add_argument("--connect-timeout", type=positive_float, default=60.0,
                   help="seconds to keep trying to reach the syncer at start before giving up")
    p.add_argument("--ranks", type=positive_int, default=1,
                   help="ranks in this unit: DDP over gloo inside it, rank 0 talks to the syncer; "
                        "if any rank dies the whole unit restarts (default 1)")
    p.add_argument("--collective-timeout", type=positive_float, default=60.0,
                   help="seconds a rank waits for the others (a paused rank stalls its unit this long at most)")
    p.add_argument("--rank", type=non_negative_int, default=None, help=argparse.SUPPRESS)  # set by the unit
    p.add_argument("--rendezvous", default=None, help=argparse.SUPPRESS)  # the unit's gloo file store
    p.set_defaults(func=cmd_learner)

    p = sub.add_parser("eval", help="held-out loss of the global parameters in a state dir (JSON)",
                       description="Print the held-out loss of the global parameters a syncer's state dir holds, "
                                   "as one JSON line.")
    p.add_argument("--state-dir", required=True, help="a syncer's --state-dir")
    p.add_argument("--data", default="markov", help="'markov[:k=v,...]' or a text file or folder")
    p.add_argument("--run-dir", help="also write an `eval` event to RUN_DIR/events/evaluator.jsonl")
    p.set_defaults(func=cmd_eval)

    p = sub.add_parser("run", help="start a local cluster, train, and print a summary")
    add_common_args(p)
    add_train_args(p)
    add_syncer_args(p)
    p.add_argument("--learners", type=positive_int, default=3, help="learner units to start, each on its own shard")
    p.add_argument("--out", help="run directory (default runs/<timestamp>)")
    p.add_argument("--data", default="markov", help="'markov[:k=v,...]' or a text file or folder")
    p.add_argument("--duration", type=positive_float, default=60.0, help="seconds of training")
    p.add_argument("--threads", type=positive_int, default=1, help="torch threads per learner")
    p.add_argument("--ranks", type=positive_int, default=1, help="ranks per learner unit (DDP over gloo)")
    add_device_arg(p)
    p.add_argument("--restart-delay", type=float, default=1.0, help="seconds before restarting a dead learner")
    p.add_argument("--no-supervise", dest="supervise", action="store_false",
                   help="do not restart processes that die")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_run)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parse_with_hints(parser, list(sys.argv[1:] if argv is None else argv))
    sub = subcommand_parser(parser, args)
    return int(args.func(args, sub) or 0)


# Long-running roles whose clean stop has already flushed and fsynced all they own.
FAST_EXIT_COMMANDS = ("syncer", "learner")


def exit_now(code: int) -> None:
    """Skip interpreter teardown, which takes 2-4 s with torch loaded (freeing its
    allocator and thread pools) and would make every container stop and restart slow.
    Safe only after a role's clean stop: its events are closed, its state is durable."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    command = sys.argv[1] if len(sys.argv) > 1 else ""
    code = main()
    if command in FAST_EXIT_COMMANDS:
        exit_now(code)
    sys.exit(code)
