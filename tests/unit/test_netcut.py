"""chaos/netcut.py takes every link but the loopback and those it keeps down, and up again,
and an address's route comes back with its link: run in a network namespace of its own (unshare -n) on a veth pair, so this
machine's own links are never touched."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("ip"),
    reason="needs root, unshare and ip (iproute2) for a throwaway network namespace")

SCRIPT = f"""set -e
ip link add v0 type veth peer name v1
ip link add k0 type veth peer name k1
ip addr add 10.9.9.9/24 dev v0
ip addr add 10.8.8.8/24 dev k0
ip link set lo up; ip link set v0 up; ip link set v1 up; ip link set k0 up
{sys.executable} -m chaos.netcut down --keep 10.8.8.8
echo "link when down: $(ip -o link show v0)"
echo "route down: $(ip route show dev v0)"
echo "kept: $(ip -o link show k0)"
echo "loopback: $(ip -o link show lo)"
{sys.executable} -m chaos.netcut up
echo "link when up: $(ip -o link show v0)"
echo "route up: $(ip route show dev v0)"
"""


def test_links_go_down_but_the_kept_ones_and_come_up_with_their_routes():
    done = subprocess.run(["unshare", "-n", "sh", "-c", SCRIPT], capture_output=True, text=True, timeout=60,
                          cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    assert done.returncode == 0, done.stderr
    lines = dict(line.split(": ", 1) for line in done.stdout.splitlines() if ": " in line)
    assert "v0" in lines["link when down"] and ",UP," not in lines["link when down"] and lines["route down"] == ""
    assert ",UP," in lines["link when up"] and "10.9.9.0/24" in lines["route up"]
    assert ",UP," in lines["kept"] and ",UP," in lines["loopback"]
