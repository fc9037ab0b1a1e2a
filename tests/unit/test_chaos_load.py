"""The artificial CPU load (chaos/load.py) behind `pytest --chaos-load N` and `chaos load N`."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import pytest

from chaos.load import CpuLoad, LoadReport, main


def _cpu_seconds(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _wait(predicate, what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"{what} did not happen within {timeout:.0f} s"
        time.sleep(0.05)


def test_processes_spin_pinned_round_robin_and_stop() -> None:
    load = CpuLoad(2).start()
    try:
        assert load.running() == 2
        cpus = sorted(os.sched_getaffinity(0))
        _wait(lambda: [os.sched_getaffinity(p.pid) for p in load._procs] == [{cpus[0]}, {cpus[1 % len(cpus)]}],
              "pinning each busy process to its CPU")
        _wait(lambda: all(_cpu_seconds(p.pid) > 0.2 for p in load._procs), "the busy processes using CPU")
    finally:
        report = load.stop()
    assert load.running() == 0
    assert report.processes == 2 and report.loadavg_samples, "the report has at least the final sample"


def test_a_process_stops_on_its_own_when_its_time_is_up() -> None:
    load = CpuLoad(1, max_seconds=0.5).start()
    _wait(lambda: load.running() == 0, "the busy process ending at its deadline")
    load.stop()


def test_a_process_stops_when_its_parent_is_gone(tmp_path) -> None:
    script = textwrap.dedent("""
        import os, sys
        sys.path.insert(0, sys.argv[1])
        from chaos.load import CpuLoad
        load = CpuLoad(1, max_seconds=120).start()
        print(load._procs[0].pid, flush=True)
        os._exit(0)  # no stop(): the child must notice on its own
    """)
    out = subprocess.run([sys.executable, "-c", script, os.getcwd()], capture_output=True, text=True, timeout=60)
    child = int(out.stdout.strip())

    def gone() -> bool:
        try:
            state = open(f"/proc/{child}/stat").read().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            return True
        return state == "Z"

    _wait(gone, "the orphaned busy process exiting")


def test_bad_arguments_name_the_field() -> None:
    with pytest.raises(ValueError, match="processes"):
        CpuLoad(-1)
    with pytest.raises(ValueError, match="max-seconds"):
        CpuLoad(1, max_seconds=0)
    with pytest.raises(SystemExit):
        main(["0"])
    with pytest.raises(SystemExit):
        main(["1", "--seconds", "-3"])


def test_report_line() -> None:
    assert "no load-average sample" in LoadReport(2, 10.0).line()
    line = LoadReport(2, 10.0, [3.0, 4.0, 5.0]).line()
    assert line.startswith("2 busy process(es) for 10 s") and "median 4.00" in line and "max 5.00" in line


def test_cli_runs_for_the_given_seconds(capsys: pytest.CaptureFixture) -> None:
    started = time.monotonic()
    assert main(["1", "--seconds", "1"]) == 0
    assert time.monotonic() - started < 15
    out = capsys.readouterr().out
    assert "load: 1 busy process(es)" in out and "for at most 1 s" in out
