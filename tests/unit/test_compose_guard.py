"""`--backend compose` refuses to start beside a cluster brought up by hand from the same
compose file, naming it and how to stop it. Fake containers: no Docker engine needed."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest

from chaos.backends.compose import ComposeCluster
from chaos.backends.compose_guard import (ALONGSIDE_ENV, ClusterBusy, config_files, other_projects,
                                          refuse_if_busy)

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "compose.yaml"


@dataclass
class FakeContainer:
    name: str
    project: str
    files: str = "compose.yaml,compose.islands-toxiproxy.yaml"  # as v1 records them: relative
    working_dir: str = str(ROOT)
    status: str = "running"
    labels: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.labels = {"com.docker.compose.project": self.project,
                       "com.docker.compose.project.config_files": self.files,
                       "com.docker.compose.project.working_dir": self.working_dir}


class FakeDocker:
    def __init__(self, containers: list[FakeContainer]) -> None:
        self.containers = self
        self._all = containers
        self.filters: list[dict] = []

    def list(self, all: bool = False, filters: dict | None = None) -> list[FakeContainer]:
        self.filters.append(filters or {})
        return self._all


HAND_STARTED = [FakeContainer("main_syncer_1", "main"), FakeContainer("main_learner-1_1", "main"),
                FakeContainer("main_toxiproxy_1", "main")]


def test_config_files_are_made_absolute_against_the_working_dir() -> None:
    assert config_files(HAND_STARTED[0].labels) == [COMPOSE, ROOT / "compose.islands-toxiproxy.yaml"]
    v2 = {"com.docker.compose.project.config_files": f"{COMPOSE}", "com.docker.compose.project.working_dir": "/"}
    assert config_files(v2) == [COMPOSE]


def test_a_hand_started_cluster_is_found_and_ours_or_others_are_not() -> None:
    others = [FakeContainer("islands-chaos_syncer_1", "islands-chaos"),  # our own project: cleaned, not refused
              FakeContainer("x_syncer_1", "x", files="/elsewhere/compose.yaml"),  # another compose file
              FakeContainer("old_syncer_1", "old", status="exited")]  # not running
    found = other_projects(HAND_STARTED + others, COMPOSE, "islands-chaos")
    assert [(p.name, sorted(p.containers)) for p in found] == [
        ("main", ["main_learner-1_1", "main_syncer_1", "main_toxiproxy_1"])]


def test_the_refusal_names_what_runs_and_the_command_that_stops_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ALONGSIDE_ENV, raising=False)
    docker = FakeDocker(HAND_STARTED)
    with pytest.raises(ClusterBusy) as info:
        refuse_if_busy(docker, COMPOSE, "islands-chaos", ["docker-compose"])
    message = str(info.value)
    assert "compose project 'main' is running this cluster" in message
    assert "main_syncer_1" in message and "main_learner-1_1" in message
    assert (f"`docker-compose -p main -f {COMPOSE} -f {ROOT / 'compose.islands-toxiproxy.yaml'} down -v -t 2`"
            in message)
    assert ALONGSIDE_ENV in message
    assert docker.filters == [{"label": ["com.docker.compose.project.config_files"]}]
    refuse_if_busy(FakeDocker([]), COMPOSE, "islands-chaos", ["docker-compose"])  # nothing running: no error
    monkeypatch.setenv(ALONGSIDE_ENV, "1")
    refuse_if_busy(docker, COMPOSE, "islands-chaos", ["docker-compose"])  # asked to run beside it


def test_the_backend_refuses_in_preflight_before_anything_is_created(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ALONGSIDE_ENV, raising=False)
    monkeypatch.setenv("ISLANDS_COMPOSE", "docker-compose")
    cluster = ComposeCluster(tmp_path / "run", learners=3)
    cluster._docker = FakeDocker(HAND_STARTED)
    cluster._docker.images = type("Images", (), {"get": staticmethod(lambda name: object())})()
    with pytest.raises(ClusterBusy, match="compose project 'main'"):
        cluster.preflight()
    assert not (tmp_path / "run").exists()
