"""`python -m chaos run`: the cluster's size, refusals that leave nothing behind, and the
syncer's own words when it exits at start. No cluster is started here."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import chaos.runner
from chaos.__main__ import main
from chaos.backends.local import LocalCluster
from chaos.processes import log_tail

ROOT = Path(__file__).resolve().parents[2]
QUICK = ROOT / "examples" / "schedules" / "quick.yaml"  # learners: 2


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> list[dict]:
    """Stand in for run_schedule: record what would have started."""
    calls: list[dict] = []

    def fake_run_schedule(schedule, run_dir, spec=None, checker_options=None, evaluate=True, reference="auto",
                          **settings):
        calls.append({"schedule": schedule, "run_dir": run_dir, "spec": spec, "reference": reference,
                      **settings})
        raise RuntimeError("stand-in: no cluster in unit tests")

    monkeypatch.setattr(chaos.runner, "run_schedule", fake_run_schedule)
    return calls


def test_the_schedules_learners_sets_the_cluster_size(started: list[dict], tmp_path: Path) -> None:
    assert main(["run", str(QUICK), "--out", str(tmp_path / "run")]) == 1
    assert started[-1]["spec"].learners == 2, "quick.yaml says learners: 2, so the run starts 2"


def test_reference_seconds_reaches_the_run_and_defaults_to_the_runs_own(started: list[dict], tmp_path: Path) -> None:
    assert main(["run", str(QUICK), "--out", str(tmp_path / "a"), "--reference-seconds", "90"]) == 1
    assert started[-1]["reference_seconds"] == 90.0
    assert main(["run", str(QUICK), "--out", str(tmp_path / "b")]) == 1
    assert started[-1]["reference_seconds"] == 0.0  # obtain() then uses the run's duration


def test_reference_seconds_must_be_positive(started: list[dict], capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as info:
        main(["run", str(QUICK), "--reference-seconds", "0"])
    assert info.value.code == 2 and not started
    assert "--reference-seconds" in capsys.readouterr().err


def test_without_learners_anywhere_the_run_starts_three(started: list[dict], tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text("seed: 1\nfaults:\n- {kind: pause, at: 1, duration: 1, target: learner-3}\n")
    assert main(["run", str(path), "--out", str(tmp_path / "run")]) == 1
    assert started[-1]["spec"].learners == 3


def test_learners_that_disagree_with_the_schedule_is_an_error_naming_both(
        started: list[dict], tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as info:
        main(["run", str(QUICK), "--learners", "3", "--out", str(tmp_path / "run")])
    assert info.value.code == 2 and not started
    err = capsys.readouterr().err
    assert "--learners 3 disagrees with" in err and "learners: 2" in err
    assert not (tmp_path / "run").exists()


def test_a_rank_target_without_ranks_is_refused_before_the_run_dir_exists(
        started: list[dict], tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = tmp_path / "rank.yaml"
    path.write_text("seed: 1\nlearners: 2\nfaults:\n- {kind: kill, at: 1, duration: 2, target: learner-2/rank-3}\n")
    assert main(["run", str(path), "--out", str(tmp_path / "run")]) == 2
    assert "no such target 'learner-2/rank-3'" in capsys.readouterr().err
    assert not started and not (tmp_path / "run").exists()


def test_a_rank_target_of_a_learners_own_ranks_reaches_the_run(started: list[dict], tmp_path: Path) -> None:
    path = tmp_path / "rank.yaml"
    path.write_text("seed: 1\nlearners: 2\nfaults:\n- {kind: kill, at: 1, duration: 2, target: learner-2/rank-3}\n")
    assert main(["run", str(path), "--learner-args", "2:--ranks 4", "--out", str(tmp_path / "run")]) == 1
    spec = started[-1]["spec"]
    assert spec.learner_args == {2: ("--ranks", "4")} and (spec.ranks_of(1), spec.ranks_of(2)) == (1, 4)


def test_a_rank_target_a_learners_own_ranks_lack_is_refused_before_the_run_dir_exists(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """The real run_schedule: the cluster checks each rank target against its own unit."""
    path = tmp_path / "rank.yaml"
    path.write_text("seed: 1\nlearners: 2\nfaults:\n- {kind: kill, at: 1, duration: 2, target: learner-2/rank-3}\n")
    assert main(["run", str(path), "--learner-args", "2:--ranks 2", "--out", str(tmp_path / "run")]) == 2
    assert "faults[0].target: learner-2 runs 2 rank(s), so 'learner-2/rank-3' does not exist" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_a_fault_the_backend_cannot_apply_leaves_no_run_dir(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """The real run_schedule: the local backend refuses a network partition before creating anything."""
    path = tmp_path / "net.yaml"
    path.write_text("seed: 1\nlearners: 2\nfaults:\n"
                    "- {kind: partition, at: 1, duration: 2, targets: [learner-1], mode: network}\n")
    out = tmp_path / "run"
    assert main(["run", str(path), "--out", str(out)]) == 2
    assert "faults[0].mode: 'network' partitions need the compose backend" in capsys.readouterr().err
    assert not out.exists(), "a refused run must not leave a run directory behind"


class _Exited:
    """A ManagedProcess whose syncer exited at once, as one given a flag it does not know."""

    def __init__(self, log: Path) -> None:
        self.log = log
        self.popen = type("P", (), {"returncode": 2})()

    def running(self) -> bool:
        return False


def test_a_syncer_that_exits_at_start_is_quoted_in_the_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = tmp_path / "logs" / "syncer.log"
    log.parent.mkdir()
    log.write_text("usage: python -m trainer syncer [-h] ...\n"
                   "python -m trainer syncer: error: unrecognized arguments: --bogus-flag\n")
    cluster = LocalCluster(tmp_path, learners=1, trainer_args=["--bogus-flag"])
    monkeypatch.setattr(cluster, "_spawn", lambda name, argv: _Exited(log))
    with pytest.raises(RuntimeError) as info:
        cluster.restart("syncer")
    message = str(info.value)
    assert message.startswith("syncer exited with 2 before listening")
    assert "unrecognized arguments: --bogus-flag" in message


def test_log_tail_keeps_the_last_lines_and_says_when_there_is_no_log(tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    log.write_text("".join(f"line {i}\n" for i in range(40)))
    tail = log_tail(log, lines=3)
    assert tail.splitlines() == ["    line 37", "    line 38", "    line 39"]
    assert "no log" in log_tail(tmp_path / "missing.log")
    log.write_text("")
    assert "empty" in log_tail(log)


def test_validate_and_run_agree_on_a_schedule_without_learners(tmp_path: Path) -> None:
    """What `chaos validate` accepts `chaos run` accepts, and the reverse, for the same flags."""
    path = tmp_path / "seven.yaml"
    path.write_text("seed: 1\nfaults:\n- {kind: kill, at: 1, duration: 2, target: learner-7}\n")
    validate = subprocess.run([sys.executable, "-m", "chaos", "validate", str(path)], capture_output=True,
                              text=True, timeout=120, cwd=ROOT)
    assert validate.returncode == 2 and "(learners: 1..3)" in validate.stderr
    assert main(["run", str(path), "--out", str(tmp_path / "run")]) == 2
    assert not (tmp_path / "run").exists()


def test_the_printed_verdict_names_the_required_checks(capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    """`chaos run` prints which checks had to pass, and fails on a required one left unknown."""
    from chaos.__main__ import print_verdicts
    from chaos.checkers import CHECKERS, PASS, UNKNOWN, Verdict, verdict_document
    from chaos.runner import RunResult

    verdicts = [Verdict(n, UNKNOWN if n == "no_lost_acks" else PASS, "d") for n in CHECKERS]
    document = verdict_document(verdicts)
    print_verdicts(RunResult(tmp_path, verdicts, document, {}))
    out = capsys.readouterr().out
    assert "verdict: FAIL" in out
    assert ("required to pass: no_lost_acks, no_double_apply, monotonic_versions, finite; "
            "unknown, which fails the run: no_lost_acks") in out
