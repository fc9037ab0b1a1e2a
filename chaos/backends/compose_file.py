"""Reading compose.yaml: its services, and the learner services a larger cluster adds.

compose.yaml is the one source of truth for what a container runs. The compose backend
overrides it for learners beyond the three it defines; the swarm backend renders a stack
file from it (stack.py). Both patch a learner's command and key the same way, here: learner
N mounts only the secret `islands_key_N` (its own key file, trainer/keys.py), never the
run's secret, which only the syncer mounts.
"""
from __future__ import annotations

from pathlib import Path

import yaml

PROXY_BASE_PORT = 21000  # learner-N's proxy listens on PROXY_BASE_PORT + N (docker/toxiproxy.json)
SYNCER_UPSTREAM = "syncer:7000"
KEY_DIR_ENV = "ISLANDS_KEY_DIR"            # host folder of learner-N.key files (trainer.keys)
DEFAULT_KEY_DIR = "./runs/compose/keys"


def key_secret(learner: int) -> str:
    """The compose/Docker secret that holds learner N's key, and only it."""
    return f"islands_key_{learner}"


def key_mount(learner: int) -> str:
    return f"/run/secrets/{key_secret(learner)}"


def key_secrets(learners: range | list[int]) -> dict[str, dict]:
    """Top-level `secrets:` entries for these learners' key files (variables resolved by compose)."""
    return {key_secret(n): {"file": f"${{{KEY_DIR_ENV}:-{DEFAULT_KEY_DIR}}}/learner-{n}.key"} for n in learners}


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
    if "--key-file" in command:
        command[command.index("--key-file") + 1] = key_mount(learner)
    return command + [str(a) for a in extra]


def learner_service(base: dict, learner: int, extra: list[str] | tuple[str, ...] = ()) -> dict:
    """`base` (a learner service) made learner N's: its command, and its own key as its one secret."""
    return {**base, "command": learner_command(base["command"], learner, extra), "secrets": [key_secret(learner)]}
