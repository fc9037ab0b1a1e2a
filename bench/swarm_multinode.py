#!/usr/bin/env python3
"""A chaos run across a multi-node swarm on this one machine: placement, faults, a node failure.

    python bench/swarm_multinode.py [--nodes 3] [--learners 4] [--reuse-nodes] [--keep-nodes]

Why: to prove nothing in the swarm backend assumes one engine. bench/swarm_nodes.py makes
Docker-in-Docker nodes (node 1 the manager, labelled for the syncer; the others for
learners) and loads the islands image into each. This script points the swarm backend at
node 1's engine (DOCKER_HOST), deploys the stack, and on one schedule clock:

- kills a learner that runs on node 2 (Swarm's restart policy brings it back),
- blackholes the link of a learner that runs on node 3,
- powers node 3 off (its container SIGKILLed: engine, tasks and address gone at once),
  measures when the manager sees it down, when Swarm has each of its learners running on a
  surviving node, and when each rejoins and contributes a merged update; then powers it on.

Each node has a clock of its own (--node-clocks: seconds apart, drifting), as separate
machines would: the run probes every node's clock and places each event on the
controller's timeline (chaos/timeline.py) before judging; the table compares the offsets
estimated with those set.

The node failure goes into the history as one kill window per learner the node ran, from
the power-off to the new task running, so the checks judge the run knowing about it.
Prints a table and writes JSON (bench/out/swarm_multinode.json).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from chaos.clock_probe import Prober  # noqa: E402
from chaos.controller import HISTORY_FILE, Controller, History, read_history  # noqa: E402
from chaos.runner import evaluate_run, record_clocks, wait_until_training  # noqa: E402
from chaos.timeline import run_events  # noqa: E402
from faults import Kill, Partition, Schedule  # noqa: E402
from trainer.runspec import RunSpec  # noqa: E402
from trainer.argtypes import Parser  # noqa: E402
from bench.outputs import check_output, output_dir, output_file  # noqa: E402

NODES_SCRIPT = REPO / "bench" / "swarm_nodes.py"
NODES_JSON = REPO / "runs" / "swarm-nodes.json"
FAST_TRAINER_ARGS = ("--n-layer", "1", "--n-embd", "32", "--n-head", "2", "--batch-size", "8", "--sync-every", "10")
STACK = "islands-multinode"
KILL_AT, PARTITION_AT, NODE_FAIL_AT = 5.0, 12.0, 25.0
AFTER_FAIL = 75.0        # schedule seconds after the power-off: reschedule, rejoin, recover, settle
WAIT = 120.0             # bound on each wait of the node failure
FAILURE_INDEX = 100      # history indices of the node failure's windows (the schedule's are 0, 1)
NODE_CLOCKS = "+5@200,-6@-300,+7@100"  # seconds apart both ways and drifting, as separate machines are


def nodes_cli(*args: str, timeout: float = 900) -> dict:
    """bench/swarm_nodes.py on the host's engine (the nodes are its containers), whatever
    DOCKER_HOST this process points at the swarm's manager."""
    env = {k: v for k, v in os.environ.items() if k != "DOCKER_HOST"}
    done = subprocess.run([sys.executable, str(NODES_SCRIPT), *args], capture_output=True, text=True,
                          timeout=timeout, env=env)
    if done.returncode != 0:
        raise SystemExit(f"swarm_nodes.py {' '.join(args)} failed:\n{done.stderr[-3000:]}")
    out = done.stdout.strip()
    return json.loads(out) if out.startswith("{") else {}


def bring_up(args: argparse.Namespace) -> tuple[dict, dict]:
    """The nodes (made now, or those of an earlier `up`) and the time each step took."""
    figures: dict = {}
    if not args.reuse_nodes:
        t = time.monotonic()
        nodes_cli("image")
        figures["node_image_s"] = round(time.monotonic() - t, 1)
        t = time.monotonic()
        summary = nodes_cli("up", "--nodes", str(args.nodes), "--share", str(REPO), f"--clocks={args.node_clocks}")
        figures["nodes_up_s"] = round(time.monotonic() - t, 1)
        figures.update(summary.get("figures", {}))
    return json.loads(NODES_JSON.read_text()), figures


