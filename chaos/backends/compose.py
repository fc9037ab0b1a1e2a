"""The compose backend: the same cluster as containers, driven through the Docker SDK.

compose.yaml defines the services (syncer, learner-1…3, toxiproxy). This backend brings
them up with the compose CLI, then finds their containers by compose labels (project and
service) and applies process faults through the Docker SDK: SIGKILL, pause (cgroup
freezer), start again, and network disconnect/connect that keeps the service's aliases.
Link faults go through Toxiproxy's API, published on 127.0.0.1. Events reach the host
through a bind mount of the run directory, so checkers read them exactly as for the
local backend; the syncer's state volume is copied out when the cluster stops.
"""
from __future__ import annotations

import io
import json
import os
import shlex
import shutil
import signal
import socket
import tarfile
import time
from pathlib import Path

import yaml
from tenacity import retry, retry_if_exception, stop_after_attempt, wait_random_exponential

from trainer.runspec import RunSpec
from trainer.keys import write_key_files
from trainer.secretfile import ensure_secret
from trainer.wire import load_secret
from trainer.task import BUILTIN_TASKS

from ..client import NotFound, ToxiproxyClient, Unreachable
from ..filelock import hold, holder
from ..processes import islands_home, proc_start_time
from .base import Cluster, UnknownTarget, UnsupportedFault
from .disk_layer import MODE_FILE, write_mode_file
from .compose_file import (KEY_DIR_ENV, PROXY_BASE_PORT, SYNCER_UPSTREAM, defined_learners, key_secrets,
                           learner_command, learner_service, load_services)
from .compose_cli import ComposeError, ComposeProject, find_compose_command, find_compose_file
from .compose_guard import ClusterBusy, refuse_if_busy
from .ranks import SIGNAL_RANK_SCRIPT, published_ranks, split_rank, wait_for_rank

PROJECT_ENV = "ISLANDS_COMPOSE_PROJECT"
# Not the directory name a hand-run `docker compose up` would use: each start removes what
# its project left behind, and must not take a cluster someone brought up by hand with it.
DEFAULT_PROJECT = "islands-chaos"
IMAGE_ENV = "ISLANDS_IMAGE"
TOXIPROXY_IMAGE_ENV = "TOXIPROXY_IMAGE"
TOXIPROXY_SERVER_ENV = "ISLANDS_TOXIPROXY"   # auto | shopify | islands
DEFAULT_IMAGE = "islands:latest"
DEFAULT_TOXIPROXY_IMAGE = "ghcr.io/shopify/toxiproxy:2.12.0"
OVERRIDE_FILE = "compose.islands-toxiproxy.yaml"
CONTROL_NETWORK = "control"
DOCKER_TIMEOUT = 120  # seconds one engine API call may take: a loaded engine answers in tens of seconds
START_TIMEOUT = 180.0
STOP_TIMEOUT = 10
PARTITIONS_FILE = "compose-partitions.json"
PROJECT_LABEL = "com.docker.compose.project"
SERVICE_LABEL = "com.docker.compose.service"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _engine_hiccup(exc: BaseException) -> bool:
    """A 5xx from the engine, e.g. runc's "unable to freeze" when a busy cgroup does not
    settle in time (about 1 pause in 20 under load here), or an engine socket that refused
    the connection (the request never reached it). A 4xx (409: not running) is final, and so
    is a timeout: the action may have happened (a kill retried would answer 409), and a slow
    engine gets DOCKER_TIMEOUT s for each call instead."""
    import docker.errors
    import requests
    import urllib3
    if isinstance(exc, requests.exceptions.ConnectionError) and not isinstance(exc, requests.exceptions.Timeout):
        reason = exc.args[0] if exc.args else None
        return isinstance(getattr(reason, "reason", reason), urllib3.exceptions.NewConnectionError)
    return isinstance(exc, docker.errors.APIError) and exc.status_code is not None and exc.status_code >= 500


# Every fault action on a container: a few quick tries, with jitter, then the error stands.
engine_retry = retry(retry=retry_if_exception(_engine_hiccup), stop=stop_after_attempt(5),
                     wait=wait_random_exponential(multiplier=0.05, max=2.0), reraise=True)


def _image_present(client, image: str) -> bool:
    import docker.errors
    try:
        client.images.get(image)
        return True
    except docker.errors.ImageNotFound:
        return False


