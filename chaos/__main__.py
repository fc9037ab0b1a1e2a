"""CLI: `python -m chaos {run,replay,demo,validate,toxiproxy,report,stack,forward,load,sim,explore,simulate-goodput}`. `--help` on each."""
from __future__ import annotations

import argparse
import shlex
import sys
from datetime import datetime
from pathlib import Path

from trainer.argtypes import positive_float as _positive_float
from trainer.argtypes import non_negative_int as _non_negative_int
from trainer.argtypes import positive_int as _positive_int
from trainer.argtypes import Parser, device_arg, parse_with_hints, subcommand_parser

from faults.sizing import DEFAULT_LEARNERS, DEFAULT_RANKS
from trainer.rundir import claim_run_dir, release_if_empty
from trainer.runspec import BACKENDS


def print_verdicts(result, verdict_file: str = "verdict.json") -> None:
    from .checkers import describe_required

    width = max(len(v.name) for v in result.verdicts)
    print(f"\nverdict: {'PASS' if result.passed else 'FAIL'}  ({result.run_dir / verdict_file})")
    print(f"  {describe_required(result.document)}")
    for v in result.verdicts:
        print(f"  {v.status.upper():<7} {v.name:<{width}}  {v.detail}")
        if v.name == "faults_applied":
            for line in timing_lines(v.evidence):
                print(f"  {'':<7} {'':<{width}}    {line}")
    s = result.summary
    if "goodput" in s:
        print(f"  goodput {s['goodput']:.1%}, {s['merges']} merges / {s['sync_rounds']} sync rounds, "
              f"{s['tokens_processed']} tokens, recent training loss {s['train_loss_recent']}")
        from trainer.fates import fates_lines
        for line in fates_lines(s):
            print(f"  {line}")
    if s.get("final_loss") is not None:
        facts = [f"{k.replace('_', ' ')} {s[k]:.4f}" for k in ("unigram_entropy", "loss_floor")
                 if isinstance(s.get(k), float)]
        facts += [f"held-out {k} {v:.4f}" for k, v in (s.get("metrics") or {}).items()]
        print(f"  final held-out loss {s['final_loss']:.4f}" + (f" ({', '.join(facts)})" if facts else ""))


def timing_lines(evidence: dict) -> list[str]:
    """faults_applied's per-fault timing, one line each: planned, in force, how far off."""
    out = []
    for row in evidence.get("timing") or []:
        planned, in_force = row["planned"], row["in_force"]
        end = "down" if planned[1] is None else f"{planned[1]:g}"
        until = "heal" if in_force[1] is None else f"{in_force[1]:.2f}"
        short = "" if row.get("shortfall") is None else f", {max(row['shortfall'], 0.0):.3f} s short"
        shifted = (f", shifted {row['waited_for']['shifted_by']:.2f} s past faults[{row['waited_for']['fault']}]"
                   if (row.get("waited_for") or {}).get("shifted_by") else "")
        out.append(f"faults[{row['fault']}] {row['kind']} {', '.join(row['targets'])}: planned {planned[0]:g}-{end} s, "
                   f"in force {in_force[0]:.2f}-{until} s ({row['start_late']:.3f} s late{short}{shifted})")
    return out


def cmd_run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from faults import Schedule, ScheduleError
    from faults.schedule import declared_learners
    from faults.sizing import SizeConflict, resolve_learners

    from trainer.runspec import RunSpec
    from trainer.task import TaskError, resolve_spec

    path = Path(args.schedule)
    try:
        if not path.is_file():
            raise FileNotFoundError(args.schedule)
        # The schedule's `learners:` sizes the cluster unless --learners says (the same).
        args.learners = resolve_learners(declared_learners(path), args.learners, source=str(path))
        # A learner's own flags (--learner-args N:--ranks R) may give its unit other ranks than
        # --ranks: the cluster then checks each rank target against its own unit (run_schedule,
        # before anything starts).
        schedule = Schedule.load(path, learners=args.learners, ranks=None if args.learner_args else args.ranks)
    except FileNotFoundError:
        parser.error(f"SCHEDULE: no such file: {args.schedule}")
    except SizeConflict as exc:
        parser.error(str(exc))
    except ScheduleError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    try:
        spec = RunSpec(backend=args.backend, learners=args.learners, ranks=args.ranks, mode=args.mode,
                       task=resolve_spec(args.task), device=args.device, data=args.data,
                       trainer_args=args.trainer_args, learner_args=learner_args(args.learner_args),
                       duration=args.duration, warm_spares=args.warm_spares, host_clocks=args.host_clocks)
    except (ValueError, TaskError) as exc:
        parser.error(as_flag(str(exc)))
    out = Path(args.out) if args.out else claim_run_dir(f"runs/chaos-{datetime.now():%Y%m%d-%H%M%S}")
    if (out / "events").exists() and any((out / "events").iterdir()):
        parser.error(f"--out: {out} already holds a run; choose a new directory")
    try:
        return _run_in(out, schedule, spec, args)
    finally:
        if not args.out:
            release_if_empty(out)  # a refused run leaves no directory behind


