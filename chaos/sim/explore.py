"""Search for a failing schedule in the simulator, and shrink the first one found.

Schedules are drawn by a seeded generator of the simulated vocabulary (schedule i of a
seed is always the same schedule), run on both cores, judged by the checkers; the search
stops at the first schedule (in draw order) that fails a check. Shrinking then looks for
the smallest schedule that still fails one of the same checks: fewer faults first, then
each one shorter, earlier and simpler, as Hypothesis and Jepsen shrink. The result says
how to replay the shrunk schedule on a live cluster."""
from __future__ import annotations

import json
import multiprocessing
import os
import random
import shlex
import shutil
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Iterator

from faults import Schedule
from faults.schedule import ScheduleError

from trainer import defects

from ..runner import TAIL_SECONDS as TAIL
from ..checkers import UNKNOWN, RunView, Verdict, failing
from ..runner import check_events, evaluate_run, run_schedule
from .world import SimSettings, simulate

EXPLORED_KINDS = ("kill", "pause", "partition", "latency", "power_loss")
MAX_SHRINK_RUNS = {"sim": 300, "local": 12}  # a live shrink step costs a live run
DRAW_ATTEMPTS = 50
# Where a run judged from memory says it is (the syncer's configuration names its state
# dir): never created, as a run directory that was deleted would not be there either.
MEMORY_RUN_DIR = Path(tempfile.gettempdir()) / "islands-sim-memory" / "run"


@dataclass(frozen=True)
class Space:
    """What is drawn: how many learners, faults and seconds, which kinds."""
    learners: int = 2
    max_faults: int = 3
    horizon: float = 10.0
    kinds: tuple[str, ...] = EXPLORED_KINDS
    tail: float = 10.0
    backend: str = "sim"    # or "local": every schedule a live cluster (the long randomised runs)
    # No fault starts before this: pushes are flowing by then, live as in the simulator, so
    # a shrunk failure replays on a live cluster (a kill before the first acknowledgement
    # tests nothing durable; tests/properties/test_defects.py learned it first).
    min_at: float = 2.0


@dataclass
class Outcome:
    """A schedule's judgment, as a live run's verdict reads its checks: `failed` holds every
    check that failed and every required one that answered unknown (it fails a live run
    too); `unknown` the other checks that could not judge this run."""
    failed: list[str]
    details: dict[str, str] = field(default_factory=dict)
    unknown: list[str] = field(default_factory=list)

    @classmethod
    def of(cls, verdicts: list[Verdict]) -> "Outcome":
        bad = failing(verdicts)
        return cls([v.name for v in bad],
                   {v.name: v.detail if v.status != UNKNOWN else f"unknown, and required: {v.detail}" for v in bad},
                   [v.name for v in verdicts if v.status == UNKNOWN and v not in bad])


def _tenths(x: float) -> float:
    return round(round(x * 10) / 10, 1)


def draw(seed: int, index: int, space: Space) -> Schedule:
    """Schedule `index` of `seed`: faults drawn one by one, each kept only if the schedule
    stays valid (the rules of faults/: no two faults on one thing at once, and so on)."""
    rng = random.Random(f"{seed}:{index}")
    learners = [f"learner-{n}" for n in range(1, space.learners + 1)]
    faults: list[dict] = []
    for _ in range(rng.randint(0, space.max_faults)):
        for _attempt in range(DRAW_ATTEMPTS):
            candidate = _draw_fault(rng, learners, space)
            try:  # from_dict validates: overlaps, targets, bounds
                Schedule.from_dict({"seed": index, "learners": space.learners, "faults": faults + [candidate]})
            except ScheduleError:
                continue
            faults.append(candidate)
            break
    return Schedule.from_dict({"seed": rng.randrange(2 ** 31), "learners": space.learners, "faults": faults})


def _draw_fault(rng: random.Random, learners: list[str], space: Space) -> dict:
    kind = rng.choice(space.kinds)
    duration = _tenths(rng.uniform(0.5, min(5.0, space.horizon)))
    at = _tenths(rng.uniform(space.min_at, max(space.min_at, space.horizon - duration)))
    fault: dict = {"kind": kind, "at": at, "duration": duration}
    if kind in ("kill", "pause"):
        fault["target"] = rng.choice(learners + ["syncer"])
    elif kind == "power_loss":
        fault["target"] = "syncer"
    elif kind == "partition":
        fault["targets"] = sorted(rng.sample(learners, rng.randint(1, len(learners))))
        fault["mode"] = rng.choice(("blackhole", "refuse"))
        if fault["mode"] == "blackhole":
            fault["direction"] = rng.choice(("both", "upstream", "downstream"))
    else:  # latency
        fault["target"] = rng.choice(learners)
        fault["latency_ms"] = float(rng.choice((50, 300, 1000, 3000)))
    return fault


