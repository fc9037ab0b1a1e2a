"""The stack file rendered from compose.yaml, `chaos stack`, and the API relay: no Docker needed."""
from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml

from chaos import forward
from chaos.backends.compose_file import PROXY_BASE_PORT, load_services
from chaos.backends.stack import Placement, render_stack
from chaos.backends.swarm import _parse_time

ROOT = Path(__file__).resolve().parents[2]
NODE_CLOCK_ENV = {"ISLANDS_HOST": "{{.Node.Hostname}}", "ISLANDS_HOST_CLOCK_FILE": "/islands/host-clock/clock.json"}
FILES = [ROOT / "compose.yaml", ROOT / "compose.islands-toxiproxy.yaml"]


def test_the_stack_runs_what_compose_runs() -> None:
    compose = load_services(*FILES)
    stack = render_stack(FILES, learners=3)
    for name in ("syncer", "toxiproxy", "learner-1", "learner-2", "learner-3"):
        svc = stack["services"][name]
        for key in ("image", "command", "networks", "init"):
            if key in compose[name]:
                assert svc[key] == compose[name][key], f"{name}.{key} differs from compose.yaml"
        if "environment" in compose[name]:  # and, on top, the node it runs on and its clock
            assert svc["environment"] == {**compose[name]["environment"], **NODE_CLOCK_ENV}, name
    assert stack["services"]["syncer"]["secrets"] == ["islands_secret"]
    assert stack["secrets"] == yaml.safe_load((ROOT / "compose.yaml").read_text())["secrets"]


def test_swarm_only_keys_are_added_and_compose_only_keys_dropped() -> None:
    stack = render_stack(FILES, learners=2, placement=Placement(learners=("node.labels.islands.learners == true",)))
    services = stack["services"]
    assert stack["version"] == "3.8"
    for name, svc in services.items():
        if name == "clock":
            continue  # one task per node (below)
        assert "depends_on" not in svc and "ports" not in svc, name
        deploy = svc["deploy"]
        assert deploy["restart_policy"]["condition"] == "any", name   # Swarm brings a killed task back
        assert deploy["endpoint_mode"] == "dnsrr", name                 # no IPVS needed
    for role in ("syncer", "toxiproxy"):
        assert services[role]["deploy"]["placement"]["constraints"] == ["node.labels.islands.syncer == true"]
    assert services["learner-2"]["deploy"]["placement"]["constraints"] == ["node.labels.islands.learners == true"]
    # A paused container must not be replaced as unhealthy; the proxy keeps its probe.
    assert services["syncer"]["healthcheck"] == {"disable": True}
    assert services["learner-1"]["healthcheck"] == {"disable": True}
    assert services["toxiproxy"]["healthcheck"]["interval"] == "1s", "the override's probe lost compose.yaml's timing"
    assert {n: s["driver"] for n, s in stack["networks"].items()} == {"control": "overlay", "links": "overlay",
                                                                     "backplane": "overlay"}
    assert stack["networks"]["control"]["attachable"] and stack["networks"]["links"]["internal"]


def test_the_proxy_config_is_a_swarm_config_not_a_bind_mount() -> None:
    stack = render_stack(FILES, learners=3)
    proxy = stack["services"]["toxiproxy"]
    assert "volumes" not in proxy
    assert proxy["configs"] == [{"source": "toxiproxy_config", "target": "/config/toxiproxy.json"}]
    assert Path(stack["configs"]["toxiproxy_config"]["file"]) == (ROOT / "docker" / "toxiproxy.json").resolve()


def test_learners_beyond_compose_yaml_and_their_own_flags() -> None:
    services = render_stack(FILES, learners=5, learner_args={2: ("--speed", "0.25")})["services"]
    assert [n for n in services if n.startswith("learner-")] == [f"learner-{i}" for i in range(1, 6)]
    for i in range(1, 6):
        command = services[f"learner-{i}"]["command"]
        assert command[command.index("--learner") + 1] == str(i)
        assert command[command.index("--connect") + 1] == f"toxiproxy:{PROXY_BASE_PORT + i}"
    assert services["learner-2"]["command"][-2:] == ["--speed", "0.25"]
    assert "--speed" not in services["learner-3"]["command"]


