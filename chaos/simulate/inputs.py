"""The scale simulation's inputs, each with the assumption that sets its default.

The defaults are the paper preset (Decoupled DiLoCo, arXiv 2604.21428: 1.2M chips, one
interruption per chip-year, M=8 learners). Each assumption below names where its value
comes from: the paper (as quoted by the public copies listed in docs/simulate-goodput.md,
"What the paper says"; its simulation appendix itself could not be read), a calibration
to the paper's figures, or our choice and why. Two constants are calibrated, and say so:
the reconfiguration stall (from the paper's two elastic data-parallel figures) and the time
a failed slice stays out (from its two non-elastic ones).

The paper preset's decoupled learners follow the paper's own rule (`learner_failure`
"shrink"): a chip failure takes a slice out of its learner, which goes on with fewer slices
and keeps its state. The `islands-warm` and `islands-cold` presets keep the paper's cluster
and workload but give the decoupled learners Islands' rule ("kill": a failure kills the
learner, which loses its unpushed steps) and Islands' own measured detection and rejoin
times (BENCHMARKS.md, "Recovery").
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from .dists import Dist, Fixed, LogNormal, Sum

YEAR = 365.25 * 86400.0
DAY = 86400.0
TARGET_FAILURES = 20_000  # the automatic duration simulates this many cluster failures
LEARNER_FAILURES = ("shrink", "kill")


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
    learner_failure: str = "shrink"  # "shrink": the paper's learner; "kill": Islands' learner
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
        if self.learner_failure not in LEARNER_FAILURES:
            out.append(f"--learner-failure: expected one of {', '.join(LEARNER_FAILURES)}, got "
                       f"{self.learner_failure!r}")
        if self.slice_chips > self.chips:
            out.append(f"--slice-chips: must be <= --chips ({self.chips}), got {self.slice_chips}")
        return out


PAPER = ScaleInputs()

# BENCHMARKS.md, "Recovery": kill -> marked dead median 0.069 s; restart -> first merged push
# median 0.32 s, p90 1.00 s with warm spares, 4.01 s / 4.44 s cold.
ISLANDS_WARM = PAPER.replace(learner_failure="kill", detection=Fixed(0.069), recovery_decoupled=LogNormal(0.32, 1.00))
ISLANDS_COLD = PAPER.replace(learner_failure="kill", detection=Fixed(0.054), recovery_decoupled=LogNormal(4.01, 4.44))
PRESETS = {"paper": PAPER, "islands-warm": ISLANDS_WARM, "islands-cold": ISLANDS_COLD}

# The assumption behind each input, as --help and docs/simulate-goodput.md print it. "Paper [X]"
# marks what the paper states, X naming the source that quotes it (docs/simulate-goodput.md,
# "What the paper says", sources [A]-[G]); "calibrated" a value fitted to its figures; "our
# choice" a value it does not give, with the reason.
ASSUMPTIONS = {
    "chips": "chips in the cluster. Paper [C, D]: 1.2M for 88/58/27; its failure simulation spans 150k ('1x') "
             "to 1.2M ('8x'), and its Table 1 goes to 2.4M.",
    "learners": "decoupled learners M. Paper [C, D]: M=8 (its learner ablation also gives M=2, 4 and 16).",
    "chips_per_learner": "chips per learner (default chips/M). Paper [C]: 150k at 1.2M and M=8, its '1x' size.",
    "mtbi_years": "mean time between interruptions of one chip, in years (inf: none). Paper [C, G]: 1 year, which it "
                  "calls aggressive, so the cluster fails every 26 s at 1.2M chips (MTBF_cluster = "
                  "MTBI_chip / N_chip). Failures are Poisson (as a summary of the paper reports [D]; "
                  "our choice in any case), superposed per learner.",
    "step_time": "seconds per inner step. Paper silent for its simulation; our choice of 1 s, the step "
                 "time its bandwidth figures assume [G].",
    "sync_every": "H, inner steps between two pushes of a fragment. Paper [C]: H=24. In the scale mode only "
                  "--learner-failure kill uses it (the steps a killed learner loses).",
    "fragments": "P, fragments (streaming); must divide H. Paper [C]: P=24.",
    "quorum": "K, pushes that make a merge (0: every live learner). Paper [C]: K=1 by default. As Islands' "
              "syncer does, the quorum is min(K, live learners), so merging stops only with none live.",
    "grace": "seconds a merge below quorum waits (our choice: Islands' syncer default 0.5; the paper's "
             "window is adaptive). Learners never wait for merges, so it costs time to merge, not tokens.",
    "max_staleness": "versions after which a push is thrown away (our choice: Islands' default 4). Crash "
                     "failures make no stale pushes (a restarted learner fetches the current state); "
                     "schedules with partitions and pauses do.",
    "learner_failure": "what a chip failure does to its decoupled learner. shrink (paper preset): the paper's "
                       "learner is an elastic island; the paper [E]: 'for both data-parallel and Decoupled DiLoCo, "
                       "the loss of chips and their corresponding slices reduces the effective batch size' and "
                       "'recovering learners rejoin the system with stale parameters and optimizer states'. The "
                       "learner stalls for one --reconfigure (downscale), goes on without the slice, stalls for "
                       "another when it returns after --slice-return (upscale), and loses only the step in "
                       "progress; --detection and --recovery-decoupled are unused. kill (islands presets): "
                       "Islands' learner dies, loses its steps since it last pushed each fragment (H/2 on "
                       "average) and is out for --detection + --recovery-decoupled.",
    "detection": "kill only: failure -> syncer marks the learner dead, added to its outage. Paper preset 0; "
                 "islands presets 0.069 s warm / 0.054 s cold (BENCHMARKS 'Recovery').",
    "recovery_decoupled": "kill only: a learner's outage per failure (restart, state fetch, rejoin). Default "
                          "two --reconfigure stalls (20 s), the paper learner's stalls per failure; "
                          "islands-warm lognormal:0.32,1.0, islands-cold lognormal:4.01,4.44 (restart -> first "
                          "merged push, BENCHMARKS 'Recovery').",
    "reconfigure": "the stall of one reconfiguration of an elastic job (elastic-dp: all chips; a shrink "
                   "learner: that learner), at a failure (downscale) and when the slice returns (upscale). "
                   "Paper [B]: downscale and upscale times are parameters of its simulation, values not found. "
                   "Calibrated: the paper's elastic 58% at 1.2M and 40% at 2.4M both fit goodput = 1/(1 + "
                   "rate x 20 s), two 10 s stalls per failure; this matches 'tens of seconds of lost training "
                   "time per interruption' of the slice-granularity elasticity (Gemini 2.5 report [F]) that the "
                   "paper's Figure 1 names (our reading of its caption). Only the mean matters (renewal): the exponentiated-Weibull "
                   "recovery a summary reports the paper using [D] (expweibull:) moves nothing at the same mean.",
    "slice_return": "how long a failed slice stays out before it can rejoin. Paper [B]: 'time for failed chips "
                    "to return' is a parameter of its simulation, value not found. Calibrated: 60 s, so that "
                    "non-elastic DP (which must wait for it, then restart) gives the paper's 27% at 1.2M; its "
                    "18% at 2.4M is then a check (the model gives 15%).",
    "recovery_dp": "non-elastic data-parallel: the job's restart after any failure (default slice_return + "
                   "reconfigure = 70 s): everyone waits. Calibrated, see --slice-return: the '10 or more "
                   "minute delay' Gemini 2.5 reports [F] without elasticity would give 4%, not the paper's 27%.",
    "checkpoint_every": "non-elastic data-parallel: seconds of progress between checkpoints, rolled back at a "
                        "failure. Paper silent; our choice of 1 s (in memory, every step) is the one most "
                        "favourable to DP: with the cluster failing every 26 s, a minutes-long interval would "
                        "leave it almost no goodput.",
    "slice_chips": "chips a failure takes out (of elastic-dp, or of a shrink learner). Paper [C, E]: slices, size not "
                   "found; our choice of 256, a TPU v6e pod (the paper trained on v6e and v5p). Barely "
                   "matters: 256 chips out for 60 s per failure is 0.05% of capacity.",
    "duration": "simulated seconds (our choice; default: long enough for 20,000 cluster failures, at least a "
                "day, which keeps the noise well under a point).",
    "seed": "seed of the failure times and recovery draws: the same seed gives the same result.",
}
COMMON = ("Failures that arrive during a recovery join it (the restart replaces every chip failed "
          "before it completes): the paper's elastic figures fit this renewal form and not an "
          "extending one. Checkpoints, merges and pushes cost no time.")
