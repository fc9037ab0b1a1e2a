"""Recovery times over many learner kills: failure detection and rejoin, as distributions.

A real local chaos cluster (chaos.backends.local: syncer, N learners, each learner behind
its own proxy) trains the small model while the chaos controller SIGKILLs learners
round-robin and restarts each --down seconds after its kill (never two faults on one
learner at once). --pacing adaptive (the default) makes each kill through the
controller's own actions, at least --interval s after the previous one and only once its
target has rejoined since its last restart: every kill then hits a training learner and
every restart is measured to its end, however slow start-up is on a loaded machine.
--pacing fixed applies a plain schedule (one kill every --interval s) instead, where a
kill can hit a process still starting up. From the controller's history and the event
logs, all on one monotonic clock:

  * failure detection: the kill (the controller's `start` action) -> the syncer marking
    that learner incarnation dead (its `leave` or `heartbeat_lost` event, whichever comes
    first). A SIGKILL closes the learner's socket, so the syncer normally sees the
    connection drop (`leave`) long before the lease (--heartbeat-timeout) runs out; the
    lease path is what catches a learner that hangs or is cut off.
  * rejoin: the restart (the controller's `stop` action) -> the first `merge` whose
    contributors include the new incarnation, split into
      start-up     restart -> the syncer's `join` of the new incarnation (interpreter,
                   torch import and warm-up, HELLO: Python + torch, not the protocol;
                   with --warm-spares, the default, a spare has paid the imports already),
      training     join -> its first push accepted (H inner steps),
      merge wait   push accepted -> the merge that contains it.

Goal (issue 7): detection <= 1 s and rejoin <= 2 s at the median. Prints a table of
n / median / p90 / max, writes bench/out/recovery.json and a histogram bench/out/recovery.png.

    python bench/recovery.py [--learners 3] [--kills 24] [--interval 5] [--down 2] [--pacing adaptive]
                             [--warm-spares 1] [--quick]
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.outputs import check_output, output_dir, output_file  # noqa: E402
from trainer.argtypes import Parser, DescriptionFormatter  # noqa: E402

OUT = ROOT / "bench" / "out" / "recovery.json"
FAST = ["--n-layer", "1", "--n-embd", "32", "--n-head", "2", "--batch-size", "8", "--sync-every", "10"]
DETECTION_GOAL = 1.0
REJOIN_GOAL = 2.0
WARM_SPARES = 1     # restarts take a warm spare process (chaos/spares.py)
TAIL_SECONDS = 15.0  # after the last restart: time for its rejoin to complete
SEGMENTS = ("startup_s", "training_s", "merge_wait_s")
MEASURES = {  # row key -> table label
    "detection_s": "failure detection (kill -> marked dead)",
    "reaped_s": "  kill -> killed process reaped (teardown)",
    "rejoin_s": "rejoin (restart -> first merged push)",
    "startup_s": "  start-up (restart -> join)",
    "training_s": "  training (join -> first push accepted)",
    "merge_wait_s": "  merge wait (push accepted -> merge)",
    "process_start_s": "  restart -> learner process_start",
}


# ----------------------------------------------------------------------------- schedule
def build_schedule(learners: int, kills: int, interval: float, down: float, start: float = 2.0, seed: int = 0):
    """`kills` kills, one every `interval` s, round-robin over the learners, each restarted after `down` s."""
    from faults import Kill, Schedule

    if learners < 1 or kills < 1:
        raise ValueError("--learners and --kills must be >= 1")
    if not 0 < down < interval * learners:
        raise ValueError(f"--down {down} must be > 0 and below --interval x --learners = {interval * learners}: "
                         "a learner must be up again before its next kill")
    faults = [Kill(at=round(start + k * interval, 6), duration=down, target=f"learner-{k % learners + 1}")
              for k in range(kills)]
    return Schedule(seed=seed, faults=tuple(faults), learners=learners, name="bench-recovery").validate(learners)


# ----------------------------------------------------------------------------- pairing
def _action_time(entry: dict) -> float:
    """When the controller began an action: a history entry's `t` is written after it (`took` s)."""
    return float(entry["t"]) - float(entry.get("took") or 0.0)


