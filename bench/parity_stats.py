"""Paired comparison over seeds: the mean relative gap of an arm to sync DP, with a 95%
interval, for bench/parity.py.

Why paired: sync DP itself moves by ~1.4% (sd) from seed to seed on real text, more
than the 1% question. With the same seed an arm and sync DP share the model's
initialisation and the data each learner reads, so the per-seed gap cancels most of
that spread; its mean and Student-t interval over n seeds are what the verdict reads.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass

# Two-sided 95% quantiles of Student's t, by degrees of freedom (no scipy needed).
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262,
        10: 2.228, 11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120, 17: 2.110,
        18: 2.101, 19: 2.093, 20: 2.086, 25: 2.060, 30: 2.042, 40: 2.021, 60: 2.000, 120: 1.980}


def t_quantile(df: int) -> float:
    """t_{0.975, df}: the table's value, or the next smaller df listed (a wider interval)."""
    if df < 1:
        raise ValueError(f"degrees of freedom: must be >= 1, got {df}")
    return T975[max(k for k in T975 if k <= df)] if df <= 120 else 1.960


@dataclass(frozen=True)
class PairedGap:
    """gap_s = loss_arm(s) / loss_sync(s) − 1 for every seed s both arms ran."""

    seeds: list[int]
    gaps: list[float]
    mean: float
    sd: float | None
    low: float | None    # the 95% interval of the mean gap (None with one seed)
    high: float | None

    def to_dict(self) -> dict:
        return asdict(self)


def paired_gap(sync: dict[int, float], arm: dict[int, float]) -> PairedGap:
    """The paired gap over the seeds present in both {seed: final loss} maps."""
    seeds = sorted(set(sync) & set(arm))
    if not seeds:
        raise ValueError("paired_gap: the arm and sync DP share no seed")
    gaps = [arm[s] / sync[s] - 1.0 for s in seeds]
    mean = statistics.fmean(gaps)
    if len(gaps) < 2:
        return PairedGap(seeds, gaps, mean, None, None, None)
    sd = statistics.stdev(gaps)
    half = t_quantile(len(gaps) - 1) * sd / math.sqrt(len(gaps))
    return PairedGap(seeds, gaps, mean, sd, mean - half, mean + half)


def format_gap(g: PairedGap) -> str:
    """`+0.42% [−0.10, +0.94]` (mean and 95% interval, in percent)."""
    if g.low is None or g.high is None:
        return f"{g.mean * 100:+.2f}% (one seed)"
    return f"{g.mean * 100:+.2f}% [{g.low * 100:+.2f}, {g.high * 100:+.2f}]"
