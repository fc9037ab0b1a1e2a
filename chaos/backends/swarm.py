"""The swarm backend: the compose cluster as a Docker Swarm stack, on one node or many.

What differs from compose, and why:
- Lifecycle: the stack file is rendered from compose.yaml (stack.py) and deployed with
  `docker stack deploy`; removal goes through the engine's API, waiting until the stack's
  services, containers, networks, secret, config and volumes are gone (a stack's removal
  is asynchronous, and a new deploy beside leftovers fails or loads a stale state volume).
- Where a target runs: Swarm decides. A target's container is its service's newest task's
  container, on whatever node it was scheduled; the controller reaches that node's own
  engine through the node label `islands.engine` (e.g. tcp://10.0.0.3:2375), or the local
  engine for the node it runs on. The manager is the engine DOCKER_HOST names.
- Kill: SIGKILL the task's container and let Swarm's restart policy bring a new task up;
  restart() waits for it and says when it ran. A kill with `restart: false` also scales the
  service to 0 (hold_down), until the heal scales it back to 1.
- The proxy's API: a Swarm service cannot publish on 127.0.0.1 only, so a relay container
  (forward.py) on the attachable `control` network publishes it there instead.
- Placement: the syncer and its proxy on the node labelled `islands.syncer=true`, where
  the state volume lives; learners on nodes labelled `islands.learners=true` when any is.
  A single-node swarm's one node is labelled for both; a larger swarm must be labelled by
  its operator (the error says how).
Faults on processes inside a container (pause, a rank's signal) work as for compose.
"""
from __future__ import annotations

import calendar
import json
import os
import time
from pathlib import Path

from trainer.runspec import RunSpec
from trainer.task import BUILTIN_TASKS

from ..client import ToxiproxyClient
from .base import UnknownTarget, UnsupportedFault
from .compose import DOCKER_TIMEOUT, START_TIMEOUT, STOP_TIMEOUT, ComposeCluster, _image_present, engine_retry
from .compose_cli import ComposeError, run_engine_cli
from .ranks import split_rank
from .collect import COLLECTED_DIRS, VOLUME_TARGET, Collector
from .stack import (CLOCK_PORT, CLOCK_SERVICE, DATA_TARGET, HOST_CLOCK_DIR, LEARNERS_LABEL, SYNCER_LABEL, Placement,
                    dump_stack, render_stack)

STACK_ENV = "ISLANDS_SWARM_STACK"
# A command that powers a node off or on: {node} (its hostname) and {action} (off, on) are
# filled in; e.g. "python3 bench/swarm_nodes.py power {node} {action}" for the nodes that
# script makes, an IPMI or cloud CLI call for real hosts. Without it a node cannot be killed.
NODE_POWER_ENV = "ISLANDS_NODE_POWER"
NODE_POWER_TIMEOUT = 120.0
DATA_CONFIG_MAX = 500_000  # bytes: Docker's limit on a config
DEFAULT_STACK = "islands-chaos"
API_ADDRESS_ENV = "ISLANDS_SWARM_API_ADDRESS"  # where the API relay publishes (127.0.0.1)
ENGINE_LABEL = "islands.engine"
NAMESPACE_LABEL = "com.docker.stack.namespace"
SERVICE_NAME_LABEL = "com.docker.swarm.service.name"
API_PORT = 8474
RESTART_TIMEOUT = 120.0
REMOVE_TIMEOUT = 120.0
POLL = 0.25


class SwarmError(ComposeError):
    """The swarm is missing, refused a request, or did not converge in time; the message says which."""


def node_address(attrs: dict) -> str:
    """Where a node is reached: its status address, or a manager's own address where the
    engine reports 0.0.0.0 for it (as it does for managers)."""
    addr = attrs.get("Status", {}).get("Addr") or ""
    if addr in ("", "0.0.0.0"):
        addr = (attrs.get("ManagerStatus") or {}).get("Addr", "127.0.0.1").rsplit(":", 1)[0]
    return addr


def _parse_time(stamp: str) -> float:
    """Docker's RFC 3339 timestamp (nanoseconds, Z) as Unix seconds."""
    whole, _, frac = stamp.rstrip("Z").partition(".")
    return calendar.timegm(time.strptime(whole, "%Y-%m-%dT%H:%M:%S")) + float(f"0.{frac or 0}")


