"""compose.yaml and its Toxiproxy config, read as data: the isolation rules hold without Docker."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = yaml.safe_load((ROOT / "compose.yaml").read_text())
OVERRIDE = yaml.safe_load((ROOT / "compose.islands-toxiproxy.yaml").read_text())
PROXIES = json.loads((ROOT / "docker" / "toxiproxy.json").read_text())
SERVICES = COMPOSE["services"]
LEARNERS = sorted(name for name in SERVICES if name.startswith("learner-"))


def test_at_least_three_learners_a_syncer_and_toxiproxy() -> None:
    assert {"syncer", "toxiproxy"} <= set(SERVICES) and len(LEARNERS) >= 3


def test_no_port_is_published_beyond_loopback() -> None:
    for name, service in SERVICES.items():
        for port in service.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), f"{name} publishes {port} beyond 127.0.0.1"
    published = [name for name, s in SERVICES.items() if s.get("ports")]
    assert published == ["toxiproxy"], "only the Toxiproxy API is published"


def test_learners_reach_the_syncer_only_through_their_proxy() -> None:
    networks = COMPOSE["networks"]
    assert networks["links"].get("internal") and networks["backplane"].get("internal")
    assert SERVICES["syncer"]["networks"] == ["backplane"]
    assert set(SERVICES["toxiproxy"]["networks"]) >= {"links", "backplane"}
    by_name = {p["name"]: p for p in PROXIES}
    for name in LEARNERS:
        service = SERVICES[name]
        assert service["networks"] == ["links"], f"{name} must sit on the links network only"
        command = service["command"]
        host, port = command[command.index("--connect") + 1].split(":")
        assert host == "toxiproxy"
        proxy = by_name[name]
        assert proxy["listen"].endswith(f":{port}") and proxy["upstream"] == "syncer:7000"
        assert command[command.index("--learner") + 1] == name.split("-")[1]


def test_stateful_syncer_healthchecks_and_dependencies() -> None:
    assert "syncer-state" in COMPOSE["volumes"]
    assert any(v.startswith("syncer-state:") for v in SERVICES["syncer"]["volumes"])
    for name in ("syncer", "toxiproxy"):
        assert SERVICES[name]["healthcheck"]["test"], name
    for name in LEARNERS:
        deps = SERVICES[name]["depends_on"]
        assert deps["syncer"]["condition"] == deps["toxiproxy"]["condition"] == "service_healthy"
    for name, service in SERVICES.items():
        assert service.get("init") is True, f"{name}: init: true forwards signals and reaps zombies"


def test_the_real_toxiproxy_image_and_our_server_take_the_same_command() -> None:
    toxiproxy = SERVICES["toxiproxy"]
    assert toxiproxy["image"] == "${TOXIPROXY_IMAGE:-ghcr.io/shopify/toxiproxy:2.12.0}"
    assert "-host=0.0.0.0" in toxiproxy["command"]
    ours = OVERRIDE["services"]["toxiproxy"]
    assert "command" not in ours, "the override swaps image and entrypoint, never the real command line"
    assert ours["entrypoint"][-2:] == ["chaos", "toxiproxy"]


def _compose_command(version: str) -> list[str]:
    if version == "v1":
        if shutil.which("docker-compose") is None:
            pytest.skip("docker-compose (v1) is not installed")
        return ["docker-compose"]
    probe = subprocess.run(["docker", "compose", "version"], capture_output=True, timeout=20) \
        if shutil.which("docker") else None
    if probe is None or probe.returncode != 0:
        pytest.skip("docker compose (v2) is not installed")
    return ["docker", "compose"]


@pytest.mark.parametrize("version", ["v1", "v2"])
@pytest.mark.parametrize("files", [["compose.yaml"], ["compose.yaml", "compose.islands-toxiproxy.yaml"]])
def test_docker_compose_accepts_the_files(version: str, files: list[str]) -> None:
    argv = [*_compose_command(version), *[a for f in files for a in ("-f", f)], "config", "-q"]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


# --------------------------------------------------------------------------- the header's commands

HEADER = [line for line in (ROOT / "compose.yaml").read_text().splitlines()[:60] if line.startswith("#")]
COMMAND = re.compile(r"^#\s+(docker-compose|docker compose)\s+(.*?)\s*(#.*)?$")


def _header_commands() -> list[tuple[str, str]]:
    return [(m.group(1), m.group(2)) for line in HEADER if (m := COMMAND.match(line))]


def test_the_header_leads_with_the_command_that_works_offline() -> None:
    """The real Toxiproxy image must be pulled; the override needs only the islands image,
    which docker/build-image.sh builds without pulling anything."""
    ups = [(tool, args) for tool, args in _header_commands() if re.search(r"\bup\b", args)]
    assert ups, "the header shows how to bring the cluster up"
    assert "-f compose.yaml -f compose.islands-toxiproxy.yaml" in ups[0][1], ups[0]
    offline = {tool for tool, args in ups if "compose.islands-toxiproxy.yaml" in args}
    assert offline == {"docker-compose", "docker compose"}, "both compose v1 and v2 are shown"
    text = "\n".join(HEADER)
    assert "docker/build-image.sh" in text
    plain = [args for _, args in ups if "compose.islands-toxiproxy.yaml" not in args]
    assert plain and "already present" in text, "plain `up` is shown only with what it needs"


def test_every_file_the_header_names_exists() -> None:
    for _, args in _header_commands():
        words = args.split()
        while words[:1] == ["-f"]:  # the global -f flags, before the subcommand (`logs -f` is follow)
            assert (ROOT / words[1]).is_file(), f"{args}: no {words[1]}"
            words = words[2:]


def test_events_reach_the_container_logs() -> None:
    for name in ["syncer", *LEARNERS]:
        env = SERVICES[name]["environment"]
        assert env.get("ISLANDS_EVENTS_TO_STDERR") == "${ISLANDS_EVENTS_TO_STDERR:-1}", name


# --------------------------------------------------------------------------- the shared secret

SECRET_NAME = "islands_secret"
SECRET_MOUNT = f"/run/secrets/{SECRET_NAME}"
SECRET_VARIABLE = re.compile(r"\$\{?ISLANDS_SECRET(?!_FILE)\b")
ISLANDS_SERVICES = ["syncer", *LEARNERS]


def _environment(service: dict) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):  # compose also takes KEY=VALUE lines
        env = dict(item.split("=", 1) if "=" in item else (item, "") for item in env)
    return {str(k): "" if v is None else str(v) for k, v in env.items()}


def test_no_environment_carries_the_secret() -> None:
    """`docker inspect` shows every container's environment to whoever may talk to the engine."""
    for name, service in SERVICES.items():
        env = _environment(service)
        assert "ISLANDS_SECRET" not in env, f"{name}: the secret must not be an environment variable"
        leaking = {k: v for k, v in env.items() if SECRET_VARIABLE.search(v)}
        assert not leaking, f"{name}: {leaking} would put the secret in the environment"


