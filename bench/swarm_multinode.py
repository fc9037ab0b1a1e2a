#!/usr/bin/env python3
"""A chaos run across a multi-node swarm on this one machine: placement, faults, a node failure.

    python bench/swarm_multinode.py [--nodes 3] [--learners 4] [--reuse-nodes] [--keep-nodes]

Why: to prove nothing in the swarm backend assumes one engine. bench/swarm_nodes.py makes
Docker-in-Docker nodes (node 1 the manager, labelled for the syncer; the others for
learners) and loads the islands image into each. This script points the swarm backend at
node 1's engine (DOCKER_HOST), deploys the stack, and on one schedule clock:

- kills a learner that runs on node 2 (Swarm's restart policy brings it back),
- blackholes the link of a learner that runs on node 3,
- powers node 3 off, a `node` fault of the schedule (its container SIGKILLed: engine, tasks
  and address gone at once; $ISLANDS_NODE_POWER runs swarm_nodes.py power): Swarm runs its
  learners on surviving nodes, and the table says when each rejoined and contributed a
  merged update; at the fault's end the node is powered on again, and its learners are
  moved back onto it (`rebalance`: Swarm's scheduler spreads them once it is back).

Each node has a clock of its own (--node-clocks: seconds apart, drifting), as separate
machines would: the run probes every node's clock and places each event on the
controller's timeline (chaos/timeline.py) before judging; the table compares the offsets
estimated with those set.

The node fault's history entry names the units it took down, so self_heal and rejoined judge
the learners that were on it.
Prints a table and writes JSON (bench/out/swarm_multinode.json).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from chaos.clock_probe import Prober  # noqa: E402
from chaos.controller import HISTORY_FILE, Controller, History, read_history  # noqa: E402
from chaos.runner import evaluate_run, record_clocks, wait_until_training  # noqa: E402
from chaos.timeline import run_events  # noqa: E402
from faults import Kill, Node, Partition, Schedule  # noqa: E402
from trainer.runspec import RunSpec  # noqa: E402
from trainer.argtypes import Parser  # noqa: E402
from bench.outputs import check_output, output_dir, output_file  # noqa: E402

NODES_SCRIPT = REPO / "bench" / "swarm_nodes.py"
NODES_JSON = REPO / "runs" / "swarm-nodes.json"
FAST_TRAINER_ARGS = ("--n-layer", "1", "--n-embd", "32", "--n-head", "2", "--batch-size", "8", "--sync-every", "10")
STACK = "islands-multinode"
KILL_AT, PARTITION_AT, NODE_FAIL_AT = 5.0, 12.0, 25.0
NODE_DOWN = 25.0         # the node's power stays off this long: Swarm reschedules its learners meanwhile
AFTER_FAIL = 75.0        # schedule seconds after the power-off: reschedule, rejoin, recover, settle
# Seconds apart both ways and drifting, as separate machines are: the syncer's node behind,
# the learners' ahead, so a timeline that trusted every clock would misplace their events.
NODE_CLOCKS = "-6@-300,+5@200,+7@100"


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
        # No directory of this machine in the nodes: each writes its events into its own
        # volume, and the swarm backend copies them out (chaos/backends/collect.py).
        summary = nodes_cli("up", "--nodes", str(args.nodes), "--no-share", f"--clocks={args.node_clocks}")
        figures["nodes_up_s"] = round(time.monotonic() - t, 1)
        figures.update(summary.get("figures", {}))
    return json.loads(NODES_JSON.read_text()), figures


def node_failure_figures(run_dir: Path, history: list[dict]) -> dict:
    """When the node fault's learners came back, on the controller's timeline: each one's
    first join and first merged contribution after the power-off (seconds after it)."""
    start = next((h for h in history if h.get("event") == "start" and h.get("kind") == "node"), None)
    if start is None or not start.get("ok"):
        return {"error": "the node fault did not start" + (f": {start.get('error')}" if start else "")}
    stop = next((h for h in history if h.get("event") == "stop" and h.get("index") == start["index"]), {})
    off = start["t"]
    events = run_events(run_dir)[0]
    figures: dict = {"victims": start.get("units", []), "did": start.get("did"), "stop": stop.get("did"),
                     "rejoined_s": {}, "contributed_s": {}, "error": None}
    for unit in figures["victims"]:
        if not unit.startswith("learner-"):
            continue
        learner = int(unit.split("-")[1])
        joins = [e["t"] for e in events if e["kind"] == "join" and e.get("learner") == learner and e["t"] > off]
        merged = [e["t"] for e in events if e["kind"] == "merge" and e["t"] > off
                  and any(c["learner"] == learner for c in e["contributors"])]
        figures["rejoined_s"][unit] = round(joins[0] - off, 1) if joins else None
        figures["contributed_s"][unit] = round(merged[0] - off, 1) if merged else None
        if not merged:
            figures["error"] = f"{unit} never contributed after its node was powered off"
    return figures


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
                      ISLANDS_SWARM_STACK=STACK,
                      # the node fault's power switch: the nodes are containers of this machine's engine
                      ISLANDS_NODE_POWER=f"env -u DOCKER_HOST {sys.executable} {NODES_SCRIPT} power {{node}} {{action}}")
    from chaos.backends.swarm import SwarmCluster  # after DOCKER_HOST: its client is the manager's

    run_dir = REPO / "runs" / f"swarm-multinode-{datetime.now():%Y%m%d-%H%M%S}"  # on this machine alone
    spec = RunSpec(backend="swarm", learners=args.learners, trainer_args=FAST_TRAINER_ARGS)
    cluster = SwarmCluster(run_dir, spec=spec)
    cluster.preflight()
    run_dir.mkdir(parents=True)
    (run_dir / "run.json").write_text(json.dumps(spec.to_json(), indent=2))
    history = History(run_dir / HISTORY_FILE)
    report: dict = {"nodes": [{k: n.get(k) for k in ("name", "ip", "role", "labels", "hostname")}
                              for n in nodes["nodes"]], "setup": figures, "run_dir": str(run_dir)}
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
        on = {n["name"]: sorted(u for u, h in placement.items() if h == n["hostname"] and u.startswith("learner"))
              for n in nodes["nodes"]}
        learner_nodes = [n for n in nodes["nodes"][1:] if on[n["name"]]]
        if len(learner_nodes) < 2:
            raise SystemExit(f"learners landed on fewer than 2 nodes: {placement}")
        kill_node, fail_node = learner_nodes[0], learner_nodes[-1]
        # One schedule: a learner killed, a learner's link cut, and a whole node powered off
        # (a `node` fault: Swarm runs its learners elsewhere; at the fault's end it comes back).
        schedule = Schedule(name="swarm-multinode", seed=16, learners=args.learners, faults=(
            Kill(at=KILL_AT, duration=4, target=on[kill_node["name"]][0]),
            Partition(at=PARTITION_AT, duration=5, targets=(on[fail_node["name"]][0],)),
            Node(at=NODE_FAIL_AT, duration=NODE_DOWN, target=fail_node["hostname"], mode="kill", rebalance=True)))
        schedule.dump(run_dir / "schedule.yaml")
        report["faults"] = [f.to_dict() | {"node": n["name"]}
                            for f, n in zip(schedule.faults, (kill_node, fail_node, fail_node))]
        report["node_failure"] = {"node": fail_node["name"], "at": NODE_FAIL_AT, "down_for": NODE_DOWN}
        controller = Controller(cluster, schedule, history)
        controller.run(NODE_FAIL_AT + AFTER_FAIL)
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
    report.setdefault("node_failure", {}).update(node_failure_figures(run_dir, read_history(run_dir / HISTORY_FILE)))
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
    return 0 if result.passed and report["node_failure"].get("error") is None else 1


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
    print(f"  node fault on {nf.get('node')}: {nf.get('did')}; its learners rejoined {nf.get('rejoined_s')} and "
          f"contributed {nf.get('contributed_s')} (s after the power-off); {nf.get('stop')}")
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
