"""trainer.pacing.StepPacer on a fake clock: --step-time slots and the --speed sleep."""
from __future__ import annotations

import pytest

import trainer.pacing as pacing
from trainer.pacing import StepPacer


class FakeClock:
    """perf_counter and a stop Event whose wait advances the clock (never set)."""

    def __init__(self) -> None:
        self.now = 100.0
        self.waits: list[float] = []

    def perf_counter(self) -> float:
        return self.now

    def wait(self, seconds: float) -> bool:
        self.waits.append(round(seconds, 6))
        self.now += seconds
        return False

    def is_set(self) -> bool:
        return False


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(pacing.time, "perf_counter", fake.perf_counter)
    return fake


def test_step_time_starts_one_step_per_slot_from_the_first_steps_start(clock: FakeClock) -> None:
    pacer = StepPacer(step_time=0.025)
    clock.now += 0.006  # the first step computed for 6 ms
    pacer.after_step(0.006, clock)
    assert clock.waits == [0.019], "the first slot began when the first step did"
    clock.now += 0.010  # the next step's host work and compute
    pacer.after_step(0.008, clock)
    assert clock.waits == [0.019, 0.015]
    assert clock.now == pytest.approx(100.050)


def test_a_step_that_ran_over_starts_the_next_slot_late_without_catching_up(clock: FakeClock) -> None:
    pacer = StepPacer(step_time=0.025)
    clock.now += 0.005
    pacer.after_step(0.005, clock)  # waits 20 ms: slot 2 begins at 100.025
    clock.now += 0.060  # a slow step: 35 ms past its slot's end
    pacer.after_step(0.060, clock)
    assert clock.waits == [0.02], "no wait after a step that ran over"
    clock.now += 0.004
    pacer.after_step(0.004, clock)
    assert clock.waits == [0.02, 0.021], "the next slot counts from when the slow step ended, no burst"


def test_speed_sleeps_in_proportion_to_compute_and_full_speed_does_not_wait(clock: FakeClock) -> None:
    StepPacer(speed=0.25).after_step(0.010, clock)
    assert clock.waits == [0.03]
    StepPacer().after_step(0.010, clock)
    assert clock.waits == [0.03]


def test_spin_keeps_the_caller_busy_until_its_deadline(clock: FakeClock, monkeypatch: pytest.MonkeyPatch) -> None:
    ticks = iter([100.0, 100.01, 100.02, 100.031])
    monkeypatch.setattr(pacing.time, "perf_counter", lambda: next(ticks))
    StepPacer(speed=0.25, slowdown="spin").after_step(0.010, clock)
    assert clock.waits == [], "spinning never sleeps"
