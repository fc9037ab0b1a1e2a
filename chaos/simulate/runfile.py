"""A recorded goodput benchmark as simulator input: its schedule, settings and measurements.

bench/goodput.py (and bench/goodput_scale.py) write one JSON per run: `schedule`
(faults.Schedule.to_dict), `config` (learners, duration, step_time, trainer_args...) and
`systems` (per system the measured goodput_available, goodput, learner_rates_tokens_per_s,
summary and run_dir). Islands decoupled's row is `decoupled` in the first and `chaos` in the
second. Any learner count works: the schedule and `config.learners` size the cluster.

From the run's directory (`systems.decoupled.run_dir`: history.jsonl and
events/learner-*.jsonl) two measured inputs can be taken:
  restarts  the restart order -> first inner step of each restarted learner
            (the spec `restarts:RUN_DIR` for --recovery-decoupled);
  pace      the steps a learner made while up ÷ the steps its credited rate allows
            (the machine's CPU contention, which the simulator does not otherwise see).
"""
from __future__ import annotations

import bisect
import json
import shlex
from dataclasses import dataclass
from pathlib import Path

from faults import Schedule

from .dists import Dist, Empirical, parse_dist
from .scheduled import RunInputs

UP_GAP = 1.0  # steps further apart than this are a learner down, not a slow step
DECOUPLED_ROWS = ("decoupled", "chaos")  # bench/goodput.py, bench/goodput_scale.py
# trainer_args flags that set a RunInputs field (defaults: trainer/config.py, as RunInputs).
TRAINER_FLAGS = {"--sync-every": ("sync_every", int), "--fragments": ("fragments", int),
                 "--quorum": ("quorum", int), "--grace": ("grace", float), "--grace-policy": ("grace_policy", str),
                 "--max-staleness": ("max_staleness", int),
                 "--heartbeat-interval": ("heartbeat_interval", float),
                 "--heartbeat-timeout": ("heartbeat_timeout", float)}


@dataclass(frozen=True)
class RunFile:
    path: Path
    schedule: Schedule
    settings: dict[str, object]           # RunInputs fields the run's JSON sets
    measured: dict[str, float]             # Islands decoupled's goodput_available, goodput (, merged_ratio)
    run_dir: Path | None                   # the decoupled system's run directory, if it is here and this run's
    rates: dict[int, float]                # learner -> credited tokens/s
    note: str                              # why run_dir is None, if it is


def _flags(args: list[str]) -> dict[str, object]:
    out: dict[str, object] = {}
    for i, arg in enumerate(args):
        name, eq, value = arg.partition("=")
        if name in TRAINER_FLAGS and (eq or i + 1 < len(args)):
            field, kind = TRAINER_FLAGS[name]
            out[field] = kind(value if eq else args[i + 1])
    return out


def load_run(path: str | Path) -> RunFile:
    """Read a bench/goodput.py JSON; ValueError names what is missing."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"cannot read {path}: {exc}") from None
    if not isinstance(doc, dict) or "schedule" not in doc:
        raise ValueError(f"{path}: no 'schedule' (expected bench/goodput.py's JSON)")
    schedule = Schedule.from_dict(doc["schedule"])
    config = doc.get("config") or {}
    settings: dict[str, object] = {}
    learners = config.get("learners") or schedule.learners
    if learners:
        settings["learners"] = int(learners)
    for key in ("duration", "step_time"):
        if config.get(key):
            settings[key] = float(config[key])
    trainer_args = config.get("trainer_args") or []
    settings.update(_flags(shlex.split(trainer_args) if isinstance(trainer_args, str) else list(trainer_args)))
    systems = doc.get("systems") or {}
    decoupled = next((systems[k] for k in DECOUPLED_ROWS if isinstance(systems.get(k), dict)), {})
    measured = {k: decoupled[k] for k in ("goodput_available", "goodput") if decoupled.get(k) is not None}
    ratio = (doc.get("comparison") or {}).get("merged_ratio")  # bench/goodput_scale.py: chaos / fault-free twin
    if ratio is not None:
        measured["merged_ratio"] = ratio
    run_dir, note = _own_run_dir(path, decoupled)
    rates = {int(k): float(v) for k, v in (decoupled.get("learner_rates_tokens_per_s") or {}).items()}
    return RunFile(path, schedule, settings, measured, run_dir, rates, note)


def _own_run_dir(json_path: Path, row: dict) -> tuple[Path | None, str]:
    """The decoupled run's directory, if it is here and still holds that run: a later run
    of the benchmark writes to the same directory, so its inner steps must match the JSON's."""
    recorded = row.get("run_dir")
    if not recorded:
        return None, "the JSON names no run directory"
    run_dir = _resolve(json_path, recorded)
    if run_dir is None:
        return None, f"its run directory {recorded} is not here"
    expected = (row.get("summary") or {}).get("inner_steps")
    found = sum(len(steps) for steps in _steps(run_dir).values())
    if expected is not None and found != expected:
        return None, f"{recorded} holds another run ({found} inner steps, the JSON counts {expected})"
    return run_dir, ""


