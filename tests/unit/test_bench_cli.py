"""The bench scripts' command lines: every --help works (trainer.argtypes.Parser refuses a
flag without help text when the parser is built, so a missing one fails here), and every
output path is checked when the command line is parsed (bench/outputs.py), not after the
work: `bench/goodput.py --out DIR` once ran nine minutes, then died writing its JSON."""
from __future__ import annotations

import argparse
import importlib
import inspect
import os
import subprocess
import sys
from pathlib import Path

import pytest

from .bench_scripts import BENCH, load_bench

ROOT = BENCH.parent
sys.path.insert(0, str(ROOT))  # bench.outputs, as the scripts import it

from bench.outputs import check_output, output_dir, output_file  # noqa: E402
from trainer.argtypes import Parser  # noqa: E402


def _scripts() -> list[str]:
    """Every bench/*.py with a command line (a `__main__` block)."""
    return sorted(p.name for p in BENCH.glob("*.py") if 'if __name__ == "__main__"' in p.read_text())


SCRIPTS = _scripts()
HELP_COMMANDS = ([[f"bench/{s}"] for s in SCRIPTS]
                 + [["bench/swarm_nodes.py", sub] for sub in ("image", "up", "down", "fail", "recover", "check")]
                 + [["-m", "fuzz.live"], ["-m", "fuzz.run"]])


def test_the_scripts_are_found() -> None:
    assert {"goodput.py", "goodput_scale.py", "parity.py", "recovery.py", "syncer_scaling.py",
            "proxy_throughput.py", "swarm_nodes.py", "compose_lifecycle.py"} <= set(SCRIPTS)
    assert "outputs.py" not in SCRIPTS and "parity_stats.py" not in SCRIPTS, "modules, not scripts"