def _run_in(out: Path, schedule, spec, args: argparse.Namespace) -> int:
    """Run `schedule` in `out` with the progress printer; the exit status."""
    from .progress import ProgressPrinter, RunProgress
    from .runner import run_schedule

    if args.seed is not None:
        schedule = type(schedule)(seed=args.seed, faults=schedule.faults, learners=schedule.learners,
                                  name=schedule.name)
    header = f"chaos: {len(schedule.faults)} fault(s), {args.learners} learners, backend {args.backend}, run dir {out}"
    try:
        with ProgressPrinter(RunProgress(out, args.learners)) as printer:
            result = run_schedule(schedule, out, spec, reference=args.reference, on_phase=printer.phase,
                                  on_start=lambda: print(header, flush=True),
                                  reference_seconds=args.reference_seconds or 0.0)
    except ValueError as exc:  # e.g. a fault the backend cannot apply, named by its field
        print(f"run: error: {as_flag(str(exc))}", file=sys.stderr)
        return 2
    except (RuntimeError, TimeoutError) as exc:
        print(f"run: error: {exc}", file=sys.stderr)
        return 1
    print_verdicts(result)
    return 0 if result.passed else 1


def cmd_replay(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Rerun a recorded run (a `chaos run` dir or a pytest artifacts dir) with its settings and seed."""
    from .progress import ProgressPrinter, RunProgress
    from .replay import ReplayError, load_recorded, next_replay_dir, replay
    from .replay_compare import format_comparison, record_comparison

    try:
        recorded = load_recorded(args.run_dir)
        if args.backend:
            recorded = recorded.on_backend(args.backend)
    except ReplayError as exc:
        print(f"replay: error: {exc}", file=sys.stderr)
        return 2
    out = Path(args.out) if args.out else next_replay_dir(args.run_dir)
    if (out / "events").exists() and any((out / "events").iterdir()):
        parser.error(f"--out: {out} already holds a run; choose a new directory")
    extra = f", task {recorded.task}" if recorded.task != "gpt" else ""
    extra += f", trainer args {' '.join(recorded.trainer_args)}" if recorded.trainer_args else ""
    extra += "".join(f", {k}={v}" for k, v in sorted(recorded.env.items()))
    header = (f"chaos: replaying {args.run_dir}: {len(recorded.schedule.faults)} fault(s), seed "
              f"{recorded.schedule.seed}, {recorded.learners} learners, backend {recorded.backend}, mode "
              f"{recorded.mode}{extra}, run dir {out}")
    try:
        with ProgressPrinter(RunProgress(out, recorded.learners)) as printer:
            result = replay(args.run_dir, out, recorded, reference=args.reference, on_phase=printer.phase,
                            on_start=lambda: print(header, flush=True))
    except ValueError as exc:
        print(f"replay: error: {exc}", file=sys.stderr)
        return 2
    except (RuntimeError, TimeoutError) as exc:
        print(f"replay: error: {exc}", file=sys.stderr)
        return 1
    print_verdicts(result)
    comparison = record_comparison(args.run_dir, result.run_dir, result.document, recorded.learners)
    print(format_comparison(comparison))
    print(f"  (recorded in {result.run_dir / 'replay.json'})")
    return 0 if result.passed else 1


DEMO_WARM_SPARES = 1  # the killed learner comes back from a warm spare (chaos/spares.py)
DEMO_SCHEDULE = Path(__file__).resolve().parent.parent / "examples" / "schedules" / "kill-partition-latency.yaml"


def cmd_demo(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """The README's demo: a kill, a partition and latency on 3 learners, checks, a report."""
    from .report import write_report

    args.schedule = str(args.schedule or DEMO_SCHEDULE)
    args.out = args.out or str(claim_run_dir(f"runs/demo-{datetime.now():%Y%m%d-%H%M%S}"))
    # learners None: the schedule's `learners:` (3 for the default one) sizes the cluster.
    args.backend, args.learners, args.duration, args.mode, args.data, args.seed = "local", None, None, \
        "decoupled", "markov", None
    args.ranks = 1
    args.task, args.device, args.learner_args = "gpt", "auto", []
    args.warm_spares, args.host_clocks, args.reference_seconds = DEMO_WARM_SPARES, "", None
    status = cmd_run(args, parser)
    if (Path(args.out) / "events").is_dir():
        png, html = write_report(Path(args.out))
        print(f"\nreport: {html}\n        {png}")
    return status


def cmd_validate(argv: list[str]) -> int:
    from faults.cli import validate_main
    return validate_main(argv, parser_class=Parser)


def cmd_toxiproxy(argv: list[str]) -> int:
    from .toxiproxy import main as toxiproxy_main
    return toxiproxy_main(argv)


def cmd_report(argv: list[str]) -> int:
    from .report import main as report_main
    return report_main(argv)


# Subcommands with parsers of their own: everything after the name is theirs.
def cmd_load(argv: list[str]) -> int:
    from .load import main as load_main
    return load_main(argv)


def cmd_stack(argv: list[str]) -> int:
    from .stack_cli import main
    return main(argv)


def cmd_forward(argv: list[str]) -> int:
    from .forward import main
    return main(argv)


def cmd_sim(argv: list[str]) -> int:
    from .sim.cli import sim_main
    return sim_main(argv)


def cmd_explore(argv: list[str]) -> int:
    from .sim.cli import explore_main
    return explore_main(argv)


def cmd_simulate_goodput(argv: list[str]) -> int:
    from .simulate.cli import main
    return main(argv)


def cmd_check(argv: list[str]) -> int:
    from .check_cli import main
    return main(argv)


PASSTHROUGH = {"check": cmd_check, "validate": cmd_validate, "toxiproxy": cmd_toxiproxy, "report": cmd_report, "load": cmd_load,
               "stack": cmd_stack, "forward": cmd_forward, "simulate-goodput": cmd_simulate_goodput,
               "sim": cmd_sim, "explore": cmd_explore}


REFERENCE_CHOICES = ("auto", "off")  # chaos/reference.py
REFERENCE_HELP = ("auto (default): judge final_loss and no_divergence against a fault-free run of the same "
                  "configuration at the same merged tokens, cached under the islands home and run once when "
                  "missing; off: the unigram-entropy rule only")


def as_flag(message: str) -> str:
    """A RunSpec error ("warm_spares: ...") as the flag the user typed ("--warm-spares: ...")."""
    field, sep, rest = message.partition(":")
    if sep and field.replace("_", "").isalpha() and not field.startswith("-"):
        return f"--{field.replace('_', '-')}:{rest}"
    return message


def learner_args(values: list[str]) -> dict[int, list[str]]:
    """--learner-args N:FLAGS, repeated, as {N: [flags...]} (a learner's later flags add to its earlier)."""
    out: dict[int, list[str]] = {}
    for value in values:
        number, sep, flags = value.partition(":")
        if not sep or not number.isdigit():
            raise ValueError(f"learner_args: expected N:FLAGS, e.g. '2:--speed 0.5', got {value!r}")
        out.setdefault(int(number), []).extend(shlex.split(flags))
    return out


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="python -m chaos", description="Islands' chaos harness: fault schedules applied to a "
                                                         "training cluster, checked, reported and replayed.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("run", help="start a cluster, apply a fault schedule, heal, check",
                       description="Start a cluster, apply a fault schedule on its clock, heal, stop, check the run "
                                   "and print the verdicts; exit 1 if a check failed, 2 for a refused run.")
    p.add_argument("schedule", metavar="SCHEDULE", help="schedule file (.yaml, .yml or .json)")
    p.add_argument("--backend", choices=BACKENDS, default="local",
                   help="where the cluster runs: local processes, docker compose or a Docker Swarm stack")
    p.add_argument("--learners", type=_positive_int, default=None,
                   help=f"learner units (default: the schedule's learners:, else {DEFAULT_LEARNERS}; "
                        f"must agree with the schedule's learners: when both are given)")
    p.add_argument("--ranks", type=_positive_int, default=DEFAULT_RANKS,
                   help="ranks per learner unit (DDP over gloo; faults may target learner-N/rank-R with R < ranks)")
    p.add_argument("--duration", type=_positive_float, default=None,
                   help="seconds from the first fault's clock start (default: schedule horizon + 20)")
    p.add_argument("--warm-spares", type=_non_negative_int, default=0, metavar="N",
                   help="local backend: keep N warm spare processes (torch already imported) that restarts "
                        "take instead of starting Python cold (default 0: every restart starts cold)")
    p.add_argument("--out", help="run directory (default runs/chaos-<timestamp>)")
    p.add_argument("--mode", choices=("decoupled", "sync"), default="decoupled",
                   help="decoupled DiLoCo, or the synchronous data-parallel baseline on the same code")
    p.add_argument("--task", default="gpt", metavar="TASK",
                   help="what the cluster trains: FILE.py:NAME or MODULE:NAME (README, 'Your own model'); "
                        "default gpt, the built-in byte-level GPT on --data")
    p.add_argument("--device", type=device_arg, default="auto",
                   help="where learners train: auto (CUDA when present), cpu, cuda or cuda:N (default auto)")
    p.add_argument("--data", default="markov", help="the built-in task's data: markov[:k=v,...] or a text path")
    p.add_argument("--learner-args", action="append", default=[], metavar="N:FLAGS",
                   help="extra flags of learner-N, e.g. '2:--speed 0.5' (repeatable)")
    p.add_argument("--seed", type=int, default=None, help="override the schedule's seed")
    p.add_argument("--host-clocks", default="", metavar="PROCESS=OFFSET[@PPM],...",
                   help="local backend: give processes clocks of their own, as if each ran on its own machine, "
                        "e.g. 'syncer=-4,learner-1=+5@200' (offset in seconds, drift in parts per million); the "
                        "run probes them and places their events on one timeline (default: none, one clock)")
    p.add_argument("--reference", choices=REFERENCE_CHOICES, default="auto", help=REFERENCE_HELP)
    p.add_argument("--reference-seconds", type=_positive_float, default=None, metavar="S",
                   help="use only a cached reference that ran at least S s (a shorter one does not count), and "
                        "run a missing one that long, so that longer runs of the same configuration find it "
                        "cached too (default: none; the run's own duration, rounded up to 30 s, decides)")
    p.set_defaults(func=cmd_run, trainer_args=[])
    p.epilog = "Flags after a lone -- go to the syncer, e.g. -- --sync-every 10 --grace 1"

    p = sub.add_parser("replay", help="rerun a recorded run dir (run.json + schedule.yaml) with the same "
                                      "settings and seed",
                       description="Rerun a recorded run (a `chaos run` directory or a pytest chaos-artifacts "
                                   "directory) with its settings and seed, then print it beside the original.")
    p.add_argument("run_dir", metavar="RUN_DIR", help="a `chaos run` directory or a pytest chaos-artifacts directory")
    p.add_argument("--out", help="run directory for the replay (default RUN_DIR-replay-<n>, the first free n)")
    p.add_argument("--backend", choices=BACKENDS, default=None,
                   help="replay on this backend instead of the recorded one")
    p.add_argument("--reference", choices=REFERENCE_CHOICES, default="auto", help=REFERENCE_HELP)
    p.set_defaults(func=cmd_replay)

    p = sub.add_parser("demo", help="a demo chaos run on the local backend that ends with a report",
                       description="The README's demo: 3 learners on the local backend; learner-1 SIGKILLed and "
                                   "restarted, learner-2's link partitioned, learner-3's slowed; the checks' verdicts, "
                                   "then timeline.html and timeline.png in the run directory.")
    p.add_argument("--out", help="run directory (default runs/demo-<timestamp>)")
    p.add_argument("--schedule", help=f"schedule file (default {DEMO_SCHEDULE.name})")
    p.add_argument("--reference", choices=REFERENCE_CHOICES, default="auto", help=REFERENCE_HELP)
    p.set_defaults(func=cmd_demo, trainer_args=[])

    sub.add_parser("check", help="judge a finished run directory again, without running anything (check --help)")
    sub.add_parser("validate", help="check a schedule file without running it (validate --help)")
    sub.add_parser("toxiproxy", help="run the Toxiproxy-compatible server (toxiproxy --help)")
    sub.add_parser("report", help="write timeline.png and timeline.html for a run dir (report --help)")
    sub.add_parser("stack", help="print the Docker Swarm stack file rendered from compose.yaml (stack --help)")
    sub.add_parser("forward", help="relay TCP from one address to another: the swarm backend's API gateway "
                                   "(forward --help)")
    sub.add_parser("load", help="keep N busy processes on the CPUs for a while, to run something under a "
                                "known load (load --help)")
    sub.add_parser("sim", help="one schedule in the deterministic simulator: the real syncer on a virtual clock, "
                               "network and disk (sim --help)")
    sub.add_parser("explore", help="search schedules in the simulator, shrink the first failure (explore --help)")
    sub.add_parser("simulate-goodput", help="seeded goodput simulator: decoupled vs elastic and non-elastic "
                                            "data-parallel at scale, or a fault schedule (simulate-goodput --help)")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in PASSTHROUGH:
        return PASSTHROUGH[argv[0]](argv[1:])
    trainer_args: list[str] = []
    if argv[:1] == ["run"] and "--" in argv:
        cut = argv.index("--")
        argv, trainer_args = argv[:cut], argv[cut + 1:]
    args = parse_with_hints(parser, argv)
    if args.command == "run":
        args.trainer_args = trainer_args
    return int(args.func(args, subcommand_parser(parser, args)) or 0)


if __name__ == "__main__":
    sys.exit(main())
