#!/usr/bin/env python3
"""A multi-node Docker Swarm on one machine, from Docker-in-Docker nodes.

Why: the Islands cluster runs as a swarm stack, and a chaos run wants to fail a *node*
(not just a container) and watch Swarm notice and reschedule. One host engine is one
node, so this script starts N Docker-in-Docker containers ``islands-node-1..N`` (privileged,
or with every capability but CAP_SYS_RESOURCE where the host lacks it), each with its own
``dockerd`` on overlay2 over a named volume, on the project's own bridge network ``islands-node-net``, makes them a
swarm (node 1 manager, the rest workers), loads the Islands image into each, and labels
them so a stack can place the syncer on node 1 and learners on the others.

    python3 bench/swarm_nodes.py image                  # build islands-node:bookworm offline
    python3 bench/swarm_nodes.py up --nodes 3           # network, nodes, images, swarm, labels
    python3 bench/swarm_nodes.py up --clocks=+5@200,-6@-300,+7@100   # each node a clock of its own
    python3 bench/swarm_nodes.py fail islands-node-3    # power-cut a node (docker kill)
    python3 bench/swarm_nodes.py recover islands-node-3 # power it back on (docker start)
    python3 bench/swarm_nodes.py power islands-node-3 off|on   # the same, as a `node` fault runs it
    python3 bench/swarm_nodes.py check                  # throwaway stack: placement, failover,
                                                        # overlay across nodes, shared bind mount
    python3 bench/swarm_nodes.py down                   # remove nodes, volumes, network

Everything it creates is named ``islands-node*`` and labelled ``islands.node=1``; it never
touches the host engine's own swarm, containers or networks. Each inner engine listens on
``tcp://0.0.0.0:2375`` without TLS *inside its node*; nothing is published on the host, so
the port is reachable only over ``islands-node-net`` (from the host and the other nodes).
Every wait is bounded and every subprocess has a timeout.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.outputs import check_output, output_file  # noqa: E402
from trainer.argtypes import Parser  # noqa: E402

NODE_IMAGE = "islands-node:bookworm"
NETWORK = "islands-node-net"
PREFIX = "islands-node"
OWNER_LABEL = "islands.node=1"
ENGINE_PORT = 2375
DEFAULT_SUBNET = "10.213.77.0/24"
DEFAULT_OUT = REPO / "runs" / "swarm-nodes.json"
MIRROR = os.environ.get("DEBIAN_MIRROR", "http://deb.debian.org/debian")
NODE_PACKAGES = "docker.io,iptables,ca-certificates,procps,python3,tini,iproute2"
NODE_NAME_RE = re.compile(rf"^{PREFIX}-(\d+)$")


def log(msg: str) -> None:
    """Progress goes to stderr so stdout stays the JSON summary."""
    print(f"[swarm-nodes] {msg}", file=sys.stderr, flush=True)


class Fail(RuntimeError):
    """An error worth one clear line to the user, not a traceback."""


def sh(*args: str, timeout: float = 120, check: bool = True) -> str:
    """Run a command with a timeout; a failure raises Fail with its stderr."""
    try:
        p = subprocess.run(args, capture_output=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        raise Fail(f"timed out after {timeout:.0f}s: {shlex.join(args)}") from e
    if check and p.returncode != 0:
        err = p.stderr.decode(errors="replace").strip() or p.stdout.decode(errors="replace").strip()
        raise Fail(f"{shlex.join(args)} -> rc {p.returncode}: {err}")
    return p.stdout.decode(errors="replace").strip()


def engine(ip: str) -> str:
    """The engine URL of a node's inner dockerd."""
    return f"tcp://{ip}:{ENGINE_PORT}"


def dk(ip: str | None, *args: str, timeout: float = 60, check: bool = True) -> str:
    """docker CLI against the host engine (ip None) or a node's inner engine."""
    host = ["-H", engine(ip)] if ip else []
    return sh("docker", *host, *args, timeout=timeout, check=check)


def exists(kind: str, name: str) -> bool:
    """Whether a host-engine object (image, container, volume, network) exists."""
    return subprocess.run(["docker", kind, "inspect", name], capture_output=True, timeout=30).returncode == 0


# ---------------------------------------------------------------- image