def kill_actions(history: Iterable[dict]) -> list[dict]:
    """The kills the controller did, from its history: learner, kill time, restart time (None if none)."""
    kills: dict[int, dict] = {}
    for h in history:
        if h.get("kind") != "kill" or h.get("event") not in ("start", "stop"):
            continue
        target = h["fault"]["target"]
        if not target.startswith("learner-") or "/" in target:
            continue
        k = kills.setdefault(h["index"], {"index": h["index"], "learner": int(target.split("-", 1)[1]),
                                          "killed_at": None, "restarted_at": None, "ok": True})
        k["ok"] = k["ok"] and bool(h.get("ok", True))
        k["killed_at" if h["event"] == "start" else "restarted_at"] = _action_time(h)
        if h["event"] == "start":
            k["reaped_s"] = h.get("took")  # the local backend's kill returns once the process is reaped
    return sorted((k for k in kills.values() if k["killed_at"] is not None), key=lambda k: k["killed_at"])


def _syncer(events: Iterable[dict]) -> list[dict]:
    return sorted((e for e in events if e.get("process") == "syncer"), key=lambda e: e["t"])


def pair_recoveries(kills: list[dict], events: list[dict]) -> list[dict]:
    """One row per kill: the incarnation killed, when the syncer noticed, and the rejoin timeline.

    Every time is a difference of monotonic timestamps (seconds). A value is None when the
    thing it measures did not happen (e.g. the new incarnation never had a push merged)
    and `note` says why.
    """
    syncer = _syncer(events)
    joins = [e for e in syncer if e["kind"] == "join"]
    deaths = [e for e in syncer if e["kind"] in ("leave", "heartbeat_lost")]
    merges = [e for e in syncer if e["kind"] == "merge"]
    accepted = {e["id"]: e for e in syncer if e["kind"] == "push_accepted"}
    starts = [e for e in events if e["kind"] == "process_start" and e.get("role") == "learner"]
    rows = []
    for k in kills:
        j, killed_at, restarted_at = k["learner"], k["killed_at"], k["restarted_at"]
        row = {"index": k["index"], "learner": j, "killed_at": killed_at, "restarted_at": restarted_at,
               "incarnation": None, "detected_by": None, "detection_s": None, "reaped_s": k.get("reaped_s"),
               "new_incarnation": None,
               "rejoin_s": None, "startup_s": None, "training_s": None, "merge_wait_s": None,
               "process_start_s": None, "note": ""}
        rows.append(row)
        before = [e for e in joins if e["learner"] == j and e["t"] <= killed_at]
        if not before:
            row["note"] = "no incarnation had joined before the kill"
        else:
            inc = max(int(e["incarnation"]) for e in before)
            row["incarnation"] = inc
            gone = [e for e in deaths if e["learner"] == j and int(e["incarnation"]) == inc]
            after = [e for e in gone if e["t"] >= killed_at]
            if after:
                row["detected_by"] = after[0]["kind"]
                row["detection_s"] = after[0]["t"] - killed_at
            elif gone:  # marked dead before the kill and never revived: nothing left to detect
                last_death = max(e["t"] for e in gone)
                starting = any(o["learner"] == j and o["restarted_at"] is not None
                               and last_death <= o["restarted_at"] <= killed_at for o in kills)
                row["note"] = (f"killed during start-up: the process restarted after incarnation {inc} died "
                               "had not joined yet" if starting
                               else f"incarnation {inc} was already marked dead before the kill")
            else:
                row["note"] = f"the syncer never marked incarnation {inc} dead"
        if restarted_at is None:
            row["note"] = (row["note"] + "; " if row["note"] else "") + "not restarted"
            continue
        floor = row["incarnation"] or 0
        rejoined = [e for e in joins if e["learner"] == j and e["t"] >= restarted_at and int(e["incarnation"]) > floor]
        if not rejoined:
            row["note"] = (row["note"] + "; " if row["note"] else "") + "the restarted learner never joined"
            continue
        join = rejoined[0]
        new = int(join["incarnation"])
        row["new_incarnation"] = new
        row["startup_s"] = join["t"] - restarted_at
        started = [e for e in starts if e.get("learner") == j and e.get("incarnation") == new]
        if started:
            row["process_start_s"] = started[0]["t"] - restarted_at
        for m in merges:
            if m["t"] < join["t"]:
                continue
            mine = [c for c in m.get("contributors", []) if c["learner"] == j and int(c["incarnation"]) == new]
            if not mine:
                continue
            row["rejoin_s"] = m["t"] - restarted_at
            pushed = min((accepted[c["id"]]["t"] for c in mine if c["id"] in accepted), default=None)
            if pushed is not None:
                row["training_s"] = pushed - join["t"]
                row["merge_wait_s"] = m["t"] - pushed
            break
        else:
            row["note"] = (row["note"] + "; " if row["note"] else "") + \
                f"no merge contained a push of incarnation {new}"
    return rows


