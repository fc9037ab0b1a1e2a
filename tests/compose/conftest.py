"""The compose suite: `pytest --chaos-backend compose -m compose` with a Docker engine and
the islands image built (docker/build-image.sh). Without --chaos-backend compose every
test here is skipped by the plugin, with the reason."""
from __future__ import annotations

import pytest

from chaos.pytest_plugin import ClusterSettings

# The small model of the property suites: it learns within seconds, so a short run
# still has a final loss to judge.
FAST_TRAINER_ARGS = ("--n-layer", "1", "--n-embd", "32", "--n-head", "2", "--batch-size", "8", "--sync-every", "10")


@pytest.fixture(autouse=True)
def separate_project(monkeypatch: pytest.MonkeyPatch) -> None:
    """Keep the suite's containers apart from a cluster a developer has up by hand (while
    one runs, the backend refuses to start beside it: chaos/backends/compose_guard.py)."""
    monkeypatch.setenv("ISLANDS_COMPOSE_PROJECT", "islands-test")


@pytest.fixture
def cluster_settings() -> ClusterSettings:
    return ClusterSettings(learners=3, trainer_args=FAST_TRAINER_ARGS)
