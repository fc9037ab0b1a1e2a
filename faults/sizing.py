"""The cluster a schedule runs on: how many learner units, how many ranks each.

``chaos validate`` and ``chaos run`` must agree on what a schedule may name, so both take
their defaults and their checks from here: a schedule that validates is one that runs.
"""

from __future__ import annotations

from typing import Iterable

from faults.kinds import BaseFault, parse_target

DEFAULT_LEARNERS = 3  # what `chaos run` starts when neither --learners nor the schedule's `learners:` says
DEFAULT_RANKS = 1  # ranks per learner unit when --ranks is not given


class SizeConflict(ValueError):
    """--learners and the schedule's ``learners:`` name different cluster sizes."""


def resolve_learners(declared: int | None, given: int | None, source: str = "the schedule") -> int:
    """The run's learner count: --learners, else the schedule's ``learners:``, else the default.

    Both given and different is an error naming both, because a schedule that says 2 and a
    run of 3 would check its targets against one cluster and run on another.
    """
    if given is not None and declared is not None and given != declared:
        raise SizeConflict(f"--learners {given} disagrees with {source}'s learners: {declared}; "
                           f"drop --learners or make them agree")
    if given is not None:
        return given
    return declared if declared is not None else DEFAULT_LEARNERS


def rank_problems(indexed: Iterable[tuple[int, BaseFault]], ranks: int) -> list[str]:
    """One message per ``learner-N/rank-R`` target that a unit of ``ranks`` ranks lacks.

    A unit of one rank is a single process, with no rank targets at all (as the backends
    list them), so ``learner-N/rank-0`` is refused there too.
    """
    out = []
    for i, fault in indexed:
        target = getattr(fault, "target", None)
        if not isinstance(target, str):
            continue
        try:
            parsed = parse_target(target)
        except ValueError:
            continue  # reported by the field check
        if parsed.rank is None:
            continue
        if ranks == 1:
            out.append(f"faults[{i}].target: no such target {target!r}: {parsed.unit} runs a single process "
                       f"(--ranks 1); name {parsed.unit!r}, or give units more ranks with --ranks")
        elif parsed.rank >= ranks:
            out.append(f"faults[{i}].target: no such target {target!r}: {parsed.unit} runs {ranks} ranks "
                       f"(rank-0..rank-{ranks - 1}; --ranks {ranks})")
    return out