def learner_ready(events: Iterable[dict], learner: int, since: float | None) -> bool:
    """Has the learner, restarted at `since`, rejoined: a merge after it holds a push of an
    incarnation that joined after it? (True for a learner never restarted.)"""
    if since is None:
        return True
    syncer = _syncer(events)
    incs = {int(e["incarnation"]) for e in syncer if e["kind"] == "join" and e["learner"] == learner
            and e["t"] >= since}
    return any(m["kind"] == "merge" and m["t"] >= since and any(
        c["learner"] == learner and int(c["incarnation"]) in incs for c in m.get("contributors", []))
        for m in syncer)


# ----------------------------------------------------------------------------- statistics
def percentile(values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default); q in [0, 100]."""
    if not values:
        raise ValueError("percentile of no values")
    if not 0 <= q <= 100:
        raise ValueError(f"q must be in [0, 100], got {q}")
    s = sorted(values)
    pos = (len(s) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def distribution(values: Iterable[float | None]) -> dict:
    """n, median, p90, max (and min, mean) of the values that are not None."""
    v = [float(x) for x in values if x is not None]
    if not v:
        return {"n": 0, "median": None, "p90": None, "max": None, "min": None, "mean": None}
    return {"n": len(v), "median": percentile(v, 50), "p90": percentile(v, 90), "max": max(v), "min": min(v),
            "mean": sum(v) / len(v)}


def summarize(rows: list[dict]) -> dict:
    stats = {key: distribution(r[key] for r in rows) for key in MEASURES}
    by: dict[str, int] = {}
    for r in rows:
        if r["detected_by"]:
            by[r["detected_by"]] = by.get(r["detected_by"], 0) + 1
    det, rej = stats["detection_s"]["median"], stats["rejoin_s"]["median"]
    rejoin_wo_startup = distribution(
        r["rejoin_s"] - r["startup_s"] for r in rows if r["rejoin_s"] is not None and r["startup_s"] is not None)
    return {
        "kills": len(rows), "stats": stats, "detected_by": by, "rejoin_without_startup_s": rejoin_wo_startup,
        "goals": {
            "detection_median_le_1s": None if det is None else det <= DETECTION_GOAL,
            "rejoin_median_le_2s": None if rej is None else rej <= REJOIN_GOAL,
            "rejoin_without_startup_median_le_2s": (None if rejoin_wo_startup["median"] is None
                                                    else rejoin_wo_startup["median"] <= REJOIN_GOAL),
        },
        "problems": [f"kill {r['index']} (learner-{r['learner']}): {r['note']}" for r in rows if r["note"]],
    }


def format_table(summary: dict) -> str:
    def cell(x: float | None) -> str:
        return f"{x:8.3f}" if x is not None else f"{'-':>8}"

    lines = [f"{'measure (seconds)':<44} {'n':>4} {'median':>8} {'p90':>8} {'max':>8}  goal"]
    goals = {"detection_s": (DETECTION_GOAL, summary["goals"]["detection_median_le_1s"]),
             "rejoin_s": (REJOIN_GOAL, summary["goals"]["rejoin_median_le_2s"])}
    for key, label in MEASURES.items():
        s = summary["stats"][key]
        goal = ""
        if key in goals:
            limit, met = goals[key]
            goal = f"median <= {limit:g} s: " + ("met" if met else "missed" if met is not None else "unknown")
        lines.append(f"{label:<44} {s['n']:>4} {cell(s['median'])} {cell(s['p90'])} {cell(s['max'])}  {goal}")
    w = summary["rejoin_without_startup_s"]
    met = summary["goals"]["rejoin_without_startup_median_le_2s"]
    lines.append(f"{'rejoin minus start-up (join -> merge)':<44} {w['n']:>4} {cell(w['median'])} {cell(w['p90'])} "
                 f"{cell(w['max'])}  median <= 2 s: {'met' if met else 'missed' if met is not None else 'unknown'}")
    by = ", ".join(f"{k} {v}" for k, v in sorted(summary["detected_by"].items())) or "none"
    lines.append(f"detected by: {by}")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- plot
def plot(rows: list[dict], summary: dict, path: Path, title: str, reference: float | None = None) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    det = [r["detection_s"] * 1000 for r in rows if r["detection_s"] is not None]
    ax = axes[0]
    if det:
        ax.hist(det, bins=min(20, max(5, len(det) // 2)), color="tab:blue")
    s = summary["stats"]["detection_s"]
    if s["median"] is not None:
        ax.axvline(s["median"] * 1000, color="k", ls="--", label=f"median {s['median'] * 1000:.0f} ms")
        ax.axvline(s["p90"] * 1000, color="gray", ls=":", label=f"p90 {s['p90'] * 1000:.0f} ms")
        ax.legend()
    ax.set_xlabel("kill -> syncer marks the learner dead (ms)")
    ax.set_ylabel("kills")
    ax.set_title(f"failure detection (goal <= {DETECTION_GOAL * 1000:.0f} ms)")

    ax = axes[1]
    rejoin = [r["rejoin_s"] for r in rows if r["rejoin_s"] is not None]
    startup = [r["startup_s"] for r in rows if r["rejoin_s"] is not None and r["startup_s"] is not None]
    rest = [r["rejoin_s"] - r["startup_s"] for r in rows if r["rejoin_s"] is not None and r["startup_s"] is not None]
    if rejoin:
        hi = max(rejoin) * 1.05
        bins = [hi * i / 20 for i in range(21)]
        ax.hist(rejoin, bins=bins, alpha=0.5, label="rejoin (restart -> merged push)", color="tab:red")
        ax.hist(startup, bins=bins, alpha=0.5, label="start-up part (restart -> join)", color="tab:orange")
        ax.hist(rest, bins=bins, alpha=0.5, label="rest (join -> merged push)", color="tab:green")
    ax.axvline(REJOIN_GOAL, color="k", ls="--", label=f"goal {REJOIN_GOAL:g} s")
    if reference is not None:
        ax.axvline(reference, color="tab:brown", ls=":", label=f"bare Python+torch start-up {reference:.1f} s")
    ax.set_xlabel("seconds")
    ax.set_title("rejoin")
    ax.legend(fontsize=8)

    ax = axes[2]
    done = [r for r in rows if r["rejoin_s"] is not None and r["startup_s"] is not None]
    x = list(range(len(done)))
    bottom = [0.0] * len(done)
    for key, color in zip(SEGMENTS, ("tab:orange", "tab:green", "tab:purple")):
        vals = [r[key] or 0.0 for r in done]
        ax.bar(x, vals, bottom=bottom, color=color, label=MEASURES[key].strip().split(" (")[0])
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.axhline(REJOIN_GOAL, color="k", ls="--")
    ax.set_xlabel("kill (in order)")
    ax.set_ylabel("seconds from restart")
    ax.set_title("rejoin, per kill")
    ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ----------------------------------------------------------------------------- start-up reference
STARTUP_PROBE = """
import json, sys, time
t = [time.monotonic()]
import torch
t.append(time.monotonic())
from trainer.data import load_corpus
from trainer.learner import warm_up_torch
t.append(time.monotonic())
load_corpus("markov")
t.append(time.monotonic())
warm_up_torch(1)
t.append(time.monotonic())
print(json.dumps(t))
"""
STARTUP_PHASES = ("interpreter", "import torch", "import trainer", "load corpus", "torch warm-up")


def startup_phases(spawned_at: float, marks: list[float]) -> dict[str, float]:
    """Seconds per phase of a learner-like start-up, from the spawn time and the probe's marks."""
    points = [spawned_at, *marks]
    return {name: b - a for name, (a, b) in zip(STARTUP_PHASES, zip(points, points[1:]))}


