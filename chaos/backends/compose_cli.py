"""Finding and running docker compose: v2 (`docker compose`) or v1 (`docker-compose` 1.29).

Only lifecycle goes through the CLI (up, stop, down): it knows the project's files,
dependencies and healthchecks. Faults go through the Docker SDK (see compose.py).
"""
from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from tenacity import Retrying, retry_if_exception, stop_after_attempt, wait_exponential_jitter

import chaos

COMPOSE_ENV = "ISLANDS_COMPOSE"          # e.g. "docker compose" or "docker-compose"
COMPOSE_FILE_ENV = "ISLANDS_COMPOSE_FILE"
DEFAULT_TIMEOUT = 300.0
# A loaded engine: compose v1's HTTP read timeout of 60 s expired creating containers at a
# load average of 19. What compose waits for one engine call, and how often a command that
# failed for a slow engine is run again.
ENGINE_HTTP_TIMEOUT = 300
ENGINE_RETRIES = 3
SLOW_ENGINE = ("Read timed out", "read timeout", "timed out", "Timeout", "500 Server Error", "502 Server Error",
               "503 Server Error", "Connection aborted", "connection refused", "Cannot connect to the Docker daemon")


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
    attempts: int = 0  # of the last command run: more than 1 when a slow engine made it retry

    def argv(self, *args: str) -> list[str]:
        out = [*self.command, "-p", self.project]
        for f in self.files:
            out += ["-f", str(f)]
        return out + list(args)

    def run(self, *args: str, timeout: float = DEFAULT_TIMEOUT, check: bool = True,
            retries: int = ENGINE_RETRIES) -> subprocess.CompletedProcess:
        """Run one compose command, waiting for a slow engine (run_engine_cli)."""
        try:
            done, self.attempts = run_engine_cli(self.argv(*args), self.files[0].parent, self.env, timeout, check,
                                                 retries)
        except ComposeError as exc:
            self.attempts = getattr(exc, "attempts", 1)
            raise
        return done


def run_engine_cli(argv: list[str], cwd: Path, env: dict[str, str], timeout: float, check: bool = True,
                   retries: int = ENGINE_RETRIES) -> tuple[subprocess.CompletedProcess, int]:
    """Run a docker or compose command and how many attempts it took. A slow engine is
    waited for: compose's own HTTP timeout is raised (COMPOSE_HTTP_TIMEOUT,
    DOCKER_CLIENT_TIMEOUT: v1 gave up after 60 s at load 19, before the cluster had
    started), and a command that failed because the engine was slow (a read timeout, a
    5xx, a refused socket) is run again with backoff and jitter, `retries` times at most and
    within `timeout` in all: up, stop, down and stack deploy are idempotent. A failure
    raises ComposeError with the command's last lines."""
    env = {**os.environ, "COMPOSE_HTTP_TIMEOUT": str(ENGINE_HTTP_TIMEOUT),
           "DOCKER_CLIENT_TIMEOUT": str(ENGINE_HTTP_TIMEOUT), **env}
    deadline = time.monotonic() + timeout
    attempts = 0
    for attempt in Retrying(stop=stop_after_attempt(retries + 1),
                            wait=wait_exponential_jitter(multiplier=1.0, max=15.0, jitter=1.0),
                            retry=retry_if_exception(lambda e: isinstance(e, _EngineSlow)
                                                     and time.monotonic() < deadline - 1.0), reraise=True):
        with attempt:
            attempts += 1
            try:
                done = _once(argv, cwd, env, max(1.0, deadline - time.monotonic()), check)
            except ComposeError as exc:
                exc.attempts = attempts  # type: ignore[attr-defined]
                raise
    return done, attempts


def _once(argv: list[str], cwd: Path, env: dict[str, str], timeout: float, check: bool) -> subprocess.CompletedProcess:
    try:
        done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        raise ComposeError(f"`{shlex.join(argv)}` did not finish within {timeout:.0f}s") from exc
    if check and done.returncode != 0:
        output = done.stdout + done.stderr
        tail = "\n".join(output.strip().splitlines()[-25:])
        cls = _EngineSlow if any(p in output for p in SLOW_ENGINE) else ComposeError
        raise cls(f"`{shlex.join(argv)}` exited with {done.returncode}:\n{tail}")
    return done


class _EngineSlow(ComposeError):
    """A compose command that failed because the engine answered too slowly: worth a retry."""