@pytest.mark.parametrize("command", HELP_COMMANDS, ids=" ".join)
def test_help_exits_0(command: list[str]) -> None:
    proc = subprocess.run([sys.executable, *command, "--help"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, f"{' '.join(command)} --help:\n{proc.stderr[-3000:]}"
    assert proc.stdout.strip(), f"{' '.join(command)} --help printed nothing"
    assert "usage:" in proc.stdout
    options = [line for line in proc.stdout.splitlines() if line.startswith("  -") and "--help" not in line]
    if options:  # the formatter shows every option's default
        assert "default" in proc.stdout


def test_the_parsers_built_inside_functions_have_help_for_every_flag(tmp_path: Path) -> None:
    """parity builds one parser per arm (prog "parity arm NAME"), goodput one for the
    evaluation config: both are built here, as --help never builds them."""
    parity = load_bench("parity.py", "bench_cli_parity")
    args, _ = parity.parse_args(["--quick", "--arms", "levers,diloco-p1-fp32,single",
                                 "--out", str(tmp_path / "parity.json"), "--runs-dir", str(tmp_path / "runs")])
    assert len(args.selected) > 5  # parse_args built every selected arm's parser
    goodput = load_bench("goodput.py", "bench_cli_goodput")
    assert goodput.eval_config(goodput.FAST_TRAINER_ARGS).model.n_layer == 1


# --------------------------------------------------------------------------- bench/outputs.py
def test_output_file_refuses_an_existing_directory_naming_it(tmp_path: Path) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="is a directory") as err:
        output_file(str(tmp_path))
    assert str(tmp_path) in str(err.value)


def test_output_file_creates_a_missing_parent_but_not_the_file(tmp_path: Path) -> None:
    target = tmp_path / "a" / "b" / "out.json"
    assert output_file(str(target)) == target
    assert target.parent.is_dir() and not target.exists()


def test_output_file_accepts_an_existing_file_and_leaves_it(tmp_path: Path) -> None:
    target = tmp_path / "out.json"
    target.write_text("old")
    assert output_file(target) == target and target.read_text() == "old"


def test_output_file_refuses_a_path_under_a_regular_file(tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    plain.write_text("")
    with pytest.raises(argparse.ArgumentTypeError, match="not a directory") as err:
        output_file(str(plain / "out.json"))
    assert str(plain) in str(err.value)
    with pytest.raises(argparse.ArgumentTypeError, match="part of that path is a file"):
        output_file(str(plain / "deeper" / "out.json"))


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write anywhere")
def test_output_file_refuses_a_read_only_parent(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        with pytest.raises(argparse.ArgumentTypeError, match="not writable"):
            output_file(str(locked / "out.json"))
        with pytest.raises(argparse.ArgumentTypeError, match="cannot create"):
            output_file(str(locked / "sub" / "out.json"))
    finally:
        locked.chmod(0o700)


def test_output_file_refuses_a_parent_it_may_not_write(tmp_path: Path, monkeypatch) -> None:
    """The os.access check, for root too (root may write anywhere, so the test above skips)."""
    import bench.outputs

    monkeypatch.setattr(bench.outputs.os, "access", lambda path, mode: False)
    with pytest.raises(argparse.ArgumentTypeError, match="is not writable") as err:
        output_file(str(tmp_path / "out.json"))
    assert str(tmp_path) in str(err.value)
    with pytest.raises(argparse.ArgumentTypeError, match="is not writable"):
        output_dir(str(tmp_path / "runs"))


def test_output_file_refuses_an_empty_path() -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="empty"):
        output_file("")


def test_output_dir_accepts_a_missing_directory_creating_nothing_and_refuses_a_file(tmp_path: Path) -> None:
    assert output_dir(str(tmp_path / "runs" / "x")) == tmp_path / "runs" / "x"
    assert not (tmp_path / "runs").exists()
    assert output_dir(tmp_path) == tmp_path
    (tmp_path / "plain").write_text("")
    with pytest.raises(argparse.ArgumentTypeError, match="it exists and is not a directory"):
        output_dir(str(tmp_path / "plain"))
    with pytest.raises(argparse.ArgumentTypeError, match="not a directory") as err:
        output_dir(str(tmp_path / "plain" / "runs"))
    assert str(tmp_path / "plain") in str(err.value)


def test_a_refused_path_is_a_usage_error_naming_the_flag(tmp_path: Path, capsys) -> None:
    parser = Parser(prog="x")
    parser.add_argument("--out", type=output_file, help="where")
    with pytest.raises(SystemExit) as exit_:
        parser.parse_args(["--out", str(tmp_path)])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "--out" in err and str(tmp_path) in err and "is a directory" in err
    with pytest.raises(SystemExit):
        check_output(parser, "--out", tmp_path)
    assert "--out: " in capsys.readouterr().err


# --------------------------------------------------------------------------- each script refuses at parse time
class _Parsed(Exception):
    """Raised instead of returning from parse_args: a script whose check failed does no work."""


def _refusing(tmp_path: Path) -> dict[str, Path]:
    plain = tmp_path / "plain"
    plain.write_text("")
    return {"dir": tmp_path, "under-file": plain / "out.json", "file": plain}


# (how to load it, argv before the path, flag, which bad path)
REFUSALS = [
    ("goodput.py", [], "--out", "dir"),
    ("goodput_scale.py", [], "--out", "dir"),
    ("heterogeneous.py", [], "--out", "dir"),
    ("parity.py", [], "--out", "dir"),
    ("parity.py", [], "--runs-dir", "file"),
    ("proxy_throughput.py", [], "--out", "dir"),
    ("recovery.py", [], "--out", "dir"),
    ("recovery.py", [], "--png", "under-file"),
    ("recovery.py", [], "--keep", "file"),
    ("simulate_goodput.py", [], "--out", "under-file"),
    ("simulate_goodput.py", [], "--png", "dir"),
    ("swarm_multinode.py", [], "--out", "dir"),
    ("swarm_nodes.py", ["up"], "--out", "dir"),
    ("syncer_scaling.py", [], "--out", "dir"),
    ("syncer_scaling.py", [], "--png", "dir"),
    ("syncer_scaling.py", [], "--keep", "file"),
    ("trainer_overhead.py", [], "--out", "dir"),
    ("fault_timing.py", [], "--out", "dir"),
    ("small_task_goodput.py", [], "--out", "dir"),
    ("fuzz.live", [], "--json", "dir"),
    ("fuzz.run", [], "--json", "dir"),
]


@pytest.mark.parametrize(("script", "before", "flag", "bad"), REFUSALS, ids=lambda v: v if isinstance(v, str) else "")
def test_every_script_refuses_a_bad_output_before_any_work(script, before, flag, bad, tmp_path, monkeypatch,
                                                           capsys) -> None:
    if script.startswith("fuzz."):
        module = importlib.import_module(script)
    else:
        if not (BENCH / script).exists():
            pytest.skip(f"bench/{script} is not here")
        module = load_bench(script, f"bench_cli_{script[:-3]}")
    original = Parser.parse_args

    def parse_args(self, *args, **kwargs):
        original(self, *args, **kwargs)
        raise _Parsed  # the path was accepted: stop before main does anything

    monkeypatch.setattr(Parser, "parse_args", parse_args)
    argv = [*before, flag, str(_refusing(tmp_path)[bad])]
    monkeypatch.setattr(sys, "argv", [script, *argv])
    with pytest.raises(SystemExit) as exit_:
        module.main(argv) if inspect.signature(module.main).parameters else module.main()
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert flag in err and str(tmp_path) in err, err


def test_goodput_checks_what_it_writes_beside_out_before_the_runs(tmp_path: Path, capsys) -> None:
    goodput = load_bench("goodput.py", "bench_cli_goodput")
    (tmp_path / "goodput-runs").write_text("")
    with pytest.raises(SystemExit):
        goodput.parse_args(["--out", str(tmp_path / "goodput.json")])
    assert "goodput-runs" in capsys.readouterr().err
    (tmp_path / "goodput-runs").unlink()
    (tmp_path / "goodput-sync.png").mkdir()
    with pytest.raises(SystemExit):
        goodput.parse_args(["--out", str(tmp_path / "goodput.json"), "--systems", "sync"])
    assert "goodput-sync.png" in capsys.readouterr().err
    args = goodput.parse_args(["--out", str(tmp_path / "goodput.json"), "--systems", "decoupled"])
    assert args.out == tmp_path / "goodput.json" and not (tmp_path / "goodput.json").exists()


def test_parity_checks_its_plot_beside_out(tmp_path: Path, capsys) -> None:
    parity = load_bench("parity.py", "bench_cli_parity")
    (tmp_path / "parity.png").mkdir()
    with pytest.raises(SystemExit):
        parity.parse_args(["--quick", "--out", str(tmp_path / "parity.json"), "--runs-dir", str(tmp_path / "r")])
    assert "parity.png" in capsys.readouterr().err
