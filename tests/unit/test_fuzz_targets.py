"""Every fuzz target under atheris for a short budget: its seed corpus, then coverage-guided
mutations. A crash (an exception the target does not expect) fails with the input kept.
The long run is `python -m fuzz.run --seconds 300` (BENCHMARKS.md)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from fuzz.run import ROOT, targets

RUNS = 3000


def test_there_is_a_target_for_every_parser_the_issue_names() -> None:
    assert {"frame_decoder", "handshake", "push_validation", "toxiproxy_http"} <= set(targets())


@pytest.mark.parametrize("target", targets())
def test_target_survives_a_short_fuzzing_budget(target: str, tmp_path: Path) -> None:
    out = tmp_path / "fuzz.json"
    proc = subprocess.run([sys.executable, "-m", "fuzz.run", target, "--runs", str(RUNS), "--seconds", "120",
                           "--json", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=400)
    assert out.exists(), f"fuzz.run wrote no result:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    row = json.loads(out.read_text())["rows"][0]
    assert row["crashes"] == 0, f"{target} crashed:\n{proc.stdout[-6000:]}"
    assert row["executions"] and row["executions"] >= RUNS, f"{target} ran {row['executions']} of {RUNS}:\n{proc.stdout[-3000:]}"
    assert row["coverage"], f"{target}: libFuzzer reported no coverage (was the target instrumented?)"
