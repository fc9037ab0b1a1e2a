"""chaos/timeline.py: a host clock estimated from Cristian probes, with a bound that holds,
on synthetic probes of clocks whose offset and drift are known."""
from __future__ import annotations

import random

import pytest

from chaos import timeline
from chaos.timeline import ClockSample, estimate


def probes(host: str, offset: float, drift: float, n: int = 60, every: float = 1.0, seed: int = 0,
           rtt: tuple[float, float] = (0.0004, 0.02)) -> list[ClockSample]:
    """Probes of a host whose clock reads c + offset + drift·c, each read at a random instant
    of a round trip whose length is drawn from `rtt` (some queued far longer)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        sent = 100.0 + i * every
        trip = rng.uniform(*rtt) if rng.random() > 0.2 else rng.uniform(0.05, 0.3)
        read_at = sent + rng.random() * trip
        out.append(ClockSample(host, sent, sent + trip, read_at + offset + drift * read_at))
    return out


@pytest.mark.parametrize("offset,drift", [(5.0, 0.0), (-5.0, 200e-6), (7.25, -300e-6), (0.0, 0.0)])
def test_the_estimate_places_host_times_within_its_bound(offset, drift):
    clock = estimate("node-1", probes("node-1", offset, drift))
    assert clock.error < 0.02  # the short round trips decide, not the queued ones
    for c in (100.0, 130.5, 159.0, 175.0, 60.0):  # inside the probed span and beyond it
        host_time = c + offset + drift * c
        assert abs(clock.to_controller(host_time) - c) <= clock.bound_at(c)
    assert abs(clock.drift - drift) <= clock.slope_error


def test_the_bound_grows_beyond_the_probed_span():
    clock = estimate("n", probes("n", 3.0, 100e-6))
    assert clock.bound_at(clock.first) == clock.error == clock.bound_at(clock.last)
    assert clock.bound_at(clock.last + 600) > clock.error


def test_one_probe_gives_its_half_round_trip_and_the_largest_drift_beyond_it():
    s = ClockSample("n", 10.0, 10.2, 15.1)
    clock = estimate("n", [s])
    assert clock.offset == pytest.approx(5.0) and clock.drift == 0.0
    assert clock.error == pytest.approx(0.1)
    assert clock.bound_at(110.1) == pytest.approx(0.1 + 100 * 2 * timeline.MAX_DRIFT)


def test_a_host_never_probed_is_named():
    with pytest.raises(ValueError, match="'node-3'"):
        estimate("node-3", [])


def test_to_host_and_to_controller_are_inverses():
    clock = estimate("n", probes("n", -4.0, 250e-6))
    for c in (0.0, 100.0, 1e4):
        assert clock.to_controller(clock.to_host(c)) == pytest.approx(c, abs=1e-9)


def test_a_run_directory_keeps_probes_and_estimates(tmp_path):
    for s in probes("a", 1.0, 0.0, n=5) + probes("b", -2.0, 0.0, n=5):
        timeline.append_sample(tmp_path, s)
    with open(tmp_path / timeline.SAMPLES_FILE, "a") as fh:
        fh.write('{"host": "a", "sent": 1')  # cut short by a kill
    clocks = timeline.read_estimates(tmp_path)
    assert sorted(clocks) == ["a", "b"] and clocks["a"].samples == 5
    timeline.write_estimates(tmp_path, clocks)
    assert timeline.read_estimates(tmp_path) == clocks