def test_the_secret_reaches_the_syncer_alone_and_each_learner_only_its_own_key() -> None:
    """Issue 27: a learner holding the run secret (or another's key) could speak as any learner."""
    assert COMPOSE["secrets"][SECRET_NAME] == {"file": "${ISLANDS_SECRET_FILE:-./runs/compose/secret}"}
    assert SERVICES["syncer"]["secrets"] == [SECRET_NAME]
    assert _environment(SERVICES["syncer"])["ISLANDS_SECRET_FILE"] == SECRET_MOUNT
    for name in LEARNERS:
        n = int(name.split("-")[1])
        service = SERVICES[name]
        assert service.get("secrets") == [f"islands_key_{n}"], f"{name} must mount its own key and nothing else"
        assert COMPOSE["secrets"][f"islands_key_{n}"] == {"file": f"${{ISLANDS_KEY_DIR:-./runs/compose/keys}}/learner-{n}.key"}
        command = service["command"]
        assert command[command.index("--key-file") + 1] == f"/run/secrets/islands_key_{n}", name
        assert "ISLANDS_SECRET_FILE" not in _environment(service), f"{name} must not be pointed at the run secret"
    assert "secrets" not in SERVICES["toxiproxy"], "the proxy never needs the secret"


def _rendered(version: str, files: list[str], env: dict[str, str]) -> str:
    argv = [*_compose_command(version), *[a for f in files for a in ("-f", f)], "config"]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize("version", ["v1", "v2"])
@pytest.mark.parametrize("files", [["compose.yaml"], ["compose.yaml", "compose.islands-toxiproxy.yaml"]])
def test_the_rendered_config_mounts_the_secret_and_never_shows_it(version: str, files: list[str],
                                                                 tmp_path: Path) -> None:
    """What compose itself makes of the files: even with the value exported as ISLANDS_SECRET
    (the old way), it appears nowhere in the config; the file is a compose secret."""
    value = "f00d" * 16
    secret = tmp_path / "secret"
    secret.write_text(value)
    from trainer.keys import write_key_files
    keys = write_key_files(tmp_path / "keys", value.encode(), len(LEARNERS))
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("ISLANDS_")},
           "ISLANDS_SECRET": value, "ISLANDS_SECRET_FILE": str(secret), "ISLANDS_KEY_DIR": str(tmp_path / "keys")}
    text = _rendered(version, files, env)
    assert value not in text
    config = yaml.safe_load(text)
    assert Path(config["secrets"][SECRET_NAME]["file"]) == secret
    for name in ISLANDS_SERVICES:
        service = config["services"][name]
        mounted = [s if isinstance(s, str) else s["source"] for s in service["secrets"]]
        if name == "syncer":
            assert mounted == [SECRET_NAME], name
            assert _environment(service)["ISLANDS_SECRET_FILE"] == SECRET_MOUNT, name
        else:
            n = int(name.split("-")[1])
            assert mounted == [f"islands_key_{n}"], name
            assert Path(config["secrets"][f"islands_key_{n}"]["file"]) == keys[n]
        assert "ISLANDS_SECRET" not in _environment(service), name