class SwarmCluster(ComposeCluster):
    backend_name = "swarm"
    supports_disk_layer = False
    disk_layer_refusal = ("the swarm backend cannot mount it: a swarm service cannot be given the /dev/fuse "
                          "device (docker service create has no --device), which a FUSE file system needs; run "
                          "disk and power_loss faults on the local or compose backend")
    partitions_file = "swarm-partitions.json"
    project_noun, project_env = "swarm stack", STACK_ENV

    def __init__(self, run_dir: str | os.PathLike, spec: RunSpec | None = None, stack: str | None = None,
                 compose_file: str | os.PathLike | None = None, **settings) -> None:
        super().__init__(run_dir, spec=spec, project=stack or os.environ.get(STACK_ENV, DEFAULT_STACK),
                         compose_file=compose_file, **settings)
        self.stack = self.project_name
        self._engines: dict[str, object] = {}
        self._killed: dict[str, tuple[str | None, float]] = {}  # unit -> (container id, wall time)
        self._deployed = False
        self._node_id: str | None = None
        self._clock_hosts: tuple[float, dict[str, tuple[str, int]]] = (-1e9, {})
        self._node_cut: dict[str, list[str]] = {}  # node -> what a node partition cut off
        self._collector: Collector | None = None
        self._data_file: Path | None = None

    # ----------------------------------------------------------- engines
    def _local_node(self) -> str:
        if self._node_id is None:
            self._node_id = self.docker.info()["Swarm"].get("NodeID", "")
        return self._node_id

    def _engine(self, node_id: str):
        """The engine of the node that runs a task: its `islands.engine` label, or the manager's own."""
        if node_id == self._local_node():
            return self.docker
        node = self.docker.nodes.get(node_id)
        url = (node.attrs["Spec"].get("Labels") or {}).get(ENGINE_LABEL)
        hostname = node.attrs["Description"]["Hostname"]
        if not url:
            raise SwarmError(f"node {hostname} ({node_id[:12]}) runs a task but has no {ENGINE_LABEL} label: the "
                             f"controller needs that node's engine to signal its containers; label it, e.g. "
                             f"docker node update --label-add {ENGINE_LABEL}=tcp://NODE:2375 {hostname}")
        if url not in self._engines:
            import docker
            self._engines[url] = docker.DockerClient(base_url=url, timeout=DOCKER_TIMEOUT)
        return self._engines[url]

    def _all_engines(self) -> list:
        engines = [self.docker]
        for node in self.docker.nodes.list():
            if node.attrs["Spec"].get("Labels", {}).get(ENGINE_LABEL) and node.id != self._local_node() \
                    and node.attrs["Status"]["State"] == "ready":
                try:
                    engines.append(self._engine(node.id))
                except SwarmError:
                    pass
        return engines

    # ----------------------------------------------------------- services and tasks
    def _service(self, unit: str):
        import docker.errors
        try:
            return self.docker.services.get(f"{self.stack}_{unit}")
        except docker.errors.NotFound:
            return None

    def _tasks(self, unit: str) -> list[dict]:
        """The unit's tasks, newest first."""
        service = self._service(unit)
        if service is None:
            return []
        return sorted(service.tasks(), key=lambda t: t.get("Version", {}).get("Index", 0), reverse=True)

    def _node_ready(self, node_id: str) -> bool:
        """Whether the node answers its manager: a failed node's engine would only time out."""
        if node_id == self._local_node():
            return True
        import docker.errors
        try:
            return self.docker.nodes.get(node_id).attrs["Status"]["State"] == "ready"
        except docker.errors.NotFound:
            return False

    def _task_container(self, task: dict):
        import docker.errors
        cid = (task.get("Status", {}).get("ContainerStatus") or {}).get("ContainerID")
        if not cid or not self._node_ready(task.get("NodeID", "")):
            return None
        try:
            return self._engine(task["NodeID"]).containers.get(cid)
        except docker.errors.NotFound:
            return None

    def _container(self, target: str):
        return self._container_of(split_rank(self.check_target(target))[0])

    def _container_of(self, unit: str):
        """The container of the unit's newest task that has one (running, or the last one stopped)."""
        for task in self._tasks(unit):
            if (c := self._task_container(task)) is not None:
                return c
        return None

    def _containers(self, service: str | None = None, all: bool = True) -> list:
        units = [service] if service else self.units() + ["toxiproxy"]
        return [c for u in units if (c := self._container_of(u)) is not None]

    def _running_task(self, unit: str) -> dict | None:
        """The task Swarm runs for the unit now, not the one the last kill took down."""
        killed = self._killed.get(unit, (None, 0.0))[0]
        for task in self._tasks(unit):
            status = task.get("Status", {})
            cid = (status.get("ContainerStatus") or {}).get("ContainerID")
            if task.get("DesiredState") == "running" and status.get("State") == "running" and cid != killed:
                container = self._task_container(task)
                if container is not None and self._state(container) in ("running", "paused"):
                    return task
        return None

    # ----------------------------------------------------------- node faults
    def _nodes_by_name(self) -> dict[str, object]:
        return {n.attrs["Description"]["Hostname"]: n for n in self.docker.nodes.list()}

    def _manager_name(self) -> str:
        return self.docker.nodes.get(self._local_node()).attrs["Description"]["Hostname"]

    def node_fault_problems(self, fault) -> list[tuple[str, str]]:
        if fault is None:
            return [("kind", "no such node")]
        problems = []
        if fault.mode == "kill" and not os.environ.get(NODE_POWER_ENV):
            problems.append(("mode", f"'kill' of a node needs ${NODE_POWER_ENV}, a command that powers a node off "
                                     f"and on with {{node}} and {{action}} (off, on) in it, e.g. 'python3 "
                                     f"bench/swarm_nodes.py power {{node}} {{action}}' for that script's nodes"))
        if not fault.target.startswith("node-of:"):
            try:
                names = self._nodes_by_name()
            except Exception:  # noqa: BLE001 - no engine yet: the preflight says so
                names = None
            if names is not None and fault.target not in names:
                problems.append(("target", f"no node {fault.target!r} in this swarm (nodes: {', '.join(sorted(names))})"))
            elif names is not None and fault.mode == "kill" and fault.target == self._manager_name():
                problems.append(("target", f"{fault.target} is the swarm's manager, through which the controller "
                                           f"drives the swarm: kill another node"))
        return problems

    def resolve_node(self, target: str) -> str:
        if target.startswith("node-of:"):
            unit = self.check_target(target[len("node-of:"):])
            task = self._running_task(unit)
            if task is None:
                raise UnsupportedFault(f"{target}: {unit} runs on no node now (it is down)")
            return self.docker.nodes.get(task["NodeID"]).attrs["Description"]["Hostname"]
        if target not in self._nodes_by_name():
            raise UnknownTarget(f"no node {target!r} in this swarm")
        return target

    def units_on(self, node: str) -> list[str]:
        """Two calls to the manager (the node's running tasks, the stack's services): a node
        fault is due now, and the per-unit placement walks every task's container."""
        return [u for u in self._stack_services_on(node) if u in self.units()]

    def _stack_services_on(self, node: str) -> list[str]:
        """The stack's services with a task meant to run on `node` (by its hostname)."""
        node_obj = self._nodes_by_name().get(node)
        if node_obj is None:
            return []
        names = {svc.id: svc.name for svc in self.docker.services.list(
            filters={"label": f"{NAMESPACE_LABEL}={self.stack}"})}
        prefix = f"{self.stack}_"
        running = self.docker.api.tasks(filters={"node": node_obj.id, "desired-state": "running"})
        return sorted({names[t["ServiceID"]][len(prefix):] for t in running if t.get("ServiceID") in names})

    def _power(self, node: str, action: str) -> None:
        import shlex
        import subprocess
        template = os.environ.get(NODE_POWER_ENV)
        if not template:
            raise UnsupportedFault(f"node faults of mode 'kill' need ${NODE_POWER_ENV}")
        argv = shlex.split(template.format(node=node, action=action))
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=NODE_POWER_TIMEOUT)
        except subprocess.TimeoutExpired:
            raise SwarmError(f"${NODE_POWER_ENV} {action} {node}: no answer within {NODE_POWER_TIMEOUT:.0f} s") from None
        if done.returncode != 0:
            raise SwarmError(f"${NODE_POWER_ENV} {action} {node}: exit {done.returncode}: {done.stderr.strip()[-500:]}")

    def node_off(self, node: str) -> str:
        if node == self._manager_name():
            raise UnsupportedFault(f"{node} is the swarm's manager, through which the controller drives the swarm")
        self._power(node, "off")
        self._clock_hosts = (-1e9, {})  # its clock no longer answers
        return f"powered off {node}"

    def node_on(self, node: str) -> str:
        started = time.monotonic()
        self._power(node, "on")
        deadline = started + RESTART_TIMEOUT
        while self._nodes_by_name().get(node) is None or \
                self._nodes_by_name()[node].attrs["Status"].get("State") != "ready":
            if time.monotonic() > deadline:
                raise SwarmError(f"{node} was powered on but its manager did not see it ready within "
                                 f"{RESTART_TIMEOUT:.0f} s")
            time.sleep(POLL)
        self._clock_hosts = (-1e9, {})
        return f"powered on {node}, ready again {time.monotonic() - started:.1f} s later"

    def rebalance(self, units: list[str]) -> str:
        """Force an update of each unit's service: Swarm stops its task (SIGTERM: a learner
        pushes what it has) and schedules a new one, spreading it over the nodes (the one that
        came back is empty); waits until each runs, and says where."""
        for unit in units:
            if (service := self._service(unit)) is not None:
                engine_retry(service.force_update)()
        placed = []
        for unit in units:
            self._wait_running([unit], RESTART_TIMEOUT)
            task = self._running_task(unit)
            placed.append(f"{unit} on {self.docker.nodes.get(task['NodeID']).attrs['Description']['Hostname']}"
                          if task is not None else f"{unit} not running")
        return "rebalanced: " + ", ".join(placed)

    def node_cut(self, node: str, units: list[str]) -> str:
        """Take down the overlay links of every stack task on `node` (its units and the proxy,
        if there): the node is cut off, its tasks keep running (chaos/netcut.py says why links
        and not a network disconnect)."""
        cut = [u for u in self._stack_services_on(node) if u in units or u == "toxiproxy"]
        self._node_cut[node] = cut
        self._switch_links(cut, up=False)
        return f"cut {node} off the overlay networks"

    def node_join(self, node: str, units: list[str]) -> str:
        self._switch_links(self._node_cut.pop(node, units), up=True)
        return f"joined {node} to the overlay networks again"

    def _switch_links(self, names: list[str], up: bool) -> None:
        """chaos.netcut in a helper container in each task's network namespace, with
        CAP_NET_ADMIN alone (a privileged exec needs every capability, which a host may not
        grant), all at once: one node's tasks are cut together."""
        import concurrent.futures

        import docker.errors

        def one(name: str) -> str | None:
            c = self._container_of(name)
            if c is None:
                return f"{name}: no container"
            c.reload()
            # The control network stays: the controller reaches the proxy's API over it.
            keep = [s.get("IPAddress") for net, s in c.attrs["NetworkSettings"]["Networks"].items()
                    if net.endswith("_control") and s.get("IPAddress")]
            argv = ["chaos.netcut", "up" if up else "down"]
            for a in keep:
                argv += ["--keep", a]
            engine = self._engine(self._node_of(c))
            try:
                engine_retry(engine.containers.run)(
                    self.image, argv, network_mode=f"container:{c.id}", cap_add=["NET_ADMIN"], remove=True,
                    labels={NAMESPACE_LABEL: self.stack, "islands.role": "netcut"})
            except docker.errors.ContainerError as exc:
                return f"{name}: {exc.stderr.decode(errors='replace').strip() if exc.stderr else exc}"
            return None

        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, len(names))) as pool:
            errors = [e for e in pool.map(one, names) if e]
        if errors:
            raise SwarmError(f"could not take links {'up' if up else 'down'}: {'; '.join(errors)}")

    def _container_data(self) -> str:
        """A data file on this machine goes to every node as a Swarm config (no directory is
        shared between nodes); a config holds at most DATA_CONFIG_MAX bytes."""
        path = Path(self.data)
        if not path.exists():
            return self.data  # e.g. "markov"
        if path.is_dir() or path.stat().st_size > DATA_CONFIG_MAX:
            raise ValueError(f"data: the swarm backend hands a data file to every node as a Swarm config, of at most "
                             f"{DATA_CONFIG_MAX // 1000} KB; {path} is {'a directory' if path.is_dir() else 'larger'}: "
                             f"put it in the image, or use the compose backend")
        self._data_file = path
        return f"{DATA_TARGET}/{path.name}"

    def clock_file_written(self, target: str, path: Path) -> None:
        """Into the unit's container, where its process reads it ($ISLANDS_CLOCK_DIR is in its
        node's run volume). A task Swarm starts later, on another node, has a true clock."""
        import io
        import tarfile
        container = self._container(target)
        if container is None:
            return
        data = path.read_bytes()
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as tar:
            folder = tarfile.TarInfo("clocks")
            folder.type, folder.mode, folder.mtime = tarfile.DIRTYPE, 0o755, int(time.time())
            tar.addfile(folder)
            info = tarfile.TarInfo(f"clocks/{path.name}")
            info.size, info.mtime = len(data), int(time.time())
            tar.addfile(info, io.BytesIO(data))
        engine_retry(container.put_archive)(VOLUME_TARGET, buffer.getvalue())

    def heal_clocks(self) -> list[str]:
        """Every wall clock true again: a zero offset handed to each unit's container (the
        files in the run dir are only the controller's copies)."""
        from ..nemesis.clock import write_clock
        units = [p.stem for p in sorted(self.clock_dir.glob("*.json"))] if self.clock_dir.is_dir() else []
        for unit in units:
            try:
                write_clock(self, unit, 0.0)
            except Exception:  # noqa: BLE001 - a unit down now starts with a true clock anyway
                pass
        return super().heal_clocks()

    # ----------------------------------------------------------- evidence
    def _evidence_sources(self) -> dict[str, object]:
        """Per ready node, a fetch of its run volume's events/ and units/ (collect.py)."""
        from functools import partial
        return {node.attrs["Description"]["Hostname"]: partial(self._node_archives, node.id)
                for node in self.docker.nodes.list() if node.attrs["Status"].get("State") == "ready"}

    def _node_archives(self, node_id: str) -> list[bytes]:
        """The node's events/ and units/, as tar archives, through a container of that node
        that mounts its run volume: the node's `clock` task."""
        import docker.errors
        container = None
        for task in self._tasks(CLOCK_SERVICE):
            if task.get("NodeID") == node_id and task.get("Status", {}).get("State") == "running":
                container = self._task_container(task)
                if container is not None:
                    break
        if container is None:
            raise SwarmError("no running clock task on the node to read its run volume through")
        archives = []
        for directory in COLLECTED_DIRS:
            try:
                stream, _ = container.get_archive(f"{VOLUME_TARGET}/{directory}")
            except docker.errors.NotFound:
                continue  # nothing written there yet
            archives.append(b"".join(stream))
        return archives

    # ----------------------------------------------------------- node clocks
    NODE_LIST_EVERY = 5.0  # the prober asks each round; the nodes are listed at most this often

    def clock_hosts(self) -> dict[str, tuple[str, int]]:
        """Every ready node, by hostname (what its tasks stamp as their host), and where its
        clock responder answers: the node's address, the port each node publishes."""
        listed_at, hosts = self._clock_hosts
        if time.monotonic() - listed_at < self.NODE_LIST_EVERY:
            return hosts
        hosts = {}
        try:
            for node in self.docker.nodes.list():
                if node.attrs["Status"].get("State") != "ready":
                    continue
                hosts[node.attrs["Description"]["Hostname"]] = (node_address(node.attrs), CLOCK_PORT)
        except Exception:  # noqa: BLE001 - an engine too slow to list nodes: probe the last ones known
            return hosts or self._clock_hosts[1]
        self._clock_hosts = (time.monotonic(), hosts)
        return hosts

    def placement_of(self) -> dict[str, str]:
        """Each unit's node now (hostname), for reports and the multi-node bench."""
        out = {}
        for unit in [*self.units(), "toxiproxy"]:
            task = self._running_task(unit)
            if task is not None:
                out[unit] = self.docker.nodes.get(task["NodeID"]).attrs["Description"]["Hostname"]
        return out

    # ----------------------------------------------------------- lifecycle
    def preflight(self) -> None:
        """Refuse without a swarm this engine manages, without the image, or while another run
        holds the stack."""
        self.claim_project()
        try:
            swarm = self.docker.info().get("Swarm", {})
            if swarm.get("LocalNodeState") != "active" or not swarm.get("ControlAvailable"):
                raise SwarmError("this Docker engine is not a swarm manager: run `docker swarm init "
                                 "--advertise-addr 127.0.0.1` (one node), or point DOCKER_HOST at a manager")
            if not _image_present(self.docker, self.image):
                raise SwarmError(f"image {self.image} not found: build it with docker/build-image.sh (on a swarm of "
                                 f"several nodes, load it on every node: docker save | docker load)")
            self.placement()
        except BaseException:
            self.release_project()
            raise

    def placement(self) -> Placement:
        """Constraints from the node labels; a single-node swarm's node is labelled for every role."""
        nodes = self.docker.nodes.list()
        labelled = [n for n in nodes if n.attrs["Spec"].get("Labels", {}).get(SYNCER_LABEL) == "true"]
        if not labelled and len(nodes) == 1:
            spec = nodes[0].attrs["Spec"]
            spec["Labels"] = {**spec.get("Labels", {}), SYNCER_LABEL: "true", LEARNERS_LABEL: "true"}
            nodes[0].update(spec)
            labelled = nodes
        if not labelled:
            raise SwarmError(f"no node is labelled {SYNCER_LABEL}=true: the syncer's state volume must stay on one "
                             f"node; choose it with docker node update --label-add {SYNCER_LABEL}=true NODE")
        learners = any(n.attrs["Spec"].get("Labels", {}).get(LEARNERS_LABEL) == "true" for n in nodes)
        return Placement(learners=(f"node.labels.{LEARNERS_LABEL} == true",) if learners else ())

    def start(self) -> None:
        self.preflight()
        # The node clock's bind source must exist on every node; on this one the controller
        # makes it (empty: this machine's own clock). Other nodes are made by their operator
        # (bench/swarm_nodes.py up writes each node's clock there).
        Path(HOST_CLOCK_DIR).mkdir(parents=True, exist_ok=True)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "logs").mkdir(exist_ok=True)
        self.leftovers = self._remove_stack()
        files = self._service_files()
        env = self._compose_env()
        stack_file = self.run_dir / "stack.yaml"
        task_mount = self.spec.task not in BUILTIN_TASKS and ".py:" in self.spec.task
        stack_file.write_text(dump_stack(render_stack(files, self.learners, self.spec.learner_args, self.placement(),
                                                      task_mount=task_mount, data_file=self._data_file)))
        self._deployed = True
        self._cli("stack", "deploy", "--resolve-image", "never", "--prune", "-c", str(stack_file), self.stack,
                  env=env, timeout=START_TIMEOUT)
        self._collector = Collector(self.run_dir, self._evidence_sources).start()
        self._start_gateway()
        self._wait_for_toxiproxy()
        for i in range(1, self.learners + 1):
            self._ensure_proxy(f"learner-{i}")
        (self.run_dir / "toxiproxy.json").write_text(json.dumps({
            "url": self.toxiproxy.url, "server": self.toxiproxy_server, "stack": self.stack}))
        self._wait_running(["syncer", *(f"learner-{i}" for i in range(1, self.learners + 1))], START_TIMEOUT)

    def _cli(self, *args: str, env: dict[str, str] | None = None, timeout: float = 120.0) -> str:
        """A docker command, waiting for a slow engine (compose_cli.run_engine_cli: retried
        with backoff when the engine was too slow to answer)."""
        try:
            done, _ = run_engine_cli(["docker", *args], self.compose_file.parent, env or {}, timeout)
        except ComposeError as exc:
            raise SwarmError(str(exc)) from exc
        return done.stdout

    def _start_gateway(self) -> None:
        """The relay that publishes the proxy's API on 127.0.0.1 (see forward.py)."""
        bind = os.environ.get(API_ADDRESS_ENV, "127.0.0.1")
        gateway = self.docker.containers.run(
            self.image, ["chaos", "forward", "--listen", f"0.0.0.0:{API_PORT}", "--to", f"toxiproxy:{API_PORT}"],
            name=f"{self.stack}-api", detach=True, init=True, network=f"{self.stack}_control",
            ports={f"{API_PORT}/tcp": (bind, None)},
            labels={NAMESPACE_LABEL: self.stack, "islands.role": "api-gateway"})
        port = None
        deadline = time.monotonic() + 30
        while port is None and time.monotonic() < deadline:
            gateway.reload()
            bound = (gateway.attrs["NetworkSettings"]["Ports"] or {}).get(f"{API_PORT}/tcp")
            port = int(bound[0]["HostPort"]) if bound else None
            if port is None:
                time.sleep(POLL)
        if port is None:
            raise SwarmError(f"the API relay container {gateway.name} published no port within 30 s")
        self.toxiproxy_port = port
        self.toxiproxy = ToxiproxyClient(f"http://{bind}:{port}")

    def _wait_running(self, units: list[str], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        waiting = list(units)
        while waiting:
            waiting = [u for u in waiting if self._running_task(u) is None]
            if not waiting:
                return
            if time.monotonic() > deadline:
                errors = {u: (self._tasks(u)[:1] or [{}])[0].get("Status", {}).get("Err", "no task") for u in waiting}
                raise SwarmError(f"no running task within {timeout:.0f}s for {', '.join(waiting)}: {errors}")
            time.sleep(POLL)

    def stop(self) -> None:
        """Heal, scale the learners to 0 (SIGTERM: they push what is left), then the syncer;
        keep logs and state; remove the stack."""
        if not self._deployed:
            self.release_project()
            return
        try:
            self._heal_before_stopping()
            self._scale_down([f"learner-{i}" for i in range(1, self.learners + 1)])
            self._scale_down(["syncer", "toxiproxy"])
            if self._collector is not None:  # every process has stopped and flushed: the final copy
                self._collector.stop()
            self._save_logs()
            self._export_state()
        finally:
            try:
                if os.environ.get("ISLANDS_SWARM_KEEP") != "1":
                    self._remove_stack()
            finally:
                self.release_project()

    def _scale_down(self, units: list[str]) -> None:
        for unit in units:
            if (service := self._service(unit)) is not None:
                service.scale(0)
        deadline = time.monotonic() + STOP_TIMEOUT + 30
        while any(self._state(c) in ("running", "paused") for u in units if (c := self._container_of(u))):
            if time.monotonic() > deadline:
                return  # removal below kills what is left
            time.sleep(POLL)

    def _save_logs(self) -> None:
        """Every task's container log, oldest task first, one file per unit. Not the service's
        log stream: the engine's `service logs` can hang once the service is scaled to 0."""
        for unit in [*self.units(), "toxiproxy"]:
            parts = []
            for task in reversed(self._tasks(unit)):
                try:
                    if (container := self._task_container(task)) is not None:
                        parts.append(container.logs(stdout=True, stderr=True, timestamps=False))
                except Exception:  # noqa: BLE001 - logs are a convenience
                    continue
            if parts:
                (self.run_dir / "logs" / f"{unit}.log").write_bytes(b"".join(parts))

    def _remove_stack(self) -> list[str]:
        """Remove everything labelled with this stack, on every engine, and wait until it is gone."""
        removed = []
        for service in self.docker.services.list(filters={"label": f"{NAMESPACE_LABEL}={self.stack}"}):
            removed.append(service.name)
            service.remove()
        engines = self._all_engines()
        for engine in engines:
            for c in engine.containers.list(all=True, filters={"label": f"{NAMESPACE_LABEL}={self.stack}"}):
                if c.labels.get("islands.role") == "api-gateway":
                    c.remove(force=True)
        self._until_gone(lambda: [c.name for e in engines for c in e.containers.list(
            all=True, filters={"label": f"{NAMESPACE_LABEL}={self.stack}"})], "the stack's containers")
        for kind in ("networks", "secrets", "configs"):
            for obj in getattr(self.docker, kind).list(filters={"label": f"{NAMESPACE_LABEL}={self.stack}"}):
                self._retry_remove(obj)
        for engine in engines:
            for volume in engine.volumes.list(filters={"label": f"{NAMESPACE_LABEL}={self.stack}"}):
                self._retry_remove(volume)
        return removed

    @staticmethod
    def _retry_remove(obj) -> None:
        """Networks and volumes are released a moment after their last container: retry, bounded."""
        import docker.errors
        deadline = time.monotonic() + 30
        while True:
            try:
                obj.remove()
                return
            except docker.errors.NotFound:
                return
            except docker.errors.APIError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    @staticmethod
    def _until_gone(listing, what: str) -> None:
        deadline = time.monotonic() + REMOVE_TIMEOUT
        while left := listing():
            if time.monotonic() > deadline:
                raise SwarmError(f"{what} were not removed within {REMOVE_TIMEOUT:.0f}s: {', '.join(left)}")
            time.sleep(0.5)

    # ----------------------------------------------------------- processes
    def kill(self, target: str) -> None:
        unit, rank = split_rank(self.check_target(target))
        if rank is not None:
            super().kill(target)
            return
        container = self._container(unit)
        if container is not None and self._state(container) in ("running", "paused"):
            self._killed[unit] = (container.id, time.time())
            engine_retry(container.kill)()

    def hold_down(self, target: str) -> None:
        """Scale the service to 0: Swarm starts no new task until restart() scales it back."""
        unit, rank = split_rank(self.check_target(target))
        if rank is None and (service := self._service(unit)) is not None:
            service.scale(0)

    @engine_retry
    def restart(self, target: str) -> str | None:
        """Wait for Swarm's new task (scaling back to 1 after a kill with restart: false); when it ran."""
        unit, rank = split_rank(self.check_target(target))
        if rank is not None:
            return super().restart(target)
        service = self._service(unit)
        if service is None:
            raise UnknownTarget(f"{unit}: no service {self.stack}_{unit} in the swarm")
        if service.attrs["Spec"]["Mode"].get("Replicated", {}).get("Replicas", 1) == 0:
            service.scale(1)
        self._wait_running([unit], RESTART_TIMEOUT)
        task = self._running_task(unit)
        killed_at = self._killed.pop(unit, (None, None))[1]
        if task is None or killed_at is None:
            return None
        ran = _parse_time(task["Status"]["Timestamp"]) - killed_at
        host = self.docker.nodes.get(task["NodeID"]).attrs["Description"]["Hostname"]
        return f"Swarm's new task running {max(ran, 0.0):.1f} s after the kill, on {host}"

    def is_running(self, target: str) -> bool:
        unit, rank = split_rank(self.check_target(target))
        if rank is not None:
            return super().is_running(target)
        return self._running_task(unit) is not None

    # ----------------------------------------------------------- networks
    def disconnect(self, target: str) -> None:
        """Cut the task's container off its overlay networks; refused with the engine's reason."""
        self._cut(target, self._container(target))

    def _cut(self, target: str, c) -> None:
        """Cut container `c` (of `target`: a unit, or the proxy) off its overlay networks."""
        import docker.errors
        if c is None or target in self._partitioned:
            return
        c.reload()
        saved = {name: [a for a in (s.get("Aliases") or []) if a != c.id[:12]] or [target]
                 for name, s in c.attrs["NetworkSettings"]["Networks"].items() if not name.endswith("_control")}
        self._partitioned[target] = {"container": c.id, "networks": saved}  # type: ignore[dict-item]
        self._write_partitions()
        engine = self._engine(self._node_of(c))
        for name in saved:
            try:
                engine.networks.get(name).disconnect(c, force=True)
            except docker.errors.APIError as exc:
                raise UnsupportedFault(f"swarm backend: the engine refused to disconnect {target} from {name} "
                                       f"(partition mode 'network'): {exc.explanation or exc}") from exc

    def connect(self, target: str) -> None:
        import docker.errors
        saved = self._partitioned.get(target)
        if saved is None:
            return
        try:
            engine = None
            c = None
            for task in self._tasks(split_rank(target)[0]):
                cid = (task.get("Status", {}).get("ContainerStatus") or {}).get("ContainerID")
                if cid == saved["container"]:
                    engine = self._engine(task["NodeID"])
                    c = engine.containers.get(cid)
                    break
            if c is not None and self._state(c) in ("running", "paused"):  # a new task has its networks already
                attached = set(c.attrs["NetworkSettings"]["Networks"])
                for name, aliases in saved["networks"].items():  # type: ignore[union-attr]
                    if name not in attached:
                        engine.networks.get(name).connect(c, aliases=aliases)
        except docker.errors.NotFound:
            pass
        del self._partitioned[target]
        self._write_partitions()

    def _node_of(self, container) -> str:
        return container.labels.get("com.docker.swarm.node.id", self._local_node())
