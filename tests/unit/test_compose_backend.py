"""The compose backend's plumbing that needs no Docker engine: generated services for
larger clusters, per-learner flags, the environment handed to compose, data files."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from chaos.backends.compose import PROXY_BASE_PORT, TASK_MOUNT, ComposeCluster
from chaos.backends.compose_guard import ClusterBusy
from chaos.backends.compose_cli import COMPOSE_ENV, ComposeProject, find_compose_command

ROOT = Path(__file__).resolve().parents[2]


def test_defined_learners_need_no_override(tmp_path: Path) -> None:
    assert ComposeCluster(tmp_path, learners=3)._learner_overrides() == {}


def test_more_learners_get_generated_services_with_their_own_proxy_port(tmp_path: Path) -> None:
    services = ComposeCluster(tmp_path, learners=5)._learner_overrides()["services"]
    assert sorted(services) == ["learner-4", "learner-5"]
    for i in (4, 5):
        service = services[f"learner-{i}"]
        command = service["command"]
        assert command[command.index("--learner") + 1] == str(i)
        assert command[command.index("--connect") + 1] == f"toxiproxy:{PROXY_BASE_PORT + i}"
        assert service["networks"] == ["links"], "a generated learner must not reach the syncer directly"
        assert service["depends_on"]["syncer"]["condition"] == "service_healthy"
    yaml.safe_dump({"services": services})  # what the backend writes must be plain YAML


def test_per_learner_flags_only_extend_that_learners_command(tmp_path: Path) -> None:
    services = ComposeCluster(tmp_path, learners=3, learner_args={2: ["--speed", "0.25"]})._learner_overrides()
    assert list(services["services"]) == ["learner-2"]
    assert services["services"]["learner-2"] == {"command": [
        "trainer", "learner", "--learner", "2", "--connect", f"toxiproxy:{PROXY_BASE_PORT + 2}",
        "--run-dir", "/islands/run", "--key-file", "/run/secrets/islands_key_2", "--speed", "0.25"]}


def test_environment_carries_the_run_settings_and_a_private_secret(tmp_path: Path) -> None:
    cluster = ComposeCluster(tmp_path / "run", learners=2, mode="sync", trainer_args=["--sync-every", "10"])
    cluster.run_dir.mkdir(parents=True)
    env = cluster._compose_env()
    assert env["ISLANDS_SYNCER_ARGS"] == "--mode sync --task gpt --eval-data markov --sync-every 10"
    assert env["ISLANDS_LEARNER_ARGS"] == "--mode sync --task gpt --data markov --device auto"
    assert env["ISLANDS_TASK"] == "gpt" and env["ISLANDS_TASK_DIR"] == str(ROOT / "examples" / "tasks")
    assert env["ISLANDS_LEARNERS"] == "2" and env["ISLANDS_RUN_DIR"] == str(cluster.run_dir)
    secret = cluster.run_dir / "secret"
    assert env["ISLANDS_SECRET_FILE"] == str(secret) and secret.stat().st_mode & 0o077 == 0
    assert len(secret.read_text()) == 64
    assert 0 < int(env["TOXIPROXY_PORT"]) < 65536


def test_compose_gets_the_secrets_path_and_never_its_value(tmp_path: Path) -> None:
    """The value in the compose CLI's environment would reach every container that names
    the variable, and `docker inspect`; the containers read it from a compose secret."""
    cluster = ComposeCluster(tmp_path / "run", learners=2)
    cluster.run_dir.mkdir(parents=True)
    env = cluster._compose_env()
    value = (cluster.run_dir / "secret").read_text().strip()
    assert not [k for k, v in env.items() if value in v], "no variable may carry the secret"
    assert "ISLANDS_SECRET" not in env


def test_generated_learners_mount_only_their_own_key(tmp_path: Path) -> None:
    """Issue 27: learner N gets the secret islands_key_N, never the run's secret."""
    overrides = ComposeCluster(tmp_path, learners=5)._learner_overrides()
    assert sorted(overrides["services"]) == ["learner-4", "learner-5"]
    for name, service in overrides["services"].items():
        n = int(name.split("-")[1])
        assert service["secrets"] == [f"islands_key_{n}"], name
        assert service["command"][service["command"].index("--key-file") + 1] == f"/run/secrets/islands_key_{n}"
        assert "ISLANDS_SECRET_FILE" not in service["environment"], name
        assert "ISLANDS_SECRET" not in service["environment"], name
    assert overrides["secrets"] == {f"islands_key_{n}": {"file": f"${{ISLANDS_KEY_DIR:-./runs/compose/keys}}/learner-{n}.key"}
                                    for n in (4, 5)}