TASK_MOUNT = "/islands/task"  # where every container sees the user's task folder (read-only)


DISK_OVERRIDE_FILE = "compose.disk.yaml"
DISK_CONTROL = "/run/islands-diskfs.sock"  # the disk layer's control socket inside the syncer's container
DISK_DAEMON_START_S = 30.0  # how long a restarted container's disk layer may take to answer its socket


def disk_layer_override() -> dict:
    """The syncer service with the disk-fault layer (docker/entrypoint.sh mounts it): what a
    container needs for FUSE (the /dev/fuse device, CAP_SYS_ADMIN, and no AppArmor profile,
    which forbids mount on hosts that load one), and its state volume at /islands/state.disk
    too, the durable image under the mount."""
    return {"services": {"syncer": {
        "devices": ["/dev/fuse:/dev/fuse"], "cap_add": ["SYS_ADMIN"], "security_opt": ["apparmor:unconfined"],
        "environment": {"ISLANDS_DISK_LAYER": "1"}, "volumes": ["syncer-state:/islands/state.disk"]}}}


class ComposeCluster(Cluster):
    backend_name = "compose"
    # The disk layer runs in the syncer's container (docker/entrypoint.sh): a killed container
    # loses what it held unsynced, so there a kill of the syncer is a power loss as well.
    supports_disk_layer = True
    # A fault action is an engine call here (kill, pause, start, network disconnect): the
    # worst fault of compose-acceptance.yaml was in force 0.24 s late idle and 0.59 s late
    # beside two busy loops (bench/fault_timing.py --backend compose; BENCHMARKS.md).
    action_tolerance = 2.0
    partitions_file = PARTITIONS_FILE  # the containers a network partition cut off, for a look after a crash
    project_noun, project_env = "compose project", PROJECT_ENV  # what claim_project holds, and its variable

    def __init__(self, run_dir: str | os.PathLike, spec: RunSpec | None = None, project: str | None = None,
                 compose_file: str | os.PathLike | None = None, **settings) -> None:
        """`spec` is what runs; `settings` (learners=, mode=, task=, ...) make or amend one."""
        self.spec = spec = (spec or RunSpec()).replace(backend="compose", **settings)
        self.run_dir = Path(run_dir).resolve()
        self.learners = spec.learners
        self.data = spec.data
        self.learner_args = {i: list(a) for i, a in spec.learner_args.items()}
        self.project_name = project or os.environ.get(PROJECT_ENV, DEFAULT_PROJECT)
        self.compose_file = Path(compose_file) if compose_file else find_compose_file()
        self.image = os.environ.get(IMAGE_ENV, DEFAULT_IMAGE)
        self.toxiproxy: ToxiproxyClient | None = None  # type: ignore[assignment]
        self.leftovers: list[str] = []
        self._docker = None
        self._partitioned: dict[str, dict[str, list[str]]] = {}
        self.compose: ComposeProject | None = None
        self._project_hold: int | None = None

    # ----------------------------------------------------------- docker plumbing
    @property
    def docker(self):
        if self._docker is None:
            import docker
            try:
                self._docker = docker.from_env(timeout=DOCKER_TIMEOUT)
                self._docker.ping()
            except docker.errors.DockerException as exc:
                raise ComposeError(f"cannot reach the Docker engine ({exc}); is dockerd running?") from exc
        return self._docker

    def _containers(self, service: str | None = None, all: bool = True) -> list:
        labels = [f"{PROJECT_LABEL}={self.project_name}"]
        if service is not None:
            labels.append(f"{SERVICE_LABEL}={service}")
        return self.docker.containers.list(all=all, filters={"label": labels})

    def _container(self, target: str):
        found = self._containers(self.check_target(target))
        return found[0] if found else None

    @staticmethod
    def _state(container) -> str:
        """The container's status now ('absent' for no container): one engine call."""
        if container is None:
            return "absent"
        container.reload()
        return container.status

    def _status(self, target: str) -> str:
        return self._state(self._container(target))

    # ----------------------------------------------------------- lifecycle
    def preflight(self) -> None:
        """Refuse while another live run uses this project, without the image, or while another
        project runs this cluster (compose_guard.py)."""
        self.claim_project()
        try:
            if not _image_present(self.docker, self.image):
                raise ComposeError(f"image {self.image} not found: build it with docker/build-image.sh "
                                   f"(or name another in ${IMAGE_ENV})")
            refuse_if_busy(self.docker, self.compose_file, self.project_name, find_compose_command())
        except BaseException:
            self.release_project()
            raise

    def claim_project(self) -> None:
        """Hold this run's compose project until stop(): start() takes `down -v` to whatever
        the project holds, which must be a crashed run's leftovers, never the cluster of a
        run still going (two runs of the default project at once). The hold is an flock,
        so it ends with its process however that ends."""
        if self._project_hold is not None:
            return
        path = islands_home() / self.backend_name / f"{self.project_name}.lock"
        self._project_hold = hold(path, {"pid": os.getpid(), "start": proc_start_time(os.getpid()),
                                         "run_dir": str(self.run_dir)})
        if self._project_hold is None:
            other = holder(path)
            raise ClusterBusy(f"{self.project_noun} {self.project_name!r} is in use by another run (pid "
                              f"{other.get('pid', '?')}, run dir {other.get('run_dir', '?')}); wait for it to "
                              f"end, or give this run one of its own with ${self.project_env}")

    def release_project(self) -> None:
        if self._project_hold is not None:
            os.close(self._project_hold)
            self._project_hold = None

    def start(self) -> None:
        self.preflight()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.compose = ComposeProject(self._compose_files(), self.project_name, self._compose_env())
        self.leftovers = self._clean_leftovers()
        (self.run_dir / "logs").mkdir(exist_ok=True)
        self.compose.run("up", "-d", "--no-build", "syncer", "toxiproxy", timeout=START_TIMEOUT)
        self.toxiproxy = ToxiproxyClient(f"http://127.0.0.1:{self.toxiproxy_port}")
        self._wait_for_toxiproxy()
        for i in range(1, self.learners + 1):
            self._ensure_proxy(f"learner-{i}")
        (self.run_dir / "toxiproxy.json").write_text(json.dumps({
            "url": self.toxiproxy.url, "server": self.toxiproxy_server, "project": self.project_name}))
        try:
            self.compose.run("up", "-d", "--no-build", *(f"learner-{i}" for i in range(1, self.learners + 1)),
                             timeout=START_TIMEOUT)
        except ComposeError as exc:  # the learners wait for a healthy syncer: say why it is not
            raise ComposeError(f"{exc}\nthe end of the syncer container's log:\n{self._log_tail('syncer')}") \
                from exc

    def _compose_files(self) -> list[Path]:
        files = self._service_files()
        extra = self._learner_overrides()
        if extra:
            path = self.run_dir / "compose.learners.yaml"
            path.write_text(yaml.safe_dump(extra, sort_keys=False))
            files.append(path)
        if self.spec.disk_layer:
            path = self.run_dir / DISK_OVERRIDE_FILE
            path.write_text(yaml.safe_dump(disk_layer_override(), sort_keys=False))
            files.append(path)
            write_mode_file(self.run_dir / MODE_FILE, "none", 50.0)
        return files

    def _service_files(self) -> list[Path]:
        """compose.yaml, and the override that swaps in our Toxiproxy-compatible server unless
        the real Toxiproxy's image is present (or $ISLANDS_TOXIPROXY chooses)."""
        files = [self.compose_file]
        choice = os.environ.get(TOXIPROXY_SERVER_ENV, "auto")
        if choice not in ("auto", "shopify", "islands"):
            raise ValueError(f"${TOXIPROXY_SERVER_ENV}: must be auto, shopify or islands, got {choice!r}")
        toxiproxy_image = os.environ.get(TOXIPROXY_IMAGE_ENV, DEFAULT_TOXIPROXY_IMAGE)
        use_ours = choice == "islands" or (choice == "auto" and not _image_present(self.docker, toxiproxy_image))
        self.toxiproxy_server = "islands" if use_ours else toxiproxy_image
        if use_ours:
            files.append(self.compose_file.parent / OVERRIDE_FILE)
        return files

    def _learner_overrides(self) -> dict:
        """Services for learners beyond those compose.yaml defines, and per-learner flags."""
        defined = defined_learners(load_services(self.compose_file))
        if not defined:
            raise ComposeError(f"{self.compose_file} defines no learner-N service")
        template = defined[min(defined)]
        services: dict[str, dict] = {}
        added: list[int] = []
        for i in range(1, self.learners + 1):
            extra = [str(a) for a in self.learner_args.get(i, [])]
            if i in defined and not extra:
                continue
            if i in defined:
                services[f"learner-{i}"] = {"command": learner_command(defined[i]["command"], i, extra)}
            else:  # a learner compose.yaml lacks: the template's service, with its own key
                services[f"learner-{i}"] = learner_service(template, i, extra)
                added.append(i)
        if not services:
            return {}
        return {"services": services, **({"secrets": key_secrets(added)} if added else {})}

    def _compose_env(self) -> dict[str, str]:
        # The path, never the value: compose.yaml mounts the file into the syncer and learners
        # as a compose secret, since `docker inspect` shows a container's environment.
        secret_file = ensure_secret(self.run_dir / "secret")
        # Each learner mounts only its own key (compose.yaml's islands_key_N): written here,
        # for every learner compose.yaml defines too, since compose checks every secret's file.
        key_dir = self.run_dir / "keys"
        defined = defined_learners(load_services(self.compose_file))
        write_key_files(key_dir, load_secret(str(secret_file)), max(self.learners, *defined, 1))
        self.toxiproxy_port = _free_port()
        task_dir, task = self._container_task()
        # The containers' view of the spec: data and task at their paths inside. Per-learner
        # flags go into each learner's command (_learner_overrides), not this shared list.
        inside = self.spec.replace(data=self._container_data(), task=task, learner_args={})
        syncer_args = inside.syncer_flags()[2:]  # --learners comes from ISLANDS_LEARNERS
        learner_args = inside.learner_flags(1)
        for args in (syncer_args, learner_args):
            if any(not a or any(ch.isspace() for ch in a) for a in args):
                raise ValueError(f"trainer_args: the compose backend passes flags split on spaces; "
                                 f"{shlex.join(args)} holds an empty or spaced value")
        return {"ISLANDS_SECRET_FILE": str(secret_file), KEY_DIR_ENV: str(key_dir), "ISLANDS_RUN_DIR": str(self.run_dir),
                "ISLANDS_LEARNERS": str(self.learners), "ISLANDS_SYNCER_ARGS": " ".join(syncer_args),
                "ISLANDS_LEARNER_ARGS": " ".join(learner_args), "TOXIPROXY_PORT": str(self.toxiproxy_port),
                "ISLANDS_IMAGE": self.image, "ISLANDS_TASK_DIR": task_dir, "ISLANDS_TASK": task,
                **self.spec.env}

    def _container_task(self) -> tuple[str, str]:
        """(the host folder mounted read-only at TASK_MOUNT, the task as the containers name
        it): a task file's folder, mounted whole so the task may import its neighbours."""
        if self.spec.task in BUILTIN_TASKS or ".py:" not in self.spec.task:
            return str(self.compose_file.parent / "examples" / "tasks"), self.spec.task  # built-in or a module
        path, _, name = self.spec.task.rpartition(":")
        host = Path(path).resolve()
        return str(host.parent), f"{TASK_MOUNT}/{host.name}:{name}"

    def _container_data(self) -> str:
        """A data file on the host is copied into the run dir, which the learners mount."""
        path = Path(self.data)
        if not path.exists():
            return self.data  # e.g. "markov" or "markov:seed=3"
        dest = self.run_dir / "data" / path.name
        if not dest.exists():
            dest.parent.mkdir(parents=True, exist_ok=True)
            (shutil.copytree if path.is_dir() else shutil.copy2)(path, dest)
        return f"/islands/run/data/{path.name}"

    def _clean_leftovers(self) -> list[str]:
        """Heal and remove whatever a crashed earlier run of this project left behind."""
        found = self._containers()
        names = []
        for c in found:
            names.append(c.name)
            if c.status == "paused":
                c.unpause()
        self.compose.run("down", "-v", "--remove-orphans", "-t", "2", timeout=120)
        return names

    def _wait_for_toxiproxy(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            try:
                self.toxiproxy.version()
                return
            except Unreachable as exc:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"Toxiproxy API at {self.toxiproxy.url} did not answer within "
                                       f"{START_TIMEOUT:.0f}s: {exc}") from exc
            time.sleep(0.2)

    def _ensure_proxy(self, name: str) -> None:
        """The config file creates learner-1…3; a larger cluster adds its proxies here."""
        try:
            self.toxiproxy.proxy(name)
        except NotFound:
            number = int(name.split("-", 1)[1])
            self.toxiproxy.create_proxy(name, f"0.0.0.0:{PROXY_BASE_PORT + number}", SYNCER_UPSTREAM)

    def stop(self) -> None:
        """Heal, SIGTERM learners (they push what is left), then the syncer; keep logs and state; remove."""
        if self.compose is None:
            self.release_project()
            return
        try:
            self._heal_before_stopping()
            learners = [f"learner-{i}" for i in range(1, self.learners + 1)]
            self.compose.run("stop", "-t", str(STOP_TIMEOUT), *learners, timeout=120, check=False)
            self.compose.run("stop", "-t", str(STOP_TIMEOUT), "syncer", "toxiproxy", timeout=120, check=False)
            self._save_logs()
            self._export_state()
        finally:
            try:
                if os.environ.get("ISLANDS_COMPOSE_KEEP") != "1":
                    self.compose.run("down", "-v", "--remove-orphans", "-t", "2", timeout=120, check=False)
            finally:
                self.release_project()

    def _heal_before_stopping(self) -> None:
        """Toxics off, networks back, containers thawed: every process can stop cleanly,
        learners pushing what they have left. Best effort: stopping goes on regardless."""
        if self.toxiproxy is not None:
            for proxy in self.link_proxies():
                try:
                    self.toxiproxy.clear(proxy)
                except Exception:  # noqa: BLE001 - stopping goes on whatever the proxy says
                    pass
        self._reconnect_all()
        for c in self._containers():
            if self._state(c) == "paused":
                c.unpause()

    def _log_tail(self, service: str, lines: int = 15) -> str:
        """The last lines a service's container wrote (its own error, e.g. a refused flag)."""
        c = self._container(service)
        if c is None:
            return f"    (no {service} container)"
        try:
            text = c.logs(tail=lines).decode("utf-8", "replace").rstrip()
        except Exception as exc:  # noqa: BLE001 - an error message must not fail on its own details
            return f"    (its log could not be read: {exc})"
        return "\n".join(f"    {line}" for line in text.splitlines()) or "    (the log is empty)"

    def _save_logs(self) -> None:
        for c in self._containers():
            service = c.labels.get(SERVICE_LABEL, c.name)
            try:
                (self.run_dir / "logs" / f"{service}.log").write_bytes(c.logs(timestamps=False))
            except Exception:  # noqa: BLE001 - logs are a convenience
                pass

    def _export_state(self) -> None:
        """Copy the syncer's state volume to RUN_DIR/state, where `trainer eval` reads it."""
        syncer = self._container("syncer")
        if syncer is None:
            return
        import docker.errors
        try:
            stream, _ = syncer.get_archive("/islands/state")
        except docker.errors.NotFound:
            return
        dest = self.run_dir / "state"
        shutil.rmtree(dest, ignore_errors=True)
        with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as tar:
            tar.extractall(self.run_dir, filter="data")  # the archive's root folder is `state/`

    # ----------------------------------------------------------- processes
    def _signal_rank(self, target: str, sig: int) -> str | None:
        """Signal one rank inside its unit's container; its state letter, or None if it is not there."""
        unit, rank = split_rank(target)
        c = self._container(unit)
        info = published_ranks(self.run_dir, unit)
        if self._state(c) != "running" or info is None or rank >= len(info.get("ranks", [])):
            return None
        code, out = c.exec_run(["python3", "-c", SIGNAL_RANK_SCRIPT, str(info["ranks"][rank]),
                                str(info["supervisor"]), str(int(sig))])
        return out.decode().strip() if code == 0 else None

    @engine_retry
    def kill(self, target: str) -> None:
        if split_rank(self.check_target(target))[1] is not None:
            self._signal_rank(target, signal.SIGKILL)  # the unit restarts all its ranks in its container
            return
        c = self._container(target)
        if self._state(c) in ("running", "paused"):
            c.kill()

    @engine_retry
    def pause(self, target: str) -> None:
        if split_rank(self.check_target(target))[1] is not None:
            self._signal_rank(target, signal.SIGSTOP)
            return
        c = self._container(target)
        if self._state(c) == "running":
            c.pause()

    @engine_retry
    def resume(self, target: str) -> None:
        if split_rank(self.check_target(target))[1] is not None:
            self._signal_rank(target, signal.SIGCONT)
            return
        c = self._container(target)
        if self._state(c) == "paused":
            c.unpause()

    @engine_retry
    def restart(self, target: str) -> None:
        unit, rank = split_rank(self.check_target(target))
        c = self._container(unit)
        if c is None:
            raise UnknownTarget(f"{unit}: no container in compose project {self.project_name!r}")
        if self._state(c) not in ("running", "paused"):
            c.start()
        elif rank is not None:  # the unit restarts its ranks itself: wait for it
            wait_for_rank(lambda: self.is_running(target), target)

    def is_running(self, target: str) -> bool:
        if split_rank(self.check_target(target))[1] is not None:
            return self._signal_rank(target, 0) not in (None, "Z")
        return self._status(target) in ("running", "paused")

    def is_paused(self, target: str) -> bool:
        if split_rank(self.check_target(target))[1] is not None:
            return self._signal_rank(target, 0) == "T"
        return self._status(target) == "paused"

    # ----------------------------------------------------------- the syncer's disk
    def set_disk(self, target: str, mode: str, latency_ms: float = 50.0) -> None:
        """The mode goes to the run dir first (a daemon started again with its container reads
        it), then to the running daemon through its control socket, inside the container."""
        if not self.spec.disk_layer:
            raise UnsupportedFault(self._needs_disk_layer("disk"))
        write_mode_file(self.run_dir / MODE_FILE, mode, latency_ms)
        c = self._container(target)
        if self._state(c) != "running":
            return  # down (a kill, a power loss, a restart): it starts in the mode just written
        # Running is not answering: a container Docker has just started again (the syncer ended
        # with 75 after a failed disk) may not have its daemon up yet, and that daemon may have
        # read the mode file before it was written above, so the mode must still reach it.
        code, out = c.exec_run(["python3", "-m", "chaos.diskfs.client", DISK_CONTROL, "--wait", f"{DISK_DAEMON_START_S:g}",
                                "mode", mode, "--latency-ms", f"{latency_ms:g}"])
        if code != 0:
            raise ComposeError(f"{target}: setting its disk to {mode} failed (exit {code}): "
                               f"{out.decode(errors='replace').strip()[-500:]}")

    def power_loss(self, target: str) -> None:
        """The syncer's container is killed whole: its processes and the disk layer's memory."""
        if not self.spec.disk_layer:
            raise UnsupportedFault(self._needs_disk_layer("power_loss"))
        self.kill(target)

    # ----------------------------------------------------------- networks
    supports_network_partitions = True

    def disconnect(self, target: str) -> None:
        """Cut `target` off its project networks (not the control network); aliases are kept for connect()."""
        c = self._container(target)
        if c is None or target in self._partitioned:
            return
        c.reload()
        saved: dict[str, list[str]] = {}
        for net_name, settings in c.attrs["NetworkSettings"]["Networks"].items():
            if net_name.endswith(f"_{CONTROL_NETWORK}"):
                continue
            short_id = c.id[:12]
            saved[net_name] = [a for a in (settings.get("Aliases") or []) if a != short_id] or [target]
        self._partitioned[target] = saved
        self._write_partitions()
        for net_name in saved:
            self.docker.networks.get(net_name).disconnect(c, force=True)

    def connect(self, target: str) -> None:
        saved = self._partitioned.get(target)
        c = self._container(target)
        if saved is None or c is None:
            return
        c.reload()
        attached = set(c.attrs["NetworkSettings"]["Networks"])
        for net_name, aliases in saved.items():
            if net_name not in attached:
                self.docker.networks.get(net_name).connect(c, aliases=aliases)
        del self._partitioned[target]
        self._write_partitions()

    def _write_partitions(self) -> None:
        (self.run_dir / self.partitions_file).write_text(json.dumps(self._partitioned))

    def _reconnect_all(self) -> list[str]:
        done = []
        for target in list(self._partitioned):
            self.connect(target)
            done.append(f"reconnected {target}")
        return done

    def heal_all(self) -> list[str]:
        return self._reconnect_all() + super().heal_all()

    def container_name(self, target: str) -> str | None:
        c = self._container(target)
        return c.name if c is not None else None
