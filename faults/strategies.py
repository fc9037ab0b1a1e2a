"""Hypothesis strategies for valid fault schedules.

Validity is built in rather than filtered for: faults that could clash are put
on one "lane" (a process unit, a partitioned link, a link plus toxic kind, a
unit's disk or a unit's clock) and laid end to end on it, so nothing overlaps.
A kill or power_loss of a unit shares the unit's process lane; disk and clock
faults have lanes of their own, so they may overlap the unit's kills and pauses
(a disk stays faulty while its process is down), which the schedule allows. A
kill or power_loss without restart waits for, then closes, every lane of its
unit. A fault that would not fit in the horizon, or that lands on a unit already
down for good, is left out.

Disk, power_loss and clock are drawn only when asked for (``kinds``), not by
default. Disk and power_loss act on the syncer alone (the one process with
durable state), so they are drawn only with ``include_syncer``; clock targets
the syncer or a learner unit (never a rank). Clock offsets come from a few
meaningful values (+/-1 s, +/-60 s, +/-3600 s, shrinking toward +1 s), drift
rates from 2, 0.5 and 10; a slow disk's latency from 50 (the default), 5, 500
and 5000 ms.

Shrinking moves toward fewer faults (down to none), shorter ones
(durations toward ``min_duration``), earlier ones (``at`` toward the lane's
free time, 0 for the first) and simpler ones (the first listed kind, learner-1,
default direction/toxicity/restart, small parameters). Hypothesis also counts a
kind with fewer parameters as simpler, so kill and pause (one draw each) win
ties against the toxics. Times are whole tenths of a
second, computed as integers, so files read ``at: 2.3``, not ``2.3000000000000003``.

A kind's parameters are drawn field by field from each field's ``Rule`` (one draw per
rule, below), so a new kind whose fields use known rules needs no edit here. Kill,
partition, latency, slicer, disk and clock keep draws of their own: kill's target and
restart are one draw, and the others have fields that constrain one another.

hypothesis is imported inside the function, so ``faults`` works without it.
"""

from __future__ import annotations

import math
from dataclasses import fields
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from faults.kinds import (
    CLOCK_MODES,
    NODE_MODES,
    COUNT,
    DIRECTION,
    DIRECTIONS,
    DISK_LATENCY_MS,
    DISK_MODES,
    FLAG,
    KINDS,
    LINK_TARGET,
    MILLIS,
    POSITIVE_COUNT,
    POWER_TARGET,
    PROCESS_KINDS,
    PROCESS_TARGET,
    RATE,
    SYNCER,
    TOXICITY,
    Rule,
)
from faults.schedule import Schedule

if TYPE_CHECKING:
    from hypothesis.strategies import SearchStrategy

DEFAULT_KINDS: tuple[str, ...] = ("kill", "pause", "partition", "latency")
SYNCER_ONLY_KINDS: tuple[str, ...] = ("disk", "power_loss")  # the syncer alone keeps durable state
CLOCK_OFFSETS: tuple[float, ...] = (1.0, -1.0, 60.0, -60.0, 3600.0, -3600.0)  # shrinks toward +1 s
DRIFT_RATES: tuple[float, ...] = (2.0, 0.5, 10.0)
DISK_LATENCIES: tuple[float, ...] = (DISK_LATENCY_MS, 5.0, 500.0, 5000.0)  # the default first: left out of files


def _tenths(seconds: float, up: bool) -> int:
    scaled = seconds * 10
    return math.ceil(scaled - 1e-9) if up else math.floor(scaled + 1e-9)


