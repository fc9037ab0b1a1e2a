"""Recovery-time distributions, written as short specs so that every flag can take one.

A failed unit (a learner, a data-parallel slice, a whole job) comes back after a time that
is rarely a constant: Islands' own restarts spread from 0.02 s to 2 s (BENCHMARKS.md,
"Recovery"). A spec names the shape and its figures:

  fixed:S                 always S seconds
  lognormal:MEDIAN,P90    a log-normal with that median and 90th percentile (how
                          bench/recovery.py reports its measures)
  expweibull:SCALE,K,A    an exponentiated Weibull, CDF (1 - exp(-(x/SCALE)^K))^A (A=1: a
                          Weibull): the family a summary of the paper reports for its
                          recovery delays, parameters unknown
  empirical:FILE.json     resample measured values: a JSON list of seconds, or the output
                          of bench/recovery.py (its rows' `rejoin_s`; `FILE.json#startup_s`
                          picks another field of the rows)

Sums (one outage made of parts, e.g. detection + rejoin) are built with `Sum`.
"""
from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

Z90 = 1.2815515655446004  # the standard normal's 90th percentile
RECOVERY_FIELD = "rejoin_s"  # bench/recovery.py: restart -> first merged push
SPEC_FORMS = "fixed:S, lognormal:MEDIAN,P90, expweibull:SCALE,K,A or empirical:FILE.json[#FIELD]"


class Dist(Protocol):
    def sample(self, rng: random.Random) -> float: ...

    def mean(self) -> float: ...

    def scaled(self, factor: float) -> Dist: ...

    def spec(self) -> str: ...


@dataclass(frozen=True)
class Fixed:
    seconds: float

    def sample(self, rng: random.Random) -> float:
        return self.seconds

    def mean(self) -> float:
        return self.seconds

    def scaled(self, factor: float) -> Fixed:
        return Fixed(self.seconds * factor)

    def spec(self) -> str:
        return f"fixed:{self.seconds:g}"


@dataclass(frozen=True)
class LogNormal:
    median: float
    p90: float

    @property
    def sigma(self) -> float:
        return math.log(self.p90 / self.median) / Z90

    def sample(self, rng: random.Random) -> float:
        return rng.lognormvariate(math.log(self.median), self.sigma)

    def mean(self) -> float:
        return self.median * math.exp(self.sigma ** 2 / 2)

    def scaled(self, factor: float) -> LogNormal:
        return LogNormal(self.median * factor, self.p90 * factor)

    def spec(self) -> str:
        return f"lognormal:{self.median:g},{self.p90:g}"


@dataclass(frozen=True)
class ExpWeibull:
    """Exponentiated Weibull: CDF F(x) = (1 - exp(-(x/scale)^k))^a, sampled by inversion."""

    scale: float
    k: float
    a: float

    def _at(self, s: float) -> float:
        """The quantile at u = 1 - e^-s (s > 0): scale * (-ln(1 - u^(1/a)))^(1/k), computed
        without rounding u to 1 for large s."""
        return self.scale * (-math.log(-math.expm1(math.log1p(-math.exp(-s)) / self.a))) ** (1 / self.k)

    def sample(self, rng: random.Random) -> float:
        return self._at(rng.expovariate(1.0))  # 1 - e^-s is uniform on (0, 1)

    def mean(self) -> float:
        # E[X] is the integral of Q(u) over (0, 1), i.e. of Q(1 - e^-s) e^-s over s > 0: the
        # midpoint rule up to s = 60 (the tail beyond weighs under 1e-20)
        n, top = 6000, 60.0
        h = top / n
        return h * sum(self._at((i + 0.5) * h) * math.exp(-(i + 0.5) * h) for i in range(n))

    def scaled(self, factor: float) -> ExpWeibull:
        return ExpWeibull(self.scale * factor, self.k, self.a)

    def spec(self) -> str:
        return f"expweibull:{self.scale:g},{self.k:g},{self.a:g}"


