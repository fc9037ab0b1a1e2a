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
    python bench/simulator.py --schedules 1000000 --ledger bench/out/simulator-long.jsonl --background

A long run goes in chunks of --chunk schedules; with --ledger each finished chunk is
appended there and is not run again by the same code, so a million schedules can span
sessions (the ledger names each chunk's commit, simulated code and rate) and an
interrupted run loses one chunk. The code is a hash of the files a simulation runs (all of
trainer/ and faults/, and the part of chaos/ the simulator imports: bench/simulated_code.py):
a commit that changes only tests, docs, bench, the proxy server, the report or a CLI keeps
counting the chunks before it; chunks of other code stay in the ledger as history and do not count.

BENCHMARKS.md ("Simulator") has the table.
"""
from __future__ import annotations

import inspect
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import simulated_code  # noqa: E402
from bench.background import lowest_priority  # noqa: E402
from bench.outputs import output_file  # noqa: E402
from chaos.sim.explore import Space, draw, judge  # noqa: E402
from trainer.argtypes import Parser, non_negative_int, positive_int  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CORES = ("trainer/syncer/core.py", "trainer/syncer/fragment_state.py", "trainer/syncer/outer_step.py",
         "trainer/syncer/service.py", "trainer/push_protocol.py", "trainer/pushes.py", "trainer/merge_rule.py",
         "trainer/adoption.py", "trainer/membership.py", "trainer/admission.py", "trainer/quarantine.py",
         "trainer/group_commit.py", "trainer/validation.py", "trainer/outer.py", "trainer/state.py",
         "trainer/storage.py")
DEFAULT_OUT = ROOT / "bench" / "out" / "simulator.json"


def one(args: tuple[int, int, Space]) -> dict:
    seed, index, space = args
    schedule = draw(seed, index, space)
    started = time.perf_counter()
    outcome = judge(schedule, space)
    return {"index": index, "seconds": time.perf_counter() - started, "failed": outcome.failed,
            "unknown": outcome.unknown,
            "simulated": schedule.horizon + space.tail, "faults": len(schedule.faults)}


def space_key(space: Space) -> dict:
    """What a ledger's chunk must match to count towards a run: the same schedules."""
    return {"learners": space.learners, "max_faults": space.max_faults, "horizon": space.horizon,
            "kinds": list(space.kinds), "tail": space.tail, "min_at": space.min_at}


def _git(*args: str) -> str:
    return simulated_code.git(*args).strip()


code_of = simulated_code.code_of  # what a chunk ran: bench/simulated_code.py says which files count


def identity() -> tuple[str, str]:
    """The checkout's commit and simulated code, each with -dirty when the tracked files of
    the simulated code differ from it (a ledger then says what ran)."""
    try:
        head = _git("rev-parse", "--short", "HEAD")
        dirty = bool(head) and simulated_code.dirty(head)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown", "unknown"
    if not head:
        return "unknown", "unknown"
    suffix = "-dirty" if dirty else ""
    return head + suffix, (code_of(head) or "unknown") + suffix


COMMIT, CODE = identity()  # what this process runs: read once, at its start, not when a chunk ends
_CODE_OF_COMMIT: dict[str, str] = {}


def chunk_code(chunk: dict) -> str:
    """The simulated code a ledger chunk ran: recorded since the ledger kept it, else
    derived from its commit (chunks of a dirty checkout match only their own dirty runs)."""
    if chunk.get("code"):
        return chunk["code"]
    commit = str(chunk.get("commit", ""))
    if commit.endswith("-dirty") or commit == "unknown":
        return commit
    if commit not in _CODE_OF_COMMIT:
        _CODE_OF_COMMIT[commit] = code_of(commit) or commit
    return _CODE_OF_COMMIT[commit]


def run_chunk(seed: int, start: int, count: int, space: Space, jobs: int) -> dict:
    """Schedules start..start+count-1 of `seed`, summed up (a million rows are not kept)."""
    tasks = [(seed, i, space) for i in range(start, start + count)]
    began = time.perf_counter()
    if jobs == 1:
        rows = [one(t) for t in tasks]
    else:
        with multiprocessing.get_context("fork").Pool(jobs) as pool:
            rows = list(pool.imap(one, tasks, chunksize=8))
    wall = time.perf_counter() - began
    per = sorted(r["seconds"] for r in rows)
    failed = [{"index": r["index"], "checks": r["failed"]} for r in rows if r["failed"]]
    unknown = Counter(name for r in rows for name in r["unknown"])
    return {"seed": seed, "start": start, "count": count, "space": space_key(space), "jobs": jobs,
            "commit": COMMIT, "code": CODE, "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "wall_seconds": round(wall, 3), "simulated_seconds": round(sum(r["simulated"] for r in rows), 1),
            "faults": sum(r["faults"] for r in rows), "median_s": per[len(per) // 2],
            "p99_s": per[int(len(per) * 0.99)], "max_s": per[-1], "violations": len(failed), "failed": failed[:20],
            "unknown": dict(sorted(unknown.items()))}


def read_ledger(path: Path, seed: int, space: Space) -> dict[tuple[int, int], dict]:
    """The chunks already run for this seed and space by this simulated code (CODE: a chunk
    of other code does not count for it, whatever its commit), by (start, count). A line cut short by an interrupted write
    is skipped (its chunk runs again)."""
    done: dict[tuple[int, int], dict] = {}
    if not path.exists():
        return done
    key = space_key(space)
    for line in path.read_text().splitlines():
        try:
            chunk = json.loads(line)
        except json.JSONDecodeError:
            continue
        if chunk.get("seed") == seed and chunk.get("space") == key and chunk_code(chunk) == CODE:
            done[(chunk["start"], chunk["count"])] = chunk
    return done


def append_ledger(path: Path, chunk: dict) -> None:
    with path.open("a") as f:
        f.write(json.dumps(chunk, separators=(",", ":")) + "\n")
        f.flush()
        os.fsync(f.fileno())


def run(seed: int, count: int, space: Space, jobs: int, chunk: int, ledger: Path | None,
        say=print) -> list[dict]:
    """Every chunk of schedules 0..count-1, from the ledger where it already ran there
    (a long run goes on where it stopped), each new one appended as it ends."""
    done = read_ledger(ledger, seed, space) if ledger is not None else {}
    chunks = []
    for start in range(0, count, chunk):
        size = min(chunk, count - start)
        found = done.get((start, size))
        if found is None:
            found = run_chunk(seed, start, size, space, jobs)
            if ledger is not None:
                append_ledger(ledger, found)
            ran = sum(c["count"] for c in chunks) + size
            say(f"  {ran:>9} of {count}: {size / found['wall_seconds']:.1f} schedules/s, "
                f"{found['violations']} violations")
        chunks.append(found)
    return chunks


def summarize(chunks: list[dict], space: Space) -> dict:
    """One result over every chunk (which may come from several sessions and commits)."""
    wall = sum(c["wall_seconds"] for c in chunks)
    count = sum(c["count"] for c in chunks)
    simulated = sum(c["simulated_seconds"] for c in chunks)
    failed = [f for c in chunks for f in c["failed"]]
    unknown: Counter[str] = Counter()
    for c in chunks:
        unknown.update(c.get("unknown", {}))
    return {"schedules": count, "jobs": sorted({c["jobs"] for c in chunks}), "seed": chunks[0]["seed"],
            "chunks": len(chunks), "commits": sorted({c["commit"] for c in chunks}),
            "wall_seconds": round(wall, 2), "schedules_per_second": round(count / wall, 2),
            "simulated_seconds": round(simulated, 1), "speedup": round(simulated / wall, 1),
            "per_schedule_median_s": round(statistics.median(c["median_s"] for c in chunks), 4),
            "per_schedule_p99_s": round(max(c["p99_s"] for c in chunks), 4),
            "per_schedule_max_s": round(max(c["max_s"] for c in chunks), 4),
            "chunk_rates": {"min": round(min(c["count"] / c["wall_seconds"] for c in chunks), 2),
                            "max": round(max(c["count"] / c["wall_seconds"] for c in chunks), 2)},
            "faults": sum(c["faults"] for c in chunks), "violations": sum(c["violations"] for c in chunks),
            "failed": failed[:20], "space": space_key(space),
            # Checks that could not judge a schedule (a required one fails it instead), over the
            # schedules of chunks that recorded them (a ledger's older chunks did not).
            "unknown": dict(sorted(unknown.items())),
            "unknown_recorded": sum(c["count"] for c in chunks if "unknown" in c)}


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


def coverage(seed: int, count: int, space: Space) -> dict:
    """Line coverage of CORES over schedules 0..count-1 (sys.settrace, this process only):
    per file at the end, and the share of all their lines after 1, 10, 100, ... schedules,
    which says whether more schedules would still reach more of the cores."""
    files = {str((ROOT / f).resolve()): f for f in CORES}
    hit: dict[str, set[int]] = {f: set() for f in CORES}
    lines = {f: executable_lines(ROOT / f) for f in CORES}
    total = sum(len(v) for v in lines.values())

    def tracer(frame, event, arg):
        name = files.get(frame.f_code.co_filename)
        if name is None:
            return None
        if event == "line":
            hit[name].add(frame.f_lineno)
        return tracer

    growth = []
    marks = {10 ** k for k in range(12)} | {count}
    sys.settrace(tracer)
    try:
        for i in range(count):
            judge(draw(seed, i, space), space)
            if i + 1 in marks:
                run_lines = sum(len(hit[f] & lines[f]) for f in CORES)
                growth.append({"schedules": i + 1, "lines_run": run_lines, "share": round(run_lines / total, 4)})
    finally:
        sys.settrace(None)
    per_file = {f: {"lines": len(lines[f]), "run": len(hit[f] & lines[f]),
                    "share": len(hit[f] & lines[f]) / max(1, len(lines[f]))} for f in CORES}
    return {"files": per_file, "growth": growth, "lines": total}


def report(ledger: Path, seed: int, space: Space) -> int:
    """The ledger's chunks for this seed and space, summed per simulated code, oldest first,
    with the commits each code ran at."""
    key = space_key(space)
    by_code: dict[str, list[dict]] = {}
    for line in ledger.read_text().splitlines() if ledger.exists() else []:
        try:
            chunk = json.loads(line)
        except json.JSONDecodeError:
            continue
        if chunk.get("seed") == seed and chunk.get("space") == key:
            by_code.setdefault(chunk_code(chunk), []).append(chunk)
    print(f"{'code':<14} {'commits':<18} {'schedules':>10} {'wall h':>7} {'sched/s':>8} {'sim s/wall s':>13} "
          f"{'p99 s':>7} {'violations':>11} {'unknown':>8}  first failing schedules")
    for code, chunks in by_code.items():
        r = summarize(chunks, space)
        failed = ", ".join(f"{f['index']} ({'/'.join(f['checks'])})" for f in r["failed"][:5]) or "-"
        mark = " (this checkout)" if code == CODE else ""
        unknown = str(sum(r["unknown"].values())) if r["unknown_recorded"] else "-"
        print(f"{code:<14} {','.join(r['commits']):<18} {r['schedules']:>10} {r['wall_seconds'] / 3600:>7.2f} "
              f"{r['schedules_per_second']:>8.2f} {r['speedup']:>13.1f} {r['per_schedule_p99_s']:>7.3f} "
              f"{r['violations']:>11} {unknown:>8}  {failed}{mark}")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = Parser(description=__doc__.split("\n\n")[0])
    p.add_argument("--schedules", type=positive_int, default=2000, help="schedules to run")
    p.add_argument("--seed", type=int, default=1, help="the search's seed (chaos explore --seed)")
    p.add_argument("--jobs", type=positive_int, default=min(2, os.cpu_count() or 1), help="worker processes")
    p.add_argument("--coverage", type=non_negative_int, default=0,
                   help="schedules to rerun under the line tracer for the cores' coverage (0: none)")
    p.add_argument("--out", type=output_file, default=DEFAULT_OUT, help="the JSON written at the end")
    p.add_argument("--chunk", type=positive_int, default=10000,
                   help="schedules per chunk: the unit a long run records and resumes by")
    p.add_argument("--ledger", type=output_file, default=None,
                   help="a JSONL file of finished chunks: those already there for this seed and space are "
                        "not run again, each new one is appended as it ends (a million schedules span "
                        "sessions; default: none, every chunk runs)")
    p.add_argument("--background", action="store_true",
                   help="run at the lowest CPU priority: nice 19 for the run and its session's autogroup, "
                        "so other work on the machine (a test suite) takes the CPUs first; Docker's "
                        "containers are not reached (default: off, normal priority)")
    p.add_argument("--report", action="store_true",
                   help="run nothing: print what the ledger holds, per simulated code (needs --ledger)")
    args = p.parse_args(argv)
    space = Space()
    if args.report:
        if args.ledger is None:
            p.error("--report: needs --ledger, the file to report on")
        return report(args.ledger, args.seed, space)
    if args.background:
        print("background: " + "; ".join(lowest_priority()))
    chunks = run(args.seed, args.schedules, space, args.jobs, args.chunk, args.ledger)
    result = summarize(chunks, space)
    print(f"{'schedules':>10} {'chunks':>6} {'wall s':>9} {'sched/s':>8} {'sim s/wall s':>13} {'median s':>9} "
          f"{'p99 s':>7} {'violations':>11}")
    print(f"{result['schedules']:>10} {result['chunks']:>6} {result['wall_seconds']:>9.1f} "
          f"{result['schedules_per_second']:>8.2f} {result['speedup']:>13.1f} {result['per_schedule_median_s']:>9.3f} "
          f"{result['per_schedule_p99_s']:>7.3f} {result['violations']:>11}")
    print(f"processes {result['jobs']}, commits {', '.join(result['commits'])}, chunk rates "
          f"{result['chunk_rates']['min']}-{result['chunk_rates']['max']}/s")
    if result["unknown"]:
        print("checks that could not judge some schedules: " + ", ".join(
            f"{name} in {n}" for name, n in result["unknown"].items()))
    for f in result["failed"]:
        print(f"  schedule {f['index']} failed {', '.join(f['checks'])}: python -m chaos explore replays it")
    if args.coverage:
        result["coverage"] = coverage(args.seed, args.coverage, space)
        print(f"\nline coverage of the cores over {args.coverage} schedules:")
        for f, c in result["coverage"]["files"].items():
            print(f"  {f:<34} {c['run']:>5} of {c['lines']:>5} lines  {c['share']:.0%}")
        print("  growth: " + ", ".join(f"{g['schedules']}: {g['share']:.1%}" for g in result["coverage"]["growth"]))
    args.out.write_text(json.dumps(result, indent=2))
    print(f"\nwrote {args.out}")
    return 1 if result["violations"] else 0


if __name__ == "__main__":
    sys.exit(main())
