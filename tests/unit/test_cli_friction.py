"""Issue 26, finding 7: command lines that say what every flag does and what went wrong.

Every flag of `python -m trainer` and `python -m chaos` (and its subcommands) has help text
and a default shown, enforced where parsers are built (trainer/argtypes.py's Parser: a flag
without help cannot be added); an unknown flag is answered with the nearest known ones and
no page of usage; a syncer whose port is taken says so in one line and writes nothing.
"""
from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from trainer.argtypes import Parser

ROOT = Path(__file__).resolve().parents[2]


def run(*argv: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *argv], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})})


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _options(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in parser._actions if a.option_strings and not isinstance(a, argparse._HelpAction)]


@pytest.mark.parametrize("module", ["trainer", "chaos"])
def test_every_flag_has_help_and_a_default_shown(module: str) -> None:
    """Each subcommand's every option: help text, and the rendered help names its default."""
    build = __import__(f"{module}.__main__", fromlist=["build_parser"]).build_parser
    parser = build()
    subs = _subparsers(parser)
    assert subs, f"{module} has no subcommands"
    for name, sub in subs.items():
        for action in _options(sub):
            flag = action.option_strings[-1]
            assert action.help, f"{module} {name} {flag} has no help"
            if action.help == argparse.SUPPRESS:
                continue
            shown = sub.formatter_class(prog=sub.prog)._get_help_string(action)
            assert "default" in shown.lower(), f"{module} {name} {flag}: no default in its help: {shown!r}"


def test_trainer_help_lists_every_subcommand() -> None:
    out = run("trainer", "--help").stdout
    assert "{syncer,learner,eval,run}" in out and "eval" in out.split("positional arguments:")[1]


def test_a_flag_without_help_cannot_be_added() -> None:
    with pytest.raises(ValueError, match="--bare has no help text"):
        Parser(prog="x").add_argument("--bare")
    with pytest.raises(ValueError, match="--bare has no help text"):
        Parser(prog="x").add_argument_group("g").add_argument("--bare")
    with pytest.raises(ValueError, match="--bare has no help text"):
        Parser(prog="x").add_mutually_exclusive_group().add_argument("--bare", action="store_true")


def test_an_unknown_flag_gets_did_you_mean_and_no_page_of_usage() -> None:
    done = run("trainer", "run", "--learnrs", "2")
    assert done.returncode == 2
    assert "--learnrs: did you mean --learners" in done.stderr
    assert "python -m trainer run: error: unrecognized arguments: --learnrs 2" in done.stderr
    assert len(done.stderr.splitlines()) <= 4, done.stderr  # was ~40 lines of usage above the one that matters
    chaos = run("chaos", "run", "examples/schedules/quick.yaml", "--learnrs", "2")
    assert chaos.returncode == 2 and "did you mean --learners" in chaos.stderr


def test_subcommand_help_names_itself() -> None:
    assert run("chaos", "report", "--help").stdout.startswith("usage: python -m chaos report")
    demo = run("chaos", "demo", "--help").stdout
    assert "The README's demo" in demo


def test_a_syncer_on_a_port_in_use_says_so_and_writes_nothing(tmp_path: Path) -> None:
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    state = tmp_path / "state"
    try:
        done = run("trainer", "syncer", "--state-dir", str(state), "--port", str(port), env={"ISLANDS_SECRET": "s" * 32})
    finally:
        taken.close()
    assert done.returncode == 2, done.stderr
    assert f"syncer: error: port: 127.0.0.1:{port} is in use by another process" in done.stderr
    assert "Traceback" not in done.stderr
    assert not state.exists(), f"the refused syncer left {sorted(p.name for p in state.iterdir())}"


def test_a_refused_chaos_run_names_no_run_dir(tmp_path: Path) -> None:
    """A run the backend refuses (a network partition on local processes) makes no run
    directory and must not print one."""
    schedule = tmp_path / "net.yaml"
    schedule.write_text("seed: 1\nlearners: 2\nfaults:\n- {kind: partition, at: 1, duration: 2, targets: [learner-1], "
                        "mode: network}\n")
    done = run("chaos", "run", str(schedule), "--out", str(tmp_path / "never"))
    assert done.returncode == 2, done.stdout + done.stderr
    assert "faults[0].mode: 'network' partitions need the compose backend" in done.stderr
    assert "run dir" not in done.stdout and not (tmp_path / "never").exists()


def test_a_duration_shorter_than_the_schedule_is_refused_not_stretched(tmp_path: Path) -> None:
    done = run("chaos", "run", "examples/schedules/kill-partition-latency.yaml", "--duration", "5",
               "--out", str(tmp_path / "never"))
    assert done.returncode == 2
    assert "run: error: --duration: 5 s ends before the schedule's last fault does" in done.stderr
    assert not (tmp_path / "never").exists()
