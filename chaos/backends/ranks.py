"""Single ranks of a learner unit as fault targets (`learner-N/rank-R`).

A unit of several ranks publishes the PIDs of its current ranks in
RUN_DIR/units/learner-N.json (see trainer/unit.py); a backend reads it to signal one rank.
The unit itself restarts all its ranks when one dies, so "restarting" a rank means
waiting for the unit's next generation.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Callable

from trainer.unit import units_file

RANK_RESTART_TIMEOUT = 60.0

# Run inside a unit's container (`python3 -c SCRIPT PID SUPERVISOR SIGNAL`): signal PID only
# if it is still a child of the unit's supervisor (never a recycled PID), print its state
# letter; exit 3 if it is not there. Signal 0 only reads the state.
SIGNAL_RANK_SCRIPT = """
import os, sys
pid, parent, sig = map(int, sys.argv[1:4])
try:
    stat = open(f"/proc/{pid}/stat").read()
except OSError:
    sys.exit(3)
fields = stat[stat.rindex(")") + 2:].split()
if int(fields[1]) != parent:
    sys.exit(3)
if sig:
    os.kill(pid, sig)
print(fields[0])
"""


def split_rank(target: str) -> tuple[str, int | None]:
    """`learner-2/rank-1` -> ("learner-2", 1); a unit or the syncer -> (target, None)."""
    unit, sep, rank = target.partition("/rank-")
    return unit, int(rank) if sep else None


def published_ranks(run_dir: Path, unit: str) -> dict | None:
    """The unit's published generation and rank PIDs, or None if it has published nothing."""
    try:
        return json.loads(units_file(run_dir, int(unit.split("-", 1)[1])).read_text())
    except (OSError, ValueError):
        return None


def published_rank_pid(run_dir: Path, unit: str, rank: int) -> int | None:
    info = published_ranks(run_dir, unit)
    if info is None or rank >= len(info.get("ranks", [])):
        return None
    return int(info["ranks"][rank])


def wait_for_rank(running: Callable[[], bool], target: str, timeout: float = RANK_RESTART_TIMEOUT) -> None:
    """Until the unit has brought `target` back; fails naming the rank if it has not."""
    deadline = time.monotonic() + timeout
    while not running():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{target} did not come back within {timeout:.0f}s: its unit did not restart it")
        time.sleep(0.1)
