"""The same cluster as containers: faults through the Docker SDK and Toxiproxy, checks
from the bind-mounted event logs. Needs a Docker engine and the islands image."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from chaos.backends.compose import ComposeCluster
from chaos.controller import read_history
from chaos.runner import wait_until_training
from trainer.events import read_events

from ..integration.cluster_helpers import contributed, wait_for
from ..integration.disk_evidence import disk_schedule_problems, syncer_incarnations
from .conftest import FAST_TRAINER_ARGS

pytestmark = [pytest.mark.compose, pytest.mark.integration]
ROOT = Path(__file__).resolve().parents[2]
ACCEPTANCE = ROOT / "examples" / "schedules" / "compose-acceptance.yaml"


def contributed_after(learner: int, t: float):
    def predicate(events: list[dict]) -> bool:
        return any(e["kind"] == "merge" and e["t"] > t and any(c["learner"] == learner for c in e["contributors"])
                   for e in events)
    return predicate


def test_acceptance_schedule_passes_through_the_cli(tmp_path: Path) -> None:
    """Kill and restart a learner, pause another, partition a link, kill and restart the
    syncer, disconnect a learner's network: every check passes, and the history shows each
    fault applied. Run as a user (or a replay command) would: `python -m chaos run`."""
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "chaos", "run", str(ACCEPTANCE), "--backend", "compose", "--learners", "3",
           "--out", str(out), "--", *FAST_TRAINER_ARGS]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=420)
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    verdict = json.loads((out / "verdict.json").read_text())
    assert verdict["passed"] and not verdict["unknown"], json.dumps(verdict["checks"], indent=1)

    history = read_history(out / "history.jsonl")
    actions = {(h["index"], h["event"]): h for h in history if h.get("event") in ("start", "stop")}
    assert len(actions) == 10 and all(h["ok"] for h in actions.values()), actions
    assert actions[(0, "start")]["did"] == "SIGKILL learner-1" and actions[(0, "stop")]["did"] == "restarted learner-1"
    assert actions[(1, "start")]["did"] == "SIGSTOP learner-2"
    assert actions[(2, "start")]["did"].startswith("added toxics learner-3/partition_")
    assert actions[(3, "start")]["did"] == "SIGKILL syncer" and actions[(3, "stop")]["did"] == "restarted syncer"
    assert actions[(4, "start")]["did"].startswith("disconnected learner-1")

    events = read_events(out)
    joins = {(e["learner"], e["incarnation"]) for e in events if e["kind"] == "join"}
    assert (1, 2) in joins, "the killed learner-1 container did not rejoin as incarnation 2"
    assert any(e["kind"] == "state_loaded" for e in events), "the restarted syncer did not load its state volume"
    assert (out / "state" / "meta.json").is_file(), "the syncer's state volume was not copied out"
    assert json.loads((out / "toxiproxy.json").read_text())["url"].startswith("http://127.0.0.1:")

    # What `docker compose logs` shows: the roles' events on stderr, saved by the backend.
    assert " learner-1 inner_step " in (out / "logs" / "learner-1.log").read_text(), "a learner's log is silent"
    assert " syncer merge " in (out / "logs" / "syncer.log").read_text(), "the syncer's log shows no merge"
    # What the user saw while it ran: progress, each fault as it started.
    assert "every learner is training" in done.stdout and "faults[3] kill syncer started" in done.stdout


def test_disk_faults_a_power_loss_and_clock_steps_pass_in_containers(tmp_path: Path) -> None:
    """Issue 27's schedule in containers: the disk-fault layer runs in the syncer's container
    (/dev/fuse, CAP_SYS_ADMIN), a full disk is refused (storage_full) or holds a merge back
    until space returns (disk_evidence.py says why either may happen), a
    failed sync ends the syncer with 75 and Docker's restart policy starts it again, the power
    loss kills the container and its disk layer, and wall clocks step through the run dir."""
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "chaos", "run", str(ROOT / "examples" / "schedules" / "disk-power-clock.yaml"),
           "--backend", "compose", "--out", str(out), "--reference", "off", "--", *FAST_TRAINER_ARGS]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=420)
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    assert (out / "compose.disk.yaml").is_file(), "the syncer ran without the disk-fault layer"
    events = read_events(out)
    assert disk_schedule_problems(events) == []
    # Docker's restart policy, not the harness, brought it back after the failed sync: a
    # syncer began between that exit and the power loss's restart; and one after it.
    failed = next(e["t"] for e in events if e.get("process") == "syncer" and e["kind"] == "process_stop"
                  and e.get("reason") == "disk failed")
    power_back = next(h["t"] for h in read_history(out / "history.jsonl")
                      if h.get("event") == "stop" and h.get("kind") == "power_loss")
    began = syncer_incarnations(events)
    assert any(failed < t < power_back for t in began), \
        f"the syncer was not started again after its failed sync: began at {began}, exit at {failed}"
    assert any(t > power_back for t in began), f"the syncer did not come back after the power loss: {began}"
    assert (out / "state" / "meta.json").is_file(), "the durable image was not copied out"


def test_network_partition_keeps_the_aliases_and_the_learner_rejoins(cluster: ComposeCluster) -> None:
    run_dir = cluster.run_dir
    cluster.disconnect("learner-2")
    container = cluster.docker.containers.get(cluster.container_name("learner-2"))
    networks = container.attrs["NetworkSettings"]["Networks"]
    assert not any(n.endswith("_links") for n in networks), f"learner-2 still on {sorted(networks)}"
    cut = time.monotonic()
    wait_for(run_dir, "the syncer to lose learner-2's lease",
             lambda ev: any(e["kind"] in ("heartbeat_lost", "leave") and e.get("learner") == 2 and e["t"] > cut
                            for e in ev), timeout=30)

    cluster.connect("learner-2")
    container.reload()
    links = [v for n, v in container.attrs["NetworkSettings"]["Networks"].items() if n.endswith("_links")]
    assert links and "learner-2" in links[0]["Aliases"], f"aliases not restored: {links}"
    healed = time.monotonic()
    wait_for(run_dir, "learner-2 to contribute a merged update after reconnecting", contributed_after(2, healed),
             timeout=60)
    assert cluster.heal_all() == [], "nothing should be left to heal"


def test_pause_and_kill_are_real_container_states(cluster: ComposeCluster) -> None:
    cluster.pause("learner-3")
    assert cluster.is_paused("learner-3") and cluster.is_running("learner-3")
    cluster.resume("learner-3")
    assert not cluster.is_paused("learner-3")
    cluster.kill("learner-1")
    assert not cluster.is_running("learner-1")
    did = cluster.heal_all()
    assert did == ["restarted learner-1"], did
    restarted = time.monotonic()
    wait_for(cluster.run_dir, "the restarted learner-1 to contribute", contributed_after(1, restarted), timeout=90)


def test_a_crashed_run_is_healed_and_cleaned_by_the_next(tmp_path: Path) -> None:
    """A controller that died mid-fault leaves a paused container, a toxic and a cut network;
    the next start removes them and trains from scratch, here with a learner more than
    compose.yaml defines (a generated service and a proxy created through the API)."""
    first = ComposeCluster(tmp_path / "first", learners=2, trainer_args=list(FAST_TRAINER_ARGS))
    first.start()
    wait_until_training(first.run_dir, 2)
    first.pause("learner-1")
    first.toxiproxy.add_toxic("learner-2", name="latency_downstream", type="latency", attributes={"latency": 500})
    first.disconnect("learner-2")
    # ...and the controller is gone: no stop(), no heal. Its process would take its hold on the
    # project with it (an flock); this one lives on, so it lets go by hand.
    first.release_project()

    second = ComposeCluster(tmp_path / "second", learners=4, trainer_args=list(FAST_TRAINER_ARGS))
    try:
        second.start()
        assert len(second.leftovers) == 4, f"expected the 4 containers of the first run: {second.leftovers}"
        wait_until_training(second.run_dir, 4)
        assert not second.is_paused("learner-1")
        assert second.toxiproxy.proxy("learner-2")["toxics"] == []
        assert second.toxiproxy.proxy("learner-4")["upstream"] == "syncer:7000"
        wait_for(second.run_dir, "all 4 learners to contribute in the fresh cluster",
                 lambda ev: all(contributed_after(i, 0)(ev) for i in (1, 2, 3, 4)), timeout=120)
    finally:
        second.stop()


def test_a_single_rank_is_killed_and_paused_inside_its_units_container(tmp_path: Path) -> None:
    """learner-1 is a unit of 2 ranks in one container: killing rank 1 makes the unit restart
    both ranks without the container stopping; pausing rank 0 stops only that process."""
    cluster = ComposeCluster(tmp_path / "run", learners=2, trainer_args=list(FAST_TRAINER_ARGS),
                             learner_args={1: ["--ranks", "2"]})
    try:
        cluster.start()
        wait_until_training(cluster.run_dir, 2)
        assert "learner-1/rank-1" in cluster.services()
        wait_for(cluster.run_dir, "learner-1's rank 1 to start",
                 lambda ev: any(e["kind"] == "rank_start" and e["learner"] == 1 for e in ev), timeout=60)
        cluster.pause("learner-1/rank-0")
        assert cluster.is_paused("learner-1/rank-0") and not cluster.is_paused("learner-1")
        cluster.resume("learner-1/rank-0")
        assert not cluster.is_paused("learner-1/rank-0")

        killed = time.monotonic()
        cluster.kill("learner-1/rank-1")
        wait_for(cluster.run_dir, "the unit to restart after its rank 1 was killed",
                 lambda ev: any(e["kind"] == "unit_restart" and e["learner"] == 1 and e["t"] > killed for e in ev),
                 timeout=30)
        assert cluster.is_running("learner-1"), "killing one rank must not stop the unit's container"
        cluster.restart("learner-1/rank-1")  # waits for the unit's next generation
        assert cluster.is_running("learner-1/rank-1")
        events = wait_for(cluster.run_dir, "rank 0 of the restarted unit to rejoin",
                          lambda ev: any(e["kind"] == "join" and e["learner"] == 1 and e["t"] > killed for e in ev),
                          timeout=60)
        rejoined = max(e["incarnation"] for e in events if e["kind"] == "join" and e["learner"] == 1)
        wait_for(cluster.run_dir, f"learner-1 incarnation {rejoined} to contribute a merged update",
                 lambda ev: contributed(ev, 1, rejoined, killed), timeout=90)
        assert cluster.heal_all() == [], "nothing should be left to heal"
    finally:
        cluster.stop()


TASK_SCHEDULE = """\
name: compose-task
seed: 3
learners: 2
faults:
- {kind: kill, at: 4, duration: 3, target: learner-1}
- {kind: partition, at: 10, duration: 3, targets: [learner-2]}
"""


def test_a_users_task_mounted_read_only_trains_in_containers_and_replays_with_it(tmp_path: Path) -> None:
    """`--task FILE.py:NAME` on compose: the task's folder is mounted read-only at
    /islands/task in every container, the syncer and the learners train it there, the run
    passes every check, and run.json records the task for `chaos replay`."""
    schedule = tmp_path / "schedule.yaml"
    schedule.write_text(TASK_SCHEDULE)
    out = tmp_path / "run"
    task = ROOT / "examples" / "tasks" / "digits.py"
    cmd = [sys.executable, "-m", "chaos", "run", str(schedule), "--backend", "compose", "--task", f"{task}:task",
           "--reference", "off", "--out", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    verdict = json.loads((out / "verdict.json").read_text())
    assert verdict["passed"] and not verdict["unknown"], json.dumps(verdict["checks"], indent=1)
    events = read_events(out)
    starts = [e for e in events if e["kind"] == "process_start" and e.get("role") == "syncer"]
    assert starts and all(e["config"]["task"] == "/islands/task/digits.py:task" for e in starts), \
        [e.get("config", {}).get("task") for e in starts]
    assert {e.get("task") for e in events if e["kind"] == "process_start" and e.get("role") == "learner"} == \
        {"/islands/task/digits.py:task"}
    final = [e for e in events if e["kind"] == "eval"]
    assert final and final[-1]["metrics"]["accuracy"] > 0.5, final[-1:]  # ten classes: chance is 0.1
    recorded = json.loads((out / "run.json").read_text())
    assert recorded["task"] == f"{task}:task" and recorded["backend"] == "compose"