def _resolve(json_path: Path, run_dir: str) -> Path | None:
    """The run directory as recorded, or relative to the repository the JSON sits in."""
    candidate = Path(run_dir)
    for root in (Path.cwd(), *json_path.resolve().parents):
        p = candidate if candidate.is_absolute() else root / candidate
        if (p / "history.jsonl").is_file():
            return p
    return None


def _read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _steps(run_dir: Path) -> dict[int, list[tuple[float, int]]]:
    """learner -> (time, tokens) of each inner step, in time order."""
    out: dict[int, list[tuple[float, int]]] = {}
    for log in sorted((run_dir / "events").glob("learner-*.jsonl")):
        for e in _read_jsonl(log):
            if e.get("kind") == "inner_step":
                out.setdefault(int(e["learner"]), []).append((float(e["t"]), int(e.get("tokens") or 0)))
    for steps in out.values():
        steps.sort()
    return out


def _kill_stops(run_dir: Path) -> list[tuple[float, int]]:
    """(restart order time, learner) of every kill the controller restarted."""
    out = []
    for h in _read_jsonl(run_dir / "history.jsonl"):
        target = (h.get("fault") or {}).get("target") or ""
        if h.get("event") == "stop" and h.get("kind") == "kill" and target.startswith("learner-"):
            out.append((float(h["t"]), int(target.split("-", 1)[1].split("/")[0])))
    return out


def measured_restarts(run_dir: Path) -> tuple[float, ...]:
    """Seconds from each restart order to the restarted learner's first inner step."""
    steps = _steps(run_dir)
    out = []
    for t, learner in _kill_stops(run_dir):
        times = [s for s, _ in steps.get(learner, [])]
        i = bisect.bisect_left(times, t)
        if i < len(times):
            out.append(times[i] - t)
    if not out:
        raise ValueError(f"{run_dir}: no restarted learner made a step")
    return tuple(out)


def measured_pace(run_dir: Path, rates: dict[int, float]) -> float:
    """Tokens the learners processed while up ÷ what their credited rates allow in that time,
    at most 1. Up: between consecutive steps less than UP_GAP apart. A learner paced by an
    emulated accelerator steps a hair faster than the median step its rate is credited
    with (the 32-learner run measured 1.0003): that is full pace, not more."""
    made = allowed = 0.0
    for learner, steps in _steps(run_dir).items():
        rate = rates.get(learner)
        if not rate:
            continue
        for (a, _), (b, tokens) in zip(steps, steps[1:]):
            if b - a < UP_GAP:
                made += tokens
                allowed += (b - a) * rate
    if allowed <= 0:
        raise ValueError(f"{run_dir}: no steps to measure a pace from")
    return min(1.0, made / allowed)


def parse_recovery(spec: str) -> Dist:
    """A recovery spec: dists.SPEC_FORMS, or restarts:RUN_DIR (a chaos run's measured restarts)."""
    kind, _, rest = spec.partition(":")
    if kind == "restarts":
        run_dir = Path(rest)
        if not (run_dir / "history.jsonl").is_file():
            raise ValueError(f"restarts:RUN_DIR needs a chaos run directory with history.jsonl, got {rest!r}")
        return Empirical(measured_restarts(run_dir), f"restarts of {rest}")
    return parse_dist(spec)


def run_inputs(run: RunFile, overrides: dict[str, object]) -> RunInputs:
    """The run's settings, then the flags the user gave."""
    fields = {**run.settings, **{k: v for k, v in overrides.items() if v is not None}}
    return RunInputs(**{k: v for k, v in fields.items() if k in RunInputs.__dataclass_fields__})
