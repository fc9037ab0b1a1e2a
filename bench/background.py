"""Run a long benchmark at the lowest CPU priority, so it yields to whatever else runs.

`nice` alone is not enough on Linux: with the kernel's autogroups (on by default), the
scheduler first shares the CPUs fairly between sessions and only then, inside a session,
by nice. A `setsid` long run niced to 19 still takes half the CPUs from a test suite started
in another session. Its session's autogroup must be niced too (/proc/self/autogroup).
Docker's containers sit in cgroups of their own, and neither reaches them."""
from __future__ import annotations

import os
from pathlib import Path

AUTOGROUP = Path("/proc/self/autogroup")
LOWEST = 19


def lowest_priority(autogroup: Path = AUTOGROUP) -> list[str]:
    """Nice this process (and the workers it forks) and its session's autogroup to 19.
    Returns what was done, one line each, for the run's output. A kernel without
    autogroups is left as it is."""
    done = [f"nice {os.nice(LOWEST - os.nice(0))}"]
    try:
        autogroup.write_text(f"{LOWEST}\n")
    except FileNotFoundError:
        done.append("no autogroups in this kernel: nice alone orders the CPUs")
    except OSError as e:
        done.append(f"the session's autogroup kept its nice ({e.strerror}): other sessions still share the CPUs with it")
    else:
        done.append(f"session autogroup: {autogroup.read_text().split()[-1]}")
    return done
