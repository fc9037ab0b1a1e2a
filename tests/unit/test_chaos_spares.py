"""Warm spare processes (chaos/spares.py, chaos/spare_main.py) with stand-in roles: a spare
becomes exactly the command it is sent, and anything it cannot serve starts cold."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from chaos.processes import ManagedProcess, Registry, proc_start_time, start_recorded
from chaos.spares import SparePool, start_spares

PROBE = """
import json, os, sys
json.dump({"pid": os.getpid(), "argv": sys.argv, "path0": sys.path[0], "cwd": os.getcwd(),
           "marker": os.environ.get("SPARE_MARKER"), "preloaded": "colorsys" in sys.modules},
          open(os.environ["PROBE_OUT"], "w"))
print("probe ran")
sys.exit(int(os.environ.get("PROBE_EXIT", "0")))
"""


def _wait_exit(popen: subprocess.Popen, what: str, timeout: float = 30.0) -> int:
    try:
        return popen.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        popen.kill()
        pytest.fail(f"{what} did not exit within {timeout:.0f}s")


@pytest.fixture
def probe_env(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "probe_mod.py").write_text(PROBE)
    return dict(os.environ, PYTHONPATH=str(tmp_path), PROBE_OUT=str(tmp_path / "probe.json"),
                SPARE_MARKER="from-the-pool")


def _pool(tmp_path: Path, env: dict[str, str], size: int = 1, **kw) -> SparePool:
    pool = SparePool(sys.executable, env, ["colorsys"], tmp_path / "logs" / "spares.log", size, **kw)
    pool.start()
    return pool


def test_a_spare_becomes_the_module_it_is_sent(tmp_path: Path, probe_env: dict[str, str]) -> None:
    env = dict(probe_env, PROBE_EXIT="7")
    pool = _pool(tmp_path, env)
    try:
        spare_pid = pool.idle[0].pid
        popen = pool.take([sys.executable, "-m", "probe_mod", "--flag", "x"], env, tmp_path / "role.log")
        assert popen is not None and popen.pid == spare_pid, "the caller holds the spare's own process"
        assert _wait_exit(popen, "the spare turned probe_mod") == 7, "the role's exit status is the process's"
        seen = json.loads((tmp_path / "probe.json").read_text())
        assert seen["pid"] == spare_pid
        assert seen["argv"][1:] == ["--flag", "x"] and seen["argv"][0].endswith("probe_mod.py")
        assert seen["marker"] == "from-the-pool" and seen["preloaded"] is True
        assert seen["path0"] == os.getcwd(), "sys.path[0] is the working directory, as with `python -m`"
        assert "probe ran" in (tmp_path / "role.log").read_text(), "the role's output goes to its own log"
        assert len(pool.idle) == 1 and pool.idle[0].pid != spare_pid, "the pool refilled itself"
        assert pool.taken == 1
    finally:
        pool.close()


def test_a_spare_runs_a_script_path_with_its_directory_first_on_sys_path(
        tmp_path: Path, probe_env: dict[str, str]) -> None:
    script_dir = tmp_path / "scripts"
    script_dir.mkdir()
    script = script_dir / "probe_script.py"
    script.write_text(PROBE)
    pool = _pool(tmp_path, probe_env)
    try:
        popen = pool.take([sys.executable, str(script), "a", "b"], probe_env, tmp_path / "role.log")
        assert popen is not None
        assert _wait_exit(popen, "the spare turned probe_script") == 0
        seen = json.loads((tmp_path / "probe.json").read_text())
        assert seen["argv"] == [str(script), "a", "b"]
        assert seen["path0"] == str(script_dir)
    finally:
        pool.close()


def test_what_a_spare_cannot_serve_is_refused(tmp_path: Path, probe_env: dict[str, str]) -> None:
    pool = _pool(tmp_path, probe_env)
    try:
        other_env = dict(probe_env, SPARE_MARKER="another")
        assert pool.take([sys.executable, "-m", "probe_mod"], other_env, tmp_path / "x.log") is None, \
            "imports may read the environment: a different one starts cold"
        assert pool.take(["/bin/echo", "-m", "probe_mod"], probe_env, tmp_path / "x.log") is None, \
            "another interpreter starts cold"
        assert pool.take([sys.executable], probe_env, tmp_path / "x.log") is None
        assert pool.taken == 0 and len(pool.idle) == 1
    finally:
        pool.close()
    assert pool.take([sys.executable, "-m", "probe_mod"], probe_env, tmp_path / "x.log") is None, \
        "a closed pool serves nothing"


def test_a_managed_process_falls_back_to_a_cold_start(tmp_path: Path, probe_env: dict[str, str]) -> None:
    pool = _pool(tmp_path, probe_env, size=0)
    registry = Registry(f"spares-test-{os.getpid()}")
    try:
        proc = start_recorded("role", [sys.executable, "-m", "probe_mod"], tmp_path / "logs", probe_env,
                              registry, pool)
        assert _wait_exit(proc.popen, "the cold-started probe") == 0
        assert json.loads((tmp_path / "probe.json").read_text())["marker"] == "from-the-pool"
    finally:
        registry.close()


def test_a_dead_spare_is_skipped_and_replaced(tmp_path: Path, probe_env: dict[str, str]) -> None:
    pool = _pool(tmp_path, probe_env, size=2)
    try:
        first, second = pool.idle
        first.kill()
        _wait_exit(first, "the killed spare")
        popen = pool.take([sys.executable, "-m", "probe_mod"], probe_env, tmp_path / "role.log")
        assert popen is second, "the dead spare is passed over for the live one"
        assert _wait_exit(popen, "the probe") == 0
        assert len(pool.idle) == 2 and all(p.poll() is None for p in pool.idle)
    finally:
        pool.close()


def test_close_kills_the_idle_spares_and_end_of_file_ends_a_spare(tmp_path: Path,
                                                                  probe_env: dict[str, str]) -> None:
    pool = _pool(tmp_path, probe_env, size=2)
    idle = list(pool.idle)
    pool.close()
    assert all(p.poll() is not None for p in idle), "close reaps every idle spare"
    assert pool.idle == []
    lone = _pool(tmp_path, probe_env)
    spare = lone.idle[0]
    spare.stdin.close()  # the harness went away without assigning it
    assert _wait_exit(spare, "an unassigned spare whose stdin closed") == 0
    lone.close()


def test_start_spares_records_each_spare_and_a_role_replaces_its_entry(tmp_path: Path,
                                                                      probe_env: dict[str, str]) -> None:
    registry = Registry(f"spares-test-{os.getpid()}")
    try:
        assert start_spares(sys.executable, probe_env, ["colorsys"], tmp_path, 0, registry) is None
        pool = start_spares(sys.executable, probe_env, ["colorsys"], tmp_path, 1, registry)
        try:
            pid = pool.idle[0].pid
            entries = registry.entries()
            assert [(e["name"], e["pid"]) for e in entries] == [(f"spare-{pid}", pid)]
            assert entries[0]["start"] == proc_start_time(pid)
            proc = ManagedProcess("learner-1", [sys.executable, "-m", "probe_mod"], tmp_path / "l.log", probe_env)
            proc.start(pool)
            registry.record(proc)
            names = {e["name"]: e["pid"] for e in registry.entries()}
            assert names["learner-1"] == pid and f"spare-{pid}" not in names, \
                "the spare's entry became the role's: one PID, one entry"
            _wait_exit(proc.popen, "the probe")
        finally:
            pool.close()
    finally:
        registry.close()


def test_the_spare_script_refuses_a_bad_command_line(tmp_path: Path) -> None:
    from chaos.spares import SPARE_SCRIPT
    out = subprocess.run([sys.executable, str(SPARE_SCRIPT), "--bogus"], capture_output=True, text=True,
                         timeout=30, stdin=subprocess.DEVNULL)
    assert out.returncode == 2 and "usage: spare_main.py --preload" in out.stderr


def test_warm_spares_is_validated_and_local_only(tmp_path: Path) -> None:
    from chaos.backends.compose import ComposeCluster
    from chaos.backends.local import LocalCluster
    from chaos.runner import make_cluster
    from trainer.runspec import RunSpec
    with pytest.raises(ValueError, match="warm_spares: must be >= 0"):
        LocalCluster(tmp_path, warm_spares=-1)
    with pytest.raises(ValueError, match="warm_spares: only the local backend"):
        make_cluster(RunSpec(backend="compose", learners=2, warm_spares=1), tmp_path)
    with pytest.raises(ValueError, match="warm_spares: only the local backend"):
        ComposeCluster(tmp_path, RunSpec(learners=2, warm_spares=1))  # a local spec moved onto compose
    cluster = make_cluster(RunSpec(backend="local", learners=2, warm_spares=2), tmp_path)
    assert isinstance(cluster, LocalCluster) and cluster.spec.warm_spares == 2
    assert cluster.warm_spares == 2 and cluster.spares is None, "spares start with the cluster, not before"


@pytest.mark.parametrize("argv, message", [
    (["--warm-spares", "-1"], "argument --warm-spares: must be >= 0, got -1"),
    (["--warm-spares", "1", "--backend", "compose"], "--warm-spares: only the local backend"),
])
def test_chaos_run_refuses_bad_warm_spares_naming_the_flag(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                           argv: list[str], message: str) -> None:
    from chaos.__main__ import main
    from faults import Kill, Schedule
    schedule = tmp_path / "s.yaml"
    Schedule(seed=1, faults=(Kill(at=1, duration=1, target="learner-1"),)).dump(schedule)
    with pytest.raises(SystemExit) as exc:
        main(["run", str(schedule), "--out", str(tmp_path / "run"), *argv])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "run").exists(), "nothing was started"
