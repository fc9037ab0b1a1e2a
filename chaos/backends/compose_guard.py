"""Refuse to start the compose backend's project beside another one of the same cluster.

A cluster brought up by hand (`docker-compose up -d` in the checkout: project named after
the directory) keeps training while `--backend compose` brings up its own project: the
two share the machine's cores, so the run's timings, goodput and verdicts measure both.
The backend therefore refuses, naming what is running and the command that stops it.
Using the running cluster instead is not an option: its secret, run directory, flags and
learner count are not the run's.
"""
from __future__ import annotations

import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

ALONGSIDE_ENV = "ISLANDS_COMPOSE_ALONGSIDE"  # "1": run beside another project anyway
PROJECT_LABEL = "com.docker.compose.project"
CONFIG_FILES_LABEL = "com.docker.compose.project.config_files"
WORKING_DIR_LABEL = "com.docker.compose.project.working_dir"
LIVE_STATES = ("running", "paused", "restarting")


class ClusterBusy(RuntimeError):
    """Another compose project runs this cluster; the message says which and how to stop it."""


@dataclass
class OtherProject:
    name: str
    files: list[Path]
    containers: list[str] = field(default_factory=list)


def config_files(labels: dict[str, str]) -> list[Path]:
    """The compose files a container was created from, absolute (v1 records them as given)."""
    base = Path(labels.get(WORKING_DIR_LABEL) or ".")
    return [(base / f).resolve() if not Path(f).is_absolute() else Path(f).resolve()
            for f in (labels.get(CONFIG_FILES_LABEL) or "").split(",") if f]


def other_projects(containers: Iterable, compose_file: Path, own_project: str) -> list[OtherProject]:
    """Live containers of projects other than `own_project` created from `compose_file`."""
    target = compose_file.resolve()
    found: dict[str, OtherProject] = {}
    for c in containers:
        labels = c.labels or {}
        project = labels.get(PROJECT_LABEL)
        if not project or project == own_project or c.status not in LIVE_STATES:
            continue
        files = config_files(labels)
        if target not in files:
            continue
        found.setdefault(project, OtherProject(project, files)).containers.append(c.name)
    return sorted(found.values(), key=lambda p: p.name)


def busy_message(projects: list[OtherProject], compose_command: list[str]) -> str:
    parts = []
    for p in projects:
        down = shlex.join([*compose_command, "-p", p.name, *(a for f in p.files for a in ("-f", str(f))),
                           "down", "-v", "-t", "2"])
        parts.append(f"compose project {p.name!r} is running this cluster from {p.files[0]} "
                     f"(containers: {', '.join(sorted(p.containers))}); stop it with `{down}`")
    return ("; ".join(parts) + ". A run beside it would share the cores with a cluster that keeps training, "
            f"and judge both; set {ALONGSIDE_ENV}=1 to run beside it anyway")


def refuse_if_busy(docker_client, compose_file: Path, own_project: str, compose_command: list[str]) -> None:
    """Raise ClusterBusy when another project of `compose_file` is live (unless $ISLANDS_COMPOSE_ALONGSIDE=1)."""
    if os.environ.get(ALONGSIDE_ENV) == "1":
        return
    live = docker_client.containers.list(filters={"label": [CONFIG_FILES_LABEL]})
    projects = other_projects(live, compose_file, own_project)
    if projects:
        raise ClusterBusy(busy_message(projects, compose_command))
