"""Rerun a recorded chaos run: `python -m chaos replay RUN_DIR [--out DIR]`.

A run directory written by `chaos run` (or an artifacts directory the pytest plugin left
for a failing test) holds `schedule.yaml` and `run.json` (backend, learners, mode, data,
trainer_args, seed, duration). Replaying runs the same schedule with the same settings
and seed on a fresh cluster, through the same `chaos.runner.run_schedule` as `chaos run`.
"""
from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from faults import Schedule, ScheduleError

RUN_FILE = "run.json"
SCHEDULE_FILE = "schedule.yaml"


class ReplayError(Exception):
    """The run directory cannot be replayed; the message names what is missing or wrong."""


@dataclass(frozen=True)
class Recorded:
    schedule: Schedule
    backend: str = "local"
    learners: int = 3
    mode: str = "decoupled"
    data: str = "markov"
    trainer_args: list[str] = field(default_factory=list)
    duration: float | None = None
    env: dict[str, str] = field(default_factory=dict)
    learner_args: dict[int, list[str]] = field(default_factory=dict)
    warm_spares: int = 0


def load_recorded(run_dir: str | Path) -> Recorded:
    """Read RUN_DIR/run.json and RUN_DIR/schedule.yaml; the schedule gets run.json's seed."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ReplayError(f"{run_dir}: no such directory")
    missing = [str(run_dir / name) for name in (RUN_FILE, SCHEDULE_FILE) if not (run_dir / name).is_file()]
    if missing:
        raise ReplayError(f"cannot replay {run_dir}: missing {' and '.join(missing)} "
                          f"(written by `chaos run` and by the pytest plugin's artifacts)")
    try:
        run = json.loads((run_dir / RUN_FILE).read_text(encoding="utf-8"))
    except ValueError as exc:
        raise ReplayError(f"{run_dir / RUN_FILE}: not valid JSON ({exc})") from None
    if not isinstance(run, dict):
        raise ReplayError(f"{run_dir / RUN_FILE}: expected a JSON object, got {type(run).__name__}")
    learners = run.get("learners", 3)
    if isinstance(learners, bool) or not isinstance(learners, int) or learners < 1:
        raise ReplayError(f"{run_dir / RUN_FILE}: learners: expected an integer >= 1, got {learners!r}")
    try:
        schedule = Schedule.load(run_dir / SCHEDULE_FILE, learners=learners)
    except ScheduleError as exc:
        raise ReplayError(str(exc)) from None
    seed = run.get("seed")
    if isinstance(seed, int) and not isinstance(seed, bool) and seed != schedule.seed:
        schedule = dataclasses.replace(schedule, seed=seed)
    trainer_args = run.get("trainer_args") or []
    if not isinstance(trainer_args, list) or not all(isinstance(a, str) for a in trainer_args):
        raise ReplayError(f"{run_dir / RUN_FILE}: trainer_args: expected a list of strings, got {trainer_args!r}")
    duration = run.get("duration")
    env = run.get("env") or {}
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise ReplayError(f"{run_dir / RUN_FILE}: env: expected an object of strings, got {env!r}")
    learner_args = run.get("learner_args") or {}
    if not isinstance(learner_args, dict) or not all(
            isinstance(k, str) and k.isdigit() and isinstance(v, list) and all(isinstance(a, str) for a in v)
            for k, v in learner_args.items()):
        raise ReplayError(f"{run_dir / RUN_FILE}: learner_args: expected an object of learner number to a list "
                          f"of strings, got {learner_args!r}")
    warm_spares = run.get("warm_spares", 0)
    if isinstance(warm_spares, bool) or not isinstance(warm_spares, int) or warm_spares < 0:
        raise ReplayError(f"{run_dir / RUN_FILE}: warm_spares: expected an integer >= 0, got {warm_spares!r}")
    return Recorded(schedule=schedule, backend=run.get("backend") or "local", learners=learners,
                    mode=run.get("mode") or "decoupled", data=run.get("data") or "markov",
                    trainer_args=list(trainer_args), duration=float(duration) if duration is not None else None,
                    env=dict(env), learner_args={int(k): list(v) for k, v in learner_args.items()},
                    warm_spares=warm_spares)


def next_replay_dir(run_dir: str | Path) -> Path:
    """RUN_DIR-replay-<n> with the first n (from 1) that does not exist yet."""
    base = Path(run_dir)
    if not base.name:  # "." or "/"
        base = base.resolve()
    n = 1
    while True:
        candidate = base.with_name(f"{base.name}-replay-{n}")
        if not candidate.exists():
            return candidate
        n += 1


def replay(run_dir: str | Path, out: str | Path | None = None, recorded: Recorded | None = None,
           reference: str = "auto"):
    """Run the recorded schedule again with its recorded settings; returns the RunResult.
    `reference` as chaos.runner.run_schedule takes it."""
    from . import runner

    recorded = recorded or load_recorded(run_dir)
    out = Path(out) if out is not None else next_replay_dir(run_dir)
    saved = {k: os.environ.get(k) for k in recorded.env}
    os.environ.update(recorded.env)  # the cluster's processes inherit it
    try:
        return runner.run_schedule(recorded.schedule, out, backend=recorded.backend, learners=recorded.learners,
                                   duration=recorded.duration, mode=recorded.mode, data=recorded.data,
                                   trainer_args=recorded.trainer_args, learner_args=recorded.learner_args,
                                   warm_spares=recorded.warm_spares if recorded.backend == "local" else 0,
                                   reference=reference)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