def schedules(
    learners: int = 3,
    kinds: Sequence[str] = DEFAULT_KINDS,
    max_faults: int = 4,
    horizon: float = 20.0,
    min_duration: float = 0.5,
    max_duration: float = 8.0,
    seed: int | SearchStrategy[int] | None = None,
    include_syncer: bool = True,
    ranks: Mapping[int, int] | None = None,
) -> SearchStrategy[Schedule]:
    """Valid schedules for ``learners`` learners, every fault ending by ``horizon`` s.

    ``seed``: a fixed int, a strategy, or None for any 32-bit seed (shrinks to 0).
    ``include_syncer``: whether kill/pause/clock may target the syncer; disk and power_loss,
    which act on the syncer alone, are drawn only when it is true.
    ``ranks``: learner number -> ranks of its unit; kill/pause may then target a single
    rank (``learner-N/rank-R``) of a unit of several.
    """
    from hypothesis import strategies as st

    kinds = tuple(kinds)
    unknown = [k for k in kinds if k not in KINDS]
    if not kinds or unknown:
        raise ValueError(f"kinds must be a non-empty selection of {', '.join(KINDS)}; unknown: {unknown}")
    if not include_syncer:
        kinds = tuple(k for k in kinds if k not in SYNCER_ONLY_KINDS)
        if not kinds:
            raise ValueError(f"{' and '.join(SYNCER_ONLY_KINDS)} act on the syncer alone: "
                             "include_syncer=False leaves no kind to draw")
    if isinstance(learners, bool) or not isinstance(learners, int) or learners < 1:
        raise ValueError(f"learners must be an integer >= 1, got {learners!r}")
    if max_faults < 0:
        raise ValueError(f"max_faults must be >= 0, got {max_faults}")
    lo, hi, end = _tenths(min_duration, True), _tenths(max_duration, False), _tenths(horizon, False)
    hi = min(hi, end)
    if lo < 1 or lo > hi:
        raise ValueError(
            f"need 0.1 <= min_duration <= max_duration and min_duration <= horizon (whole tenths of a second), "
            f"got min_duration={min_duration}, max_duration={max_duration}, horizon={horizon}"
        )

    seeds = st.integers(0, 2**32 - 1) if seed is None else st.just(seed) if isinstance(seed, int) else seed
    names = [f"learner-{n}" for n in range(1, learners + 1)]
    learner = st.sampled_from(names)
    bad_ranks = {n: r for n, r in (ranks or {}).items()
                 if not (isinstance(n, int) and 1 <= n <= learners and type(r) is int and r >= 1)}
    if bad_ranks:
        raise ValueError(f"ranks must map learner numbers 1..{learners} to integers >= 1, got {bad_ranks}")
    rank_targets = [f"learner-{n}/rank-{r}" for n, count in sorted((ranks or {}).items()) if count > 1
                    for r in range(count)]
    units = names + ([SYNCER] if include_syncer else [])  # what a clock can belong to: no ranks
    process_targets = units + rank_targets
    direction = st.sampled_from(DIRECTIONS)  # "both" first: the default is the simplest
    toxicity = st.integers(0, 9).map(lambda k: (10 - k) / 10)  # shrinks to 1.0
    millis = lambda lo_ms, hi_ms: st.integers(lo_ms, hi_ms).map(float)  # noqa: E731

    # One draw per field rule; the rule holds what is valid, the bounds here what is useful.
    draws: dict[Rule, SearchStrategy[Any]] = {
        PROCESS_TARGET: st.sampled_from(process_targets),
        LINK_TARGET: learner,
        DIRECTION: direction,
        TOXICITY: toxicity,
        MILLIS: millis(0, 5000),
        RATE: millis(1, 100_000),
        COUNT: st.integers(0, 1 << 20),
        POSITIVE_COUNT: st.integers(1, 4096),
        POWER_TARGET: st.just(SYNCER),
        FLAG: st.sampled_from((True, False)),  # the default (True) first
    }

    def from_rules(kind: str) -> SearchStrategy[dict[str, Any]]:
        """Every field but at and duration, in field order, each by its rule's draw."""
        parts = {}
        for f in fields(KINDS[kind]):  # type: ignore[arg-type]
            if f.name in ("at", "duration"):
                continue
            rule = f.metadata["rule"]
            if rule not in draws:
                raise ValueError(f"no draw for {kind}.{f.name} ({rule}): add one to the draws in faults/strategies.py")
            parts[f.name] = draws[rule]
        return st.fixed_dictionaries(parts)

    @st.composite
    def partition(draw: Any) -> dict[str, Any]:
        targets = draw(st.lists(learner, min_size=1, max_size=learners, unique=True))
        mode = draw(st.sampled_from(("blackhole", "refuse")))
        # Always draw the direction, so refuse isn't "simpler" for having one draw fewer;
        # refuse can only cut both ways.
        chosen = draw(direction)
        return {"targets": tuple(targets), "direction": "both" if mode == "refuse" else chosen, "mode": mode}

    @st.composite
    def latency(draw: Any) -> dict[str, Any]:
        ms = draw(st.integers(1, 2000))
        return {
            "target": draw(learner),
            "latency_ms": float(ms),
            "jitter_ms": float(draw(st.integers(0, ms))),
            "direction": draw(direction),
            "toxicity": draw(toxicity),
        }

    @st.composite
    def slicer(draw: Any) -> dict[str, Any]:
        size = draw(st.integers(1, 4096))
        return {
            "target": draw(learner),
            "average_size": size,
            "size_variation": draw(st.integers(0, size - 1)),
            "delay_us": draw(st.integers(0, 10_000)),
            "direction": draw(direction),
            "toxicity": draw(toxicity),
        }

    @st.composite
    def disk(draw: Any) -> dict[str, Any]:
        mode = draw(st.sampled_from(DISK_MODES))
        # Always draw the latency, so full and eio aren't "simpler" for having one draw fewer.
        latency = draw(st.sampled_from(DISK_LATENCIES))
        return {"target": SYNCER, "mode": mode, "latency_ms": latency if mode == "slow" else DISK_LATENCY_MS}

    @st.composite
    def clock(draw: Any) -> dict[str, Any]:
        target, mode = draw(st.sampled_from(units)), draw(st.sampled_from(CLOCK_MODES))
        offset, rate = draw(st.sampled_from(CLOCK_OFFSETS)), draw(st.sampled_from(DRIFT_RATES))
        if mode == "drift":  # drift accumulates its own offset; skew and jump keep true speed
            return {"target": target, "mode": mode, "offset_s": 0.0, "rate": rate}
        return {"target": target, "mode": mode, "offset_s": offset, "rate": 1.0}

    special: dict[str, SearchStrategy[dict[str, Any]]] = {
        # one draw for target and restart, so a kill is as small as a pause and kinds shrink by order
        "kill": st.sampled_from([(t, r) for r in (True, False) for t in process_targets]).map(
            lambda tr: {"target": tr[0], "restart": tr[1]}
        ),
        "partition": partition(),
        "latency": latency(),
        "slicer": slicer(),
        "disk": disk(),
        "clock": clock(),
        # a node named by what it runs: a schedule drawn before any cluster exists fits any placement
        "node": st.fixed_dictionaries({"target": st.sampled_from([f"node-of:{u}" for u in units]),
                                       "mode": st.sampled_from(NODE_MODES)}),
    }
    params = {kind: special[kind] if kind in special else from_rules(kind) for kind in kinds}

    @st.composite
    def draft(draw: Any) -> tuple[str, int, int, dict[str, Any]]:
        kind = draw(st.sampled_from(kinds))
        gap = draw(st.integers(0, end - lo))  # tenths after the lane is free
        length = draw(st.integers(lo, hi))
        return kind, gap, length, draw(params[kind])

    def stays_down(kind: str, p: dict[str, Any]) -> bool:
        return kind in ("kill", "power_loss") and not p["restart"]

    def lanes(kind: str, p: dict[str, Any]) -> list[tuple[str, ...]]:
        if kind in ("disk", "clock"):
            return [(kind, p["target"])]  # a unit's disk, a unit's clock: may overlap its kills and pauses
        if kind in PROCESS_KINDS:
            unit = p["target"].split("/")[0]  # a unit and its ranks share a lane
            if stays_down(kind, p):  # after everything on the unit, and nothing on it after
                return [("process", unit), ("disk", unit), ("clock", unit)]
            return [("process", unit)]
        if kind == "partition":
            return [("partition", t) for t in p["targets"]]
        if kind == "node":
            return [("node", p["target"])]
        return [("link", kind, p["target"])]

    more = st.sampled_from((False, True, True, True))  # shrinks to False: stop

    @st.composite
    def drafts(draw: Any, room: int) -> list[tuple[str, int, int, dict[str, Any]]]:
        # A recursive list rather than st.lists: Hypothesis deletes a whole fault by
        # passing a chain span to its tail, but it can't delete an st.lists element
        # of more than ~5 draws, so schedules shrank to [kill, kill, latency]. The
        # "more" draw happens even when full, so the last fault has a tail too.
        if not draw(more) or room == 0:
            return []
        return [draw(draft())] + draw(drafts(room - 1))

    @st.composite
    def build(draw: Any) -> Schedule:
        chosen_seed = draw(seeds)
        free: dict[tuple[str, ...], float] = {}  # lane -> first free tenth (inf: killed for good)
        faults = []
        for kind, gap, length, p in draw(drafts(max_faults)):
            keys = lanes(kind, p)
            at = max((free.get(k, 0) for k in keys), default=0) + gap
            if at + lo > end:
                continue  # does not fit (or the unit is down for good)
            length = min(length, end - at)
            faults.append(KINDS[kind](at=at / 10, duration=length / 10, **p))
            for k in keys:
                free[k] = math.inf if stays_down(kind, p) else at + length
        return Schedule(seed=chosen_seed, faults=tuple(faults), learners=learners)  # type: ignore[arg-type]

    return build()
