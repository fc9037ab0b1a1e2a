"""The wall clock a chaos run sets wrong (trainer/clock.py), and the boot clock's downtime."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from trainer import clock
from trainer.clock import WallClock, boot_stamp, downtime_since


def write(path: Path, **spec: float) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(spec))
    os.replace(tmp, path)


@pytest.fixture(autouse=True)
def _check_every_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(clock, "CHECK_EVERY", 0.0)  # a stat on every read: no waiting in tests


def settle() -> None:
    """Nothing to wait for: every read checks the file (CHECK_EVERY is 0 here)."""


def test_without_a_file_the_wall_clock_is_true(tmp_path: Path) -> None:
    for c in (WallClock(None), WallClock(tmp_path / "missing.json")):
        assert abs(c() - time.time()) < 0.01


def test_a_skew_a_step_back_and_a_drift_are_read_from_the_file(tmp_path: Path) -> None:
    path = tmp_path / "syncer.json"
    c = WallClock(path)
    write(path, offset=3600.0)
    settle()
    assert abs(c() - (time.time() + 3600)) < 0.05
    write(path, offset=-3600.0)
    settle()
    assert abs(c() - (time.time() - 3600)) < 0.05, "a second change is seen too"
    anchor = time.time() - 10.0
    write(path, offset=5.0, rate=2.0, anchor=anchor)
    settle()
    now = time.time()
    assert abs(c() - (now + 5.0 + (now - anchor))) < 0.05, "the drift runs from its anchor"
    path.unlink()
    settle()
    assert abs(c() - time.time()) < 0.05, "a removed file is the true clock again"


def test_a_half_written_file_keeps_the_last_setting(tmp_path: Path) -> None:
    path = tmp_path / "syncer.json"
    c = WallClock(path)
    write(path, offset=60.0)
    settle()
    c()
    path.write_text('{"offset": 1')
    settle()
    assert abs(c() - (time.time() + 60)) < 0.05


def test_the_role_picks_its_file_in_the_cluster_s_clock_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(clock.CLOCK_DIR_ENV, str(tmp_path))
    monkeypatch.delenv(clock.CLOCK_FILE_ENV, raising=False)
    monkeypatch.setattr(clock, "_WALL", WallClock(None))
    write(tmp_path / "learner-2.json", offset=-120.0)
    clock.use_clock_of("learner-2")
    assert abs(clock.wall() - (time.time() - 120)) < 0.05


def test_downtime_is_measured_on_the_boot_clock_and_zero_across_boots() -> None:
    stamp = boot_stamp()
    stamp["boottime"] -= 30.0
    assert 29.9 < downtime_since(stamp) < 31.0
    assert downtime_since({**stamp, "boot_id": "another-boot"}) == 0.0
    assert downtime_since(None) == 0.0 and downtime_since({"boot_id": "x"}) == 0.0