@dataclass(frozen=True)
class Empirical:
    values: tuple[float, ...]
    source: str

    def sample(self, rng: random.Random) -> float:
        return rng.choice(self.values)

    def mean(self) -> float:
        return sum(self.values) / len(self.values)

    def scaled(self, factor: float) -> Empirical:
        return Empirical(tuple(v * factor for v in self.values), f"{self.source} x{factor:g}")

    def spec(self) -> str:
        return f"empirical:{self.source} (n={len(self.values)}, mean {self.mean():.3g} s)"


@dataclass(frozen=True)
class Sum:
    """One outage made of consecutive parts (detection, then restart, then rejoin)."""

    parts: tuple[Dist, ...]

    def sample(self, rng: random.Random) -> float:
        return sum(p.sample(rng) for p in self.parts)

    def mean(self) -> float:
        return sum(p.mean() for p in self.parts)

    def scaled(self, factor: float) -> Sum:
        return Sum(tuple(p.scaled(factor) for p in self.parts))

    def spec(self) -> str:
        return " + ".join(p.spec() for p in self.parts)


def _numbers(text: str, count: int, form: str) -> list[float]:
    parts = text.split(",")
    if len(parts) != count:
        raise ValueError(f"expected {form}, got {text!r}")
    try:
        values = [float(p) for p in parts]
    except ValueError:
        raise ValueError(f"expected {form} with numbers, got {text!r}") from None
    if not all(math.isfinite(v) for v in values):
        raise ValueError(f"expected finite numbers in {form}, got {text!r}")
    return values


def read_values(path: str, field: str = RECOVERY_FIELD) -> tuple[float, ...]:
    """Seconds from a JSON list, or from bench/recovery.py's output (its rows' `field`)."""
    try:
        data = json.loads(Path(path).read_text())
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not JSON: {exc}") from None
    if isinstance(data, dict) and isinstance(data.get("rows"), list):
        values = [row.get(field) for row in data["rows"] if isinstance(row, dict)]
        values = [v for v in values if v is not None]
        if not values:
            raise ValueError(f"{path}: no row has a {field!r} value")
    elif isinstance(data, list):
        values = data
    else:
        raise ValueError(f"{path}: expected a JSON list of seconds or bench/recovery.py's output (rows)")
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0
               for v in values):
        raise ValueError(f"{path}: every value must be a finite number of seconds >= 0")
    if not values:
        raise ValueError(f"{path}: no values")
    return tuple(float(v) for v in values)


def parse_dist(spec: str) -> Dist:
    """A spec (SPEC_FORMS) as a distribution; ValueError says what is wrong with it."""
    kind, sep, rest = spec.partition(":")
    if not sep:
        raise ValueError(f"expected {SPEC_FORMS}, got {spec!r}")
    if kind == "fixed":
        (seconds,) = _numbers(rest, 1, "fixed:S")
        if seconds < 0:
            raise ValueError(f"fixed:S needs S >= 0, got {seconds:g}")
        return Fixed(seconds)
    if kind == "lognormal":
        median, p90 = _numbers(rest, 2, "lognormal:MEDIAN,P90")
        if not 0 < median <= p90:
            raise ValueError(f"lognormal:MEDIAN,P90 needs 0 < MEDIAN <= P90, got {rest}")
        return LogNormal(median, p90)
    if kind == "expweibull":
        scale, k, a = _numbers(rest, 3, "expweibull:SCALE,K,A")
        if not (scale > 0 and k > 0 and a > 0):
            raise ValueError(f"expweibull:SCALE,K,A needs SCALE, K and A > 0, got {rest}")
        return ExpWeibull(scale, k, a)
    if kind == "empirical":
        path, _, field = rest.partition("#")
        if not path:
            raise ValueError("empirical:FILE.json needs a file")
        return Empirical(read_values(path, field or RECOVERY_FIELD), rest)
    raise ValueError(f"unknown distribution {kind!r}: expected {SPEC_FORMS}")
