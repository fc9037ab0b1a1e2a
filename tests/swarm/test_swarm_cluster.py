"""The same cluster as a Docker Swarm stack: Swarm restarts what a kill took down, faults reach
each task's container on its node, every node's clock is probed and events placed on the
controller's timeline, checks read the bind-mounted event logs. Needs a Docker
engine that is a swarm manager, and the islands image."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from chaos import runner
from chaos.controller import read_history
from faults import Schedule
from trainer.events import read_events
from trainer.runspec import RunSpec

from .conftest import FAST_TRAINER_ARGS

pytestmark = [pytest.mark.swarm, pytest.mark.integration]
ROOT = Path(__file__).resolve().parents[2]
ACCEPTANCE = ROOT / "examples" / "schedules" / "swarm.yaml"


def chaos_cli(*args: str, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "chaos", *args], capture_output=True, text=True, timeout=timeout)


def test_acceptance_schedule_passes_through_the_cli(tmp_path: Path) -> None:
    """A kill Swarm repairs, a pause, a blackhole, a syncer kill (its new task loads the state
    volume on its pinned node), a learner cut off its overlay network, a node cut off (on one
    node: every task at once): every check passes,
    as a user runs it, `python -m chaos run ... --backend swarm`."""
    out = tmp_path / "run"
    done = chaos_cli("run", str(ACCEPTANCE), "--backend", "swarm", "--out", str(out), "--", *FAST_TRAINER_ARGS,
                     timeout=600)
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    verdict = json.loads((out / "verdict.json").read_text())
    assert verdict["passed"] and not verdict["unknown"], json.dumps(verdict["checks"], indent=1)

    history = read_history(out / "history.jsonl")
    actions = {(h["index"], h["event"]): h for h in history if h.get("event") in ("start", "stop")}
    assert len(actions) == 14 and all(h["ok"] for h in actions.values()), actions
    for index, target in ((0, "learner-1"), (4, "syncer")):
        assert actions[(index, "start")]["did"] == f"SIGKILL {target}"
        assert actions[(index, "stop")]["did"].startswith(f"restarted {target} (Swarm's new task running "), \
            actions[(index, "stop")]["did"]
    assert actions[(1, "start")]["did"] == "SIGSTOP learner-2"
    assert actions[(2, "start")]["did"].startswith("added toxics learner-3/partition_")
    assert actions[(5, "start")]["did"].startswith("disconnected learner-1")
    # The node fault: learner-2's node, and every unit on it, recorded for the checks to judge.
    node = actions[(6, "start")]
    assert node["did"].startswith("cut ") and "off the overlay networks" in node["did"], node
    assert "learner-2" in node["units"] and node["did"].endswith(f"(it ran {', '.join(node['units'])})"), node
    assert actions[(6, "stop")]["did"].startswith("joined "), actions[(6, "stop")]

    events = read_events(out)
    # The clock fault reached learner-2's container on its node: its wall clock read 30 s
    # ahead of its monotonic clock's course while the fault was in force, and true after.
    begin = next(h["t"] for h in history if h.get("event") == "begin")
    skew = [e["wall"] - e["t"] for e in events if e["process"] == "learner-2" and e["kind"] == "inner_step"]
    inside = [e["wall"] - e["t"] for e in events if e["process"] == "learner-2" and e["kind"] == "inner_step"
              and begin + 22 <= e["t"] <= begin + 28]
    outside = [e["wall"] - e["t"] for e in events if e["process"] == "learner-2" and e["kind"] == "inner_step"
               and begin + 33 <= e["t"] <= begin + 40]
    assert skew and inside and outside and abs(min(inside) - max(outside) - 30) < 2, (min(inside), max(outside))
    joins = {(e["learner"], e["incarnation"]) for e in events if e["kind"] == "join"}
    assert (1, 2) in joins, "learner-1's new task did not rejoin as incarnation 2"
    loads = [e for e in events if e["kind"] == "state_loaded"]
    assert len(loads) >= 2 and loads[-1]["versions"] != [0], "the syncer's new task did not load its state volume"
    assert (out / "state" / "meta.json").is_file(), "the syncer's state volume was not copied out"

    # The API is reached through the relay on 127.0.0.1, never a port Swarm publishes everywhere.
    assert json.loads((out / "toxiproxy.json").read_text())["url"].startswith("http://127.0.0.1:")
    stack = yaml.safe_load((out / "stack.yaml").read_text())
    assert all("ports" not in s for name, s in stack["services"].items() if name != "clock")
    # The clock probes' responder: one per node, its UDP port published on that node only.
    assert all(port["mode"] == "host" for port in stack["services"]["clock"]["ports"])
    timeline = next(c for c in verdict["checks"] if c["name"] == "timeline")
    assert timeline["status"] == "pass" and timeline["evidence"]["hosts"], timeline
    assert stack["services"]["syncer"]["deploy"]["placement"]["constraints"] == ["node.labels.islands.syncer == true"]
    assert " learner-1 inner_step " in (out / "logs" / "learner-1.log").read_text(), "a learner's log is silent"
    assert "faults[4] kill syncer started" in done.stdout


LOST_ACK = """\
name: lost-ack
seed: 5
learners: 2
faults:
- {kind: kill, at: 6, duration: 3, target: syncer}
"""


def test_a_failure_recorded_on_the_local_backend_replays_on_swarm(tmp_path: Path) -> None:
    """A syncer with a real durability bug (it acknowledges before its fsync) fails
    no_lost_acks under one kill on the local backend; `chaos replay --backend swarm` reruns
    that recorded run, same schedule, settings and defect, as a stack, and finds it again."""
    schedule_file = tmp_path / "lost-ack.yaml"
    schedule_file.write_text(LOST_ACK)
    spec = RunSpec(backend="local", learners=2, trainer_args=FAST_TRAINER_ARGS,
                   env={"ISLANDS_SYNCER_DEFECT": "ack_before_durable"})
    recorded = tmp_path / "local"
    local = runner.run_schedule(Schedule.load(schedule_file), recorded, spec, reference="off")
    failed_locally = {v.name for v in local.verdicts if v.status == "fail"}
    assert "no_lost_acks" in failed_locally, f"the defect went unseen on the local backend: {failed_locally}"

    out = tmp_path / "replay"
    done = chaos_cli("replay", str(recorded), "--backend", "swarm", "--out", str(out), "--reference", "off",
                     timeout=420)
    assert done.returncode == 1, f"the replay should fail as the recording did: exit {done.returncode}\n" \
                                 f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    replayed = json.loads((out / "run.json").read_text())
    assert replayed["backend"] == "swarm" and replayed["env"] == {"ISLANDS_SYNCER_DEFECT": "ack_before_durable"}
    verdict = json.loads((out / "verdict.json").read_text())
    failed = {c["name"] for c in verdict["checks"] if c["status"] == "fail"}
    assert "no_lost_acks" in failed, f"the replay on swarm did not find the lost acks: {failed}"
    assert Schedule.load(out / "schedule.yaml").faults == Schedule.load(recorded / "schedule.yaml").faults