# The live backend's small model (the suites' own): a live schedule costs 30-60 s.
LIVE_TRAINER_ARGS = ("--n-layer", "1", "--n-embd", "32", "--n-head", "2", "--batch-size", "8", "--sync-every", "10")


def judge(schedule: Schedule, space: Space, keep: Path | None = None) -> Outcome:
    """Run `schedule` (simulated, or live with backend "local") and check it; the run
    directory is kept only at `keep`. Simulated and not kept, the run is judged from
    memory: the events the checks read are the same, and no file is written."""
    if space.backend == "sim" and keep is None:
        world = simulate(schedule, MEMORY_RUN_DIR, SimSettings(learners=space.learners,
                                                               duration=schedule.horizon + space.tail), memory=True)
        # No state dir on a real disk (the syncer's is on the SimDisk), as for a run directory.
        return Outcome.of(check_events(RunView(world.events(), world.history_entries(), state_dir=None)))
    where = Path(tempfile.mkdtemp(prefix="islands-sim-")) if keep is None else keep
    run_dir = where / "run" if keep is None else keep
    if keep is not None and keep.exists():
        shutil.rmtree(keep)
    try:
        if space.backend == "local":
            defect = {k: v for k, v in os.environ.items() if k in (defects.ENV, defects.LEARNER_ENV)}
            result = run_schedule(schedule, run_dir, learners=space.learners, trainer_args=LIVE_TRAINER_ARGS,
                                  duration=schedule.horizon + max(space.tail, TAIL), reference="off", env=defect)
        else:
            simulate(schedule, run_dir, SimSettings(learners=space.learners, duration=schedule.horizon + space.tail))
            result = evaluate_run(run_dir, space.learners, None, "markov", True, None)
        return Outcome.of(result.verdicts)
    finally:
        if keep is None:
            shutil.rmtree(where, ignore_errors=True)


def _judge_index(args: tuple[int, int, Space]) -> tuple[int, Outcome]:
    seed, index, space = args
    return index, judge(draw(seed, index, space), space)


@dataclass
class Search:
    """What a search found: the schedules run, the first failing one (None: none failed)
    and the checks it failed, and how often each check could not judge a schedule (a space
    too short for a check to judge is then visible, where it would only pass)."""
    ran: int
    first: int | None
    failed: list[str]
    unknown: dict[str, int]


def search(seed: int, count: int, space: Space, jobs: int) -> Search:
    """Schedules 0..count-1 of `seed`, judged in draw order whatever the number of
    processes, up to the first that fails."""
    tasks = ((seed, i, space) for i in range(count))
    unknown: Counter[str] = Counter()
    pool = multiprocessing.get_context("fork").Pool(jobs) if jobs > 1 else None
    try:
        results = pool.imap(_judge_index, tasks, chunksize=4) if pool is not None else map(_judge_index, tasks)
        for i, (index, outcome) in enumerate(results):
            unknown.update(outcome.unknown)
            if outcome.failed:
                return Search(i + 1, index, outcome.failed, dict(unknown))
        return Search(count, None, [], dict(unknown))
    finally:
        if pool is not None:
            pool.terminate()
            pool.join()


def shrink(schedule: Schedule, failed: list[str], space: Space,
           still_fails: Callable[[Schedule], bool] | None = None) -> tuple[Schedule, int]:
    """The smallest schedule found that still fails one of `failed`; and the runs it took."""
    runs = 0

    def fails(candidate: Schedule) -> bool:
        nonlocal runs
        if runs >= MAX_SHRINK_RUNS[space.backend]:
            return False
        try:
            candidate.validate(space.learners)
        except ScheduleError:
            return False
        runs += 1
        if still_fails is not None:
            return still_fails(candidate)
        return bool(set(judge(candidate, space).failed) & set(failed))

    best = schedule
    changed = True
    while changed and runs < MAX_SHRINK_RUNS[space.backend]:
        changed = False
        for candidate in _smaller(best, space.min_at):
            if fails(candidate):
                best, changed = candidate, True
                break
        if not changed and space.backend == "sim":
            # A local minimum: no one step still fails. Two steps (a fault removed, and
            # another made shorter, earlier or simpler) can get past it, as Hypothesis's
            # shrinker tries pairs; only in the simulator, where a run costs milliseconds.
            for first in _removals(best):
                for candidate in _simplifications(first, space.min_at):
                    if fails(candidate):
                        best, changed = candidate, True
                        break
                if changed:
                    break
    return best, runs


def _smaller(schedule: Schedule, min_at: float) -> Iterator[Schedule]:
    """Candidates one step simpler than `schedule`, the biggest steps first."""
    yield from _removals(schedule)
    yield from _simplifications(schedule, min_at)