def test_the_environment_points_at_one_key_file_per_learner(tmp_path: Path) -> None:
    from trainer.keys import learner_key, load_key_file
    cluster = ComposeCluster(tmp_path / "run", learners=4)
    cluster.run_dir.mkdir(parents=True)
    env = cluster._compose_env()
    secret = (cluster.run_dir / "secret").read_bytes().strip()
    for n in (1, 2, 3, 4):
        path = Path(env["ISLANDS_KEY_DIR"]) / f"learner-{n}.key"
        assert load_key_file(path, n) == learner_key(secret, n) and path.stat().st_mode & 0o077 == 0


def test_the_syncer_scores_the_same_data_file_the_learners_train_on(tmp_path: Path) -> None:
    """A text file on the host is copied into the run dir, which the syncer mounts too."""
    text = tmp_path / "corpus.txt"
    text.write_text("hello islands " * 1000)
    cluster = ComposeCluster(tmp_path / "run", learners=2, data=str(text))
    cluster.run_dir.mkdir(parents=True)
    env = cluster._compose_env()
    assert "--eval-data /islands/run/data/corpus.txt" in env["ISLANDS_SYNCER_ARGS"]
    assert env["ISLANDS_LEARNER_ARGS"] == "--mode decoupled --task gpt --data /islands/run/data/corpus.txt --device auto"
    assert (cluster.run_dir / "data" / "corpus.txt").read_text() == text.read_text()


def test_a_task_file_is_mounted_with_its_folder_and_named_by_its_path_inside(tmp_path: Path) -> None:
    task = ROOT / "examples" / "tasks" / "digits.py"
    cluster = ComposeCluster(tmp_path / "run", learners=2, task=f"{task}:Digits", learner_args={2: ["--speed", "0.5"]})
    cluster.run_dir.mkdir(parents=True)
    env = cluster._compose_env()
    assert env["ISLANDS_TASK_DIR"] == str(task.parent) and env["ISLANDS_TASK"] == f"{TASK_MOUNT}/digits.py:Digits"
    assert env["ISLANDS_SYNCER_ARGS"] == f"--mode decoupled --task {TASK_MOUNT}/digits.py:Digits --eval-data markov"
    assert env["ISLANDS_LEARNER_ARGS"] == (f"--mode decoupled --task {TASK_MOUNT}/digits.py:Digits --data markov "
                                           "--device auto"), "learner-2's own flags go to its command alone"
    assert cluster.spec.task == f"{task}:Digits", "the spec (run.json) keeps the host's path"


def test_a_flag_value_with_spaces_is_refused_naming_trainer_args(tmp_path: Path) -> None:
    cluster = ComposeCluster(tmp_path, learners=2, trainer_args=["--data", "my file.txt"])
    with pytest.raises(ValueError, match="trainer_args: the compose backend passes flags split on spaces"):
        cluster._compose_env()


def test_a_data_file_on_the_host_is_copied_where_the_learners_mount_it(tmp_path: Path) -> None:
    text = tmp_path / "corpus.txt"
    text.write_text("hello islands\n" * 100)
    cluster = ComposeCluster(tmp_path / "run", learners=1, data=str(text))
    assert cluster._container_data() == "/islands/run/data/corpus.txt"
    assert (tmp_path / "run" / "data" / "corpus.txt").read_text() == text.read_text()
    assert ComposeCluster(tmp_path / "run2", data="markov:seed=3")._container_data() == "markov:seed=3"


