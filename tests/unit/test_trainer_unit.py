"""The learner unit supervisor (trainer/unit.py) with stand-in ranks, and the unit's flags.

The stand-in ranks are tiny Python processes, so these tests exercise the real process
handling (spawn, watch, kill, restart, publish PIDs) in well under a second each.
"""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from trainer import unit as unit_mod
from trainer.__main__ import build_parser, rank_argv
from trainer.data import ShardSampler
from trainer.events import read_events
from trainer.unit import FATAL_EXIT, UnitOptions, UnitSupervisor, units_file


@pytest.fixture(autouse=True)
def fast_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(unit_mod, "RESTART_BACKOFF", (0.01, 0.02))
    monkeypatch.setattr(unit_mod, "FOLLOWER_GRACE", 1.0)


def _script(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def _supervisor(tmp_path: Path, ranks: int, argv_for) -> UnitSupervisor:
    return UnitSupervisor(UnitOptions(learner=3, ranks=ranks, run_dir=str(tmp_path)), argv_for)


def _kinds(tmp_path: Path) -> list[tuple]:
    return [(e["kind"], e.get("generation"), e.get("rank"), e.get("exit_code"))
            for e in read_events(tmp_path) if e["process"] == "learner-3-unit"]


def test_a_clean_generation_ends_the_unit(tmp_path: Path) -> None:
    sup = _supervisor(tmp_path, 2, lambda rank, store: _script("pass"))
    assert sup.run() == 0
    assert _kinds(tmp_path) == [("unit_start", 0, None, None), ("unit_stop", 0, None, None)]
    published = json.loads(units_file(tmp_path, 3).read_text())
    assert published["generation"] == 0 and len(published["ranks"]) == 2 and published["learner"] == 3


def test_any_rank_failing_restarts_every_rank(tmp_path: Path) -> None:
    marker = tmp_path / "failed-once"
    # Rank 1 fails in the first generation only; rank 0 waits to be killed by the supervisor.
    fail_once = (f"import pathlib, sys, time; p = pathlib.Path({str(marker)!r})\n"
                 "if not p.exists(): p.write_text('x'); sys.exit(7)\n")
    slow = "import time; time.sleep(30)"

    def argv(rank: int, store: str) -> list[str]:
        return _script(fail_once) if rank == 1 else _script(slow if not marker.exists() else "pass")

    sup = _supervisor(tmp_path, 2, argv)
    assert sup.run() == 0
    kinds = _kinds(tmp_path)
    assert ("unit_failed", 0, 1, 7) in kinds, kinds
    assert ("unit_restart", 1, None, None) in kinds
    assert kinds[-1] == ("unit_stop", 1, None, None)
    assert all(p.poll() is not None for p in sup.procs), "a rank of the failed generation was left running"


def test_a_rank_that_gives_up_stops_the_unit(tmp_path: Path) -> None:
    sup = _supervisor(tmp_path, 2, lambda rank, store: _script(f"import sys; sys.exit({FATAL_EXIT})"
                                                               if rank == 0 else "import time; time.sleep(30)"))
    assert sup.run() == FATAL_EXIT, "the unit gives up as its rank did: whoever started it must not restart it"
    kinds = _kinds(tmp_path)
    assert [k for k in kinds if k[0] == "unit_start"] == [("unit_start", 0, None, None)], "it must not restart"
    assert kinds[-1][0] == "unit_stop"


def test_restarts_are_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(unit_mod, "MAX_GENERATIONS", 3)
    sup = _supervisor(tmp_path, 2, lambda rank, store: _script("import sys; sys.exit(1)"))
    assert sup.run() == 1
    assert [k[1] for k in _kinds(tmp_path) if k[0] == "unit_start"] == [0, 1, 2]


def test_a_follower_that_outlives_rank_0_is_killed(tmp_path: Path) -> None:
    sup = _supervisor(tmp_path, 2, lambda rank, store: _script("pass" if rank == 0 else "import time; time.sleep(30)"))
    assert sup.run() == 0  # rank 0 left cleanly: the unit's work is done, the straggler is not waited for
    stop = [e for e in read_events(tmp_path) if e["kind"] == "unit_stop"]
    assert [e["reason"] for e in stop] == ["rank 1 did not follow rank 0 out; killed"]
    assert all(p.poll() is not None for p in sup.procs)


def test_stop_is_forwarded_to_every_rank_and_not_restarted(tmp_path: Path) -> None:
    # Each rank exits 0 on SIGTERM, as rank 0 does after pushing its residual progress, and
    # says when its handler is in place (a loaded machine starts a Python in well over 0.3 s).
    on_term = ("import pathlib, signal, sys, time\n"
               "signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))\n"
               "pathlib.Path(sys.argv[1]).touch()\n"
               "time.sleep(30)\n")
    sup = _supervisor(tmp_path, 2, lambda rank, store: [*_script(on_term), str(tmp_path / f"ready-{rank}")])
    result: list[int] = []
    worker = threading.Thread(target=lambda: result.append(sup.run()))
    worker.start()
    deadline = time.monotonic() + 30
    while not all((tmp_path / f"ready-{r}").exists() for r in (0, 1)):
        assert time.monotonic() < deadline, "the two stand-in ranks did not install their SIGTERM handler in 30 s"
        time.sleep(0.02)
    sup.request_stop()
    worker.join(timeout=20)
    assert not worker.is_alive(), "the unit did not stop after SIGTERM"
    assert result == [0]


def test_ranks_die_with_their_supervisor(tmp_path: Path) -> None:
    """PR_SET_PDEATHSIG: a SIGKILLed supervisor leaves no orphan ranks training on."""
    code = (f"import sys; sys.path.insert(0, {str(Path(__file__).resolve().parents[2])!r})\n"
            "from trainer.unit import UnitOptions, UnitSupervisor\n"
            f"s = UnitSupervisor(UnitOptions(3, 2, {str(tmp_path)!r}), "
            "lambda r, st: [sys.executable, '-c', 'import time; time.sleep(60)'])\n"
            "s.run()\n")
    sup = subprocess.Popen([sys.executable, "-c", code])
    try:
        for _ in range(300):
            if units_file(tmp_path, 3).exists():
                break
            threading.Event().wait(0.02)
        pids = json.loads(units_file(tmp_path, 3).read_text())["ranks"]
        sup.send_signal(signal.SIGKILL)
        sup.wait(timeout=10)
        for pid in pids:
            for _ in range(250):
                if not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]:
                    break
                threading.Event().wait(0.02)
            else:
                pytest.fail(f"rank PID {pid} outlived its SIGKILLed supervisor")
    finally:
        if sup.poll() is None:
            sup.kill()


