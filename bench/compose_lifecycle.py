"""Container lifecycle on the compose backend: how long a stop takes, and how long a
SIGKILLed container takes to contribute again once it is started.

Brings up compose.yaml through the compose backend (image islands:latest, built by
docker/build-image.sh), waits until every learner trains, then for each round:
  * `docker stop` (SIGTERM through init, 10 s grace) of each learner, timed, and its
    clean stop read from the event log (residual pushes drained?);
  * start again, timed until the learner's first push accepted after the start is merged;
  * SIGKILL and start of the syncer, timed until the next merge.
Prints a table of medians and maxima and writes JSON to bench/out/compose_lifecycle.json.
The goal from issue 5: every container stops in under 2 s.

    python bench/compose_lifecycle.py [--rounds 3]
"""
from __future__ import annotations

import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from chaos.backends.compose import ComposeCluster  # noqa: E402
from chaos.runner import wait_until_training  # noqa: E402
from trainer.events import read_events  # noqa: E402
from trainer.argtypes import Parser  # noqa: E402
from bench.outputs import check_output  # noqa: E402

OUT = ROOT / "bench" / "out" / "compose_lifecycle.json"
FAST = ["--n-layer", "1", "--n-embd", "32", "--n-head", "2", "--batch-size", "8", "--sync-every", "10"]
WAIT_LIMIT = 120.0


def wait_event(run_dir: Path, what: str, predicate) -> dict:
    deadline = time.monotonic() + WAIT_LIMIT
    while time.monotonic() < deadline:
        for e in read_events(run_dir):
            if predicate(e):
                return e
        time.sleep(0.1)
    raise TimeoutError(f"no {what} within {WAIT_LIMIT:.0f}s")


def merged_push_from(learner: int, since: float):
    accepted: dict[str, float] = {}

    def predicate(e: dict) -> bool:
        if e["kind"] == "push_accepted" and e.get("learner") == learner and e["t"] >= since:
            accepted[e["id"]] = e["t"]
        return e["kind"] == "merge" and e["t"] >= since and any(c["id"] in accepted for c in e["contributors"])
    return predicate


def one_round(cluster: ComposeCluster, rows: dict[str, list[float]]) -> None:
    run_dir = cluster.run_dir
    for i in range(1, cluster.learners + 1):
        name = f"learner-{i}"
        container = cluster.docker.containers.get(cluster.container_name(name))
        t = time.monotonic()
        container.stop(timeout=10)
        rows[f"{name} stop (s)"].append(time.monotonic() - t)
        stop = [e for e in read_events(run_dir) if e["kind"] == "process_stop" and e.get("learner") == i][-1]
        rows["residual pushes drained (%)"].append(100.0 * bool(stop["drained"]))
        started = time.monotonic()
        container.start()
        merged = wait_event(run_dir, f"a merged push from restarted {name}", merged_push_from(i, started))
        rows["learner start -> first merged push (s)"].append(merged["t"] - started)
    syncer = cluster.docker.containers.get(cluster.container_name("syncer"))
    t = time.monotonic()
    syncer.stop(timeout=10)
    rows["syncer stop (s)"].append(time.monotonic() - t)
    syncer.start()
    started = time.monotonic()
    wait_event(run_dir, "a merge after the syncer restarted", lambda e: e["kind"] == "merge" and e["t"] >= started)
    rows["syncer start -> first merge (s)"].append(time.monotonic() - started)


def main() -> int:
    parser = Parser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3,
                        help="rounds of stop and start of every learner, then of the syncer; the table gives "
                             "medians and maxima over them")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error(f"--rounds: must be >= 1, got {args.rounds}")
    check_output(parser, "the output", OUT)  # written at the end, after the rounds
    rows: dict[str, list[float]] = {k: [] for k in (
        "learner-1 stop (s)", "learner-2 stop (s)", "learner-3 stop (s)", "residual pushes drained (%)",
        "learner start -> first merged push (s)", "syncer stop (s)", "syncer start -> first merge (s)")}
    with tempfile.TemporaryDirectory(prefix="islands-bench-") as tmp:
        cluster = ComposeCluster(Path(tmp) / "run", learners=3, trainer_args=FAST, project="islands-bench")
        try:
            cluster.start()
            wait_until_training(cluster.run_dir, 3)
            for _ in range(args.rounds):
                one_round(cluster, rows)
        finally:
            cluster.stop()
    table = {k: {"median": round(statistics.median(v), 3), "max": round(max(v), 3), "n": len(v)}
             for k, v in rows.items()}
    print(f"{'measure':<42} {'median':>8} {'max':>8} {'n':>4}")
    for k, v in table.items():
        print(f"{k:<42} {v['median']:>8.3f} {v['max']:>8.3f} {v['n']:>4}")
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps({"machine": platform.platform(), "rounds": args.rounds, "results": table,
                               "raw": rows}, indent=2))
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
