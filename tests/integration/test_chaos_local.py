"""The chaos harness on the local backend, end to end with real processes and proxies."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from chaos.backends.local import LocalCluster
from chaos.processes import Registry, proc_start_time, proc_state
from chaos.runner import run_schedule
from faults import Schedule

from .cluster_helpers import wait_for

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


# The demo's schedule on the suite's small model: the same faults and checks, and the
# fault-free reference (chaos/reference.py) of this configuration serves the other
# 3-learner runs of the suite too.
FAST = ["--n-layer", "1", "--n-embd", "32", "--n-head", "2", "--batch-size", "8", "--sync-every", "10"]


@pytest.fixture
def isolated_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A home of its own, for the test that counts the registry files left behind."""
    home = tmp_path / "islands-home"
    monkeypatch.setenv("ISLANDS_HOME", str(home))
    return home


def test_kill_partition_latency_schedule_passes(tmp_path: Path) -> None:
    schedule = Schedule.load(ROOT / "examples" / "schedules" / "kill-partition-latency.yaml")
    result = run_schedule(schedule, tmp_path / "run", learners=3, trainer_args=FAST)
    verdicts = {v.name: v for v in result.verdicts}
    assert result.passed, json.dumps(result.document["checks"], indent=1)
    assert verdicts["self_heal"].status == "pass"
    healed = {(h["kind"], h["learner"]) for h in verdicts["self_heal"].evidence["healings"]}
    assert healed == {("kill", 1), ("partition", 2)}
    history = [json.loads(line) for line in (tmp_path / "run" / "history.jsonl").read_text().splitlines()]
    applied = [(h["event"], h["kind"]) for h in history if h["event"] in ("start", "stop") and h["ok"]]
    assert applied.count(("start", "kill")) == 1 and applied.count(("stop", "kill")) == 1
    assert ("start", "partition") in applied and ("start", "latency") in applied
    for name in ("schedule.yaml", "history.jsonl", "verdict.json", "events/syncer.jsonl"):
        assert (tmp_path / "run" / name).exists(), f"{name} missing from the run dir"
    assert Schedule.load(tmp_path / "run" / "schedule.yaml") == schedule


def test_next_run_starts_clean_after_sigkill(tmp_path: Path, isolated_home: Path) -> None:
    schedule = tmp_path / "long.yaml"
    schedule.write_text("seed: 1\nlearners: 2\nfaults:\n"
                        "- {kind: partition, at: 1, duration: 300, targets: [learner-1]}\n"
                        "- {kind: pause, at: 1, duration: 300, target: learner-2}\n")
    first = tmp_path / "first"
    env = dict(os.environ, ISLANDS_HOME=str(isolated_home))
    controller = subprocess.Popen([sys.executable, "-m", "chaos", "run", str(schedule), "--learners", "2",
                                   "--out", str(first), "--duration", "300"], cwd=ROOT, env=env,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        wait_for(first, "the first run's faults to be applied",
                 lambda ev: (first / "history.jsonl").exists()
                 and (first / "history.jsonl").read_text().count('"event": "start"') >= 2, 180)
    finally:
        controller.send_signal(signal.SIGKILL)
        controller.wait(timeout=10)
    [crashed] = Registry("islands").orphaned()  # its owner, the controller, is gone
    leftovers = json.loads(crashed.read_text())["processes"]
    alive = [e for e in leftovers if proc_start_time(e["pid"]) == e["start"]]
    assert len(alive) == 3, f"expected the orphaned syncer and 2 learners to survive the SIGKILL: {leftovers}"

    cluster = LocalCluster(tmp_path / "second", learners=2)
    try:
        cluster.start()
        assert sorted(n.split(" ")[0] for n in cluster.leftovers) == ["learner-1", "learner-2", "syncer"]
        for e in alive:  # gone, or a zombie waiting for init to reap it
            still = proc_start_time(e["pid"]) == e["start"] and proc_state(e["pid"]) not in (None, "Z")
            assert not still, f"{e['name']} of the crashed run is still running"
        assert cluster.heal_all() == [], "the fresh cluster needed healing"
        wait_for(tmp_path / "second", "a merge in the second run",
                 lambda ev: any(e["kind"] == "merge" for e in ev), 120)
    finally:
        cluster.stop()
    assert not crashed.exists(), "the crashed run's registry was not removed once reaped"
    assert not cluster.registry.path.exists(), "a clean stop left its registry behind"
    assert not list(isolated_home.glob("local/islands*.json")), "registry files left behind"


def test_external_toxiproxy_via_url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """TOXIPROXY_URL points the local backend at a separately running Toxiproxy server."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "chaos", "toxiproxy", "--host", "127.0.0.1", "--port", str(port)],
                              cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    monkeypatch.setenv("TOXIPROXY_URL", f"http://127.0.0.1:{port}")
    cluster = LocalCluster(tmp_path / "run", learners=2)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "the external Toxiproxy server did not listen"
                time.sleep(0.1)
        cluster.start()
        assert cluster._server is None and cluster.toxiproxy.url == f"http://127.0.0.1:{port}"
        assert set(cluster.toxiproxy.proxies()) == {"learner-1", "learner-2"}
        wait_for(tmp_path / "run", "merges with both learners through the external proxies",
                 lambda ev: {c["learner"] for e in ev if e["kind"] == "merge" for c in e["contributors"]} == {1, 2},
                 120)
    finally:
        cluster.stop()
        server.terminate()
        server.wait(timeout=10)