def cmd_image(args: argparse.Namespace) -> dict[str, Any]:
    """Build islands-node:bookworm: debootstrap bookworm minbase + docker.io, docker import.

    Why debootstrap --include and not a Dockerfile: no registry is reachable and nothing may
    be downloaded inside a container; debootstrap fetches on the host and resolves docker.io's
    dependencies (containerd, runc, tini). It also installs a policy-rc.d and a fake
    start-stop-daemon while it configures, so docker.io's postinst starts no dockerd on the host.
    """
    if exists("image", NODE_IMAGE) and not args.rebuild:
        log(f"{NODE_IMAGE} is present, reused (--rebuild to build it again)")
        return {"image": NODE_IMAGE, "reused": True}
    if not shutil.which("debootstrap"):
        raise Fail("debootstrap is missing: apt-get install -y debootstrap")
    t0 = time.monotonic()
    root = Path(tempfile.mkdtemp(prefix="islands-node-rootfs."))
    logf = root.with_suffix(".log")
    try:
        log(f"debootstrap --variant=minbase --include={NODE_PACKAGES} bookworm into {root}")
        with open(logf, "wb") as lf:
            subprocess.run(["debootstrap", "--variant=minbase", f"--include={NODE_PACKAGES}",
                            "bookworm", str(root), MIRROR], stdout=lf, stderr=subprocess.STDOUT,
                           timeout=1800, check=True)
        if (root / "usr/sbin/policy-rc.d").exists() or not (root / "usr/sbin/dockerd").exists():
            raise Fail(f"unexpected rootfs (policy-rc.d left, or no dockerd); see {logf}")
        for junk in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for f in (root / junk).glob("*"):
                if f.is_file():
                    f.unlink()
        t_boot = time.monotonic() - t0
        log("docker import")
        tar = subprocess.Popen(["tar", "-C", str(root), "-c", "."], stdout=subprocess.PIPE)
        # `up` passes its own command (NODE_INIT); this CMD is for a plain privileged run.
        changes = ['ENV LANG=C.UTF-8',
                   'ENTRYPOINT ["/usr/bin/tini", "--"]',
                   f'CMD ["dockerd", "--host=unix:///var/run/docker.sock", "--host=tcp://0.0.0.0:{ENGINE_PORT}", '
                   '"--tls=false"]']
        imp = subprocess.run(["docker", "import", *sum((["-c", c] for c in changes), []), "-", NODE_IMAGE],
                             stdin=tar.stdout, capture_output=True, timeout=600)
        tar.wait(timeout=60)
        if imp.returncode != 0:
            raise Fail(f"docker import failed: {imp.stderr.decode(errors='replace')}")
    except subprocess.CalledProcessError as e:
        raise Fail(f"{e.cmd[0]} failed (rc {e.returncode}); see {logf}") from e
    finally:
        shutil.rmtree(root, ignore_errors=True)
    logf.unlink(missing_ok=True)
    total = time.monotonic() - t0
    size = int(sh("docker", "image", "inspect", "-f", "{{.Size}}", NODE_IMAGE))
    log(f"built {NODE_IMAGE} in {total:.0f}s (debootstrap {t_boot:.0f}s), {size / 1e6:.0f} MB")
    return {"image": NODE_IMAGE, "reused": False, "build_s": round(total, 1),
            "debootstrap_s": round(t_boot, 1), "size_mb": round(size / 1e6)}


# ---------------------------------------------------------------- nodes

def node_names() -> list[str]:
    """The node containers this script created (by label and name), in node order."""
    out = sh("docker", "ps", "-a", "--filter", f"label={OWNER_LABEL}", "--format", "{{.Names}}")
    names = [n for n in out.split() if NODE_NAME_RE.match(n)]
    return sorted(names, key=lambda n: int(NODE_NAME_RE.match(n).group(1)))  # type: ignore[union-attr]


def node_ip(name: str) -> str:
    """A node's address on islands-node-net (static: given at `up`, kept across restarts)."""
    ip = sh("docker", "inspect", "-f", f'{{{{(index .NetworkSettings.Networks "{NETWORK}").IPAddress}}}}', name)
    if not ip:
        # A stopped container has no live address; the static one is in its config.
        ip = sh("docker", "inspect", "-f",
                f'{{{{(index .NetworkSettings.Networks "{NETWORK}").IPAMConfig.IPv4Address}}}}', name)
    return ip


def wait_engine(name: str, ip: str, timeout: float) -> float:
    """Poll a node's inner engine /_ping until it answers; a clear error names the node."""
    t0 = time.monotonic()
    last = ""
    while time.monotonic() - t0 < timeout:
        try:
            with urllib.request.urlopen(f"http://{ip}:{ENGINE_PORT}/_ping", timeout=2) as r:
                if r.read() == b"OK":
                    return time.monotonic() - t0
        except OSError as e:
            last = str(e)
        state = sh("docker", "inspect", "-f", "{{.State.Status}}", name, check=False)
        if state not in ("running", "created", "restarting"):
            break
        time.sleep(0.3)
    raw = subprocess.run(["docker", "logs", "--tail", "25", name], capture_output=True, timeout=20)
    tail = (raw.stdout + raw.stderr).decode(errors="replace")
    raise Fail(f"{name}: inner dockerd at {engine(ip)} did not answer within {timeout:.0f}s "
               f"(last error: {last}); its log ends:\n{tail}")


