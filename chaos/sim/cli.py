"""`python -m chaos sim SCHEDULE` and `python -m chaos explore`: the simulator's command lines.

Both exit 0 when every check passed, 1 when one failed, 2 for a refused request (a bad
schedule or flag, a fault kind the simulator cannot model), naming what was wrong."""
from __future__ import annotations

import os
import sys
from datetime import datetime
from pathlib import Path

from faults import Schedule
from faults.schedule import ScheduleError
from trainer import defects
from trainer.argtypes import Parser, non_negative_int, positive_float, positive_int

from .explore import EXPLORED_KINDS, Space, dumps, explore, live_command
from .world import SimSettings, simulate, unsupported


DEFECT_CHOICES = sorted({**defects.DEFECTS, **defects.LEARNER_DEFECTS})


def _defect(name: str | None) -> None:
    """--defect: the same planted defects the live harness has (trainer/defects.py), in the
    syncer or in the learners, by the same environment variables."""
    if name:
        os.environ[defects.LEARNER_ENV if name in defects.LEARNER_DEFECTS else defects.ENV] = name


def sim_main(argv: list[str]) -> int:
    p = Parser(prog="python -m chaos sim",
               description="Run one schedule in the deterministic simulator: the real syncer on a virtual clock, "
                           "network and disk, stand-in learners; the checks' verdicts printed as `chaos run` prints "
                           "them. Exit 1 if a check failed.")
    p.add_argument("schedule", metavar="SCHEDULE", help="schedule file (.yaml, .yml or .json)")
    p.add_argument("--seed", type=int, default=None, help="override the schedule's seed (default: the schedule's)")
    p.add_argument("--out", default=None, help="run directory (default runs/sim-<timestamp>)")
    p.add_argument("--learners", type=positive_int, default=None,
                   help="learners (default: the schedule's `learners`, else 2)")
    p.add_argument("--duration", type=positive_float, default=None,
                   help="simulated seconds after t0 (default: the schedule's horizon + 20)")
    p.add_argument("--sync-every", type=positive_int, default=SimSettings.sync_every,
                   help="H: inner steps between pushes (explore's)")
    p.add_argument("--step-time", type=positive_float, default=SimSettings.step_time,
                   help="simulated seconds per inner step (explore's)")
    p.add_argument("--defect", choices=DEFECT_CHOICES, default=None,
                   help="run with a planted defect in the syncer or the learners (trainer/defects.py)")
    args = p.parse_args(argv)
    try:
        schedule = Schedule.load(args.schedule)
    except (OSError, ScheduleError) as exc:
        print(f"error: {args.schedule}: {exc}", file=sys.stderr)
        return 2
    if args.seed is not None:
        schedule = Schedule.from_dict({**schedule.to_dict(), "seed": args.seed})
    learners = args.learners or schedule.learners or 2
    problems = unsupported(schedule)
    if problems:
        print("error: " + "; ".join(problems), file=sys.stderr)
        return 2
    out = Path(args.out or f"runs/sim-{datetime.now():%Y%m%d-%H%M%S}")
    if out.exists() and any(out.iterdir()):
        print(f"error: --out {out}: exists and is not empty", file=sys.stderr)
        return 2
    _defect(args.defect)
    try:
        simulate(schedule, out, SimSettings(learners=learners, sync_every=args.sync_every,
                                            step_time=args.step_time, duration=args.duration))
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    from ..__main__ import print_verdicts
    from ..runner import evaluate_run
    result = evaluate_run(out, learners, None, "markov", True, None)
    print(f"simulated {schedule.name or args.schedule}: {len(schedule.faults)} fault(s), {learners} learner(s), "
          f"seed {schedule.seed}, run dir {out}")
    print_verdicts(result)
    if not result.passed:
        print(f"\nreplay on a live cluster: {live_command(out / 'schedule.yaml', learners, args.defect)}")
    return 0 if result.passed else 1


