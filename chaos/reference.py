"""The fault-free reference of a chaos run: Θ's held-out loss against merged tokens.

A chaos run's loss means little on its own: on a loaded machine the same configuration
merges fewer tokens in the same minute and ends higher without anything being wrong.
So `final_loss` and `no_divergence` compare it with a run of the same configuration and
no faults, at the same number of merged tokens: the reference's `global_eval` curve,
interpolated where the chaos run ended.

References are cached under `islands_home()/references/<key>.json`, the key a hash of
what decides the curve: the run's RunSpec (learners, ranks, mode, task, device, data,
trainer and learner args) but where and how long it runs, and a digest of the trainer
package's source, so a trainer change makes a new one.
The schedule's seed is not in the key: a schedule without faults draws nothing from it,
and the trainer's own seed is a trainer arg. Nor is the duration: the comparison is at
equal tokens, so a cached reference is reused when it ran at least as long as asked, or
merged at least as many tokens as the chaos run did (a run with faults, or on containers,
merges fewer in the same time).
"""
from __future__ import annotations

import bisect
import hashlib
import json
import math
import os
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from trainer.runspec import RunSpec

from .filelock import flocked
from .processes import islands_home

REFERENCE_DIR = "references"
MODES = ("auto", "off")  # auto: use the cached reference, run it when missing
# Environment that would make the reference something other than fault-free.
NOT_INHERITED = ("ISLANDS_SYNCER_DEFECT", "ISLANDS_LEARNER_DEFECT")
# Durations are rounded up to this grid, so runs of a suite whose durations differ by a
# few seconds share one reference.
DURATION_GRID = 30.0
# How long a run waits for another run's reference of the same configuration: its length
# several times over (a loaded machine), plus start-up and evaluation. Past that it goes on
# without one (TimeoutError: the run records why).
LOCK_WAIT_FACTOR, LOCK_WAIT_EXTRA = 4.0, 300.0


@dataclass(frozen=True)
class ReferenceCurve:
    """Θ's held-out loss of a fault-free run, as (merged tokens, loss) points in token order."""

    key: str
    points: tuple[tuple[float, float], ...]
    final_loss: float | None = None       # `trainer eval` of its final state
    duration: float = 0.0
    settings: dict = field(default_factory=dict)
    path: str | None = None

    @property
    def final_tokens(self) -> float:
        return self.points[-1][0] if self.points else 0.0

    def at(self, tokens: float) -> float:
        """The reference's loss at `tokens` merged tokens, linearly interpolated; past its
        last point, its last point (it merged no further)."""
        if not self.points:
            raise ValueError("reference: no points")
        xs = [p[0] for p in self.points]
        if tokens <= xs[0]:
            return self.points[0][1]
        if tokens >= xs[-1]:
            return self.points[-1][1]
        i = bisect.bisect_right(xs, tokens)
        (x0, y0), (x1, y1) = self.points[i - 1], self.points[i]
        return y0 if x1 == x0 else y0 + (y1 - y0) * (tokens - x0) / (x1 - x0)

    def best_by(self, tokens: float) -> float:
        """The best loss the reference had reached by `tokens` merged tokens (its running
        minimum, interpolated). A healthy run's Θ overshoots for a version now and then
        (the outer Nesterov step, early in training); the envelope does not let such a
        spike in the reference excuse a high loss of the chaos run."""
        envelope, best = [], math.inf
        for t, v in self.points:
            best = min(best, v)
            envelope.append((t, best))
        return ReferenceCurve(self.key, tuple(envelope)).at(tokens)

    def to_dict(self) -> dict:
        return {**asdict(self), "points": [list(p) for p in self.points]}

    @classmethod
    def from_dict(cls, data: dict) -> "ReferenceCurve":
        points = tuple((float(t), float(v)) for t, v in data["points"])
        return cls(key=str(data["key"]), points=points, final_loss=data.get("final_loss"),
                   duration=float(data.get("duration") or 0.0), settings=dict(data.get("settings") or {}),
                   path=data.get("path"))

    @property
    def unusable(self) -> list[str]:
        """The reference run's own failed checks that make it no yardstick: a reference that
        diverged or went non-finite would excuse the same in a chaos run."""
        return sorted(set(self.settings.get("failed") or ()) & {"no_divergence", "finite"})

    def describe(self) -> dict:
        """What run.json and the evidence say about it."""
        return {"key": self.key, "path": self.path, "duration": self.duration, "points": len(self.points),
                "final_tokens": self.final_tokens, "final_loss": self.final_loss,
                "run_dir": self.settings.get("run_dir"), "unusable": self.unusable}


def curve_points(events: list[dict]) -> tuple[tuple[float, float], ...]:
    """(merged tokens, loss) of every finite `global_eval`, in token order; at equal tokens
    the later sample wins (a restarted syncer scores the same Θ again)."""
    by_tokens: dict[float, float] = {}
    for e in sorted((e for e in events if e["kind"] == "global_eval"), key=lambda e: e["t"]):
        loss = _finite(e.get("loss"))
        if loss is not None:
            by_tokens[float(e.get("tokens") or 0.0)] = loss
    return tuple(sorted(by_tokens.items()))


def _finite(value: object) -> float | None:
    try:
        out = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return out if math.isfinite(out) else None


