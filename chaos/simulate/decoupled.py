"""Decoupled DiLoCo at scale: a failure costs only its learner. Two rules for what it costs
that learner (--learner-failure):

`shrink`, the paper's learner (the paper preset): a learner is itself an elastic
data-parallel job over its slices. A chip failure removes its slice and stalls that learner
alone for a downscale; the learner keeps its state and goes on with fewer slices; the slice
comes back after --slice-return and costs it an upscale stall. Only the step in progress is
lost. Each learner is then `dataparallel.elastic_run` over its own chips and failures, which
is the paper's rule that M learners do about as well as one elastic job on M times fewer
chips.

`kill`, Islands' learner (the islands presets), per learner, independently (nothing a
learner does waits for another):
  * a failure kills the learner; the steps it made since it last pushed each fragment are
    lost (Islands' learner keeps them in memory only). Fragment f is pushed at steps
    (f+1)·H/P + k·H after a (re)start (trainer/fragments.py), so the loss is the mean over
    fragments of the steps since that fragment's last push: H/2 on average, any P;
  * the learner is then out for its outage (detection + restart, state fetch, rejoin);
    failures of its chips meanwhile join that recovery;
  * it comes back with the current global state, so it never pushes stale work.
The syncer merges with min(K, live) reporters (trainer/syncer/core.py, effective_quorum): global
progress stops only while no learner is live, reported as `global_downtime_s`. A dead
learner the syncer has not yet noticed holds a merge that needs it for at most
min(grace, detection): `quorum_wait_s`, time to merge, never tokens, since learners never
wait for merges.
"""
from __future__ import annotations

from .dataparallel import elastic_run
from .failures import Failures, draws
from .inputs import ScaleInputs
from .result import SystemResult


def unpushed_steps(steps: float, sync_every: int, fragments: int) -> float:
    """Mean over fragments of the steps since each was last pushed, `steps` after a start."""
    stride = sync_every // fragments
    total = 0.0
    for f in range(fragments):
        first = (f + 1) * stride
        total += steps if steps < first else (steps - first) % sync_every
    return total / fragments


def _downtime(intervals: list[tuple[float, float]], learners: int) -> float:
    """Seconds during which every learner was out at once."""
    edges = sorted([(a, 1) for a, _ in intervals] + [(b, -1) for _, b in intervals])
    out, since, total = 0, 0.0, 0.0
    for t, step in edges:
        if out == learners:
            total += t - since
        out += step
        since = t
    return total


def simulate_decoupled(failures: Failures, inp: ScaleInputs, duration: float) -> SystemResult:
    if inp.learner_failure == "shrink":
        return _shrinking_learners(failures, inp, duration)
    result = SystemResult(seconds=duration, capacity=inp.learners * duration)
    outages = draws(inp.learner_outage, len(failures.times), inp.seed, "decoupled")
    resumed = [0.0] * inp.learners
    down_until = [0.0] * inp.learners
    intervals: list[tuple[float, float]] = []
    absorbed = quorum_wait = 0.0
    needs_dead = inp.quorum == 0 or inp.quorum >= inp.learners
    wait = min(inp.grace, inp.detection.mean())
    for k, (t, j) in enumerate(zip(failures.times, failures.learners)):
        if t < down_until[j]:
            absorbed += 1
            continue
        steps = (t - resumed[j]) / inp.step_time
        result.lost["lost_with_learner"] += unpushed_steps(steps, inp.sync_every, inp.fragments) * inp.step_time
        end = t + outages[k]
        result.lost["recovery"] += min(end, duration) - t
        intervals.append((t, min(end, duration)))
        down_until[j] = resumed[j] = end
        quorum_wait += wait if needs_dead else 0.0
    result.info = {"failures": len(failures.times), "absorbed": int(absorbed),
                   "global_downtime_s": _downtime(intervals, inp.learners), "quorum_wait_s": quorum_wait}
    return result


def _shrinking_learners(failures: Failures, inp: ScaleInputs, duration: float) -> SystemResult:
    """The paper's learners: each an elastic job over its own chips (see the module's text).
    A learner's reconfiguration stalls and its slices out are `recovery`; the step in
    progress at a failure is `rollback`. Global downtime: every learner stalled at once."""
    result = SystemResult(seconds=duration, capacity=inp.learners * duration)
    own: list[list[float]] = [[] for _ in range(inp.learners)]
    for t, j in zip(failures.times, failures.learners):
        own[j].append(t)
    intervals: list[tuple[float, float]] = []
    absorbed = 0
    for j, times in enumerate(own):
        learner, stalls = elastic_run(times, inp.per_learner, inp, duration, f"decoupled-{j}")
        result.lost["recovery"] += learner.lost["stall"] + learner.lost["recovery"]
        result.lost["rollback"] += learner.lost["rollback"]
        absorbed += learner.info["absorbed"]
        intervals += stalls
    result.info = {"failures": len(failures.times), "absorbed": int(absorbed),
                   "global_downtime_s": _downtime(intervals, inp.learners), "quorum_wait_s": 0.0}
    return result