def explore_main(argv: list[str]) -> int:
    p = Parser(prog="python -m chaos explore",
               description="Draw schedules, run each in the deterministic simulator, stop at the first that fails "
                           "a check, shrink it to a minimal schedule, write it and print the `chaos run` command "
                           "that replays it on a live cluster. Exit 1 if a check failed.")
    p.add_argument("--schedules", type=positive_int, default=1000, help="how many schedules to draw")
    p.add_argument("--seed", type=int, default=1, help="the search's seed: schedule i of a seed is always the same")
    p.add_argument("--learners", type=positive_int, default=2, help="learners in every schedule")
    p.add_argument("--max-faults", type=non_negative_int, default=3, help="the most faults a schedule holds")
    p.add_argument("--horizon", type=positive_float, default=10.0, help="every fault ends by this many seconds")
    p.add_argument("--kinds", default=",".join(EXPLORED_KINDS), help="fault kinds to draw, comma-separated")
    p.add_argument("--jobs", type=positive_int, default=None, help="worker processes (default: up to 2 CPUs)")
    p.add_argument("--out", default=None, help="where the shrunk failure goes (default runs/explore-<timestamp>)")
    p.add_argument("--defect", choices=DEFECT_CHOICES, default=None,
                   help="search with a planted defect in the syncer or the learners (trainer/defects.py)")
    p.add_argument("--backend", choices=("sim", "local"), default="sim",
                   help="sim: the deterministic simulator; local: every schedule a live cluster of processes on "
                        "this machine (30-60 s each, one at a time)")
    p.add_argument("--json", action="store_true", help="print one JSON object: schedules, violations, seconds, "
                                                       "unknown (check -> schedules it could not judge), "
                                                       "first_failure")
    args = p.parse_args(argv)
    kinds = tuple(k.strip() for k in args.kinds.split(",") if k.strip())
    bad = [k for k in kinds if k not in EXPLORED_KINDS]
    if not kinds or bad:
        print(f"error: --kinds: {', '.join(bad) or 'none given'}: the simulator explores {', '.join(EXPLORED_KINDS)}",
              file=sys.stderr)
        return 2
    _defect(args.defect)
    if args.backend == "local" and "power_loss" in kinds:
        from ..backends.disk_layer import missing_requirements
        if missing_requirements():
            kinds = tuple(k for k in kinds if k != "power_loss")  # it needs the disk-fault layer
            print(f"note: power_loss left out: the disk-fault layer needs {', '.join(missing_requirements())}",
                  file=sys.stderr)
    space = Space(learners=args.learners, max_faults=args.max_faults, horizon=args.horizon, kinds=kinds,
                  backend=args.backend)
    out = Path(args.out or f"runs/explore-{datetime.now():%Y%m%d-%H%M%S}")
    report = explore(args.schedules, args.seed, space, out, args.jobs)
    if args.json:
        print(dumps(report))
    else:
        print(f"explored {report['schedules']} schedule(s) in {report['seconds']:.1f} s "
              f"({report['schedules_per_second']:.1f}/s), {report['violations']} violation(s)")
        if report["unknown"]:
            print("checks that could not judge some schedules (they did not pass them): " + ", ".join(
                f"{name} in {n}" for name, n in report["unknown"].items()))
        failure = report["first_failure"]
        if failure:
            print(f"first failure: schedule {failure['index']} failed {', '.join(failure['original_failed'])}; "
                  f"shrunk in {failure['shrink_runs']} runs to {failure['faults']} fault(s), failing "
                  f"{', '.join(failure['failed'])}:")
            for name, detail in failure["details"].items():
                print(f"  FAIL {name}: {detail}")
            print(f"  schedule: {failure['schedule_file']}   run dir: {failure['run_dir']}")
            print(f"replay in the simulator: {failure['sim_command']}")
            print(f"replay on a live cluster: {failure['live_command']}")
    return 1 if report["violations"] else 0
