"""The swarm suite: `pytest tests/swarm --chaos-backend swarm -m swarm` with a Docker engine
that is a swarm manager (`docker swarm init --advertise-addr 127.0.0.1`) and the islands
image built (docker/build-image.sh). Without --chaos-backend swarm every test here is
skipped by the plugin, with the reason."""
from __future__ import annotations

import pytest

from chaos.pytest_plugin import ClusterSettings

from ..compose.conftest import FAST_TRAINER_ARGS

__all__ = ["FAST_TRAINER_ARGS"]


@pytest.fixture(autouse=True)
def separate_stack(monkeypatch: pytest.MonkeyPatch) -> None:
    """Keep the suite's stack apart from one a developer deployed by hand."""
    monkeypatch.setenv("ISLANDS_SWARM_STACK", "islands-test")


@pytest.fixture
def cluster_settings() -> ClusterSettings:
    return ClusterSettings(learners=3, trainer_args=FAST_TRAINER_ARGS)
