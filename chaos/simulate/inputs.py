"""The scale simulation's inputs, each with the assumption that sets its default.

The defaults are the paper preset (Decoupled DiLoCo, arXiv 2604.21428: 1.2M chips, one
interruption per chip-year, M=8 learners). Where the paper states a figure it is quoted;
where it is silent the text says what was chosen and why. Two constants are calibrated,
and say so: the reconfiguration stall (from the paper's two elastic data-parallel
figures) and the time a failed slice stays out (from its two non-elastic ones); each is
checked against the paper's second figure, and decoupled DiLoCo's 88% then follows with
no further constant (docs/simulate-goodput.md).

The `islands-warm` and `islands-cold` presets keep the paper's cluster and workload and
give the decoupled learners Islands' own measured detection and rejoin times
(BENCHMARKS.md, "Recovery").
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from .dists import Dist, Fixed, LogNormal, Sum

YEAR = 365.25 * 86400.0
DAY = 86400.0
TARGET_FAILURES = 20_000  # the automatic duration simulates this many cluster failures


@dataclass(frozen=True)
class ScaleInputs:
    chips: int = 1_200_000
    learners: int = 8
    chips_per_learner: int | None = None  # None: chips / learners
    mtbi_years: float = 1.0
    step_time: float = 1.0
    sync_every: int = 24
    fragments: int = 24
    quorum: int = 1
    grace: float = 0.5
    max_staleness: int = 4
    detection: Dist = Fixed(0.0)
    recovery_decoupled: Dist | None = None  # None: two reconfigurations (down, then up)
    reconfigure: Dist = Fixed(10.0)
    slice_return: Dist = Fixed(60.0)
    recovery_dp: Dist | None = None  # None: slice_return + reconfigure
    checkpoint_every: float = 1.0
    slice_chips: int = 256
    duration: float | None = None  # None: TARGET_FAILURES failures, at least a day
    seed: int = 0

    @property
    def per_learner(self) -> float:
        """Chips per learner (learners of chips/M each, up to a chip of rounding)."""
        return self.chips_per_learner or self.chips / self.learners

    @property
    def chip_rate(self) -> float:
        """Failures per chip per second."""
        return 0.0 if math.isinf(self.mtbi_years) else 1.0 / (self.mtbi_years * YEAR)

    @property
    def cluster_rate(self) -> float:
        return self.chips * self.chip_rate

    @property
    def sim_duration(self) -> float:
        if self.duration is not None:
            return self.duration
        rate = self.cluster_rate
        return DAY if rate == 0 else max(DAY, TARGET_FAILURES / rate)

    @property
    def decoupled_recovery(self) -> Dist:
        return self.recovery_decoupled or Sum((self.reconfigure, self.reconfigure))

    @property
    def learner_outage(self) -> Dist:
        """A decoupled learner's outage per failure: detection, then its recovery."""
        recovery = self.decoupled_recovery
        return recovery if self.detection.mean() == 0 else Sum((self.detection, recovery))

    @property
    def dp_restart(self) -> Dist:
        return self.recovery_dp or Sum((self.slice_return, self.reconfigure))

    def replace(self, **changes: object) -> ScaleInputs:
        return dataclasses.replace(self, **changes)

    def problems(self) -> list[str]:
        """What is wrong with these inputs, each naming its flag."""
        out = []
        if self.chips < 1:
            out.append(f"--chips: must be >= 1, got {self.chips}")
        if not 1 <= self.learners <= self.chips:
            out.append(f"--learners: must be in 1..--chips ({self.chips}), got {self.learners}")
        if self.chips_per_learner is not None and self.chips_per_learner * self.learners != self.chips:
            out.append(f"--chips-per-learner: {self.chips_per_learner} x --learners {self.learners} must equal "
                       f"--chips {self.chips}")
        if not self.mtbi_years > 0:
            out.append(f"--mtbi-years: must be > 0 (inf for no failures), got {self.mtbi_years}")
        if self.fragments < 1 or self.sync_every < 1 or self.sync_every % self.fragments:
            out.append(f"--fragments: {self.fragments} must be >= 1 and divide --sync-every {self.sync_every}")
        if self.quorum > self.learners:
            out.append(f"--quorum: must be <= --learners ({self.learners}), got {self.quorum}")
        if self.slice_chips > self.chips:
            out.append(f"--slice-chips: must be <= --chips ({self.chips}), got {self.slice_chips}")
        return out