def test_a_compose_file_without_learners_is_refused_by_name(tmp_path: Path) -> None:
    bad = tmp_path / "compose.yaml"
    bad.write_text("services:\n  syncer: {image: x}\n  toxiproxy: {image: y}\n")
    with pytest.raises(ValueError, match="defines no learner-N service"):
        render_stack([bad], learners=1)


def test_chaos_stack_prints_a_file_stack_deploy_reads(tmp_path: Path) -> None:
    out = tmp_path / "stack.yaml"
    done = subprocess.run([sys.executable, "-m", "chaos", "stack", "--learners", "4", "-o", str(out)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    text = out.read_text()
    assert "&id" not in text and "*id" not in text, "YAML anchors in a file meant for people"
    assert sorted(yaml.safe_load(text)["services"]) == sorted(
        ["syncer", "toxiproxy", "clock", "learner-1", "learner-2", "learner-3", "learner-4"])
    bad = subprocess.run([sys.executable, "-m", "chaos", "stack", "--compose-file", str(tmp_path / "nope.yaml")],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--compose-file: no such file" in bad.stderr


def test_docker_timestamps_parse_to_unix_seconds() -> None:
    assert _parse_time("2026-12-02T08:31:02.123456789Z") == pytest.approx(1796200262.123456789)
    assert _parse_time("2026-12-02T08:31:02Z") == 1796200262.0


@pytest.mark.parametrize("bad", ["8474", "host:", ":80", "host:0", "host:65536", "host:http"])
def test_relay_addresses_are_checked(bad: str) -> None:
    with pytest.raises(Exception, match="expected HOST:PORT"):
        forward.address(bad)


def test_the_relay_carries_bytes_both_ways() -> None:
    """An echo server behind the relay: what goes in comes back, through a second connection too."""
    echo = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve_echo() -> None:
        echo.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = echo.accept()
            except TimeoutError:
                continue
            with conn:
                while data := conn.recv(65536):
                    conn.sendall(data)

    echo_thread = threading.Thread(target=serve_echo, daemon=True)
    echo_thread.start()
    loop = asyncio.new_event_loop()
    relay = forward.Relay(echo.getsockname())
    server = loop.run_until_complete(asyncio.start_server(relay.handle, "127.0.0.1", 0))
    port = server.sockets[0].getsockname()[1]
    loop_thread = threading.Thread(target=loop.run_forever, daemon=True)
    loop_thread.start()
    try:
        for payload in (b"GET /version HTTP/1.1\r\n\r\n", bytes(range(256)) * 1000):
            with socket.create_connection(("127.0.0.1", port), timeout=5) as client:
                client.sendall(payload)
                got = b""
                while len(got) < len(payload):
                    chunk = client.recv(65536)
                    assert chunk, f"the relay closed after {len(got)} of {len(payload)} bytes"
                    got += chunk
                assert got == payload
    finally:
        async def shutdown() -> None:  # every connection's handler ends with its client
            server.close()
            others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            await asyncio.wait_for(asyncio.gather(*others, return_exceptions=True), 5)

        asyncio.run_coroutine_threadsafe(shutdown(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        loop_thread.join(5)
        loop.close()
        stop.set()
        echo_thread.join(5)  # out of accept() before its socket closes under it
        echo.close()


def test_one_run_holds_a_stack_at_a_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A start removes what its stack holds: a second run of the same stack must be refused,
    naming the first, and get it once the first lets go."""
    from chaos.backends.compose_guard import ClusterBusy
    from chaos.backends.swarm import SwarmCluster

    monkeypatch.setenv("ISLANDS_HOME", str(tmp_path / "home"))
    first, second = SwarmCluster(tmp_path / "first", stack="s1"), SwarmCluster(tmp_path / "second", stack="s1")
    first.claim_project()
    with pytest.raises(ClusterBusy, match=r"swarm stack 's1' is in use by another run .*ISLANDS_SWARM_STACK"):
        second.claim_project()
    other = SwarmCluster(tmp_path / "other", stack="s2")
    other.claim_project()  # another stack is free
    other.release_project()
    first.release_project()
    second.claim_project()
    second.release_project()


def test_each_learner_service_gets_only_its_own_key_as_a_docker_secret() -> None:
    """Issue 27: with the run secret, or another's key, a learner could speak as any learner."""
    stack = render_stack(FILES, learners=5)
    assert stack["services"]["syncer"]["secrets"] == ["islands_secret"]
    for n in range(1, 6):
        svc = stack["services"][f"learner-{n}"]
        assert svc["secrets"] == [f"islands_key_{n}"], n
        assert svc["command"][svc["command"].index("--key-file") + 1] == f"/run/secrets/islands_key_{n}"
        assert "ISLANDS_SECRET_FILE" not in (svc.get("environment") or {}), n
    assert sorted(stack["secrets"]) == ["islands_key_1", "islands_key_2", "islands_key_3", "islands_key_4",
                                        "islands_key_5", "islands_secret"]
    assert stack["secrets"]["islands_key_5"] == {"file": "${ISLANDS_KEY_DIR:-./runs/compose/keys}/learner-5.key"}
    fewer = render_stack(FILES, learners=2)
    assert sorted(fewer["secrets"]) == ["islands_key_1", "islands_key_2", "islands_secret"]


def test_every_node_answers_clock_probes_and_every_task_reads_its_nodes_clock() -> None:
    """Nodes are machines whose clocks disagree: a task names its node and reads the node's
    clock file; one responder per node answers the controller's probes on a port that node
    alone publishes (mode host, not the routing mesh, which would answer from any node)."""
    stack = render_stack(FILES, learners=2)
    clock = stack["services"]["clock"]
    assert clock["deploy"]["mode"] == "global"
    assert clock["ports"] == [{"target": 7071, "published": 7071, "protocol": "udp", "mode": "host"}]
    assert clock["command"][:2] == ["chaos.clock_probe", "serve"] and "0.0.0.0" in clock["command"]
    for name in ("clock", "syncer", "learner-1", "learner-2"):
        svc = stack["services"][name]
        assert {k: svc["environment"][k] for k in NODE_CLOCK_ENV} == NODE_CLOCK_ENV, name
        assert {"type": "bind", "source": "/var/lib/islands/host-clock", "target": "/islands/host-clock",
                "read_only": True} in svc["volumes"], name


def test_no_directory_of_this_machine_is_shared_with_the_nodes(tmp_path: Path) -> None:
    """Each node's tasks write into the node's own `run` volume (copied out through its
    engine); the built-in task needs no folder of this machine; a data file is a config."""
    stack = render_stack(FILES, learners=2, task_mount=False)
    for name in ("syncer", "learner-1", "learner-2"):
        volumes = stack["services"][name]["volumes"]
        assert "run:/islands/run" in volumes, name
        assert not any(isinstance(v, str) and ("ISLANDS_RUN_DIR" in v or "/islands/task" in v) for v in volumes), name
    assert "run:/islands/run:ro" in stack["services"]["clock"]["volumes"]  # the evidence is read through it
    assert stack["volumes"]["run"] == {}
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("hello")
    with_data = render_stack(FILES, learners=1, data_file=corpus)
    assert with_data["configs"]["islands_data"] == {"file": str(corpus)}
    assert {"source": "islands_data", "target": "/islands/data/corpus.txt"} in with_data["services"]["learner-1"]["configs"]
    assert any("/islands/task" in str(v) for v in render_stack(FILES, learners=1)["services"]["syncer"]["volumes"])
