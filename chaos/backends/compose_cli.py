"""Finding and running docker compose: v2 (`docker compose`) or v1 (`docker-compose` 1.29).

Only lifecycle goes through the CLI (up, stop, down): it knows the project's files,
dependencies and healthchecks. Faults go through the Docker SDK (see compose.py).
"""
from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import chaos

COMPOSE_ENV = "ISLANDS_COMPOSE"          # e.g. "docker compose" or "docker-compose"
COMPOSE_FILE_ENV = "ISLANDS_COMPOSE_FILE"
DEFAULT_TIMEOUT = 300.0


class ComposeError(RuntimeError):
    """A compose command failed or could not run; the message holds its output's tail."""


def find_compose_command() -> list[str]:
    """$ISLANDS_COMPOSE, else `docker compose` (v2) if it answers, else `docker-compose` (v1)."""
    override = os.environ.get(COMPOSE_ENV)
    if override:
        return shlex.split(override)
    if shutil.which("docker"):
        try:
            probe = subprocess.run(["docker", "compose", "version"], capture_output=True, timeout=20)
            if probe.returncode == 0:
                return ["docker", "compose"]
        except (OSError, subprocess.TimeoutExpired):
            pass
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    raise ComposeError("neither `docker compose` (v2) nor `docker-compose` (v1) was found; "
                       f"install one, or name it in ${COMPOSE_ENV}")


def find_compose_file() -> Path:
    """$ISLANDS_COMPOSE_FILE, else compose.yaml beside the installed `chaos` package (a checkout)."""
    override = os.environ.get(COMPOSE_FILE_ENV)
    path = Path(override) if override else Path(chaos.__file__).resolve().parent.parent / "compose.yaml"
    if not path.is_file():
        raise ComposeError(f"{path} not found: run from an Islands checkout or set ${COMPOSE_FILE_ENV}")
    return path


@dataclass
class ComposeProject:
    """One compose project: its files, its name and the environment its files read."""

    files: list[Path]
    project: str
    env: dict[str, str] = field(default_factory=dict)
    command: list[str] = field(default_factory=find_compose_command)

    def argv(self, *args: str) -> list[str]:
        out = [*self.command, "-p", self.project]
        for f in self.files:
            out += ["-f", str(f)]
        return out + list(args)

    def run(self, *args: str, timeout: float = DEFAULT_TIMEOUT, check: bool = True) -> subprocess.CompletedProcess:
        argv = self.argv(*args)
        try:
            done = subprocess.run(argv, cwd=self.files[0].parent, env={**os.environ, **self.env},
                                  capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            raise ComposeError(f"`{shlex.join(argv)}` did not finish within {timeout:.0f}s") from exc
        if check and done.returncode != 0:
            tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-25:])
            raise ComposeError(f"`{shlex.join(argv)}` exited with {done.returncode}:\n{tail}")
        return done