PAPER = ScaleInputs()

# BENCHMARKS.md, "Recovery": kill -> marked dead median 0.069 s; restart -> first merged push
# median 0.32 s, p90 1.00 s with warm spares, 4.01 s / 4.44 s cold.
ISLANDS_WARM = PAPER.replace(detection=Fixed(0.069), recovery_decoupled=LogNormal(0.32, 1.00))
ISLANDS_COLD = PAPER.replace(detection=Fixed(0.054), recovery_decoupled=LogNormal(4.01, 4.44))
PRESETS = {"paper": PAPER, "islands-warm": ISLANDS_WARM, "islands-cold": ISLANDS_COLD}

# The assumption behind each input, as --help and docs/simulate-goodput.md print it.
ASSUMPTIONS = {
    "chips": "chips in the cluster. Paper: 1.2M (its failure simulation spans 150k to 2.4M).",
    "learners": "decoupled learners M. Paper: M=8 (it also reports M=2 and M=16).",
    "chips_per_learner": "chips per learner (default chips/M). Paper: 150k, its '1x' unit.",
    "mtbi_years": "mean time between interruptions of one chip, in years (inf: none). Paper: 1 year, "
                  "so 1.2M chips fail every 26 s. Failures are Poisson, superposed per learner.",
    "step_time": "seconds per inner step. Paper silent for its simulation; its bandwidth figures use 1 s.",
    "sync_every": "H, inner steps between two pushes of a fragment. Paper: H=24.",
    "fragments": "P, fragments (streaming); must divide H. Paper: P=24.",
    "quorum": "K, pushes that make a merge (0: every live learner). Paper: K=1. As Islands' syncer "
              "does, the quorum is min(K, live learners), so merging stops only with none live.",
    "grace": "seconds a merge below quorum waits (Islands' syncer default 0.5). Learners never wait "
             "for merges, so it costs time to merge, not tokens.",
    "max_staleness": "versions after which a push is thrown away (Islands' default 4). Crash failures "
                     "make no stale pushes (a restarted learner fetches the current state); "
                     "schedules with partitions and pauses do.",
    "detection": "decoupled: failure -> syncer marks the learner dead, added to its outage. Paper "
                 "preset 0; islands presets 0.069 s warm / 0.054 s cold (BENCHMARKS 'Recovery').",
    "recovery_decoupled": "decoupled: a learner's outage per failure (restart, state fetch, rejoin). "
                          "Paper preset: a learner is an elastic island that drops the failed slice "
                          "and re-adds it later, two --reconfigure stalls of that learner only "
                          "(20 s). islands-warm lognormal:0.32,1.0, islands-cold lognormal:4.01,4.44 "
                          "(restart -> first merged push, BENCHMARKS 'Recovery').",
    "reconfigure": "elastic data-parallel: the global stall of one reconfiguration (downscale at a "
                   "failure, upscale when the slice returns). Calibrated: the paper's elastic 58% at "
                   "1.2M and 40% at 2.4M both fit goodput = 1/(1 + rate x 20 s), two 10 s stalls.",
    "slice_return": "how long a failed slice stays out before it can rejoin. Calibrated: 60 s, so that "
                    "non-elastic DP (which must wait for it, then restart) gives the paper's 27% at "
                    "1.2M; its 18% at 2.4M is then a check (the model gives 15%).",
    "recovery_dp": "non-elastic data-parallel: the job's restart after any failure (default "
                   "slice_return + reconfigure = 70 s): everyone waits.",
    "checkpoint_every": "non-elastic data-parallel: seconds of progress between checkpoints, rolled "
                        "back at a failure. Paper silent; 1 s (in memory, every step) is the choice "
                        "most favourable to DP: with the cluster failing every 26 s, a minutes-long "
                        "interval would leave it almost no goodput.",
    "slice_chips": "chips a failure takes out of elastic data-parallel (its replica). Paper silent; "
                   "256, a TPU v6e pod (the paper trained on v6e and v5p). Barely matters: 256 "
                   "chips out for 60 s per failure is 0.05% of capacity.",
    "duration": "simulated seconds (default: long enough for 20,000 cluster failures, at least a day).",
    "seed": "seed of the failure times and recovery draws: the same seed gives the same result.",
}
COMMON = ("Failures that arrive during a recovery join it (the restart replaces every chip failed "
          "before it completes): the paper's elastic figures fit this renewal form and not an "
          "extending one. Checkpoints, merges and pushes cost no time.")
