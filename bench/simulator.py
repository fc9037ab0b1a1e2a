"""Simulator: how many schedules a second, how much faster than real time, what of the
cores they reach.

Runs the search `python -m chaos explore` runs (schedule i of a seed, the same space)
without stopping at a failure, on --jobs processes, and reports schedules per second,
simulated seconds per wall second (each schedule simulates its horizon, the tail and the
learners' drain), actions per second, and any schedule that failed a check (a sound
trainer has none). With --coverage, a sample of the schedules runs again under a line
tracer limited to the cores (the syncer, the merge rule, the learners' versions protocol,
membership, group commit, validation, the outer step) and reports the share of their
lines it executed.

    python bench/simulator.py                       # 2,000 schedules on 2 processes
    python bench/simulator.py --schedules 10000 --coverage 200

BENCHMARKS.md ("Simulator") has the table.
"""
from __future__ import annotations

import inspect
import json
import multiprocessing
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.outputs import output_file  # noqa: E402
from chaos.sim.explore import Space, draw, judge  # noqa: E402
from trainer.argtypes import Parser, non_negative_int, positive_int  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CORES = ("trainer/syncer/core.py", "trainer/syncer/outer_step.py", "trainer/syncer/service.py",
         "trainer/push_protocol.py", "trainer/merge_rule.py", "trainer/adoption.py", "trainer/membership.py",
         "trainer/group_commit.py", "trainer/validation.py", "trainer/outer.py", "trainer/state.py")
DEFAULT_OUT = ROOT / "bench" / "out" / "simulator.json"


def one(args: tuple[int, int, Space]) -> dict:
    seed, index, space = args
    schedule = draw(seed, index, space)
    started = time.perf_counter()
    outcome = judge(schedule, space)
    return {"index": index, "seconds": time.perf_counter() - started, "failed": outcome.failed,
            "simulated": schedule.horizon + space.tail, "faults": len(schedule.faults)}


def run(seed: int, count: int, space: Space, jobs: int) -> tuple[list[dict], float]:
    started = time.perf_counter()
    tasks = [(seed, i, space) for i in range(count)]
    if jobs == 1:
        rows = [one(t) for t in tasks]
    else:
        with multiprocessing.get_context("fork").Pool(jobs) as pool:
            rows = list(pool.imap(one, tasks, chunksize=8))
    return rows, time.perf_counter() - started


def executable_lines(path: Path) -> set[int]:
    """The lines of the file's functions that hold code (module and class bodies run at
    import, before any tracing, and are left out; so is each function's `def` line)."""
    code = compile(path.read_text(), str(path), "exec")
    lines: set[int] = set()
    stack = [code]
    while stack:
        c = stack.pop()
        if c.co_flags & inspect.CO_NEWLOCALS:  # a function, lambda or comprehension
            lines.update(line for _, _, line in c.co_lines() if line is not None and line != c.co_firstlineno)
        stack.extend(k for k in c.co_consts if hasattr(k, "co_lines"))
    return lines


def coverage(seed: int, count: int, space: Space) -> dict[str, dict]:
    """Line coverage of CORES over `count` schedules (sys.settrace, this process only)."""
    files = {str((ROOT / f).resolve()): f for f in CORES}
    hit: dict[str, set[int]] = {f: set() for f in CORES}

    def tracer(frame, event, arg):
        name = files.get(frame.f_code.co_filename)
        if name is None:
            return None
        if event == "line":
            hit[name].add(frame.f_lineno)
        return tracer

    sys.settrace(tracer)
    try:
        for i in range(count):
            judge(draw(seed, i, space), space)
    finally:
        sys.settrace(None)
    out = {}
    for f in CORES:
        lines = executable_lines(ROOT / f)
        out[f] = {"lines": len(lines), "run": len(hit[f] & lines), "share": len(hit[f] & lines) / max(1, len(lines))}
    return out


def main(argv: list[str] | None = None) -> int:
    p = Parser(description=__doc__.split("\n\n")[0])
    p.add_argument("--schedules", type=positive_int, default=2000, help="schedules to run")
    p.add_argument("--seed", type=int, default=1, help="the search's seed (chaos explore --seed)")
    p.add_argument("--jobs", type=positive_int, default=min(2, os.cpu_count() or 1), help="worker processes")
    p.add_argument("--coverage", type=non_negative_int, default=0,
                   help="schedules to rerun under the line tracer for the cores' coverage (0: none)")
    p.add_argument("--out", type=output_file, default=DEFAULT_OUT, help="the JSON written at the end")
    args = p.parse_args(argv)
    space = Space()
    rows, wall = run(args.seed, args.schedules, space, args.jobs)
    simulated = sum(r["simulated"] for r in rows)
    failed = [r for r in rows if r["failed"]]
    per = sorted(r["seconds"] for r in rows)
    result = {"schedules": len(rows), "jobs": args.jobs, "seed": args.seed, "wall_seconds": round(wall, 2),
              "schedules_per_second": round(len(rows) / wall, 2),
              "simulated_seconds": round(simulated, 1), "speedup": round(simulated / wall, 1),
              "per_schedule_median_s": round(per[len(per) // 2], 4), "per_schedule_p99_s": round(per[int(len(per) * 0.99)], 4),
              "faults": sum(r["faults"] for r in rows), "violations": len(failed),
              "failed": [{"index": r["index"], "checks": r["failed"]} for r in failed[:20]],
              "space": {"learners": space.learners, "max_faults": space.max_faults, "horizon": space.horizon,
                        "kinds": list(space.kinds), "tail": space.tail}}
    print(f"{'schedules':>10} {'jobs':>5} {'wall s':>8} {'sched/s':>8} {'sim s/wall s':>13} {'median s':>9} "
          f"{'p99 s':>7} {'violations':>11}")
    print(f"{result['schedules']:>10} {args.jobs:>5} {wall:>8.1f} {result['schedules_per_second']:>8.2f} "
          f"{result['speedup']:>13.1f} {result['per_schedule_median_s']:>9.3f} {result['per_schedule_p99_s']:>7.3f} "
          f"{len(failed):>11}")
    if args.coverage:
        result["coverage"] = coverage(args.seed, args.coverage, space)
        print(f"\nline coverage of the cores over {args.coverage} schedules:")
        for f, c in result["coverage"].items():
            print(f"  {f:<26} {c['run']:>5} of {c['lines']:>5} lines  {c['share']:.0%}")
    args.out.write_text(json.dumps(result, indent=2))
    print(f"\nwrote {args.out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
