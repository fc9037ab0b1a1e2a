"""The Docker Swarm stack file, rendered from compose.yaml.

Why a rendered file and not compose.yaml itself: `docker stack deploy` reads the compose
file format 3, whose `depends_on` is a plain list, while compose (v1 and v2) needs the
`condition: service_healthy` form to start learners after a listening syncer; and a
Swarm service cannot publish a port on 127.0.0.1 only. So compose.yaml stays the one
source of truth for what each container runs (image, command, environment, mounts,
networks, the secret) and this module adds what Swarm alone needs:

- `deploy`: a restart policy (Swarm, not the controller, brings a killed task back),
  placement constraints (the syncer and its proxy on the node that holds the state volume,
  the learners on nodes labelled for them);
- overlay networks; `control` is attachable, so the controller's API gateway (a plain
  container publishing on 127.0.0.1) can reach the proxy's API;
- the proxy's config file as a Swarm config, not a bind mount of the checkout;
- `endpoint_mode: dnsrr`: a service's name resolves to its task's address. The default,
  a virtual IP, needs the kernel's IPVS, which many hosts (this one, CI's) lack; without
  it every connection to a virtual IP fails with "no route to host";
- no health checks on the syncer and learners: a paused container fails its probe, and
  Swarm replaces an unhealthy task, which would turn a pause into a kill;
- one service per learner, as many as the run asks for;
- no directory shared between nodes: a task writes its events into its node's own volume
  `run` (mounted where compose bind-mounts the run dir), which the controller copies out
  through each node's engine (collect.py); a data file goes to every node as a Swarm
  config, and the task folder is mounted only for a task of the user's (the image holds
  the built-in ones);
- each node's clock: a task names its node ($ISLANDS_HOST, Swarm's {{.Node.Hostname}}) and
  reads the node's clock file (HOST_CLOCK_DIR on the node, bind-mounted read-only; none
  there: the kernel's clock), and a global `clock` service answers the controller's clock
  probes on every node, on a UDP port published on that node alone (mode host). Nodes are
  separate machines whose clocks disagree; the controller places every event on its own
  timeline through those probes (chaos/timeline.py).

`python -m chaos stack` prints it for a deployment by hand.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from .compose_file import defined_learners, key_secrets, learner_service, load_services

STACK_FORMAT = "3.8"  # the newest format the Debian docker.io 20.10 client reads as well
RESTART_DELAY = "2s"
SYNCER_LABEL = "islands.syncer"       # the node that holds the syncer's state volume
LEARNERS_LABEL = "islands.learners"   # nodes learners may run on
DROPPED_KEYS = ("depends_on", "ports", "container_name", "build")
PROXY_CONFIG = "toxiproxy_config"
PROXY_CONFIG_TARGET = "/config/toxiproxy.json"
# On every node: the node's clock (clock.json, trainer/clock.py's host clock file), if any.
HOST_CLOCK_DIR = "/var/lib/islands/host-clock"
HOST_CLOCK_TARGET = "/islands/host-clock"
CLOCK_SERVICE = "clock"
CLOCK_PORT = 7071  # UDP, published on each node (mode host) for the controller's probes
NODE_NAME = "{{.Node.Hostname}}"
RUN_VOLUME = "run"            # each node's own: where its tasks write their events
RUN_TARGET = "/islands/run"
TASK_TARGET = "/islands/task"
DATA_CONFIG = "islands_data"
DATA_TARGET = "/islands/data"


@dataclass(frozen=True)
class Placement:
    """Where Swarm may run each role, as service constraints."""

    syncer: tuple[str, ...] = (f"node.labels.{SYNCER_LABEL} == true",)
    learners: tuple[str, ...] = ()
    preferences: tuple[str, ...] = field(default=())  # e.g. spread over node.labels.zone


def _deploy(constraints: tuple[str, ...], preferences: tuple[str, ...] = ()) -> dict:
    deploy: dict = {"replicas": 1, "endpoint_mode": "dnsrr",
                    "restart_policy": {"condition": "any", "delay": RESTART_DELAY}}
    placement: dict = {}
    if constraints:
        placement["constraints"] = list(constraints)
    if preferences:
        placement["preferences"] = [{"spread": p} for p in preferences]
    if placement:
        deploy["placement"] = placement
    return deploy


def _swarm_service(svc: dict, deploy: dict, health: bool) -> dict:
    out = {k: v for k, v in svc.items() if k not in DROPPED_KEYS}
    if not health:
        out["healthcheck"] = {"disable": True}
    out["deploy"] = deploy
    return out


def _target_of(volume: object) -> str | None:
    """The container path of a short-syntax volume ("SOURCE:TARGET[:MODE]"; a ${VAR:-default}
    source holds a colon of its own)."""
    if not isinstance(volume, str):
        return None
    parts = re.sub(r"\$\{[^}]*\}", "VAR", volume).split(":")
    return parts[1] if len(parts) >= 2 else None


def _own_volumes(svc: dict, task_mount: bool, data_file: Path | None) -> dict:
    """`svc` writing into its node's run volume instead of a run dir bind-mounted from the
    controller's machine; the task folder only when the task is the user's; the data file
    as a config."""
    out = dict(svc)
    volumes = []
    for volume in svc.get("volumes", []):
        target = _target_of(volume)
        if target == RUN_TARGET:
            volumes.append(f"{RUN_VOLUME}:{RUN_TARGET}")
        elif target == TASK_TARGET and not task_mount:
            continue
        else:
            volumes.append(volume)
    out["volumes"] = volumes
    if data_file is not None:
        out["configs"] = [*svc.get("configs", []), {"source": DATA_CONFIG, "target": f"{DATA_TARGET}/{data_file.name}"}]
    return out


def _on_node_clock(svc: dict) -> dict:
    """`svc` naming its node and reading the node's clock (see the module's docstring)."""
    from trainer.clock import HOST_CLOCK_ENV, HOST_ENV
    env = svc.get("environment") or {}
    if isinstance(env, list):  # KEY=VALUE items
        env = dict(item.split("=", 1) if "=" in item else (item, "") for item in env)
    out = dict(svc)
    out["environment"] = {**env, HOST_ENV: NODE_NAME, HOST_CLOCK_ENV: f"{HOST_CLOCK_TARGET}/clock.json"}
    out["volumes"] = [*svc.get("volumes", []), {"type": "bind", "source": HOST_CLOCK_DIR,
                                                 "target": HOST_CLOCK_TARGET, "read_only": True}]
    return out


def _clock_service(image: str) -> dict:
    """The clock probes' responder, one task per node, reading the node's clock."""
    svc = _on_node_clock({
        "image": image, "init": True,
        "command": ["chaos.clock_probe", "serve", "--bind", "0.0.0.0", "--port", str(CLOCK_PORT)],
        # The controller reads the node's evidence through this task (collect.py).
        "volumes": [f"{RUN_VOLUME}:{RUN_TARGET}:ro"]})
    svc["ports"] = [{"target": CLOCK_PORT, "published": CLOCK_PORT, "protocol": "udp", "mode": "host"}]
    svc["deploy"] = {"mode": "global", "restart_policy": {"condition": "any", "delay": RESTART_DELAY}}
    return svc


def _proxy_service(svc: dict, deploy: dict, compose_dir: Path) -> tuple[dict, dict]:
    """The proxy's service, its bind-mounted config turned into a Swarm config; and the config."""
    out = _swarm_service(svc, deploy, health=True)
    configs: dict = {}
    mounts = []
    for volume in out.get("volumes", []):
        source, _, rest = str(volume).partition(":")
        if rest.split(":", 1)[0] == PROXY_CONFIG_TARGET:
            configs[PROXY_CONFIG] = {"file": str((compose_dir / source).resolve())}
            continue
        mounts.append(volume)
    if configs:
        out["configs"] = [{"source": PROXY_CONFIG, "target": PROXY_CONFIG_TARGET}]
    if mounts:
        out["volumes"] = mounts
    else:
        out.pop("volumes", None)
    return out, configs


