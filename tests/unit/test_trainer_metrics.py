"""trainer.metrics' fault-free learner rates: own compute, --speed, and --step-time."""
from __future__ import annotations

import pytest

from trainer.metrics import learner_rates


def _events(learner: int, computes: list[float], tokens: int = 512, **start) -> list[dict]:
    return [{"kind": "process_start", "role": "learner", "learner": learner, **start}] + [
        {"kind": "inner_step", "learner": learner, "tokens": tokens, "compute_s": c} for c in computes]


def test_the_rate_is_tokens_over_the_median_own_compute():
    assert learner_rates(_events(1, [0.004, 0.005, 0.100])) == {1: pytest.approx(512 / 0.005)}


def test_a_speed_factor_scales_the_rate():
    assert learner_rates(_events(1, [0.005], speed=0.25)) == {1: pytest.approx(512 / 0.02)}


def test_an_emulated_accelerator_sets_the_step_time_unless_compute_takes_longer():
    paced = _events(1, [0.006, 0.006], step_time=0.025)
    over = _events(2, [0.040, 0.040], step_time=0.025)  # the host cannot keep up: its own time counts
    assert learner_rates(paced + over) == {1: pytest.approx(512 / 0.025), 2: pytest.approx(512 / 0.040)}


def test_events_from_before_step_time_existed_read_as_no_pacing():
    assert learner_rates(_events(1, [0.005], step_time=None)) == {1: pytest.approx(512 / 0.005)}
