"""bench/parity_stats.py: the paired gap over seeds and its Student-t interval."""
from __future__ import annotations

import math
import statistics

import pytest

from .bench_scripts import load_bench

stats = load_bench("parity_stats.py", "bench_parity_stats")


def test_t_quantiles_match_the_table_and_fall_back_to_a_wider_interval():
    assert stats.t_quantile(4) == 2.776 and stats.t_quantile(1) == 12.706
    assert stats.t_quantile(22) == stats.t_quantile(20)  # 22 is not listed: the next smaller df
    assert stats.t_quantile(1000) == 1.960
    with pytest.raises(ValueError, match="degrees of freedom"):
        stats.t_quantile(0)


def test_paired_gap_uses_only_shared_seeds_and_the_t_interval():
    sync = {0: 2.0, 1: 2.5, 2: 1.5, 7: 9.9}
    arm = {0: 2.02, 1: 2.5, 2: 1.53, 3: 1.0}
    g = stats.paired_gap(sync, arm)
    assert g.seeds == [0, 1, 2] and g.gaps == pytest.approx([0.01, 0.0, 0.02])
    half = 4.303 * statistics.stdev(g.gaps) / math.sqrt(3)
    assert g.mean == pytest.approx(0.01) and (g.low, g.high) == pytest.approx((0.01 - half, 0.01 + half))
    assert stats.format_gap(g) == f"+1.00% [{(0.01 - half) * 100:+.2f}, {(0.01 + half) * 100:+.2f}]"


def test_one_seed_has_no_interval_and_no_shared_seed_is_an_error():
    one = stats.paired_gap({0: 2.0}, {0: 2.1})
    assert one.low is None and one.sd is None and stats.format_gap(one) == "+5.00% (one seed)"
    with pytest.raises(ValueError, match="share no seed"):
        stats.paired_gap({0: 2.0}, {1: 2.0})
