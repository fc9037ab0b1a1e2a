"""`python -m chaos check RUN_DIR`: a finished run judged again, running nothing; bad input
is named and leaves nothing behind. (A run judged with and without placing its events on
one timeline: tests/integration/test_host_clocks_live.py.)"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def check(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "chaos", "check", *args], capture_output=True, text=True, timeout=60)


def test_a_directory_without_a_run_is_named_and_left_as_it_was(tmp_path: Path):
    done = check(str(tmp_path))
    assert done.returncode == 2 and f"{tmp_path} holds no run.json" in done.stderr
    assert list(tmp_path.iterdir()) == []


def test_a_run_without_its_history_is_named(tmp_path: Path):
    (tmp_path / "run.json").write_text("{}")
    done = check(str(tmp_path))
    assert done.returncode == 2 and "holds no history.jsonl" in done.stderr


def test_a_verdict_file_must_be_a_name_in_the_run_directory(tmp_path: Path):
    done = check(str(tmp_path), "--verdict-file", "../elsewhere.json")
    assert done.returncode == 2 and "--verdict-file: a file name in RUN_DIR" in done.stderr


def test_a_bad_alignment_switch_is_named(tmp_path: Path):
    done = check(str(tmp_path), "--clock-alignment", "maybe")
    assert done.returncode == 2 and "--clock-alignment" in done.stderr and "expected on or off" in done.stderr
