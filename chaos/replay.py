"""Rerun a recorded chaos run: `python -m chaos replay RUN_DIR [--out DIR]`.

A run directory written by `chaos run` (or an artifacts directory the pytest plugin left
for a failing test) holds `schedule.yaml` and `run.json` (the run's RunSpec: backend,
learners, ranks, mode, task, device, data, trainer and learner args, seed, duration...). Replaying runs the same schedule with the same settings
and seed on a fresh cluster, through the same `chaos.runner.run_schedule` as `chaos run`.
"""
from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from faults import Schedule, ScheduleError

from trainer.runspec import RunSpec

RUN_FILE = "run.json"
SCHEDULE_FILE = "schedule.yaml"


class ReplayError(Exception):
    """The run directory cannot be replayed; the message names what is missing or wrong."""


@dataclass(frozen=True)
class Recorded:
    """A recorded run: its schedule and its RunSpec (run.json)."""

    schedule: Schedule
    spec: RunSpec = field(default_factory=RunSpec)

    def __getattr__(self, name: str):  # backend, learners, mode, task, trainer_args, env, ...
        if name in {f.name for f in dataclasses.fields(RunSpec)}:
            return getattr(self.spec, name)
        raise AttributeError(name)

    def on_backend(self, backend: str) -> "Recorded":
        """Replay on another backend: warm spares are the local backend's alone."""
        spare = self.spec.warm_spares if backend == "local" else 0
        return dataclasses.replace(self, spec=self.spec.replace(backend=backend, warm_spares=spare))


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
    try:
        spec = RunSpec.from_json(run, source=str(run_dir / RUN_FILE))
    except ValueError as exc:
        raise ReplayError(str(exc)) from None
    try:
        schedule = Schedule.load(run_dir / SCHEDULE_FILE, learners=spec.learners)
    except ScheduleError as exc:
        raise ReplayError(str(exc)) from None
    if spec.seed is not None and spec.seed != schedule.seed:
        schedule = dataclasses.replace(schedule, seed=spec.seed)
    return Recorded(schedule=schedule, spec=spec)


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
           reference: str = "auto", on_phase=None, on_start=None):
    """Run the recorded schedule again with its recorded settings; returns the RunResult.
    `reference`, `on_phase` and `on_start` as chaos.runner.run_schedule takes them."""
    from . import runner

    recorded = recorded or load_recorded(run_dir)
    out = Path(out) if out is not None else next_replay_dir(run_dir)
    saved = {k: os.environ.get(k) for k in recorded.env}
    os.environ.update(recorded.env)  # the cluster's processes inherit it
    try:
        return runner.run_schedule(recorded.schedule, out, recorded.on_backend(recorded.backend).spec,
                                   reference=reference, on_phase=on_phase, on_start=on_start)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
