"""The local backend: the syncer, N learners and a Toxiproxy, all on 127.0.0.1, no Docker.

Each learner reaches the syncer only through its own proxy (`learner-N`), so every byte
of every link can be cut, slowed or reset. The proxy server is our Toxiproxy-compatible
server in a process of its own (`python -m chaos.toxiproxy`), or a real Toxiproxy when
TOXIPROXY_URL is set.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path

from ..client import NotFound, ToxiproxyClient
from ..processes import ManagedProcess, Registry, log_tail, proc_parent, proc_state, signal_pid, start_recorded
from ..spares import SparePool, start_spares
from ..supervisor import Supervisor
from trainer.clock import CLOCK_DIR_ENV, HOST_CLOCK_ENV, HOST_ENV
from trainer.events import EventLog
from trainer.runspec import RunSpec, parse_host_clocks
from trainer.keys import write_key_files
from trainer.secretfile import ensure_secret
from trainer.wire import load_secret

from .base import Cluster, UnsupportedFault
from .disk_layer import LocalDiskLayer, missing_requirements
from .ranks import published_rank_pid, split_rank, wait_for_rank

START_TIMEOUT = 90.0
SPARE_PRELOAD = "trainer.warm"  # what a warm spare imports: torch, both roles, torch's first-use costs
STOP_TIMEOUT = 20.0
TOXIPROXY = "toxiproxy"  # the proxy server's process: not a fault target


class LocalCluster(Cluster):
    backend_name = "local"
    supports_disk_layer = True  # when this machine can mount it (preflight says what it lacks)

    def __init__(self, run_dir: str | os.PathLike, spec: RunSpec | None = None, toxiproxy_url: str | None = None,
                 name: str = "islands", **settings) -> None:
        """`spec` is what runs; `settings` (learners=, mode=, task=, ...) make or amend one."""
        self.spec = spec = (spec or RunSpec()).replace(backend="local", **settings)
        self.run_dir = Path(run_dir)
        self.learners = spec.learners
        self.learner_args = {i: list(a) for i, a in spec.learner_args.items()}
        self.toxiproxy_url = toxiproxy_url if toxiproxy_url is not None else os.environ.get("TOXIPROXY_URL")
        self.registry = Registry(name, run_dir=self.run_dir)
        self.toxiproxy: ToxiproxyClient | None = None  # type: ignore[assignment]
        self.syncer_port = 0
        self._port_reservation: socket.socket | None = None
        self.proxy_ports: dict[str, int] = {}
        self.procs: dict[str, ManagedProcess] = {}
        self.leftovers: list[str] = []
        self.warm_spares = spec.warm_spares
        self.spares: SparePool | None = None
        # Process state changes (a fault's kill or restart, the supervisor's restart) one at a
        # time; waiting for a restarted syncer to listen happens outside it.
        self._lock = threading.RLock()
        self._held: set[str] = set()  # units killed by a fault, down until its stop restarts them
        self._stopping = False
        self.supervisor: Supervisor | None = None
        self._supervisor_log: EventLog | None = None
        self.disk = LocalDiskLayer(self.run_dir, self.registry) if spec.disk_layer else None
        # Processes on clocks of their own (spec.host_clocks): each on a host named for it,
        # whose clock probe answers on a port of its own.
        self.host_clocks = parse_host_clocks(spec.host_clocks)
        self.probe_ports: dict[str, int] = {}

    def preflight(self) -> None:
        if self.disk is not None and (missing := missing_requirements()):
            raise ValueError(f"disk_layer: the disk-fault layer (disk and power_loss faults) needs "
                             f"{', '.join(missing)} on this machine")

    # ----------------------------------------------------------- lifecycle
    def start(self) -> None:
        self.leftovers = self.registry.reap_leftovers()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        secret_file = ensure_secret(self.run_dir / "secret")
        # Each learner gets only its own key (trainer/keys.py); the run secret is the syncer's.
        self.key_files = write_key_files(self.run_dir / "keys", load_secret(str(secret_file)), self.learners)
        self.env = {**os.environ, **self.spec.env, "ISLANDS_SECRET_FILE": str(secret_file),
                    "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", CLOCK_DIR_ENV: self.clock_dir_env}
        self._start_spares()
        self._start_toxiproxy()
        self._start_host_clocks()
        # Every process imports torch (3-4 s of CPU): start them together, not the learners
        # after the syncer listens. The syncer's port is reserved first, so the proxies can
        # point at it now; a learner that dials before the syncer listens is refused by its
        # proxy and retries (trainer/link.py), as after a syncer restart.
        self._reserve_syncer_port()
        if self.disk is not None:
            self.disk.start()
        syncer = self._spawn_syncer()
        for i in range(1, self.learners + 1):
            self._create_proxy(f"learner-{i}")
        for i in range(1, self.learners + 1):
            self._start_learner(i)
        self._wait_syncer_listening(syncer)
        self._supervisor_log = EventLog(str(self.run_dir), "supervisor")
        self.supervisor = Supervisor(self, self._supervisor_log.emit, self._lock)
        self.supervisor.start()

    # ----------------------------------------------------------- host clocks
    @staticmethod
    def host_of(process: str) -> str:
        return f"host-{process}"

    def _start_host_clocks(self) -> None:
        """Write each host's clock file (its offset from now on, and its drift) and start
        its clock probe's responder, reading the same file as the host's processes do."""
        directory = self.run_dir / "hosts"
        for process, (offset, drift_ppm) in sorted(self.host_clocks.items()):
            host = self.host_of(process)
            directory.mkdir(parents=True, exist_ok=True)
            clock_file = directory / f"{host}.json"
            clock_file.write_text(json.dumps({"offset": offset, "rate": 1.0 + drift_ppm * 1e-6,
                                              "anchor": time.monotonic()}))
            port_file = directory / f"{host}.port"
            port_file.unlink(missing_ok=True)
            name = f"clock-{host}"
            proc = self.procs[name] = start_recorded(name, [
                sys.executable, "-m", "chaos.clock_probe", "serve", "--host-name", host, "--port-file", str(port_file)],
                self.run_dir / "logs", self._env_of(process), self.registry)
            deadline = time.monotonic() + START_TIMEOUT
            while not port_file.exists():  # bounded: the responder writes it once bound
                if not proc.running() or time.monotonic() > deadline:
                    raise RuntimeError(f"{name}: the clock probe's responder did not start; see {proc.log}")
                time.sleep(0.02)
            self.probe_ports[host] = int(port_file.read_text())

    def _env_of(self, process: str) -> dict[str, str]:
        """The environment of `process` (a unit: syncer, learner-N): the cluster's, and its
        host's clock when it has one of its own."""
        unit = process.split("/", 1)[0]
        if unit not in self.host_clocks:
            return self.env
        host = self.host_of(unit)
        return {**self.env, HOST_ENV: host, HOST_CLOCK_ENV: str(self.run_dir / "hosts" / f"{host}.json")}

    def clock_hosts(self) -> dict[str, tuple[str, int]]:
        return {host: ("127.0.0.1", port) for host, port in self.probe_ports.items()}

    def _reserve_syncer_port(self) -> None:
        """Hold a port for the syncer: bound (SO_REUSEADDR) but never listening, so the
        kernel hands it to no other socket, while the syncer (which sets SO_REUSEADDR too)
        can bind and listen on it, now and after every restart."""
        if self._port_reservation is not None:
            return
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", self.syncer_port))
        self._port_reservation = sock
        self.syncer_port = sock.getsockname()[1]

    def _start_spares(self) -> None:
        """Warm spares (chaos/spares.py) that restarts take instead of a cold Python: a
        restart then costs the role's own start-up, not importing torch."""
        self.spares = start_spares(sys.executable, self.env, [SPARE_PRELOAD], self.run_dir / "logs",
                                   self.warm_spares, self.registry)

    def _start_toxiproxy(self) -> None:
        """Our Toxiproxy-compatible server in a process of its own, as the real one runs: the
        controller is only its client. In the controller's process, a controller starved by
        a loaded machine starved every link with it (no learner stepped for 150 s, and the
        final heal could not reach the API); and the proxies' pumping threads took the GIL
        from the controller's workers and its heartbeat."""
        if self.toxiproxy_url:
            self.toxiproxy = ToxiproxyClient(self.toxiproxy_url)
            self.toxiproxy.reset()
        else:
            address_file = self.run_dir / "toxiproxy.addr"
            address_file.unlink(missing_ok=True)
            proc = self.procs[TOXIPROXY] = start_recorded(TOXIPROXY, [
                sys.executable, "-m", "chaos.toxiproxy", "--host", "127.0.0.1", "--port", "0",
                "--address-file", str(address_file), "--log-level", "WARNING"],
                self.run_dir / "logs", self.env, self.registry)
            url = str(self._wait_for_address(proc, address_file, TOXIPROXY)["url"])
            if self.toxiproxy is None:
                self.toxiproxy = ToxiproxyClient(url)
            else:  # restarted: the client every nemesis holds follows it to its new API port
                self.toxiproxy.url = url
        (self.run_dir / "toxiproxy.json").write_text(json.dumps({"url": self.toxiproxy.url}))

    def _wait_for_address(self, proc: ManagedProcess, address_file: Path, what: str) -> dict:
        """The address `proc` writes once it listens; raises, with its log's tail, if it exits first."""
        deadline = time.monotonic() + START_TIMEOUT
        while not address_file.exists():
            if not proc.running():
                raise RuntimeError(f"{what} exited with {proc.popen.returncode} before listening; the end of "
                                   f"{proc.log}:\n{log_tail(proc.log)}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what} did not listen within {START_TIMEOUT:.0f}s; see {proc.log}")
            time.sleep(0.05)
        return json.loads(address_file.read_text())

    def _create_proxy(self, name: str) -> None:
        try:
            self.toxiproxy.delete_proxy(name)  # a leftover of a crashed run against a real Toxiproxy
        except NotFound:
            pass
        proxy = self.toxiproxy.create_proxy(name, "127.0.0.1:0", f"127.0.0.1:{self.syncer_port}")
        self.proxy_ports[name] = int(proxy["listen"].rsplit(":", 1)[1])

    def _spawn(self, name: str, argv: list[str]) -> ManagedProcess:
        with self._lock:
            if self._stopping:
                raise RuntimeError(f"{name}: not started, the cluster is stopping")
            proc = self.procs[name] = start_recorded(name, argv, self.run_dir / "logs", self._env_of(name),
                                                        self.registry, self.spares)
        return proc

    def _spawn_syncer(self) -> ManagedProcess:
        address_file = self.run_dir / "syncer.json"
        address_file.unlink(missing_ok=True)
        return self._spawn("syncer", [
            sys.executable, "-m", "trainer", "syncer", "--state-dir", str(self.run_dir / "state"),
            "--run-dir", str(self.run_dir), "--address-file", str(address_file), "--host", "127.0.0.1",
            "--port", str(self.syncer_port), *self.spec.syncer_flags()])

    def _wait_syncer_listening(self, proc: ManagedProcess) -> None:
        self.syncer_port = int(self._wait_for_address(proc, self.run_dir / "syncer.json", "syncer")["port"])

    def _start_learner(self, i: int) -> ManagedProcess:
        port = self.proxy_ports[f"learner-{i}"]
        return self._spawn(f"learner-{i}", [
            sys.executable, "-m", "trainer", "learner", "--learner", str(i), "--connect", f"127.0.0.1:{port}",
            "--run-dir", str(self.run_dir), "--key-file", str(self.key_files[i]), *self.spec.learner_flags(i)])

    def stop(self) -> None:
        """Heal the links, SIGTERM learners (they push what is left), then the syncer."""
        with self._lock:
            self._stopping = True  # a restart still in flight elsewhere starts nothing from now on
        if self.supervisor is not None:
            self.supervisor.stop()  # nothing stopped from here on is restarted
        if self.toxiproxy is not None:
            for proxy in self.link_proxies():
                try:
                    self.toxiproxy.clear(proxy)
                except Exception:  # noqa: BLE001 - stopping must go on whatever the proxy says
                    pass
        learners = [p for n, p in self.procs.items() if n.startswith("learner-")]
        for proc in learners:
            proc.signal(signal.SIGCONT)
            proc.signal(signal.SIGTERM)
        for proc in learners:
            proc.terminate(STOP_TIMEOUT)
        if "syncer" in self.procs:
            self.procs["syncer"].terminate(STOP_TIMEOUT)
        if self.disk is not None:
            self.disk.stop()
        if self.spares is not None:
            self.spares.close()
        if TOXIPROXY in self.procs:
            self.procs[TOXIPROXY].terminate(STOP_TIMEOUT)
        for name in [n for n in self.procs if n.startswith("clock-")]:
            self.procs[name].terminate(STOP_TIMEOUT)
        if self._port_reservation is not None:
            self._port_reservation.close()
            self._port_reservation = None
        if self._supervisor_log is not None:
            self._supervisor_log.close()
            self._supervisor_log = None
        self.registry.close()

    # ----------------------------------------------------------- processes
    def _proc(self, target: str) -> ManagedProcess | None:
        return self.procs.get(self.check_target(target))

    def _rank_pid(self, target: str) -> int | None:
        """PID of one rank of a running unit, from the file the unit publishes; None if down."""
        unit, rank = split_rank(self.check_target(target))
        proc = self.procs.get(unit)
        if proc is None or not proc.running() or rank is None:
            return None
        pid = published_rank_pid(self.run_dir, unit, rank)
        return pid if pid is not None and proc_parent(pid) == proc.pid else None  # never a recycled PID

    def kill(self, target: str) -> None:
        if split_rank(target)[1] is not None:
            pid = self._rank_pid(target)
            if pid is not None:
                signal_pid(pid, signal.SIGKILL)  # the unit sees it and restarts all its ranks
            return
        with self._lock:
            proc = self._proc(target)
            self._held.add(target)  # down on purpose: the supervisor leaves it to the fault's stop
        if proc is not None:
            # Down from the moment the signal is sent: it runs no instruction after that. Its
            # teardown (seconds on a loaded machine) is reaped when it is restarted, so the
            # kill's time in force is not the kernel's time to free a large process.
            proc.signal(signal.SIGKILL)

    def set_disk(self, target: str, mode: str, latency_ms: float = 50.0) -> None:
        if self.disk is None:
            raise UnsupportedFault(self._needs_disk_layer("disk"))
        self.disk.set_mode(mode, latency_ms)

    def power_loss(self, target: str) -> None:
        """SIGKILL the syncer and the disk layer under it: what was not synced is gone."""
        if self.disk is None:
            raise UnsupportedFault(self._needs_disk_layer("power_loss"))
        with self._lock:
            proc = self._proc(target)
            self._held.add(target)
            # Signals only, as for a kill: both are down from here, and `restart` reaps them.
            if proc is not None:
                proc.signal(signal.SIGKILL)
            self.disk.power_off()

    def pause(self, target: str) -> None:
        self._signal(target, signal.SIGSTOP)

    def resume(self, target: str) -> None:
        self._signal(target, signal.SIGCONT)

    def _signal(self, target: str, sig: int) -> None:
        if split_rank(target)[1] is not None:
            pid = self._rank_pid(target)
            if pid is not None:
                signal_pid(pid, sig)
            return
        proc = self._proc(target)
        if proc is not None:
            proc.signal(sig)  # the process group: a unit's ranks with it

    def restart(self, target: str) -> None:
        unit, rank = split_rank(self.check_target(target))
        with self._lock:
            was_down = unit in self._held
            self._held.discard(unit)
            proc = self.procs.get(unit)
            if was_down and proc is not None:
                proc.kill()  # SIGKILLed by the fault: reap it (its teardown may still run) before its successor
            if unit == "syncer" and self.disk is not None and not self.disk.running:
                self.disk.start()  # powered up again: the layer first, with only its durable image
            spawned = None if proc is not None and proc.running() else self._spawn_unit(unit)
        if spawned is None:
            if rank is not None:  # the unit restarts its ranks itself: wait for it
                wait_for_rank(lambda: self.is_running(target), target)
            return
        if unit == "syncer":
            self._wait_syncer_listening(spawned)

    def _spawn_unit(self, unit: str) -> ManagedProcess:
        """Start the syncer or a learner unit again (not waiting for the syncer to listen)."""
        if unit == "syncer":
            return self._spawn_syncer()
        return self._start_learner(int(unit.split("-", 1)[1]))

    # ----------------------------------------------------------- supervision (chaos/supervisor.py)
    def supervised(self) -> list[str]:
        return [*self.units(), *([TOXIPROXY] if TOXIPROXY in self.procs else [])]

    def exit_code(self, name: str) -> int | None:
        proc = self.procs.get(name)
        return proc.exit_code() if proc is not None else None

    def started_at(self, name: str) -> float | None:
        proc = self.procs.get(name)
        return proc.started_at if proc is not None else None

    def held(self, name: str) -> bool:
        return name in self._held

    def respawn(self, name: str) -> None:
        """Start `name` again after it exited on its own. The proxy server comes back with
        every proxy at its old listen port (the learners dial those), but without the toxics
        it held: the supervisor's `exit` event says so, and faults_applied fails the run."""
        if name == TOXIPROXY:
            self._start_toxiproxy()
            self.toxiproxy.populate([{"name": n, "listen": f"127.0.0.1:{port}",
                                      "upstream": f"127.0.0.1:{self.syncer_port}", "enabled": True}
                                     for n, port in self.proxy_ports.items()])
            return
        self._spawn_unit(name)

    def is_running(self, target: str) -> bool:
        if split_rank(target)[1] is not None:
            pid = self._rank_pid(target)
            return pid is not None and proc_state(pid) not in (None, "Z")
        proc = self._proc(target)
        return proc is not None and proc.running() and target not in self._held  # killed: down, if not yet reaped

    def is_paused(self, target: str) -> bool:
        if split_rank(target)[1] is not None:
            pid = self._rank_pid(target)
            return pid is not None and proc_state(pid) == "T"
        proc = self._proc(target)
        return proc is not None and proc.paused()

    def pid(self, target: str) -> int | None:
        if split_rank(target)[1] is not None:
            return self._rank_pid(target)
        proc = self._proc(target)
        return proc.pid if proc is not None and proc.running() else None
