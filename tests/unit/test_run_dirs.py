"""Runs started at the same moment with default settings each get a run directory of their
own. The default name is the time to the second, so two `chaos run`s (or `trainer run`s)
started together used to share one: one secret, one address file, interleaved events and
one verdict over both. No cluster starts here: the second run starts while the first is
still "running" (inside the stand-in for the cluster), as two shells would."""
from __future__ import annotations

import contextlib
import threading
from datetime import datetime
from pathlib import Path

import pytest

import chaos.__main__
import chaos.runner
import trainer.__main__
import trainer.launch

ROOT = Path(__file__).resolve().parents[2]
QUICK = ROOT / "examples" / "schedules" / "quick.yaml"


class Frozen(datetime):
    """The clock both runs read: the same second."""

    @classmethod
    def now(cls, tz=None):  # noqa: ANN206 - datetime's signature
        return cls(2030, 1, 2, 3, 4, 5)


class Stop(Exception):
    """Ends a stand-in run once it has said where it runs."""


@pytest.fixture
def same_second(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(chaos.__main__, "datetime", Frozen)
    monkeypatch.setattr(trainer.__main__, "datetime", Frozen)
    return tmp_path


def test_two_chaos_runs_in_one_second_run_in_two_directories(same_second: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    dirs: list[Path] = []

    def run_schedule(schedule, run_dir, spec=None, **kwargs):
        dirs.append(Path(run_dir))
        if len(dirs) == 1:  # the second run starts while the first runs
            assert chaos.__main__.main(["run", str(QUICK), "--reference", "off"]) == 1
        raise RuntimeError("stand-in: no cluster in unit tests")

    monkeypatch.setattr(chaos.runner, "run_schedule", run_schedule)
    assert chaos.__main__.main(["run", str(QUICK), "--reference", "off"]) == 1
    assert len(dirs) == 2 and dirs[0] != dirs[1], dirs
    assert not any(d.exists() for d in dirs), "a run that never started leaves no directory behind"


def test_two_trainer_runs_in_one_second_run_in_two_directories(same_second: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    dirs: list[Path] = []

    class Cluster:
        def __init__(self, spec) -> None:
            dirs.append(Path(spec.run_dir))
            if len(dirs) == 1:
                with contextlib.suppress(Stop):
                    trainer.__main__.main(["run", "--quiet"])
            raise Stop

    monkeypatch.setattr(trainer.__main__, "_preflight", lambda *a, **k: {})
    monkeypatch.setattr(trainer.launch, "LocalCluster", Cluster)
    with pytest.raises(Stop):
        trainer.__main__.main(["run", "--quiet"])
    assert len(dirs) == 2 and dirs[0] != dirs[1], dirs


def test_claims_are_exclusive_under_contention(tmp_path: Path) -> None:
    from trainer.rundir import claim_run_dir
    got: list[Path] = []
    go = threading.Barrier(8)

    def claim() -> None:
        go.wait(timeout=10)
        got.append(claim_run_dir(tmp_path / "runs" / "chaos-20300102-030405"))

    threads = [threading.Thread(target=claim) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    assert len(got) == 8 and len(set(got)) == 8
    assert sorted(p.name for p in got)[:2] == ["chaos-20300102-030405", "chaos-20300102-030405-2"]


def test_release_removes_only_an_empty_claim(tmp_path: Path) -> None:
    from trainer.rundir import claim_run_dir, release_if_empty
    empty, used = claim_run_dir(tmp_path / "a"), claim_run_dir(tmp_path / "b")
    (used / "events").mkdir()
    release_if_empty(empty)
    release_if_empty(used)
    assert not empty.exists() and used.exists()
