"""bench/background.py: a long run niced for real, its session's autogroup included. Run in
a child process: a nice cannot be undone, and the test worker must keep its priority."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CHILD = ("import json, os, sys; from pathlib import Path; from bench.background import lowest_priority; "
         "done = lowest_priority(Path(sys.argv[1])); print(json.dumps({'done': done, 'nice': os.nice(0)}))")


def _lowest_priority_in_a_child(autogroup: Path) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, str(autogroup)], cwd=REPO, capture_output=True,
                         text=True, timeout=60, check=True).stdout
    return json.loads(out)


def test_the_process_and_its_autogroup_are_niced_to_19(tmp_path: Path) -> None:
    autogroup = tmp_path / "autogroup"
    autogroup.write_text("/autogroup-7 nice 0\n")
    result = _lowest_priority_in_a_child(autogroup)
    assert result["nice"] == 19
    assert autogroup.read_text() == "19\n", "the session's autogroup was not niced"
    assert result["done"] == ["nice 19", "session autogroup: 19"]


def test_a_kernel_without_autogroups_is_said_and_the_process_still_niced(tmp_path: Path) -> None:
    result = _lowest_priority_in_a_child(tmp_path / "absent" / "autogroup")
    assert result["nice"] == 19
    assert result["done"][1] == "no autogroups in this kernel: nice alone orders the CPUs"