def startup_reference(runs: int) -> list[dict[str, float]]:
    """What a learner process does before its HELLO, timed in a bare process, `runs` times:
    the share of rejoin that is Python + torch start-up, not the protocol."""
    import subprocess
    out = []
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    for _ in range(runs):
        spawned = time.monotonic()
        done = subprocess.run([sys.executable, "-c", STARTUP_PROBE], capture_output=True, text=True, env=env,
                              cwd=ROOT, timeout=300, check=True)
        phases = startup_phases(spawned, json.loads(done.stdout.strip().splitlines()[-1]))
        phases["total"] = sum(phases.values())
        out.append(phases)
    return out


# ----------------------------------------------------------------------------- the run
def drive_adaptive(cluster, history, run_dir: Path, learners: int, kills: int, interval: float, down: float,
                   max_wait: float) -> None:
    """Kill learners round-robin through the chaos controller's own actions (same history
    records as a schedule), each kill at least `interval` s after the previous one and only
    once its target has rejoined since its last restart, so that every kill hits a learner
    that trains and every restart can be measured to its first merged push, however long
    start-up takes on a loaded machine. Each killed learner is restarted `down` s later."""
    from chaos.controller import Controller
    from faults import Event, Kill, Schedule
    from trainer.events import iter_file

    controller = Controller(cluster, Schedule(seed=0, faults=()), history, settle=0.0)
    syncer_log = run_dir / "events" / "syncer.jsonl"
    restarts: list[tuple[float, Event]] = []
    last_restart: dict[int, float] = {}
    last_kill = -math.inf

    def tick() -> None:
        for due, event in sorted(restarts, key=lambda r: r[0]):
            if due <= time.monotonic():
                restarts.remove((due, event))
                last_restart[int(event.fault.target.split("-", 1)[1])] = time.monotonic()
                controller.apply(event, t0)

    def ready(j: int) -> bool:
        return (not any(e.fault.target == f"learner-{j}" for _, e in restarts)
                and learner_ready(iter_file(syncer_log), j, last_restart.get(j)))

    controller.heal("start")
    t0 = time.monotonic()
    history.record(event="begin", pacing="adaptive", kills=kills, interval=interval, down=down)
    try:
        for k in range(kills):
            j = k % learners + 1
            deadline = time.monotonic() + max_wait
            while True:
                tick()
                if time.monotonic() >= last_kill + interval and ready(j):
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError(f"learner-{j} did not rejoin within {max_wait:.0f}s; see {run_dir}/logs")
                time.sleep(0.1)
            now = time.monotonic()
            fault = Kill(at=round(now - t0, 4), duration=down, target=f"learner-{j}")
            controller.apply(Event(fault.at, "start", k, fault), t0)
            last_kill = now
            restarts.append((now + down, Event(fault.end, "stop", k, fault)))
        deadline = time.monotonic() + max_wait  # the last restarts, and their rejoin
        while time.monotonic() < deadline and not (not restarts and all(ready(j) for j in range(1, learners + 1))):
            tick()
            time.sleep(0.1)
    finally:
        controller.heal("end")
        history.record(event="end", errors=controller.errors)