# The node's PID 1 (under tini): make /sys and the cgroup v1 hierarchies writable (needed in
# `caps` mode, harmless when privileged), then become dockerd. --tls=false says the plain TCP
# listener is intended, which skips the 20.10 engine's deliberate start-up delay for it.
# DOCKER_SERVICE_PREFER_OFFLINE_IMAGE=1: a swarm task uses the loaded image instead of first
# trying a registry that cannot be reached (a failed pull on every (re)scheduled task).
NODE_INIT = f"""set -e
mount -o remount,rw /sys
for d in /sys/fs/cgroup/*/; do mount -o remount,bind,rw "$d"; done
export DOCKER_SERVICE_PREFER_OFFLINE_IMAGE=1
exec dockerd --host=unix:///var/run/docker.sock --host=tcp://0.0.0.0:{ENGINE_PORT} --tls=false
"""

# Capabilities 0..37 (CAP_AUDIT_READ): the set Docker 20.10's --privileged asks runc for.
PRIVILEGED_CAPS = (1 << 38) - 1


def host_can_privileged() -> bool:
    """Whether --privileged can start here: runc applies every capability, and fails with
    "unable to apply caps: operation not permitted" when the engine's bounding set lacks one
    (on this VM CAP_SYS_RESOURCE is missing). Judged from this process's bounding set, which
    on one machine is the engine's too."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("CapBnd:"):
            return int(line.split()[1], 16) & PRIVILEGED_CAPS == PRIVILEGED_CAPS
    return True


def security_args(mode: str) -> list[str]:
    """docker run flags for a node that can run its own dockerd.

    `privileged` is the usual Docker-in-Docker. `caps` is the nearest thing when that cannot
    start: every capability the engine may grant except CAP_SYS_RESOURCE, no seccomp or
    AppArmor profile, /proc/sys and friends unmasked and writable, every device allowed in
    the device cgroup; NODE_INIT then remounts /sys and the cgroup bind mounts read-write.
    """
    if mode == "auto":
        mode = "privileged" if host_can_privileged() else "caps"
    if mode == "privileged":
        return ["--privileged"]
    return ["--cap-add", "ALL", "--cap-drop", "SYS_RESOURCE",
            "--security-opt", "seccomp=unconfined", "--security-opt", "apparmor=unconfined",
            "--security-opt", "systempaths=unconfined", "--device-cgroup-rule", "a *:* rwm"]


def start_node(i: int, ip: str, shares: list[Path], mode: str) -> None:
    """docker run one node: its own dockerd, /var/lib/docker on a named volume."""
    name = f"{PREFIX}-{i}"
    vol = f"{name}-docker"
    sh("docker", "volume", "create", "--label", OWNER_LABEL, vol)
    binds = sum((["-v", f"{p}:{p}"] for p in shares), [])
    sh("docker", "run", "-d", "--name", name, "--hostname", name, *security_args(mode),
       "--label", OWNER_LABEL, "--network", NETWORK, "--ip", ip,
       # /run is a tmpfs: a node that comes back after a power cut boots with no stale pid
       # files or sockets, as a real machine would.
       "--tmpfs", "/run:rw,exec,mode=755",
       "-v", f"{vol}:/var/lib/docker", *binds, NODE_IMAGE, "sh", "-c", NODE_INIT, timeout=60)


def parse_clocks(text: str, nodes: int) -> list[tuple[float, float] | None]:
    """--clocks: one OFFSET[@PPM] per node in order (empty: the kernel's clock), e.g.
    "+5@200,-6@-300,+7@100"; a node past the list keeps the kernel's clock."""
    out: list[tuple[float, float] | None] = []
    for i, part in enumerate(p.strip() for p in text.split(",")) if text else ():
        if not part:
            out.append(None)
            continue
        offset, _, ppm = part.partition("@")
        try:
            out.append((float(offset), float(ppm or 0.0)))
        except ValueError:
            raise Fail(f"--clocks: node {i + 1}'s {part!r} is not OFFSET[@PPM] (seconds, parts per million)") from None
    if len(out) > nodes:
        raise Fail(f"--clocks: {len(out)} clocks for {nodes} nodes")
    return out + [None] * (nodes - len(out))


def set_node_clock(name: str, clock: tuple[float, float] | None) -> dict | None:
    """Give the node a clock of its own: its tasks read HOST_CLOCK_DIR/clock.json (the stack
    bind-mounts it, chaos/backends/stack.py), as a separate machine's clock would differ from
    this one's: an offset from now on, and a drift. The nodes share this kernel, so the
    anchor is its monotonic clock now. Without a clock the directory is made empty."""
    from chaos.backends.stack import HOST_CLOCK_DIR
    spec = None
    script = f"mkdir -p {HOST_CLOCK_DIR} && rm -f {HOST_CLOCK_DIR}/clock.json"
    if clock is not None:
        spec = {"offset": clock[0], "rate": 1.0 + clock[1] * 1e-6, "anchor": time.monotonic()}
        script += f" && printf '%s' {shlex.quote(json.dumps(spec))} > {HOST_CLOCK_DIR}/clock.json"
    sh("docker", "exec", name, "sh", "-c", script, timeout=30)
    return spec


def load_images(ips: dict[str, str], images: list[str]) -> tuple[float, dict[str, float]]:
    """docker save the images once on the host, docker load into each node's engine."""
    for img in images:
        if not exists("image", img):
            raise Fail(f"image {img} is not on the host engine (nothing is pulled)")
    fd, tarpath = tempfile.mkstemp(prefix="islands-node-images.", suffix=".tar", dir="/var/tmp")
    os.close(fd)
    per_node: dict[str, float] = {}
    try:
        t0 = time.monotonic()
        sh("docker", "save", "-o", tarpath, *images, timeout=900)
        save_s = time.monotonic() - t0
        log(f"docker save {' '.join(images)}: {os.path.getsize(tarpath) / 1e9:.2f} GB in {save_s:.1f}s")
        for name, ip in ips.items():
            t0 = time.monotonic()
            dk(ip, "load", "-q", "-i", tarpath, timeout=900)
            per_node[name] = round(time.monotonic() - t0, 1)
            log(f"{name}: docker load in {per_node[name]}s")
    finally:
        os.unlink(tarpath)
    return round(save_s, 1), per_node


def wait_ready(manager_ip: str, node_ids: list[str], timeout: float) -> float:
    """Wait until the manager lists every given node as Ready."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        states = {}
        for nid in node_ids:
            states[nid] = dk(manager_ip, "node", "inspect", "-f", "{{.Status.State}}", nid, check=False)
        if all(s == "ready" for s in states.values()):
            return time.monotonic() - t0
        time.sleep(0.5)
    raise Fail(f"swarm nodes not all ready after {timeout:.0f}s: {states}")


def describe(manager_ip: str) -> dict[str, Any]:
    """The summary: manager engine URL, and per node name, IP, engine, swarm id, role, labels."""
    nodes = []
    for name in node_names():
        ip = node_ip(name)
        nid = dk(ip, "info", "-f", "{{.Swarm.NodeID}}", check=False) if ip else ""
        info: dict[str, Any] = {"name": name, "ip": ip, "engine": engine(ip), "node_id": nid}
        if nid:
            raw = dk(manager_ip, "node", "inspect", nid, check=False)
            if raw:
                n = json.loads(raw)[0]
                info.update(role=n["Spec"]["Role"], labels=n["Spec"].get("Labels", {}),
                            state=n["Status"]["State"], availability=n["Spec"]["Availability"],
                            hostname=n["Description"]["Hostname"])
        nodes.append(info)
    return {"manager": engine(manager_ip), "network": NETWORK, "nodes": nodes}


def cmd_up(args: argparse.Namespace) -> dict[str, Any]:
    """Network, N nodes, images loaded, swarm (node 1 manager, rest workers), labels."""
    if node_names():
        raise Fail(f"nodes already exist ({', '.join(node_names())}): run `down` first")
    if not exists("image", NODE_IMAGE):
        raise Fail(f"{NODE_IMAGE} is missing: run `image` first")
    shares = [] if args.no_share else [Path(s).resolve() for s in (args.share or [str(REPO)])]
    for s in shares:
        if not s.is_dir():
            raise Fail(f"--share {s} is not a directory")
    images = args.image or ["islands:latest"]
    net = ipaddress.ip_network(args.subnet)
    hosts = list(net.hosts())
    if args.nodes + 2 > len(hosts):
        raise Fail(f"subnet {net} is too small for {args.nodes} nodes")
    figures: dict[str, Any] = {"mode": args.mode if args.mode != "auto" else
                               ("privileged" if host_can_privileged() else "caps")}

    t0 = time.monotonic()
    if not exists("network", NETWORK):
        sh("docker", "network", "create", "--driver", "bridge", "--label", OWNER_LABEL,
           "--subnet", str(net), "--gateway", str(hosts[0]), NETWORK)
    clocks = parse_clocks(args.clocks, args.nodes)
    ips = {f"{PREFIX}-{i}": str(hosts[9 + i]) for i in range(1, args.nodes + 1)}
    for i, (name, ip) in enumerate(ips.items(), 1):
        start_node(i, ip, shares, args.mode)
    figures["clocks"] = {name: set_node_clock(name, clock) for name, clock in zip(ips, clocks)}
    start: dict[str, float] = {}
    for name, ip in ips.items():
        wait_engine(name, ip, args.timeout)
        start[name] = round(time.monotonic() - t0, 1)
        log(f"{name}: engine {engine(ip)} up {start[name]}s after start")
    figures["node_start_s"] = start
    first = next(iter(ips.values()))
    figures["storage_driver"] = dk(first, "info", "-f", "{{.Driver}}")
    figures["cgroup"] = dk(first, "info", "-f", "{{.CgroupDriver}} v{{.CgroupVersion}}")
    figures["iptables_in_node"] = sh("docker", "exec", f"{PREFIX}-1", "iptables", "-V")
    log(f"inner engines: storage driver {figures['storage_driver']}, cgroup {figures['cgroup']}, "
        f"{figures['iptables_in_node']}")

    figures["image_save_s"], figures["image_load_s"] = load_images(ips, images)

    t0 = time.monotonic()
    mgr_name, mgr = next(iter(ips.items()))
    dk(mgr, "swarm", "init", "--advertise-addr", mgr, "--dispatcher-heartbeat", args.heartbeat)
    token = dk(mgr, "swarm", "join-token", "-q", "worker")
    joins: dict[str, float] = {}
    for name, ip in list(ips.items())[1:]:
        tj = time.monotonic()
        dk(ip, "swarm", "join", "--token", token, "--advertise-addr", ip, f"{mgr}:2377", timeout=90)
        joins[name] = round(time.monotonic() - tj, 1)
    node_ids = {name: dk(ip, "info", "-f", "{{.Swarm.NodeID}}") for name, ip in ips.items()}
    wait_ready(mgr, list(node_ids.values()), args.timeout)
    figures["swarm_join_s"] = {"init_and_all_ready": round(time.monotonic() - t0, 1), "per_worker": joins}
    figures["dispatcher_heartbeat"] = args.heartbeat
    for i, (name, ip) in enumerate(ips.items()):
        role_label = "islands.syncer=true" if i == 0 else "islands.learners=true"
        dk(mgr, "node", "update", "--label-add", f"islands.engine={engine(ip)}",
           "--label-add", role_label, node_ids[name])
    summary = describe(mgr)
    summary["figures"] = figures
    summary["shares"] = [str(s) for s in shares]
    summary["images"] = images
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(summary, indent=2) + "\n")
    log(f"wrote {out}")
    return summary


def cmd_down(args: argparse.Namespace) -> dict[str, Any]:
    """Remove the nodes, their volumes and the network, whatever state they are in."""
    t0 = time.monotonic()
    names = node_names()
    if names:
        sh("docker", "rm", "-f", "-v", *names, timeout=300)
    t_rm = time.monotonic() - t0
    vols = sh("docker", "volume", "ls", "-q", "--filter", f"label={OWNER_LABEL}").split()
    vols = [v for v in vols if re.match(rf"^{PREFIX}-\d+-docker$", v)]
    if vols:
        # Each volume holds a node's whole /var/lib/docker (the loaded images unpacked):
        # deleting those files is most of the time `down` takes.
        sh("docker", "volume", "rm", "-f", *vols, timeout=300)
    net = exists("network", NETWORK)
    if net:
        sh("docker", "network", "rm", NETWORK, timeout=60)
    total = time.monotonic() - t0
    log(f"removed {len(names)} nodes ({t_rm:.1f}s), {len(vols)} volumes, network "
        f"{'yes' if net else 'absent'}; {total:.1f}s in all")
    return {"removed_nodes": names, "removed_volumes": vols, "removed_network": net,
            "rm_nodes_s": round(t_rm, 1), "down_s": round(total, 1)}


def manager_ip() -> str:
    """Node 1's address: the manager."""
    names = node_names()
    if not names:
        raise Fail("no nodes: run `up` first")
    return node_ip(names[0])


def cmd_fail(args: argparse.Namespace) -> dict[str, Any]:
    """Power-cut a node: SIGKILL the node container (dockerd, containerd and its tasks die at
    once, its network namespace and IP vanish), so the manager just stops hearing from it."""
    name = args.node
    if name not in node_names():
        raise Fail(f"{name} is not one of this script's nodes: {node_names()}")
    if name == node_names()[0]:
        log(f"warning: {name} is the only manager; the swarm has no control plane until it is back")
    sh("docker", "kill", name, timeout=60)
    log(f"{name} killed")
    return {"failed": name, "at": time.time()}


def cmd_recover(args: argparse.Namespace) -> dict[str, Any]:
    """Power a failed node back on: same container, same IP, same /var/lib/docker volume, so its
    dockerd rejoins the swarm as the same node."""
    name = args.node
    if name not in node_names():
        raise Fail(f"{name} is not one of this script's nodes: {node_names()}")
    t0 = time.monotonic()
    sh("docker", "start", name, timeout=60)
    ip = node_ip(name)
    engine_s = wait_engine(name, ip, args.timeout)
    mgr = manager_ip()
    nid = dk(ip, "info", "-f", "{{.Swarm.NodeID}}")
    wait_ready(mgr, [nid], args.timeout)
    total = time.monotonic() - t0
    log(f"{name}: engine back in {engine_s:.1f}s, swarm node ready {total:.1f}s after start")
    return {"recovered": name, "engine_s": round(engine_s, 1), "ready_s": round(total, 1)}


# ---------------------------------------------------------------- check

STACK = "islands-node-check"


def stack_yaml(share: Path, endpoint_mode: str, image: str) -> str:
    """The throwaway stack: one web server pinned to the syncer node, two learners spread on
    the learner nodes, both bind-mounting the same shared directory under the repo."""
    return textwrap.dedent(f"""\
        version: "3.8"
        services:
          web:
            image: {image}
            command: ["python3", "-m", "http.server", "8000", "--directory", "/share"]
            volumes: [{{type: bind, source: {share}, target: /share}}]
            networks: [net]
            deploy:
              endpoint_mode: {endpoint_mode}
              placement: {{constraints: ["node.labels.islands.syncer==true"]}}
              restart_policy: {{condition: any, delay: 0s}}
          learner:
            image: {image}
            command: ["sleep", "infinity"]
            volumes: [{{type: bind, source: {share}, target: /share}}]
            networks: [net]
            deploy:
              endpoint_mode: {endpoint_mode}
              replicas: 2
              placement: {{constraints: ["node.labels.islands.learners==true"]}}
              restart_policy: {{condition: any, delay: 0s}}
        networks:
          net:
            driver: overlay
        """)


def tasks(mgr: str, service: str) -> list[dict[str, Any]]:
    """Tasks of a service from the manager: id, node, desired/current state, container id."""
    raw = dk(mgr, "service", "ps", "--no-trunc", "--format", "{{json .}}", service, check=False)
    rows = [json.loads(line) for line in raw.splitlines() if line.strip()]
    out = []
    for r in rows:
        t = json.loads(dk(mgr, "inspect", "--type", "task", r["ID"], check=False) or "[{}]")[0]
        out.append({"id": r["ID"], "node": r["Node"], "desired": r["DesiredState"], "current": r["CurrentState"],
                    "state": t.get("Status", {}).get("State"), "node_id": t.get("NodeID"),
                    "container": t.get("Status", {}).get("ContainerStatus", {}).get("ContainerID", ""),
                    "created": t.get("CreatedAt", "")})
    return out


def running(mgr: str, service: str) -> list[dict[str, Any]]:
    """Tasks of a service that are running and meant to be."""
    return [t for t in tasks(mgr, service) if t["state"] == "running" and t["desired"] == "Running"]


def wait_for(what: str, pred: Any, timeout: float, every: float = 0.25) -> float:
    """Poll pred() until true; seconds taken, or Fail naming what did not happen."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if pred():
            return time.monotonic() - t0
        time.sleep(every)
    raise Fail(f"{what}: not within {timeout:.0f}s")


def cmd_check(args: argparse.Namespace) -> dict[str, Any]:
    """Prove the swarm works: placement by label, an overlay spanning nodes, the shared bind
    mount, and a node failure (detection and reschedule timed); the stack is removed after."""
    summary = json.loads(Path(args.out).read_text())
    mgr = summary["manager"].split("//")[1].split(":")[0]
    by_name = {n["name"]: n for n in summary["nodes"]}
    by_id = {n["node_id"]: n for n in summary["nodes"]}
    victim = args.victim
    if victim not in by_name or victim == summary["nodes"][0]["name"]:
        raise Fail(f"--victim must be a worker node: {list(by_name)[1:]}")
    run_dir = Path(summary["shares"][0]) / "runs" / "swarm-nodes-check"
    share = run_dir / "share"
    share.mkdir(parents=True, exist_ok=True)
    marker = uuid.uuid4().hex
    (share / "marker.txt").write_text(marker + "\n")
    stack_file = run_dir / "stack.yaml"
    stack_file.write_text(stack_yaml(share, args.endpoint_mode, args.check_image))
    missing = {n["name"]: n["ip"] for n in summary["nodes"]
               if not dk(n["ip"], "image", "ls", "-q", args.check_image, check=False)}
    if missing:
        log(f"loading {args.check_image} into {sorted(missing)}")
        load_images(missing, [args.check_image])
    if args.heartbeat:
        dk(mgr, "swarm", "update", "--dispatcher-heartbeat", args.heartbeat)
    heartbeat = dk(mgr, "info", "-f", "{{.Swarm.Cluster.Spec.Dispatcher.HeartbeatPeriod}}")
    result: dict[str, Any] = {"endpoint_mode": args.endpoint_mode, "victim": victim,
                              "dispatcher_heartbeat": heartbeat}
    try:
        t0 = time.monotonic()
        dk(mgr, "stack", "deploy", "--resolve-image", "never", "-c", str(stack_file), STACK, timeout=120)
        wait_for("stack running", lambda: len(running(mgr, f"{STACK}_web")) == 1
                 and len(running(mgr, f"{STACK}_learner")) == 2, args.timeout)
        result["deploy_s"] = round(time.monotonic() - t0, 1)
        placement = {svc: [by_id[t["node_id"]]["name"] for t in running(mgr, f"{STACK}_{svc}")]
                     for svc in ("web", "learner")}
        result["placement"] = placement
        log(f"deployed in {result['deploy_s']}s; placement {placement}")

        # Shared bind mount: every task, on every node, reads the marker the host wrote.
        seen = {}
        for svc in ("web", "learner"):
            for t in running(mgr, f"{STACK}_{svc}"):
                node = by_id[t["node_id"]]
                seen[f"{svc}@{node['name']}"] = dk(node["ip"], "exec", t["container"], "cat", "/share/marker.txt")
        result["bind_mount_same_on_every_node"] = all(v == marker for v in seen.values())
        result["bind_mount_seen"] = seen
        log(f"bind mount: marker seen by {sorted(seen)}: {result['bind_mount_same_on_every_node']}")

        # Overlay: a learner on a learner node fetches the marker from `web` (on node 1) by name.
        probe = ("import urllib.request,socket\nprint(socket.gethostbyname('web'))\ntry:\n"
                 " print(urllib.request.urlopen('http://web:8000/marker.txt',timeout=5).read().decode().strip())\n"
                 "except OSError as e:\n print(repr(e))")
        overlay = {}
        for t in running(mgr, f"{STACK}_learner"):
            node = by_id[t["node_id"]]
            out = dk(node["ip"], "exec", t["container"], "python3", "-c", probe, check=False, timeout=30)
            overlay[node["name"]] = out.splitlines()
        result["overlay"] = overlay
        result["overlay_ok"] = all(v and v[-1] == marker for v in overlay.values())
        log(f"overlay: learners reached web by name: {result['overlay_ok']} {overlay}")

        # Node failure: kill the victim, time until the manager says it is down, and until its
        # learner runs again on another learner node.
        if victim not in placement["learner"]:
            raise Fail(f"no learner on {victim} to fail over: {placement}")
        vid = by_name[victim]["node_id"]
        before = {t["id"] for t in running(mgr, f"{STACK}_learner")}
        t_fail = time.monotonic()
        sh("docker", "kill", victim, timeout=60)
        log(f"{victim} killed; polling the manager")
        down_s = wait_for(f"manager marks {victim} down",
                          lambda: dk(mgr, "node", "inspect", "-f", "{{.Status.State}}", vid, check=False) == "down",
                          args.timeout, every=0.1)
        result["node_down_detect_s"] = round(down_s, 2)
        log(f"{victim} reported down after {down_s:.2f}s")

        def rescheduled() -> bool:
            run = running(mgr, f"{STACK}_learner")
            new = [t for t in run if t["id"] not in before]
            return len(run) == 2 and bool(new) and all(t["node_id"] != vid for t in run)

        wait_for("learner rescheduled", rescheduled, args.timeout, every=0.1)
        result["reschedule_s"] = round(time.monotonic() - t_fail, 2)
        result["placement_after_fail"] = [by_id[t["node_id"]]["name"] for t in running(mgr, f"{STACK}_learner")]
        log(f"learner running again after {result['reschedule_s']:.2f}s on {result['placement_after_fail']}")

        t_rec = time.monotonic()
        sh("docker", "start", victim, timeout=60)
        wait_engine(victim, by_name[victim]["ip"], args.timeout)
        engine_back = time.monotonic() - t_rec
        wait_for(f"{victim} ready again",
                 lambda: dk(mgr, "node", "inspect", "-f", "{{.Status.State}}", vid, check=False) == "ready",
                 args.timeout)
        result["recover"] = {"engine_s": round(engine_back, 1), "ready_s": round(time.monotonic() - t_rec, 1)}
        result["placement_after_recover"] = [by_id[t["node_id"]]["name"]
                                             for t in running(mgr, f"{STACK}_learner")]
        log(f"{victim} back: engine {engine_back:.1f}s, node ready {result['recover']['ready_s']}s; "
            f"learners now on {result['placement_after_recover']}")
    finally:
        if not args.keep:
            dk(mgr, "stack", "rm", STACK, check=False, timeout=60)
            # Wait (bounded) for the stack's tasks and network to go, so `down` finds it gone.
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and dk(mgr, "network", "ls", "-q", "--filter",
                                                       f"name={STACK}_net", check=False):
                time.sleep(0.5)
            shutil.rmtree(run_dir, ignore_errors=True)
            log(f"stack {STACK} removed")
    out = Path(args.out).with_name("swarm-nodes-check.json")
    out.write_text(json.dumps(result, indent=2) + "\n")
    log(f"wrote {out}")
    return result


def main(argv: list[str] | None = None) -> int:
    """Parse the subcommand, run it, print its JSON result; a Fail is one line on stderr."""
    p = Parser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("image", help="build islands-node:bookworm offline (debootstrap + docker import)")
    s.add_argument("--rebuild", action="store_true", help=f"build {NODE_IMAGE} again even if it is present")
    s.set_defaults(fn=cmd_image)
    s = sub.add_parser("up", help="network, nodes, images, swarm, labels")
    s.add_argument("--nodes", type=int, default=3,
                   help=f"nodes to start, {PREFIX}-1..N (node 1 the manager and the syncer's, the rest workers "
                        "for learners)")
    s.add_argument("--share", action="append", help="dir bind-mounted at the same path in every node "
                   "(repeatable; default the repo root)")
    s.add_argument("--no-share", action="store_true",
                   help="bind-mount no directory of this machine into the nodes (separate hosts share no disk; "
                        "the swarm backend copies each node's events out through its engine)")
    s.add_argument("--image", action="append", help="image to load into every node (repeatable; "
                   "default islands:latest)")
    s.add_argument("--subnet", default=DEFAULT_SUBNET, help="islands-node-net subnet (static node IPs)")
    s.add_argument("--heartbeat", default="2s", help="swarm dispatcher heartbeat (default 2s; Docker's is 5s)")
    s.add_argument("--mode", default="auto", choices=["auto", "privileged", "caps"],
                   help="node security: --privileged, or all caps but SYS_RESOURCE (auto: privileged "
                   "when the capability bounding set allows it)")
    s.add_argument("--timeout", type=float, default=90, help="bound on each wait, seconds")
    s.add_argument("--clocks", default="", metavar="OFFSET[@PPM],...",
                   help="each node's clock, in node order: an offset in seconds and a drift in parts per million, "
                        "e.g. +5@200,-6@-300,+7@100 (default: none, every node on this machine's clock)")
    s.add_argument("--out", type=output_file, default=str(DEFAULT_OUT),
                   help="the JSON written: the manager's engine, every node (name, IP, role, labels) and the "
                        "timings; `check` and bench/swarm_multinode.py read it")
    s.set_defaults(fn=cmd_up)
    s = sub.add_parser("down", help="remove nodes, volumes, network (idempotent)")
    s.set_defaults(fn=cmd_down)
    for name, fn, h in (("fail", cmd_fail, "power-cut a node (docker kill)"),
                        ("recover", cmd_recover, "power a failed node back on (docker start)")):
        s = sub.add_parser(name, help=h)
        s.add_argument("node", help=f"the node's container name, {PREFIX}-N")
        s.add_argument("--timeout", type=float, default=90,
                       help="bound on each wait, seconds" if name == "recover" else
                       "not used by fail (it waits for nothing); accepted like recover's")
        s.set_defaults(fn=fn)
    s = sub.add_parser("power", help="power a node off (fail) or on (recover): the command a `node` fault's "
                                     "kill runs ($ISLANDS_NODE_POWER='python3 bench/swarm_nodes.py power {node} {action}')")
    s.add_argument("node", help=f"the node's container name, {PREFIX}-N")
    s.add_argument("action", choices=["off", "on"], help="off: docker kill the node; on: start it and wait for it")
    s.add_argument("--timeout", type=float, default=90, help="bound on each wait of `on`, seconds")
    s.set_defaults(fn=lambda a: (cmd_fail if a.action == "off" else cmd_recover)(a))
    check = s = sub.add_parser("check", help="throwaway stack: placement, overlay, bind mount, node failover")
    s.add_argument("--victim", default=f"{PREFIX}-3",
                   help="the worker node powered off (docker kill) to time detection and reschedule")
    s.add_argument("--check-image", default="islands-base:bookworm-fuse3", help="image of the test services "
                   "(needs python3; loaded into the nodes if missing)")
    s.add_argument("--endpoint-mode", default="dnsrr", choices=["vip", "dnsrr"],
                   help="the test services' deploy endpoint_mode: vip (a virtual IP) or dnsrr (DNS round robin)")
    s.add_argument("--timeout", type=float, default=120, help="bound on each wait, seconds")
    s.add_argument("--keep", action="store_true", help="leave the stack deployed")
    s.add_argument("--heartbeat", help="docker swarm update --dispatcher-heartbeat first (e.g. 1s)")
    s.add_argument("--out", default=str(DEFAULT_OUT),
                   help="the JSON `up` wrote (read); the result goes beside it, swarm-nodes-check.json")
    s.set_defaults(fn=cmd_check)
    args = p.parse_args(argv)
    if args.cmd == "check":  # its result is written at the end: check it can be, first
        check_output(check, "--out", Path(args.out).with_name("swarm-nodes-check.json"))
    try:
        print(json.dumps(args.fn(args), indent=2))
    except Fail as e:
        log(f"error: {e}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
