"""The scale simulation: one failure stream, three systems, goodput and what each lost."""
from __future__ import annotations

from .dataparallel import simulate_dp, simulate_elastic
from .decoupled import simulate_decoupled
from .failures import failure_stream
from .inputs import ScaleInputs
from .result import SystemResult


def simulate(inp: ScaleInputs) -> dict[str, SystemResult]:
    """Each system under the same failures (the same chips break at the same times)."""
    problems = inp.problems()
    if problems:
        raise ValueError("; ".join(problems))
    duration = inp.sim_duration
    failures = failure_stream(inp.cluster_rate, inp.learners, duration, inp.seed)
    return {"decoupled": simulate_decoupled(failures, inp, duration),
            "elastic-dp": simulate_elastic(failures, inp, duration),
            "dp": simulate_dp(failures, inp, duration)}
