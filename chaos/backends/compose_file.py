"""Reading compose.yaml: its services, and the learner services a larger cluster adds.

compose.yaml is the one source of truth for what a container runs. The compose backend
overrides it for learners beyond the three it defines; the swarm backend renders a stack
file from it (stack.py). Both patch a learner's command the same way, here.
"""
from __future__ import annotations

from pathlib import Path

import yaml

PROXY_BASE_PORT = 21000  # learner-N's proxy listens on PROXY_BASE_PORT + N (docker/toxiproxy.json)
SYNCER_UPSTREAM = "syncer:7000"


def load_services(*files: Path) -> dict[str, dict]:
    """The services of `files` merged the way compose merges an override: per service, per key."""
    services: dict[str, dict] = {}
    for path in files:
        for name, svc in (yaml.safe_load(Path(path).read_text()) or {}).get("services", {}).items():
            merged = dict(services.get(name, {}))
            for key, value in (svc or {}).items():  # a mapping (healthcheck, environment) merges by key
                old = merged.get(key)
                merged[key] = {**old, **value} if isinstance(old, dict) and isinstance(value, dict) else value
            services[name] = merged
    return services


def defined_learners(services: dict[str, dict]) -> dict[int, dict]:
    """learner-N services by N."""
    return {int(name.split("-", 1)[1]): svc for name, svc in services.items()
            if name.startswith("learner-") and name.split("-", 1)[1].isdigit()}


def learner_command(base: list, learner: int, extra: list[str] | tuple[str, ...] = ()) -> list[str]:
    """`base` (a learner service's command) made learner N's: its id, its own proxy, its own flags."""
    command = [str(a) for a in base]
    command[command.index("--learner") + 1] = str(learner)
    command[command.index("--connect") + 1] = f"toxiproxy:{PROXY_BASE_PORT + learner}"
    return command + [str(a) for a in extra]