# ----------------------------------------------------------------- flags


def _learner_args(*extra: str):
    return build_parser().parse_args(["learner", "--learner", "2", "--connect", "127.0.0.1:9", *extra])


def test_rank_argv_carries_the_units_flags() -> None:
    args = _learner_args("--ranks", "3", "--run-dir", "/r", "--max-steps", "50", "--speed", "0.5")
    argv = rank_argv(args, 2, "/tmp/store")
    joined = " ".join(argv)
    for flag in ("--learner 2", "--connect 127.0.0.1:9", "--ranks 3", "--rank 2", "--rendezvous /tmp/store",
                 "--run-dir /r", "--max-steps 50", "--speed 0.5"):
        assert flag in joined, f"{flag} missing from {argv}"
    assert build_parser().parse_args(argv[3:]).rank == 2


@pytest.mark.parametrize("extra, message", [
    (["--ranks", "2", "--mode", "sync"], "--ranks: a unit of several ranks needs --mode decoupled"),
    (["--ranks", "2", "--rank", "2", "--rendezvous", "/x"], "--rank: must be below --ranks 2"),
    (["--ranks", "2", "--rank", "1"], "--rank: must be below --ranks 2, with --rendezvous"),
    (["--ranks", "0"], "--ranks"),
])
def test_bad_unit_flags_are_named(extra: list[str], message: str, capsys: pytest.CaptureFixture) -> None:
    from trainer.__main__ import main
    with pytest.raises(SystemExit) as err:
        main(["learner", "--learner", "1", "--connect", "127.0.0.1:9", *extra])
    assert err.value.code == 2
    assert message in capsys.readouterr().err


# ----------------------------------------------------------------- data


def test_ranks_of_a_unit_read_different_windows_of_the_same_shard() -> None:
    train = np.arange(20_000, dtype=np.uint8)
    single = ShardSampler(train, 0, 2, block_size=16, batch_size=4, seed=1, incarnation=1)
    old = ShardSampler(train, 0, 2, block_size=16, batch_size=4, seed=1, incarnation=1, rank=0, ranks=1)
    assert np.array_equal(single.next_batch()[0].numpy(), old.next_batch()[0].numpy()), \
        "a unit of one rank must read exactly what a plain learner reads"
    r0 = ShardSampler(train, 0, 2, block_size=16, batch_size=4, seed=1, incarnation=1, rank=0, ranks=2)
    r1 = ShardSampler(train, 0, 2, block_size=16, batch_size=4, seed=1, incarnation=1, rank=1, ranks=2)
    x0, x1 = r0.next_batch()[0], r1.next_batch()[0]
    assert not np.array_equal(x0.numpy(), x1.numpy())
    assert r0.position == r1.position == 1, "the ranks share the unit's position"
    with pytest.raises(ValueError, match="rank 2 is out of range for 2 ranks"):
        ShardSampler(train, 0, 2, block_size=16, batch_size=4, seed=1, incarnation=1, rank=2, ranks=2)
