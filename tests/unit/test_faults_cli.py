"""``validate FILE [--learners N] [--ranks R]``: output and exit codes, and agreement with ``chaos run``."""

from __future__ import annotations

from pathlib import Path

import pytest

from faults.cli import summary, validate_main
from faults.kinds import Kill
from faults.schedule import Schedule

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "schedules"


def test_valid_file(capsys: pytest.CaptureFixture[str]) -> None:
    assert validate_main([str(EXAMPLES / "kill-partition-latency.yaml")]) == 0
    out, err = capsys.readouterr()
    assert out == "OK: 3 faults over 34 s, targets: learner-1, learner-2, learner-3 (3 learners)\n"
    assert err == ""


def test_valid_json_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "one.json"
    Schedule(seed=1, faults=(Kill(0.5, 2.25, "syncer"),)).dump(path)
    assert validate_main([str(path)]) == 0
    assert capsys.readouterr().out == "OK: 1 fault over 2.75 s, targets: syncer (3 learners)\n"


def test_empty_schedule_summary() -> None:
    assert summary(Schedule(seed=1, faults=())) == "OK: 0 faults over 0 s, targets: none"


def test_invalid_file(capsys: pytest.CaptureFixture[str]) -> None:
    path = EXAMPLES / "bad.yaml"
    assert validate_main([str(path)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    lines = err.splitlines()
    assert lines[0] == f"{path}: seed: expected an integer, got 'seven'"
    assert lines[3] == f"{path}: faults[2]: unknown field 'durration'"
    assert lines[-1] == "INVALID: 9 errors"
    assert len(lines) == 10


def test_learners_option(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "no-size.yaml"
    path.write_text((EXAMPLES / "kill-partition-latency.yaml").read_text().replace("learners: 3\n", ""))
    assert validate_main([str(path), "--learners", "2"]) == 2
    _, err = capsys.readouterr()
    assert err == (
        f"{path}: faults[2].target: no such target 'learner-3' (learners: 1..2)\n"
        "INVALID: 1 error\n"
    )
    assert validate_main(["--learners", "5", str(path)]) == 0
    assert capsys.readouterr().out.endswith("(5 learners)\n")


def test_learners_option_must_agree_with_the_file(capsys: pytest.CaptureFixture[str]) -> None:
    """`chaos run --learners 5` refuses a schedule that says `learners: 3`, so validate does too."""
    path = str(EXAMPLES / "kill-partition-latency.yaml")
    assert validate_main([path, "--learners", "5"]) == 2
    err = capsys.readouterr().err
    assert "--learners 5 disagrees with" in err and "learners: 3" in err
    assert err.endswith("INVALID: 1 error\n")
    assert validate_main([path, "--learners", "3"]) == 0


def test_without_learners_targets_are_checked_against_run_default(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """No `learners:` and no --learners: the 3 learners `chaos run` would start, not unbounded."""
    path = tmp_path / "seven.yaml"
    path.write_text("seed: 1\nfaults:\n- {kind: kill, at: 1, duration: 2, target: learner-7}\n")
    assert validate_main([str(path)]) == 2
    assert "no such target 'learner-7' (learners: 1..3)" in capsys.readouterr().err
    assert validate_main([str(path), "--learners", "7"]) == 0


def test_rank_targets_need_ranks(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`learner-2/rank-3` exists only in units of 4 ranks or more, as `chaos run --ranks` makes them."""
    path = tmp_path / "rank.yaml"
    path.write_text("seed: 1\nfaults:\n- {kind: kill, at: 1, duration: 2, target: learner-2/rank-3}\n")
    assert validate_main([str(path)]) == 2
    err = capsys.readouterr().err
    assert "faults[0].target: no such target 'learner-2/rank-3': learner-2 runs a single process (--ranks 1)" in err
    assert validate_main([str(path), "--ranks", "3"]) == 2
    assert "learner-2 runs 3 ranks (rank-0..rank-2; --ranks 3)" in capsys.readouterr().err
    assert validate_main([str(path), "--ranks", "4"]) == 0
    assert capsys.readouterr().out.endswith("(3 learners of 4 ranks)\n")


def test_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nope.yaml"
    assert validate_main([str(missing)]) == 2
    out, err = capsys.readouterr()
    assert (out, err) == ("", f"error: no such file: {missing}\n")


def test_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "dir.yaml"
    folder.mkdir()
    assert validate_main([str(folder)]) == 2
    assert capsys.readouterr().err.startswith(f"error: cannot read {folder}: ")


def test_syntax_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "broken.yml"
    path.write_text("seed: [1\n")
    assert validate_main([str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"{path}: invalid YAML at line 2, column 1: ")
    assert err.endswith("INVALID: 1 error\n")


@pytest.mark.parametrize("argv", [[], ["a.yaml", "b.yaml"], ["a.yaml", "--learners", "0"], ["a.yaml", "--learners", "x"],
                                  ["a.yaml", "--ranks", "0"]])
def test_usage_errors_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert validate_main(argv) == 2
    assert "usage: python -m chaos validate" in capsys.readouterr().err


def test_help_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert validate_main(["--help"]) == 0
    assert "--learners N" in capsys.readouterr().out


def test_missing_file_with_odd_extension(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert validate_main([str(tmp_path / "nope.txt")]) == 2
    assert capsys.readouterr().err == f"error: no such file: {tmp_path / 'nope.txt'}\n"


def test_unsupported_extension(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "s.toml"
    path.write_text("seed = 1\n")
    assert validate_main([str(path)]) == 2
    assert capsys.readouterr().err == (
        f"{path}: unsupported file extension '.toml' (use .yaml, .yml or .json)\nINVALID: 1 error\n"
    )