def wait(what: str, predicate, timeout: float = WAIT, every: float = 0.25):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} did not happen within {timeout:.0f}s")
        time.sleep(every)


class NodeFailure(threading.Thread):
    """Powers a node off on the schedule's clock, measures Swarm's repair, powers it back on."""

    def __init__(self, cluster, history: History, node: dict, run_dir: Path) -> None:
        super().__init__(name="node-failure", daemon=True)
        self.cluster, self.history, self.node, self.run_dir = cluster, history, node, run_dir
        self.figures: dict = {}
        self.error: str | None = None

    def run(self) -> None:
        try:
            self._run()
        except BaseException as exc:  # noqa: BLE001 - reported in the figures and the exit status
            self.error = f"{type(exc).__name__}: {exc}"

    def _run(self) -> None:
        begin = wait("the schedule's clock to start", lambda: [h["t"] for h in read_history(self.history.path)
                                                               if h.get("event") == "begin"], timeout=300)
        t0 = begin[0]
        time.sleep(max(0.0, t0 + NODE_FAIL_AT - time.monotonic()))
        hostname = self.node["hostname"]
        victims = sorted(u for u, h in self.cluster.placement_of().items() if h == hostname and u != "toxiproxy")
        off = time.monotonic()
        for k, unit in enumerate(victims):
            self.history.record(event="start", index=FAILURE_INDEX + k, kind="kill", planned=NODE_FAIL_AT,
                                at=round(off - t0, 3), fault={"kind": "kill", "at": NODE_FAIL_AT,
                                                             "duration": 1, "target": unit},
                                did=f"powered off {self.node['name']}, which ran {unit}", ok=True, error=None)
        nodes_cli("fail", self.node["name"], timeout=120)
        docker = self.cluster.docker
        node_id = self.node["node_id"]
        wait(f"the manager to see {self.node['name']} down",
             lambda: docker.nodes.get(node_id).attrs["Status"]["State"] == "down")
        self.figures["detected_down_s"] = round(time.monotonic() - off, 1)
        self.figures["victims"] = victims
        rescheduled, rejoined, contributed = {}, {}, {}
        for k, unit in enumerate(victims):
            def elsewhere(unit=unit):
                task = self.cluster._running_task(unit)
                return task is not None and task["NodeID"] != node_id and task
            task = wait(f"Swarm to run {unit} on a surviving node", elsewhere)
            rescheduled[unit] = round(time.monotonic() - off, 1)
            host = docker.nodes.get(task["NodeID"]).attrs["Description"]["Hostname"]
            self.history.record(event="stop", index=FAILURE_INDEX + k, kind="kill", planned=None,
                                at=round(time.monotonic() - t0, 3), fault={"kind": "kill", "target": unit},
                                did=f"Swarm ran {unit} on {host} {rescheduled[unit]} s after the power-off",
                                ok=True, error=None)
        # Events on the controller's timeline (the nodes' clocks disagree with it, and each other).
        for unit in victims:
            learner = int(unit.split("-")[1])
            wait(f"{unit} to rejoin", lambda: any(e["kind"] == "join" and e.get("learner") == learner
                                                  and e["t"] > off for e in run_events(self.run_dir)[0]),
                 every=1.0)
            rejoined[unit] = round(time.monotonic() - off, 1)
            wait(f"{unit} to contribute a merged update",
                 lambda: any(e["kind"] == "merge" and e["t"] > off and
                             any(c["learner"] == learner for c in e["contributors"])
                             for e in run_events(self.run_dir)[0]), every=1.0)
            contributed[unit] = round(time.monotonic() - off, 1)
        self.figures.update(rescheduled_s=rescheduled, rejoined_s=rejoined, contributed_s=contributed)
        t = time.monotonic()
        recovered = nodes_cli("recover", self.node["name"], timeout=300)
        self.figures["recover"] = {**recovered, "wall_s": round(time.monotonic() - t, 1)}