def test_learners_must_be_positive(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="learners: must be >= 1"):
        ComposeCluster(tmp_path, learners=0)


def test_the_compose_command_can_be_named_and_projects_build_their_argv(monkeypatch: pytest.MonkeyPatch,
                                                                           tmp_path: Path) -> None:
    monkeypatch.setenv(COMPOSE_ENV, "docker compose")
    assert find_compose_command() == ["docker", "compose"]
    project = ComposeProject([tmp_path / "a.yaml", tmp_path / "b.yaml"], "p1", command=["docker-compose"])
    assert project.argv("up", "-d") == ["docker-compose", "-p", "p1", "-f", str(tmp_path / "a.yaml"),
                                        "-f", str(tmp_path / "b.yaml"), "up", "-d"]


HOLDER = r"""
import sys
from chaos.backends.compose import ComposeCluster
ComposeCluster(sys.argv[1]).claim_project()
print("held", flush=True)
sys.stdin.readline()
"""


def test_a_project_a_live_run_uses_is_refused_until_that_run_dies(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """start() takes `down -v` to what its project holds: two runs of the default project at
    once, the second took the first's cluster down. A crashed run's hold dies with it."""
    monkeypatch.setenv("ISLANDS_HOME", str(tmp_path / "home"))
    other = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path / "first")], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert other.stdout.readline().strip() == "held"
        second = ComposeCluster(tmp_path / "second")
        with pytest.raises(ClusterBusy, match=rf"'islands-chaos' is in use by another run \(pid {other.pid}, "
                                              rf"run dir {tmp_path / 'first'}\)"):
            second.claim_project()
        other.kill()
        other.wait(timeout=30)
        second.claim_project()  # the first run's controller is dead: its leftovers are ours to clean
        third = ComposeCluster(tmp_path / "third")
        with pytest.raises(ClusterBusy, match=rf"pid {os.getpid()}"):
            third.claim_project()
        second.stop()  # never started: stopping gives the project back
        third.claim_project()
        third.release_project()
    finally:
        other.kill()
        other.wait(timeout=30)


def test_a_compose_command_that_met_a_slow_engine_is_run_again(tmp_path: Path) -> None:
    """Issue 26, finding 4: at load 19 `docker-compose up -d` hit its 60 s HTTP read timeout
    and the replay failed before training. Compose now waits longer for each engine call
    (COMPOSE_HTTP_TIMEOUT) and a command that failed for a slow engine runs again with
    backoff; a real error is not retried."""
    from chaos.backends.compose_cli import ComposeError, ComposeProject

    calls = tmp_path / "calls"
    fake = tmp_path / "fake-compose"
    fake.write_text("#!/bin/sh\n"
                    f"echo \"$COMPOSE_HTTP_TIMEOUT $*\" >> {calls}\n"
                    f"n=$(wc -l < {calls})\n"
                    "case \"$*\" in *broken*) echo 'no such service: broken' >&2; exit 1;; esac\n"
                    "if [ \"$n\" -lt 3 ]; then echo \"ERROR: Read timed out. (read timeout=60)\" >&2; exit 1; fi\n"
                    "echo started\n")
    fake.chmod(0o755)
    (tmp_path / "compose.yaml").write_text("services: {}\n")
    project = ComposeProject([tmp_path / "compose.yaml"], "p", command=[str(fake)])
    done = project.run("up", "-d", timeout=60)
    assert done.stdout.strip() == "started" and project.attempts == 3
    assert all(line.startswith("300 ") for line in calls.read_text().splitlines()), calls.read_text()
    calls.write_text("x\nx\nx\n")
    with pytest.raises(ComposeError, match="no such service: broken"):
        project.run("up", "-d", "broken", timeout=60)
    assert project.attempts == 1
