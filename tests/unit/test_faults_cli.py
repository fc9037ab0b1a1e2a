"""``validate FILE [--learners N]``: output and exit codes."""

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
    assert out == "OK: 3 faults over 34 s, targets: learner-1, learner-2, learner-3\n"
    assert err == ""


def test_valid_json_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "one.json"
    Schedule(seed=1, faults=(Kill(0.5, 2.25, "syncer"),)).dump(path)
    assert validate_main([str(path)]) == 0
    assert capsys.readouterr().out == "OK: 1 fault over 2.75 s, targets: syncer\n"


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


def test_learners_option(capsys: pytest.CaptureFixture[str]) -> None:
    path = str(EXAMPLES / "kill-partition-latency.yaml")
    assert validate_main([path, "--learners", "2"]) == 2
    _, err = capsys.readouterr()
    assert err == (
        f"{path}: faults[2].target: no such target 'learner-3' (learners: 1..2)\n"
        "INVALID: 1 error\n"
    )
    assert validate_main(["--learners", "5", path]) == 0


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


@pytest.mark.parametrize("argv", [[], ["a.yaml", "b.yaml"], ["a.yaml", "--learners", "0"], ["a.yaml", "--learners", "x"]])
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