def run_cluster(run_dir: Path, schedule, learners: int, trainer_args: list[str], args: argparse.Namespace) -> None:
    from chaos.backends.local import LocalCluster
    from chaos.controller import HISTORY_FILE, Controller, History
    from chaos.runner import wait_until_training

    # A registry name of our own: LocalCluster.start() kills whatever an earlier cluster of
    # the same name left behind, and the default name is shared with the test suite.
    cluster = LocalCluster(run_dir, learners=learners, trainer_args=trainer_args,
                           name=f"islands-bench-recovery-{os.getpid()}", warm_spares=args.warm_spares)
    history = History(run_dir / HISTORY_FILE)
    try:
        cluster.start()
        wait_until_training(run_dir, learners)
        if args.pacing == "fixed":
            schedule.dump(run_dir / "schedule.yaml")
            Controller(cluster, schedule, history, settle=0.0).run(schedule.horizon + args.tail)
        else:
            drive_adaptive(cluster, history, run_dir, learners, args.kills, args.interval, args.down, args.max_wait)
    finally:
        try:
            cluster.stop()
        finally:
            history.close()


def main(argv: list[str] | None = None) -> int:
    ap = Parser(description=__doc__, formatter_class=DescriptionFormatter)
    ap.add_argument("--learners", type=int, default=3, help="learners of the cluster, killed round-robin")
    ap.add_argument("--kills", type=int, default=24, help="learner kills in all (>= 20 for the issue's figure)")
    ap.add_argument("--interval", type=float, default=5.0, help="seconds between two kills (of different learners)")
    ap.add_argument("--down", type=float, default=2.0, help="seconds from a kill to the restart")
    ap.add_argument("--heartbeat-interval", type=float, default=0.2,
                    help="the trainer's --heartbeat-interval: seconds of a quiet link after which a learner "
                         "heartbeats")
    ap.add_argument("--heartbeat-timeout", type=float, default=1.0,
                    help="the trainer's --heartbeat-timeout: seconds without a word from a learner after which "
                         "the syncer counts it gone (the lease)")
    ap.add_argument("--pacing", choices=("adaptive", "fixed"), default="adaptive",
                    help="adaptive (default): kill a learner only once it has rejoined since its last restart, "
                         "at least --interval s after the previous kill; fixed: the schedule as planned "
                         "(a kill may then hit a process still starting up)")
    ap.add_argument("--max-wait", type=float, default=240.0, help="adaptive: seconds to wait for a rejoin")
    ap.add_argument("--tail", type=float, default=TAIL_SECONDS, help="fixed: seconds after the last kill's schedule")
    ap.add_argument("--startup-reference", type=int, default=3,
                    help="time a bare learner-like start-up (imports, corpus, torch warm-up) this many times first")
    ap.add_argument("--warm-spares", type=int, default=WARM_SPARES,
                    help=f"warm spare processes restarts take (default {WARM_SPARES}; 0: every restart starts "
                         "Python cold and imports torch, which is then most of the rejoin)")
    ap.add_argument("--quick", action="store_true", help="6 kills: proves the script end to end")
    ap.add_argument("--keep", type=output_dir, help="keep the run directory here (default: a temporary one)")
    ap.add_argument("--out", type=output_file, default=str(OUT),
                    help="the JSON written: the table's distributions, every kill's row and the start-up reference")
    ap.add_argument("--png", type=output_file, default=None,
                    help="the histogram of detection and rejoin times (default: --out with .png)")
    args = ap.parse_args(argv)
    if args.png is None:
        check_output(ap, "--out", Path(args.out).with_suffix(".png"))
    if args.warm_spares < 0:
        ap.error(f"--warm-spares: must be >= 0, got {args.warm_spares}")
    if args.quick:
        args.kills = min(args.kills, 6)
        args.interval = min(args.interval, 4.0)
    try:
        schedule = build_schedule(args.learners, args.kills, args.interval, args.down)
    except ValueError as exc:
        ap.error(str(exc))
    trainer_args = [*FAST, "--heartbeat-interval", str(args.heartbeat_interval),
                    "--heartbeat-timeout", str(args.heartbeat_timeout)]

    from chaos.controller import HISTORY_FILE, read_history
    from trainer.events import read_events

    started = time.monotonic()
    load = os.getloadavg()
    reference = startup_reference(args.startup_reference)
    with tempfile.TemporaryDirectory(prefix="islands-recovery-") as tmp:
        run_dir = Path(args.keep) if args.keep else Path(tmp) / "run"
        run_cluster(run_dir, schedule, args.learners, trainer_args, args)
        history = read_history(run_dir / HISTORY_FILE)
        events = read_events(run_dir)
    rows = pair_recoveries(kill_actions(history), events)
    summary = summarize(rows)
    wall = time.monotonic() - started
    print(format_table(summary))
    for p in summary["problems"]:
        print(f"  note: {p}")
    reference_stats = {k: distribution(r[k] for r in reference) for k in (*STARTUP_PHASES, "total")}
    if reference:
        parts = ", ".join(f"{k} {reference_stats[k]['median']:.2f}" for k in STARTUP_PHASES)
        print(f"bare start-up of a learner-like process (median of {len(reference)}, s): "
              f"{reference_stats['total']['median']:.2f} = {parts}")
    out = Path(args.out)
    png = Path(args.png) if args.png else out.with_suffix(".png")
    result = {
        "command": "python bench/recovery.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "machine": platform.platform(), "cpus": os.cpu_count(), "load_average_at_start": load,
        "wall_seconds": round(wall, 1),
        "learners": args.learners, "kills": args.kills, "interval": args.interval, "down": args.down,
        "pacing": args.pacing, "warm_spares": args.warm_spares,
        "heartbeat_interval": args.heartbeat_interval, "heartbeat_timeout": args.heartbeat_timeout,
        "trainer_args": trainer_args, "backend": "local (each learner behind its own proxy)",
        "goals": {"detection_median_s": DETECTION_GOAL, "rejoin_median_s": REJOIN_GOAL},
        **summary, "startup_reference": {"runs": reference, "stats": reference_stats}, "rows": rows,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    plot(rows, summary, png, f"{len(rows)} kills of {args.learners} learners, heartbeat "
                             f"{args.heartbeat_interval}/{args.heartbeat_timeout} s, {platform.node()}, "
                             f"load {load[0]:.1f} on {os.cpu_count()} CPUs", reference_stats["total"]["median"])
    print(f"wall {wall:.0f} s; wrote {out} and {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