def render_stack(compose_files: list[Path], learners: int, learner_args: dict[int, tuple[str, ...]] | None = None,
                 placement: Placement = Placement(), task_mount: bool = True, data_file: Path | None = None) -> dict:
    """The stack file for `learners` learners, from compose.yaml (and its override files).
    `task_mount`: mount the task folder (a task of the user's); `data_file`: a data file
    on this machine, handed to every node as a config."""
    services = load_services(*compose_files)
    defined = defined_learners(services)
    if not defined:
        raise ValueError(f"{compose_files[0]} defines no learner-N service")
    for role in ("syncer", "toxiproxy"):
        if role not in services:
            raise ValueError(f"{compose_files[0]} defines no {role!r} service")
    compose_dir = Path(compose_files[0]).resolve().parent
    proxy, configs = _proxy_service(services["toxiproxy"], _deploy(placement.syncer), compose_dir)
    def own(svc: dict) -> dict:
        return _on_node_clock(_own_volumes(svc, task_mount, data_file))

    out: dict[str, dict] = {
        "syncer": _swarm_service(own(services["syncer"]), _deploy(placement.syncer), health=False),
        "toxiproxy": proxy,
        CLOCK_SERVICE: _clock_service(services["syncer"]["image"]),
    }
    template = defined[min(defined)]
    for i in range(1, learners + 1):
        base = defined.get(i) or template
        svc = own(learner_service(base, i, (learner_args or {}).get(i, ())))  # its own key, as a secret
        out[f"learner-{i}"] = _swarm_service(svc, _deploy(placement.learners, placement.preferences), health=False)

    document = yaml_document(compose_files[0])
    stack: dict = {"version": STACK_FORMAT, "services": out}
    networks = {name: {**(spec or {}), "driver": "overlay"} for name, spec in document.get("networks", {}).items()}
    for spec in networks.values():
        if not spec.get("internal"):
            spec["attachable"] = True  # the control network: the API gateway joins it
    stack["networks"] = networks
    stack["volumes"] = {**(document.get("volumes") or {}), RUN_VOLUME: {}}
    # The run secret (the syncer's) and the key of each learner this stack runs, no other.
    secrets = {name: spec for name, spec in (document.get("secrets") or {}).items()
               if not name.startswith("islands_key_")}
    secrets.update(key_secrets(range(1, learners + 1)))
    stack["secrets"] = secrets
    if data_file is not None:
        configs[DATA_CONFIG] = {"file": str(Path(data_file).resolve())}
    if configs:
        stack["configs"] = configs
    return stack


def yaml_document(path: Path) -> dict:
    return yaml.safe_load(Path(path).read_text()) or {}


def dump_stack(document: dict) -> str:
    """The stack as a file for people: no &id001 anchors where services share a value."""
    class NoAliases(yaml.SafeDumper):
        def ignore_aliases(self, data) -> bool:
            return True
    return yaml.dump(document, Dumper=NoAliases, sort_keys=False)