def main(argv: list[str] | None = None) -> int:
    parser = Parser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=3,
                        help="Docker-in-Docker nodes to make (node 1 the manager and the syncer's; at least 3)")
    parser.add_argument("--learners", type=int, default=4, help="learners of the swarm stack")
    parser.add_argument("--reuse-nodes", action="store_true", help="use the nodes of an earlier swarm_nodes.py up")
    parser.add_argument("--keep-nodes", action="store_true", help="leave the nodes up at the end")
    parser.add_argument("--node-clocks", default=NODE_CLOCKS, metavar="OFFSET[@PPM],...",
                        help="each node's clock in node order (swarm_nodes.py up --clocks): an offset in seconds "
                             "and a drift in parts per million; '' puts every node on this machine's clock")
    parser.add_argument("--out", type=output_file, default=REPO / "bench" / "out" / "swarm_multinode.json",
                        help="the JSON written: nodes, placement, faults, node-failure timings and the checks")
    args = parser.parse_args(argv)
    if args.nodes < 3:
        parser.error("--nodes: at least 3 (the syncer's node, a node to kill on, a node to fail)")
    check_output(parser, "the run directory", REPO / "runs", output_dir)  # runs/swarm-multinode-<time>/

    started = time.monotonic()
    nodes, figures = bring_up(args)
    manager = nodes["nodes"][0]
    os.environ.update(DOCKER_HOST=nodes["manager"], ISLANDS_SWARM_API_ADDRESS=manager["ip"],
                      ISLANDS_SWARM_STACK=STACK)
    from chaos.backends.swarm import SwarmCluster  # after DOCKER_HOST: its client is the manager's

    run_dir = REPO / "runs" / f"swarm-multinode-{datetime.now():%Y%m%d-%H%M%S}"  # shared with every node
    spec = RunSpec(backend="swarm", learners=args.learners, trainer_args=FAST_TRAINER_ARGS)
    cluster = SwarmCluster(run_dir, spec=spec)
    cluster.preflight()
    run_dir.mkdir(parents=True)
    (run_dir / "run.json").write_text(json.dumps(spec.to_json(), indent=2))
    history = History(run_dir / HISTORY_FILE)
    report: dict = {"nodes": [{k: n.get(k) for k in ("name", "ip", "role", "labels", "hostname")}
                              for n in nodes["nodes"]], "setup": figures, "run_dir": str(run_dir)}
    failure = None
    prober = None
    try:
        history.record(event="cluster_start", backend="swarm", learners=args.learners)
        t = time.monotonic()
        cluster.start()
        prober = Prober(run_dir, cluster.clock_hosts).start()
        wait_until_training(run_dir, args.learners)
        report["start_to_training_s"] = round(time.monotonic() - t, 1)
        placement = cluster.placement_of()
        report["placement"] = placement
        by_host = {n["hostname"]: n for n in nodes["nodes"]}
        on = {n["name"]: sorted(u for u, h in placement.items() if h == n["hostname"] and u.startswith("learner"))
              for n in nodes["nodes"]}
        learner_nodes = [n for n in nodes["nodes"][1:] if on[n["name"]]]
        if len(learner_nodes) < 2:
            raise SystemExit(f"learners landed on fewer than 2 nodes: {placement}")
        kill_node, fail_node = learner_nodes[0], learner_nodes[-1]
        schedule = Schedule(name="swarm-multinode", seed=16, learners=args.learners, faults=(
            Kill(at=KILL_AT, duration=4, target=on[kill_node["name"]][0]),
            Partition(at=PARTITION_AT, duration=5, targets=(on[fail_node["name"]][0],))))
        schedule.dump(run_dir / "schedule.yaml")
        report["faults"] = [f.to_dict() | {"node": n["name"]} for f, n in zip(schedule.faults, (kill_node, fail_node))]
        report["node_failure"] = {"node": fail_node["name"], "at": NODE_FAIL_AT}
        failure = NodeFailure(cluster, history, by_host[fail_node["hostname"]], run_dir)
        failure.start()
        controller = Controller(cluster, schedule, history)
        controller.run(NODE_FAIL_AT + AFTER_FAIL)
        failure.join(timeout=WAIT)
        if failure.is_alive():
            failure.error = f"the node failure's measurements did not finish within {WAIT:.0f}s after the schedule"
    finally:
        try:
            cluster.stop()
        finally:
            if prober is not None:
                prober.stop()
                record_clocks(run_dir, prober, history)
            history.close()
            if not args.keep_nodes:
                nodes_cli("down", timeout=600)
    result = evaluate_run(run_dir, args.learners)
    report["node_failure"].update(failure.figures if failure else {})
    report["node_failure"]["error"] = failure.error if failure else "not run"
    report["actions"] = [{k: h.get(k) for k in ("event", "index", "at", "took", "did")}
                         for h in read_history(run_dir / HISTORY_FILE) if h.get("event") in ("start", "stop")]
    report["verdict"] = {v.name: v.status for v in result.verdicts}
    report["clocks"] = clock_table(run_dir, nodes)
    unaligned = evaluate_run(run_dir, args.learners, align=False, verdict_file="verdict-clock-alignment-off.json")
    report["unaligned_verdict"] = {v.name: v.status for v in unaligned.verdicts}
    report["passed"] = result.passed
    report["total_s"] = round(time.monotonic() - started, 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print_table(report)
    return 0 if result.passed and report["node_failure"]["error"] is None else 1


def clock_table(run_dir: Path, nodes: dict) -> list[dict]:
    """Each node's clock as set (at the estimate's reference instant) and as estimated."""
    clocks = json.loads((run_dir / "clocks.json").read_text()) if (run_dir / "clocks.json").exists() else {}
    set_by_host = {n.get("hostname") or n["name"]: ((nodes.get("figures") or {}).get("clocks") or {}).get(n["name"])
                   for n in nodes["nodes"]}
    rows = []
    for host, est in sorted(clocks.items()):
        spec = set_by_host.get(host)
        expected = (spec["offset"] + (spec["rate"] - 1.0) * (est["ref"] - spec["anchor"])) if spec else 0.0
        rows.append({"host": host, "set_offset_s": round(expected, 4),
                     "set_drift_ppm": round((spec["rate"] - 1.0) * 1e6, 1) if spec else 0.0,
                     "estimated_offset_s": round(est["offset"], 4), "estimated_drift_ppm": round(est["drift"] * 1e6, 1),
                     "error_bound_ms": round(est["error"] * 1000, 2), "probes": est["samples"],
                     "off_by_ms": round(abs(est["offset"] - expected) * 1000, 2)})
    return rows


def print_table(report: dict) -> None:
    print(f"\nswarm across {len(report['nodes'])} Docker-in-Docker nodes  ({report['run_dir']})")
    for n in report["nodes"]:
        units = [u for u, h in report.get("placement", {}).items() if h == n["hostname"]]
        print(f"  {n['name']:<16} {n['role'] or '?':<8} {', '.join(sorted(units)) or '-'}")
    for a in report.get("actions", []):
        print(f"  t={a['at']:>6}  {a['event']:<5} {a['did']}")
    nf = report.get("node_failure", {})
    print(f"  node failure of {nf.get('node')}: seen down after {nf.get('detected_down_s')} s; "
          f"rescheduled {nf.get('rescheduled_s')}; rejoined {nf.get('rejoined_s')}; "
          f"contributed {nf.get('contributed_s')} (s after the power-off)")
    for c in report.get("clocks", []):
        print(f"  clock of {c['host']:<16} set {c['set_offset_s']:+.3f} s {c['set_drift_ppm']:+.0f} ppm, estimated "
              f"{c['estimated_offset_s']:+.3f} s {c['estimated_drift_ppm']:+.0f} ppm (off by {c['off_by_ms']} ms, "
              f"bound ±{c['error_bound_ms']} ms, {c['probes']} probes)")
    print("  checks: " + ", ".join(f"{k} {v}" for k, v in report.get("verdict", {}).items()))
    print("  judged on the nodes' own clocks: " + ", ".join(f"{k} {v}" for k, v in
                                                           report.get("unaligned_verdict", {}).items()))
    print(f"  {'PASS' if report.get('passed') else 'FAIL'} in {report.get('total_s')} s")


if __name__ == "__main__":
    sys.exit(main())