def trainer_digest() -> str:
    """A digest of the trainer package's source: any change to it makes new references."""
    root = Path(__file__).resolve().parent.parent / "trainer"
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        h.update(str(path.relative_to(root)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


# What does not decide a fault-free curve: where it runs, for how long, the faults' seed.
NOT_IN_KEY = ("backend", "duration", "warm_spares", "seed", "env")
MAX_TASK_FILES = 64


def settings_for(spec: RunSpec) -> dict:
    """What decides a fault-free run's curve (every RunSpec field but NOT_IN_KEY, and the
    trainer's source), as the key is computed from it."""
    settings = {k: v for k, v in spec.to_json().items() if k not in NOT_IN_KEY}
    return {**settings, "trainer": trainer_digest(), **task_digest(spec.task)}


def task_digest(task: str) -> dict:
    """A digest of a task file and the .py files beside it (only the file itself in a folder
    of more than MAX_TASK_FILES): editing your model or loss makes a new reference, as a
    trainer change does. Nothing for a built-in task or a module."""
    path, sep, _ = task.rpartition(":")
    if not sep or not path.endswith(".py") or not Path(path).is_file():
        return {}
    task_file = Path(path).resolve()
    neighbours = sorted(task_file.parent.glob("*.py"))  # what it may import beside it; not recursive
    h = hashlib.sha256()
    for source in neighbours if len(neighbours) <= MAX_TASK_FILES else [task_file]:
        h.update(source.name.encode())
        h.update(source.read_bytes())
    return {"task_source": h.hexdigest()[:16]}


def reference_key(settings: dict) -> str:
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:20]


def reference_dir() -> Path:
    return islands_home() / REFERENCE_DIR


def load_cached(key: str, duration: float, tokens: float | None = None) -> ReferenceCurve | None:
    """The cached reference for `key`, if it has a curve and either ran at least `duration` s
    or merged at least `tokens` tokens (those of the run to compare with it)."""
    path = reference_dir() / f"{key}.json"
    try:
        curve = ReferenceCurve.from_dict(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not curve.points:
        return None
    long_enough = curve.duration + 1e-6 >= duration
    far_enough = tokens is not None and tokens > 0 and curve.final_tokens >= tokens
    return curve if long_enough or far_enough else None


def store(curve: ReferenceCurve) -> ReferenceCurve:
    """Write `curve` to the cache atomically; returns it with its path."""
    folder = reference_dir()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{curve.key}.json"
    stored = ReferenceCurve(curve.key, curve.points, curve.final_loss, curve.duration, curve.settings, str(path))
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps({**stored.to_dict(), "created": time.time()}, indent=1))
    os.replace(tmp, path)
    return stored


def reference_duration(duration: float) -> float:
    return math.ceil(duration / DURATION_GRID) * DURATION_GRID


def check_reference_seconds(seconds: float) -> None:
    """Refuse a reference length that is not a finite number of seconds >= 0, by its name."""
    if not seconds >= 0 or math.isinf(seconds):
        raise ValueError(f"reference_seconds: must be a finite number of seconds >= 0, got {seconds!r}")


def obtain(spec: RunSpec, tokens: float | None = None, on_phase: Callable[[str], None] | None = None,
           at_least: float = 0.0) -> ReferenceCurve | None:
    """The cached reference for this configuration (one that covers `duration` s or the
    chaos run's `tokens` merged tokens), or a fault-free run of it made now
    through `chaos.runner.run_schedule` with an empty schedule, nothing else changed, in
    `reference_dir()/<key>-run`. It always runs on the local backend: what healthy training
    reaches at a number of merged tokens does not depend on where the processes live, and
    it needs no Docker. With `at_least`, only a reference that ran that long (and the
    run's own length) will do, and a missing one runs that long: longer runs of the configuration
    then find it cached too (a suite whose runs differ in length pays for one reference, not
    one per length, whichever of them happens to run first). None when the reference run
    sampled no global loss."""
    check_reference_seconds(at_least)
    settings = settings_for(spec)
    key = reference_key(settings)
    wanted = reference_duration(spec.duration or DURATION_GRID)
    length = max(wanted, reference_duration(at_least))
    enough = None if at_least > 0 else tokens  # a length was asked for: a shorter one's tokens do not count
    cached = load_cached(key, length, enough)
    if cached is not None:
        return cached
    # One reference run per configuration at a time: runs of one configuration started
    # together would share (and delete) `<key>-run`; the later one waits and uses the cache.
    with flocked(reference_dir() / f"{key}.lock", LOCK_WAIT_FACTOR * length + LOCK_WAIT_EXTRA):
        cached = load_cached(key, length, enough)
        return cached if cached is not None else _run_reference(spec, settings, key, length, on_phase)


def _run_reference(spec: RunSpec, settings: dict, key: str, wanted: float,
                   on_phase: Callable[[str], None] | None = None) -> ReferenceCurve | None:
    """Run the fault-free reference of `spec` for `wanted` s in `reference_dir()/<key>-run`
    and cache its curve (the caller holds the key's lock)."""
    from faults import Schedule
    from trainer.events import read_events

    from .runner import run_schedule

    run_dir = reference_dir() / f"{key}-run"
    if run_dir.exists():
        shutil.rmtree(run_dir)
    notice = (f"no fault-free reference of this configuration yet: running one for {wanted:.0f} s (plus its "
              f"start-up) in {run_dir}; cached for the next runs, --reference off skips it")
    if on_phase is not None:
        on_phase(notice)
    else:
        print(f"chaos: {notice}", flush=True)
    saved = {k: os.environ.pop(k) for k in NOT_INHERITED if k in os.environ}
    try:
        # A fault-free run restarts nothing and runs locally (above).
        result = run_schedule(Schedule(seed=0, faults=()), run_dir,
                              spec.replace(backend="local", duration=wanted, warm_spares=0, env={}), reference="off")
    finally:
        os.environ.update(saved)
    points = curve_points(read_events(run_dir))
    if not points:
        return None
    final = result.summary.get("final_loss")
    return store(ReferenceCurve(key, points, float(final) if isinstance(final, (int, float)) else None, wanted,
                                {**settings, "run_dir": str(run_dir), "failed": list(result.document["failed"])}))