def _removals(schedule: Schedule) -> Iterator[Schedule]:
    """`schedule` without one of its faults, each in turn."""
    faults = list(schedule.faults)
    for i in range(len(faults)):
        yield replace(schedule, faults=tuple(faults[:i] + faults[i + 1:]))


def _simplifications(schedule: Schedule, min_at: float) -> Iterator[Schedule]:
    """`schedule` with one fault shorter, earlier or simpler, each in turn."""
    faults = list(schedule.faults)
    for i, f in enumerate(faults):
        for change in _simpler(f, min_at):
            yield replace(schedule, faults=tuple(faults[:i] + [change] + faults[i + 1:]))


def _simpler(fault, min_at: float) -> Iterator:
    if fault.duration > 0.5:
        yield replace(fault, duration=max(0.5, _tenths(fault.duration / 2)))
        yield replace(fault, duration=max(0.5, _tenths(fault.duration - 0.5)))
    if fault.at > min_at:
        yield replace(fault, at=max(min_at, _tenths(fault.at / 2)))
        yield replace(fault, at=max(min_at, _tenths(fault.at - 0.5)))
    if fault.kind == "partition":
        if len(fault.targets) > 1:
            for t in fault.targets:
                yield replace(fault, targets=(t,))
        if fault.mode != "blackhole":
            yield replace(fault, mode="blackhole", direction="both")
        elif fault.direction != "both":
            yield replace(fault, direction="both")
    if fault.kind == "latency" and fault.latency_ms > 50:
        yield replace(fault, latency_ms=50.0)


def live_command(schedule_file: Path, learners: int, defect: str | None, duration: float | None = None) -> str:
    """The `chaos run` that replays a schedule live as `explore --backend local` runs it:
    its duration (when given) and the small model's trainer flags after `--`."""
    env = f"{defects.LEARNER_ENV if defect in defects.LEARNER_DEFECTS else defects.ENV}={defect} " if defect else ""
    length = f" --duration {duration:g}" if duration is not None else ""
    return (f"{env}python -m chaos run {shlex.quote(str(schedule_file))} --learners {learners}{length} "
            f"--reference off -- {' '.join(LIVE_TRAINER_ARGS)}")


def sim_command(schedule_file: Path, schedule: Schedule, space: Space, defect: str | None) -> str:
    """The `chaos sim` command that replays a schedule exactly as explore ran it (its
    duration is the horizon plus the search's tail, not `chaos sim`'s default)."""
    flags = f" --defect {defect}" if defect else ""
    return (f"python -m chaos sim {shlex.quote(str(schedule_file))} --learners {space.learners} "
            f"--duration {schedule.horizon + space.tail:g}{flags}")


def explore(count: int, seed: int, space: Space, out: Path, jobs: int | None = None) -> dict:
    """Search, shrink the first failure, write it under `out`; the report as one object."""
    started = time.monotonic()
    # Live clusters take every core they can get: one at a time.
    jobs = 1 if space.backend != "sim" else jobs or max(1, min(2, os.cpu_count() or 1))
    found = search(seed, count, space, jobs)
    ran, first, first_failed = found.ran, found.first, found.failed
    report: dict = {"schedules": ran, "violations": 0 if first is None else 1, "seed": seed, "jobs": jobs,
                    "backend": space.backend, "unknown": dict(sorted(found.unknown.items())),
                    "first_failure": None}
    if first is not None:
        original = draw(seed, first, space)
        shrunk, runs = shrink(original, first_failed, space)
        out.mkdir(parents=True, exist_ok=True)
        defect = os.environ.get(defects.ENV) or os.environ.get(defects.LEARNER_ENV)
        run_dir = out / "first-failure"
        final = judge(shrunk, space, keep=run_dir)
        schedule_file = out / "first-failure.yaml"
        shrunk.dump(schedule_file)
        report["first_failure"] = {
            "index": first, "schedule": shrunk.to_dict(), "faults": len(shrunk.faults),
            "failed": final.failed, "details": final.details, "original": original.to_dict(),
            "original_failed": first_failed, "shrink_runs": runs, "schedule_file": str(schedule_file),
            "run_dir": str(run_dir),
            "live_command": live_command(schedule_file, space.learners, defect,
                                         shrunk.horizon + max(space.tail, TAIL)),
            "sim_command": sim_command(schedule_file, shrunk, space, defect),
        }
    report["seconds"] = round(time.monotonic() - started, 2)
    report["schedules_per_second"] = round(ran / max(report["seconds"], 1e-9), 2)
    return report


def dumps(report: dict) -> str:
    return json.dumps(report, indent=2, default=str)
