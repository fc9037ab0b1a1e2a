"""One run's settings, in one typed place: `RunSpec`.

`trainer run`, `chaos run`, `chaos replay`, the pytest plugin, every cluster backend and
the benches all describe a run with it: they write it to run.json (`to_json`), read it
back (`from_json`), print the command that reruns it (`to_argv`) and start the syncer and
the learners with the flags it gives (`syncer_flags`, `learner_flags`). A new run option
is a field here plus the code that uses it, and travels everywhere else by itself.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field, fields
from typing import Any

from .argtypes import check_device

BACKENDS = ("local", "compose", "swarm")
# Fields to_argv writes its own way (or not at all: env goes before the command).
MAX_HOST_OFFSET = 86400.0   # seconds: a day either way
MAX_HOST_DRIFT_PPM = 1000.0  # a clock off by more than 0.1% is broken, not drifting


def parse_host_clocks(text: str) -> dict[str, tuple[float, float]]:
    """"syncer=-4,learner-1=+5@200" → {process: (offset seconds, drift ppm)}; errors name
    the part and the field."""
    out: dict[str, tuple[float, float]] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, eq, value = part.partition("=")
        if not eq or not name.strip():
            raise ValueError(f"host_clocks: {part!r}: expected PROCESS=OFFSET[@DRIFT_PPM], like learner-1=+5@200")
        offset_text, _, drift_text = value.partition("@")
        try:
            offset, drift = float(offset_text), float(drift_text or 0.0)
        except ValueError:
            raise ValueError(f"host_clocks: {part!r}: offset and drift must be numbers "
                             f"(seconds, and parts per million)") from None
        if not (math.isfinite(offset) and abs(offset) <= MAX_HOST_OFFSET):
            raise ValueError(f"host_clocks: {part!r}: offset must be within ±{MAX_HOST_OFFSET:g} s")
        if not (math.isfinite(drift) and abs(drift) <= MAX_HOST_DRIFT_PPM):
            raise ValueError(f"host_clocks: {part!r}: drift must be within ±{MAX_HOST_DRIFT_PPM:g} ppm")
        name = name.strip()
        if name in out:
            raise ValueError(f"host_clocks: {name!r} is given twice")
        out[name] = (offset, drift)
    return out


SPELLED_OUT = ("backend", "learners", "trainer_args", "learner_args", "duration", "env", "disk_layer")
MODES = ("decoupled", "sync")


@dataclass(frozen=True)
class RunSpec:
    backend: str = "local"          # local | compose | swarm
    learners: int = 3
    ranks: int = 1                  # ranks per learner unit (a learner's own --ranks in learner_args wins)
    mode: str = "decoupled"         # decoupled | sync
    task: str = "gpt"               # trainer/task.py: a built-in name, FILE.py:NAME or MODULE:NAME
    device: str = "auto"            # where learners train: auto | cpu | cuda | cuda:N
    data: str = "markov"            # the built-in task's data (and the syncer's held-out set)
    trainer_args: tuple[str, ...] = ()                    # training and syncer flags, decided by the syncer
    learner_args: dict[int, tuple[str, ...]] = field(default_factory=dict)  # extra flags of learner-N
    duration: float | None = None   # seconds of training (chaos: the schedule's horizon plus a tail)
    warm_spares: int = 0            # local backend: warm processes restarts take
    seed: int | None = None         # the fault schedule's seed
    env: dict[str, str] = field(default_factory=dict)     # set for the cluster's processes
    # The disk-fault layer (chaos/diskfs) under the syncer's state dir, for the whole run: a
    # `disk` or `power_loss` fault needs it from the start (the runner sets it from the schedule).
    disk_layer: bool = False
    # Clocks of their own for some processes, as if each ran on a machine of its own (the
    # local backend; swarm nodes get theirs from the node): "syncer=-4,learner-1=+5@200"
    # is an offset in seconds and a drift in parts per million (parse_host_clocks).
    host_clocks: str = ""

    def __post_init__(self) -> None:
        # Lists from callers become tuples, so a spec is a value that nothing can change under it.
        object.__setattr__(self, "trainer_args", tuple(str(a) for a in self.trainer_args))
        object.__setattr__(self, "learner_args", {int(k): tuple(str(a) for a in v)
                                                  for k, v in (self.learner_args or {}).items()})
        object.__setattr__(self, "env", dict(self.env or {}))
        self.validate()

    def validate(self) -> None:
        """Raise ValueError naming the field of the first bad value."""
        if self.backend not in BACKENDS:
            raise ValueError(f"backend: must be one of {', '.join(BACKENDS)}, got {self.backend!r}")
        for name in ("learners", "ranks"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: must be >= 1, got {value!r}")
        if self.mode not in MODES:
            raise ValueError(f"mode: must be one of {', '.join(MODES)}, got {self.mode!r}")
        if self.ranks > 1 and self.mode == "sync":
            raise ValueError("ranks: a unit of several ranks needs mode decoupled (sync mode is the 1-rank baseline)")
        for name in ("task", "data"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise ValueError(f"{name}: must be a non-empty string, got {getattr(self, name)!r}")
        check_device(self.device)
        bad = [k for k in self.learner_args if not 1 <= k <= self.learners]
        if bad:
            raise ValueError(f"learner_args: learner {bad[0]} is out of range 1..{self.learners}")
        if self.duration is not None and (isinstance(self.duration, bool) or not 0 < self.duration < math.inf):
            raise ValueError(f"duration: must be > 0 seconds, got {self.duration!r}")
        if isinstance(self.warm_spares, bool) or not isinstance(self.warm_spares, int) or self.warm_spares < 0:
            raise ValueError(f"warm_spares: must be >= 0, got {self.warm_spares!r}")
        if self.warm_spares and self.backend != "local":
            raise ValueError(f"warm_spares: only the local backend keeps warm spare processes, not {self.backend!r}")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)):
            raise ValueError(f"seed: must be an integer, got {self.seed!r}")
        if not isinstance(self.disk_layer, bool):
            raise ValueError(f"disk_layer: must be true or false, got {self.disk_layer!r}")
        if not isinstance(self.host_clocks, str):
            raise ValueError(f"host_clocks: must be a string like 'syncer=-4,learner-1=+5@200', got {self.host_clocks!r}")
        clocks = parse_host_clocks(self.host_clocks)
        bad = [n for n in clocks if n != "syncer" and not (n.startswith("learner-") and n[8:].isdigit()
                                                           and 1 <= int(n[8:]) <= self.learners)]
        if bad:
            raise ValueError(f"host_clocks: {bad[0]!r} is not a process of this run (syncer, learner-1.."
                             f"learner-{self.learners})")
        if clocks and self.backend != "local":
            raise ValueError(f"host_clocks: only the local backend gives processes clocks of their own; "
                             f"on {self.backend!r} a process has its node's clock")
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in self.env.items()):
            raise ValueError(f"env: must map strings to strings, got {self.env!r}")

    def replace(self, **changes: Any) -> "RunSpec":
        return dataclasses.replace(self, **changes)

    def with_learner_flags(self, flags: list[str] | tuple[str, ...]) -> "RunSpec":
        """The spec with `flags` added to every learner's (before each learner's own)."""
        return self.replace(learner_args={i: (*flags, *self.learner_args.get(i, ()))
                                          for i in range(1, self.learners + 1)})

    # ------------------------------------------------------------------ processes
    def syncer_flags(self) -> list[str]:
        """What every backend hands `python -m trainer syncer` (besides addresses and dirs):
        --eval-data makes it sample Θ's held-out loss during the run (global_eval)."""
        return ["--learners", str(self.learners), "--mode", self.mode, "--task", self.task,
                "--eval-data", self.data, *self.trainer_args]

    def learner_flags(self, learner: int) -> list[str]:
        """What every backend hands `python -m trainer learner --learner N` (besides the address)."""
        return ["--mode", self.mode, "--task", self.task, "--data", self.data, "--device", self.device,
                *(["--ranks", str(self.ranks)] if self.ranks > 1 else []), *self.learner_args.get(learner, ())]

    def ranks_of(self, learner: int) -> int:
        """Ranks of learner-N's unit: the last --ranks of its flags."""
        ranks = self.ranks
        args = list(self.learner_args.get(learner, ()))
        for i, arg in enumerate(args):
            if arg == "--ranks" and i + 1 < len(args):
                ranks = int(args[i + 1])
            elif arg.startswith("--ranks="):
                ranks = int(arg.split("=", 1)[1])
        return ranks

    # ------------------------------------------------------------------ files and command lines
    def to_json(self) -> dict:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["trainer_args"] = list(self.trainer_args)
        out["learner_args"] = {str(k): list(v) for k, v in sorted(self.learner_args.items())}
        return out

    @classmethod
    def from_json(cls, data: Any, source: str = "run.json") -> "RunSpec":
        """The spec a run.json holds (missing keys take their defaults; unknown keys are kept
        out). Errors name the file and the field."""
        if not isinstance(data, dict):
            raise ValueError(f"{source}: expected a JSON object, got {type(data).__name__}")
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known and v is not None and v != ""}
        for name in ("trainer_args",):
            v = values.get(name, [])
            if not isinstance(v, list) or not all(isinstance(a, str) for a in v):
                raise ValueError(f"{source}: {name}: expected a list of strings, got {v!r}")
        la = values.get("learner_args", {})
        if not isinstance(la, dict) or not all(
                isinstance(k, str) and k.isdigit() and isinstance(v, list) and all(isinstance(a, str) for a in v)
                for k, v in la.items()):
            raise ValueError(f"{source}: learner_args: expected an object of learner number to a list of "
                             f"strings, got {la!r}")
        values["learner_args"] = {int(k): v for k, v in la.items()}
        env = values.get("env", {})
        if not isinstance(env, dict):
            raise ValueError(f"{source}: env: expected an object of strings, got {env!r}")
        if "duration" in values:
            if isinstance(values["duration"], bool) or not isinstance(values["duration"], (int, float)):
                raise ValueError(f"{source}: duration: expected a number of seconds, got {values['duration']!r}")
            values["duration"] = float(values["duration"])
        try:
            return cls(**values)
        except (ValueError, TypeError) as exc:
            raise ValueError(f"{source}: {exc}") from None

    def to_argv(self, schedule: str | None = None) -> list[str]:
        """`python -m chaos run` arguments that rerun this spec (defaults left out)."""
        default = RunSpec()
        argv = ["python", "-m", "chaos", "run", *([schedule] if schedule else []), "--backend", self.backend,
                "--learners", str(self.learners)]
        for f in fields(self):  # every plain option is the flag of its name (chaos run --help)
            value = getattr(self, f.name)
            if f.name not in SPELLED_OUT and value is not None and value != getattr(default, f.name):
                argv += ["--" + f.name.replace("_", "-"), str(value)]
        for learner, args in sorted(self.learner_args.items()):
            argv += [f"--learner-args={learner}:{' '.join(args)}"]
        if self.duration is not None:
            argv += ["--duration", f"{self.duration:g}"]
        if self.trainer_args:
            argv += ["--", *self.trainer_args]
        return argv
