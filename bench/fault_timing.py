"""Fault timing: is every fault in force when, and for as long as, its schedule says?

Runs schedules on a live cluster, idle and beside N busy loops (chaos/load.py), and reads
each fault's planned and in-force interval from faults_applied's evidence (chaos/applied.py):
how late each started, how much shorter than planned it was in force, and the proxy API's
measured round trip. The tolerance faults_applied judges by on each backend
(chaos/applied.py DEFAULT_TOLERANCE, a backend's `action_tolerance`) is sized from these
figures; BENCHMARKS.md ("Fault timing") has the table.

    python bench/fault_timing.py                      # the local schedules, idle and at load 2
    python bench/fault_timing.py --loads 0 --repeats 1 --schedules examples/schedules/quick.yaml
    python bench/fault_timing.py --backend compose --schedules examples/schedules/compose-acceptance.yaml
"""
from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from chaos.load import CpuLoad  # noqa: E402
from chaos.runner import run_schedule  # noqa: E402
from faults import Schedule  # noqa: E402
from trainer.argtypes import DescriptionFormatter, Parser, non_negative_int, positive_int  # noqa: E402

from bench.outputs import output_file  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
# The issue-26 schedule: a syncer kill whose restart blocks for seconds, and a latency
# fault on another target due meanwhile.
ISSUE_SCHEDULE = """name: kill-then-latency
seed: 1
learners: 2
faults:
- {kind: kill, at: 3, duration: 2, target: syncer}
- {kind: latency, at: 6, duration: 3, target: learner-1, latency_ms: 100}
"""
LOCAL_SCHEDULES = ("examples/schedules/kill-partition-latency.yaml", "examples/schedules/quick.yaml",
                   "examples/schedules/disk-power-clock.yaml")
FAST = ["--n-layer", "1", "--n-embd", "32", "--n-head", "2", "--batch-size", "8", "--sync-every", "10"]


def one_run(schedule: Schedule, backend: str, work: Path) -> dict:
    """One live run's timing: every fault's row of faults_applied's evidence."""
    run_dir = work / f"run-{time.monotonic_ns()}"
    result = run_schedule(schedule, run_dir, backend=backend, learners=schedule.learners or 3, trainer_args=FAST,
                          reference="off", evaluate=False)
    applied = next(v for v in result.verdicts if v.name == "faults_applied")
    begin = next((json.loads(line) for line in (run_dir / "history.jsonl").read_text().splitlines()
                  if '"event": "begin"' in line), {})
    return {"status": applied.status, "detail": applied.detail, "tolerance": applied.evidence.get("tolerance"),
            "api": begin.get("api"), "timing": applied.evidence.get("timing", [])}


def summarize(name: str, load: int, runs: list[dict]) -> dict:
    rows = [r for run in runs for r in run["timing"]]
    late = [r["start_late"] for r in rows]
    short = [r["shortfall"] for r in rows if r["shortfall"] is not None and r["kind"] != "kill"]
    rtts = [run["api"]["round_trip"] for run in runs if run.get("api")]
    return {"schedule": name, "load": load, "runs": len(runs), "faults": len(rows),
            "passed": sum(run["status"] == "pass" for run in runs),
            "worst_start_late": max(late, default=None), "worst_shortfall": max(short, default=None),
            "worst_api_round_trip": max(rtts, default=None), "tolerance": runs[0]["tolerance"] if runs else None,
            "details": [run["detail"] for run in runs if run["status"] != "pass"]}


def table(rows: list[dict]) -> str:
    head = f"{'schedule':<26} {'load':>4} {'runs':>4} {'faults':>6} {'pass':>4} {'worst late':>10} " \
           f"{'worst short':>11} {'API rtt':>8} {'tolerance':>9}"
    lines = [head, "-" * len(head)]

    def s(v: float | None) -> str:
        return "-" if v is None else f"{v:.3f}"

    for r in rows:
        lines.append(f"{r['schedule']:<26} {r['load']:>4} {r['runs']:>4} {r['faults']:>6} {r['passed']:>4} "
                     f"{s(r['worst_start_late']):>10} {s(r['worst_shortfall']):>11} {s(r['worst_api_round_trip']):>8} "
                     f"{s(r['tolerance']):>9}")
    return "\n".join(lines)


def parse_args(argv: list[str]):
    p = Parser(description=__doc__, formatter_class=DescriptionFormatter)
    p.add_argument("--schedules", nargs="*", default=None, metavar="FILE",
                   help="schedule files to run (default: the issue-26 kill-then-latency schedule and every "
                        "local schedule of examples/schedules/)")
    p.add_argument("--backend", choices=("local", "compose", "swarm"), default="local",
                   help="where the clusters run")
    p.add_argument("--loads", type=non_negative_int, nargs="+", default=[0, 2], metavar="N",
                   help="busy loops beside the runs, one set of runs per number")
    p.add_argument("--repeats", type=positive_int, default=2, help="runs of each schedule at each load")
    p.add_argument("--out", type=output_file, default=ROOT / "bench" / "out" / "fault_timing.json",
                   help="the JSON written at the end")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(list(sys.argv[1:] if argv is None else argv))
    work = Path(tempfile.mkdtemp(prefix="islands-fault-timing-"))
    schedules = [(Path(s).stem, Schedule.load(ROOT / s if not Path(s).is_absolute() else s))
                 for s in (args.schedules if args.schedules is not None else LOCAL_SCHEDULES)]
    if args.schedules is None:
        schedules.insert(0, ("kill-then-latency", Schedule.loads(ISSUE_SCHEDULE)))
    rows = []
    try:
        for load in args.loads:
            busy = CpuLoad(load).start() if load else None
            try:
                for name, schedule in schedules:
                    runs = [one_run(schedule, args.backend, work) for _ in range(args.repeats)]
                    rows.append(summarize(name, load, runs))
                    print(table(rows[-1:]).splitlines()[-1], flush=True)
            finally:
                if busy is not None:
                    busy.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print()
    print(table(rows))
    for r in rows:
        for detail in r["details"]:
            print(f"  {r['schedule']} at load {r['load']}: {detail}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"backend": args.backend, "rows": rows}, indent=2))
    print(f"\nwrote {args.out}")
    return 0 if all(r["passed"] == r["runs"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
