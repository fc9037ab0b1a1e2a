"""Every file that holds the shared secret is private (0600) from its first byte, whoever
makes it: `trainer run`, the local and compose backends, the syncer-scaling bench.

The secret used to be written with the umask's mode and chmodded after: for that moment
(forever, had the chmod not run) any local user could read it. These tests take chmod
away and set umask 0, so the mode a file is created with is the mode it keeps."""
from __future__ import annotations

import argparse
import os
import stat
import threading
from pathlib import Path
from typing import Callable, Iterator

import pytest

from trainer.secretfile import ensure_secret, main

from .bench_scripts import load_bench


class Stop(Exception):
    """Raised right after the secret is written, so nothing else of the cluster starts."""


@pytest.fixture
def no_umask_no_chmod(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """umask 0 and no chmod: a file keeps exactly the mode it was created with."""
    monkeypatch.setattr(os, "chmod", lambda *a, **k: None)
    monkeypatch.setattr(Path, "chmod", lambda *a, **k: None)
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _trainer_run(run_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    from trainer.launch import ClusterSpec, LocalCluster
    from trainer.runspec import RunSpec
    LocalCluster(ClusterSpec(run_dir, RunSpec())).events.close()
    return run_dir / "secret"


def _local_backend(run_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    from chaos.backends.local import LocalCluster

    def stop(self) -> None:
        raise Stop

    monkeypatch.setattr(LocalCluster, "_start_spares", stop)
    monkeypatch.setenv("ISLANDS_HOME", str(run_dir.parent / "home"))
    with pytest.raises(Stop):
        LocalCluster(run_dir).start()
    return run_dir / "secret"


def _compose_backend(run_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    from chaos.backends.compose import ComposeCluster
    run_dir.mkdir(parents=True)
    ComposeCluster(run_dir, learners=2)._compose_env()
    return run_dir / "secret"


def _scaling_bench(run_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    bench = load_bench("syncer_scaling.py", "bench_syncer_scaling_secret")

    def popen(*args, **kwargs):
        raise Stop

    monkeypatch.setattr(bench.subprocess, "Popen", popen)
    run_dir.mkdir(parents=True)
    with pytest.raises(Stop):
        bench.start_syncer(run_dir, 2, "small", argparse.Namespace(
            grace=60.0, heartbeat_interval=0.2, heartbeat_timeout=10.0, encoding="fp32"))
    return run_dir / "secret"


MAKERS: dict[str, Callable[[Path, pytest.MonkeyPatch], Path]] = {
    "trainer run": _trainer_run, "local backend": _local_backend,
    "compose backend": _compose_backend, "syncer scaling bench": _scaling_bench}


@pytest.mark.parametrize("maker", list(MAKERS))
def test_the_secret_file_is_created_private(maker: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                           no_umask_no_chmod: None) -> None:
    path = MAKERS[maker](tmp_path / "run", monkeypatch)
    assert _mode(path) == 0o600, f"{maker}: {path} was created {oct(_mode(path))}"
    assert len(path.read_text().strip()) == 64


def test_ensure_secret_creates_private_and_keeps_an_existing_one(tmp_path: Path, no_umask_no_chmod: None) -> None:
    path = ensure_secret(tmp_path / "a" / "secret")
    assert _mode(path) == 0o600
    first = path.read_text()
    assert ensure_secret(path).read_text() == first, "a run dir keeps its secret"
    assert [p.name for p in path.parent.iterdir()] == ["secret"], "no temporary file is left behind"


def test_an_existing_world_readable_secret_is_tightened(tmp_path: Path) -> None:
    path = tmp_path / "secret"
    path.write_text("x" * 64)
    path.chmod(0o644)
    ensure_secret(path)
    assert _mode(path) == 0o600 and path.read_text() == "x" * 64


def test_callers_at_once_share_one_complete_secret(tmp_path: Path) -> None:
    """Nobody reads a half-written file or ends with another secret than the others."""
    path, seen = tmp_path / "secret", []
    go = threading.Barrier(8)

    def make() -> None:
        go.wait(timeout=10)
        seen.append(ensure_secret(path).read_text())

    threads = [threading.Thread(target=make) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    assert len(seen) == 8 and len(set(seen)) == 1 and len(seen[0]) == 64


def test_the_cli_makes_a_secret_for_a_hand_run_cluster(tmp_path: Path, no_umask_no_chmod: None) -> None:
    assert main([str(tmp_path / "runs" / "secret")]) == 0
    assert _mode(tmp_path / "runs" / "secret") == 0o600
    assert main([]) == 2
