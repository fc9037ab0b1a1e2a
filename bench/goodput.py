"""Goodput under chaos: one fault schedule, three systems, 4 learners each (issue 7).

The systems, run one after another on this machine, each for the same wall time under
the same schedule, with the same model and data (the property suites' small model,
FAST_TRAINER_ARGS below, on the synthetic Markov source; trainer seed 0):

  decoupled  Islands, decoupled DiLoCo (`chaos.runner.run_schedule`, local backend:
             syncer + 4 learners, each learner's link through its own proxy).
  sync       Islands sync mode, the same path with mode="sync" (an all-reduce per step).
  torchft    torchft 0.2.0 DiLoCo (bench/peers: a lighthouse + 4 replica groups), driven by
             the same `chaos.controller.Controller`. torchft has no proxy on its links,
             so only the schedule's process faults (the kills) are applied to it; its row
             is marked so. It runs whenever bench/peers/torchft_env.py can install it.

The schedule (printed, and written to the JSON), generated from --seed:
  * every learner is SIGKILLed on average every --kill-mean (30) s and restarted
    --restart-after (5) s later: kill start times per learner form a renewal process whose
    gaps are restart_after + Exp(kill_mean - restart_after), so the mean gap is kill_mean
    and a learner is never killed while it is still down (faults validation refuses that);
  * one learner's link is partitioned (blackhole, both directions) for 10 s;
  * another learner's link gets 100 ms of latency (both directions) for --latency-seconds.
Every fault ends at least --margin s before the run does. Time 0 is when every learner has
made an inner step (the controller's `begin`); each system then trains --duration s.

Same token budget: under kills a fixed token budget is impractical (how many tokens a
system gets through in a given time is what the faults change, and a run stopped at a
token count would face a different number of kills per system), so every system gets the
same wall time under the same schedule instead, and the tokens each one processed are
reported beside its goodput.

Every system runs the same way (flags below, recorded in the JSON):
  --step-time 0.025  an emulated accelerator: every inner step of every learner (and of
                     every torchft replica group) takes 25 ms, the host's own ~6 ms of work
                     overlapping it. Four learners then need about one of the two cores,
                     and one learner's death does not speed the others up.
  --warm-spares 2    restarts take a warm spare process (chaos/spares.py) that has
                     already imported torch: a restarted learner trains ~0.1 s after the
                     restart order instead of 4-9 s. torchft's groups get the same.
  --adopt rebase     Islands decoupled learners keep the steps made since a push when they
                     adopt its merge (trainer --adopt); `mix` with alpha 0 overwrites them.
--step-time 0 --warm-spares 0 --adopt mix is the bare configuration of the first runs.

Figures per system:
  goodput      Two definitions, both printed:
               * of the available capacity (the goals are judged on it; see
                 available_goodput): tokens merged in the schedule window ÷ Σ over
                 learners of its fault-free rate × (window − the seconds the schedule held
                 it killed). A system pays for what it does with the learners it has.
               * of all capacity: trainer.metrics.summarize, unchanged for all three
                 systems. Its definition:
               "Goodput = merged useful tokens ÷ the tokens the learners could have
               processed in the same wall time.
               - Merged useful tokens: in decoupled mode, the tokens of every push that
                 entered a merge, weighted by the share of parameters its fragment holds
                 (so P fragments do not count a token P times); in sync mode, the tokens
                 of every completed all-reduce round.
               - Capacity: Σ over learners of (its fault-free rate) × (wall time of the
                 run), where a learner's rate is its tokens per step over the median own
                 compute time of a step (waiting on the network excluded), scaled by its
                 configured speed factor; with an emulated accelerator (--step-time T)
                 the step time is T, or the median compute if longer."
               The wall time is from the first to the last inner step of the whole run
               (warm-up and the final stop included). It counts the schedule's own
               outages against every system: 5 s per kill and a kill every 30 s per
               learner is 1/6 of all learner-seconds, so this figure is capped near 83%
               (the `cap` row) whatever a system does.
               torchft's groups write `merge`
               events in the same schema (one per group per committed sync, its own
               tokens; 0 tokens for a group that healed from a peer), so the same function
               applies. torchft's `net goodput` also subtracts the tokens a heal took back
               (bench/peers/torchft_cluster.net_merged_tokens); it is shown when it differs.
  downtime     global downtime: seconds of the schedule window (from the controller's
               `begin` to its final heal) in which no merge (decoupled: the syncer's
               `merge`), no sync round (sync: the syncer's `sync_step`) or no commit
               (torchft: any group's `merge`, i.e. a committed sync) happened. It is the
               total length of the gaps between consecutive such events, the head (begin
               -> first) and tail (last -> end) gaps included, counting only gaps longer
               than --gap-threshold (1 s) and each such gap in full.
  final loss   held-out loss (nats/byte) of the final global parameters with
               trainer.launch.evaluate (for Islands through `python -m trainer eval`, as
               every chaos run does; for torchft on the parameters of the last committed
               sync, which the peer writes on SIGTERM with --final-params-dir).
  tokens       tokens processed: every inner step of every learner incarnation.
  checks       Islands only: the chaos checkers' verdict (chaos/checkers.py).

Goals reported (yes/no), judged on goodput of the available capacity, each with the
all-capacity figure beside it: Islands decoupled goodput >= 90% while sync mode stays
below 30% under the same schedule; Islands goodput >= 1.5x torchft's.

Outputs: the side-by-side table and the goals on stdout, --out (bench/out/goodput.json),
and one plot per system beside it, goodput-<system>.png: the fault windows per target
over the throughput (tokens/s processed, total and per learner, and tokens/s merged), with
the global-downtime gaps marked. Run directories: bench/out/goodput-runs/<system>/ (each
also has history.jsonl and, for Islands, verdict.json; `python -m chaos report DIR` works).

Reading the numbers:
  * `tokens thrown away` splits part of the loss by cause (see thrown_away()); steps a
    killed process had not yet pushed or committed are not in it.
  * Runs of one seed vary from one run to the next on a shared machine: run it three
    times and take the median (BENCHMARKS.md does).

    python bench/goodput.py [--quick] [--systems decoupled,sync,torchft] [--seed 7]
                            [--duration 150] [--step-time 0.025] [--warm-spares 2]
                            [--adopt rebase] [--out bench/out/goodput.json]
    python bench/goodput.py --median-of RUN1.json RUN2.json RUN3.json
        the median of each figure over separate runs (bench/out/goodput-median.json)

The processes of a run are registered under a private ISLANDS_HOME (bench/out/work/
goodput-home, unless ISLANDS_HOME is set): chaos clusters reap the leftovers of earlier
clusters of the same name at start, and the default home is shared with any other chaos
run on this machine.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from faults import Kill, Latency, Partition, Schedule  # noqa: E402
from trainer.metrics import event_merged_tokens  # noqa: E402
from trainer.argtypes import Parser, DescriptionFormatter  # noqa: E402
from bench.outputs import check_output, output_dir, output_file  # noqa: E402

OUT_DIR = ROOT / "bench" / "out"
SYSTEMS = ("decoupled", "sync", "torchft")
LEARNERS = 4
# tests/properties/support.py FAST_TRAINER_ARGS: the small model of the property suites.
FAST_TRAINER_ARGS = ["--n-layer", "1", "--n-embd", "32", "--n-head", "2", "--batch-size", "8",
                     "--sync-every", "10"]
DATA = "markov"
GOODPUT_GOAL = 0.90       # Islands decoupled at least this ...
SYNC_CEILING = 0.30       # ... while sync mode stays below this
TORCHFT_RATIO_GOAL = 1.5  # Islands goodput at least this times torchft's
# Measured here (2 cores shared with other jobs, load 5-9): a system's start-up, warm-up, stop
# and evaluation take 15-30 s beyond its --duration; the default run took 8.5-9.2 minutes in
# all, --quick 2.6-2.9 minutes.
DEFAULTS = {"duration": 150.0, "latency_seconds": 60.0}
QUICK = {"duration": 30.0, "latency_seconds": 12.0}
KILL_MEAN = 30.0
# Four learners, a syncer and four proxies share this machine's two cores. At full speed
# the learners compete for the CPU, so each runs at a fraction of the rate goodput's
# capacity assumes, and a killed learner speeds the others up. With an emulated
# accelerator (learner --step-time) every step takes STEP_TIME, the host's own ~6 ms of
# work overlapping it: the four learners need about one core between them, and a
# learner's fault-free rate is its tokens per step / STEP_TIME, for every system alike.
STEP_TIME = 0.025
ADOPT = "rebase"
WARM_SPARES = 2           # restarts take a warm spare process (chaos/spares.py), for every system
RESTART_AFTER = 5.0
PARTITION_SECONDS = 10.0
LATENCY_MS = 100
# Every fault ends this long before the run does: a restarted learner needs up to ~10 s
# here when it starts cold (python + torch imports on two loaded cores) before its first
# step, and the run should see it back.
MARGIN = 15.0
FIRST_FAULT = 3.0         # ... and none starts before this
GAP_THRESHOLD = 1.0
BIN_SECONDS = 2.0


# --------------------------------------------------------------------------- the schedule
def make_schedule(seed: int, duration: float, learners: int = LEARNERS, kill_mean: float = KILL_MEAN,
                  restart_after: float = RESTART_AFTER, partition_seconds: float = PARTITION_SECONDS,
                  latency_ms: int = LATENCY_MS, latency_seconds: float = 60.0,
                  margin: float = MARGIN) -> Schedule:
    """The benchmark's one schedule, a pure function of its arguments (see the module docstring).

    Kills: per learner, start times t_k = t_{k-1} + restart_after + Exp(kill_mean - restart_after)
    from t_0 = 0, kept while the restart (t_k + restart_after) is at least `margin` before
    `duration`. Partition and latency: on two different links, each starting uniformly at
    random where it still ends `margin` before `duration`; the latency window is cut to fit.
    """
    if learners < 2:
        raise ValueError("learners: the partition and the latency need two different links (>= 2 learners)")
    if not kill_mean > restart_after > 0:
        raise ValueError(f"kill mean {kill_mean} must exceed the restart delay {restart_after} (> 0)")
    last_end = duration - margin
    if last_end - FIRST_FAULT < partition_seconds:
        raise ValueError(f"--duration {duration:g}: too short for a {partition_seconds:g} s partition "
                         f"with {margin:g} s of margin")
    rng = random.Random(seed)
    faults: list = []
    for i in range(1, learners + 1):
        t = 0.0
        while True:
            t += restart_after + rng.expovariate(1.0 / (kill_mean - restart_after))
            at = round(t, 2)
            if at + restart_after > last_end:
                break
            faults.append(Kill(at=at, duration=restart_after, target=f"learner-{i}"))
    cut, slow = rng.sample(range(1, learners + 1), 2)
    at = round(rng.uniform(FIRST_FAULT, last_end - partition_seconds), 2)
    faults.append(Partition(at=at, duration=partition_seconds, targets=(f"learner-{cut}",)))
    latency_seconds = min(latency_seconds, last_end - FIRST_FAULT)
    at = round(rng.uniform(FIRST_FAULT, last_end - latency_seconds), 2)
    faults.append(Latency(at=at, duration=round(latency_seconds, 2), target=f"learner-{slow}",
                          latency_ms=latency_ms))
    schedule = Schedule(seed=seed, faults=tuple(faults), learners=learners, name=f"goodput-seed-{seed}").sorted()
    return schedule.validate()


def process_faults_only(schedule: Schedule) -> Schedule:
    """The faults a peer without link proxies can take: kills and pauses."""
    kept = tuple(f for f in schedule.faults if f.kind in ("kill", "pause"))
    return Schedule(seed=schedule.seed, faults=kept, learners=schedule.learners,
                    name=(schedule.name or "schedule") + "-process-faults")


def describe_schedule(schedule: Schedule) -> str:
    kills = [f for f in schedule.faults if f.kind == "kill"]
    per = {}
    for f in kills:
        per[f.target] = per.get(f.target, 0) + 1
    lines = [f"schedule {schedule.name}: {len(kills)} kills ("
             + ", ".join(f"{t} x{n}" for t, n in sorted(per.items())) + "), "
             + ", ".join(f"{f.kind} {getattr(f, 'target', None) or ','.join(f.targets)} {f.span}"
                         + (f" {int(f.latency_ms)} ms" if f.kind == "latency" else "")
                         for f in schedule.faults if f.kind != "kill")]
    lines += ["  " + line for line in schedule.dumps().splitlines()]
    return "\n".join(lines)


# --------------------------------------------------------------------------- pure accounting
def commit_times(events: list[dict], system: str) -> list[float]:
    """When the system made global progress: merges (decoupled, torchft commits) or sync rounds."""
    kind = "sync_step" if system == "sync" else "merge"
    return sorted(float(e["t"]) for e in events if e["kind"] == kind)


def downtime(times: list[float], start: float, end: float, threshold: float = GAP_THRESHOLD) -> dict:
    """Global downtime in [start, end]: the gaps longer than `threshold` between consecutive
    progress times, with the head (start -> first) and tail (last -> end) gaps, each counted
    in full. Times outside the window are ignored; no progress at all is one gap."""
    if end < start:
        raise ValueError(f"window ends ({end}) before it starts ({start})")
    inside = sorted(t for t in times if start <= t <= end)
    points = [start, *inside, end]
    gaps = [(a, b) for a, b in zip(points, points[1:]) if b - a > threshold]
    seconds = sum(b - a for a, b in gaps)
    window = end - start
    return {"seconds": round(seconds, 3), "window_seconds": round(window, 3),
            "fraction": round(seconds / window, 4) if window > 0 else None,
            "events": len(inside), "gaps": [(round(a - start, 3), round(b - start, 3)) for a, b in gaps],
            "longest_gap": round(max((b - a for a, b in gaps), default=0.0), 3)}


def thrown_away(events: list[dict]) -> dict:
    """Tokens processed and then thrown away, by cause (a diagnostic beside goodput):
    apply       Islands: steps made after a push and overwritten when the learner adopted
                the merged version (alpha 0: the `apply` event's discarded_tokens);
    stale_push  Islands: pushes the syncer dropped as too stale (`push_dropped`);
    sync_failed torchft: the H steps of a sync that did not commit;
    heal        torchft: the H steps a group replaced by a peer's state when it healed.
    Steps lost with a killed process (made since its last push or commit) are not listed."""
    out = {"apply": 0, "stale_push": 0, "sync_failed": 0, "heal": 0}
    for e in events:
        kind = e["kind"]
        if kind == "apply":
            out["apply"] += int(e.get("discarded_tokens") or 0)
        elif kind == "push_dropped":
            out["stale_push"] += int(e.get("tokens") or 0)
        elif kind == "sync_failed":
            out["sync_failed"] += int(e.get("discarded_tokens") or 0)
        elif kind == "torchft_heal":
            out["heal"] += int(e.get("discarded_tokens") or 0)
    out["total"] = sum(out.values())
    return out


def held_down(history: list[dict], start: float, end: float) -> dict[int, float]:
    """Seconds each learner spent killed by the schedule (from the kill to the controller's
    restart order) inside [start, end]: time no system could have trained it."""
    kills = {h["index"]: h for h in history if h.get("event") == "start" and h.get("kind") == "kill" and h.get("ok")}
    restarts = {h["index"]: h["t"] for h in history if h.get("event") == "stop" and h.get("kind") == "kill"}
    down: dict[int, float] = {}
    for index, h in kills.items():
        target = h["fault"]["target"]
        if not target.startswith("learner-") or "/" in target:
            continue
        a, b = max(start, float(h["t"])), min(end, float(restarts.get(index, end)))
        if b > a:
            learner = int(target.split("-", 1)[1])
            down[learner] = down.get(learner, 0.0) + (b - a)
    return down


def available_goodput(events: list[dict], history: list[dict], summary: dict,
                      window: tuple[float, float], learners: int = LEARNERS) -> dict:
    """Goodput over the capacity the schedule left, in the schedule's window (the
    controller's `begin`, after every learner has stepped, to its final heal): the tokens
    merged in the window ÷ Σ over learners of its fault-free rate × (window − the seconds
    the schedule held it killed).

    trainer.metrics' goodput divides by every learner's rate × the whole run, start-up
    included, so the schedule's own outages (5 s per kill, a kill every 30 s: 1/6 of all
    learner-seconds) count against every system and cap that figure at `goodput_cap`
    whatever the system does. This one charges a system only for what it did with the
    learners it had: restarting them, work lost with a killed process, stalls, thrown-away
    steps. Partitioned and slowed learners stay available: keeping them useful is the
    system's job."""
    rates = {int(k): float(v) for k, v in (summary.get("learner_rates_tokens_per_s") or {}).items()}
    start, end = window
    seconds = end - start
    if not rates or seconds <= 0:
        return {"goodput_available": None, "capacity_available_tokens": None, "held_down_seconds": {},
                "goodput_cap": None}
    down = held_down(history, start, end)
    mean_rate = sum(rates.values()) / len(rates)
    units = range(1, learners + 1)
    full = sum(rates.get(i, mean_rate) for i in units) * seconds
    available = sum(rates.get(i, mean_rate) * max(0.0, seconds - down.get(i, 0.0)) for i in units)
    merged = sum(event_merged_tokens(e) for e in events if start <= float(e["t"]) <= end)
    return {"goodput_available": round(merged / available, 4) if available > 0 else None,
            "capacity_available_tokens": round(available, 1),
            "tokens_merged_in_window": round(merged, 1),
            "held_down_seconds": {str(k): round(v, 2) for k, v in sorted(down.items())},
            "goodput_cap": round(available / full, 4) if full > 0 else None}


def schedule_window(history: list[dict], events: list[dict]) -> tuple[float, float]:
    """(controller `begin`, its final heal) on the monotonic clock; falls back to the events."""
    begin = next((h["t"] for h in history if h.get("event") == "begin"), None)
    heals = [h["t"] for h in history if h.get("event") == "heal" and h.get("reason") != "start"]
    ends = [h["t"] for h in history if h.get("event") == "end"]
    times = [float(e["t"]) for e in events]
    start = float(begin) if begin is not None else (min(times) if times else 0.0)
    end = float(heals[0]) if heals else float(ends[-1]) if ends else (max(times) if times else start)
    return start, max(start, end)


def throughput_series(events: list[dict], start: float, end: float, width: float = BIN_SECONDS) -> dict:
    """Tokens/s in `width`-second bins of [start, end]: processed (total and per learner) and
    merged (merge tokens x fragment share, or sync-round tokens), as in trainer.metrics."""
    span = max(end - start, 0.0)
    nbins = max(1, round(span / width))  # a last part shorter than width/2 joins the bin before
    edges = [round(i * width, 6) for i in range(nbins)] + [round(span, 6) if span > 0 else width]
    sizes = [b - a for a, b in zip(edges, edges[1:])]  # the last bin is between width/2 and 1.5 width
    total = [0.0] * nbins
    merged = [0.0] * nbins
    per: dict[str, list[float]] = {}
    for e in events:
        offset = float(e["t"]) - start
        if not 0.0 <= offset <= edges[-1]:
            continue
        b = min(int(offset // width), nbins - 1)
        if e["kind"] == "inner_step":
            total[b] += e["tokens"]
            per.setdefault(str(e["learner"]), [0.0] * nbins)[b] += e["tokens"]
        else:
            merged[b] += event_merged_tokens(e)

    def rate(series: list[float]) -> list[float]:
        return [round(v / w, 1) for v, w in zip(series, sizes)]

    return {"edges": edges, "processed": rate(total), "merged": rate(merged),
            "per_learner": {k: rate(v) for k, v in sorted(per.items())}}


def goals(rows: dict[str, dict]) -> list[dict]:
    """The issue's goals, each met True/False, or None when a system it needs did not run.
    They are judged on goodput of the available capacity (available_goodput); each detail
    also gives trainer.metrics' goodput over all capacity and the cap the schedule puts on it."""
    def gp(name: str) -> float | None:
        row = rows.get(name) or {}
        return row.get("goodput_available") if not row.get("error") else None

    def strict(name: str) -> str:
        row = rows.get(name) or {}
        if row.get("error") or row.get("goodput") is None:
            return ""
        return f" (of all capacity: {row['goodput']:.1%}, capped at {_cell(row.get('goodput_cap'), '.1%')})"

    dec, syn, tft = gp("decoupled"), gp("sync"), gp("torchft")
    out = [
        {"goal": f"Islands decoupled goodput >= {GOODPUT_GOAL:.0%}",
         "met": None if dec is None else dec >= GOODPUT_GOAL,
         "detail": "not run" if dec is None else f"{dec:.1%} of available capacity" + strict("decoupled")},
        {"goal": f"Islands sync mode goodput < {SYNC_CEILING:.0%}",
         "met": None if syn is None else syn < SYNC_CEILING,
         "detail": "not run" if syn is None else f"{syn:.1%} of available capacity" + strict("sync")},
    ]
    if dec is None or tft is None:
        ratio_met, detail = None, "not run"
    elif tft <= 0:
        ratio_met, detail = True, f"{dec:.1%} vs torchft {tft:.1%}"
    else:
        ratio_met, detail = dec / tft >= TORCHFT_RATIO_GOAL, f"{dec / tft:.2f}x ({dec:.1%} vs {tft:.1%})"
    if rows.get("torchft", {}).get("faults_applied") == "kills only" and ratio_met is not None:
        detail += "; torchft took the kills only (no partition, no latency)"
    out.append({"goal": f"Islands goodput >= {TORCHFT_RATIO_GOAL}x torchft's", "met": ratio_met, "detail": detail})
    return out


def _cell(value, fmt: str, missing: str = "-") -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return missing
    return format(value, fmt)


def format_table(rows: dict[str, dict]) -> str:
    """Side by side: one column per system."""
    names = list(rows)
    fields = [
        ("goodput, available capacity", lambda r: _cell(r.get("goodput_available"), ".1%")),
        ("goodput, all capacity", lambda r: _cell(r.get("goodput"), ".1%")),
        ("  cap from the outages", lambda r: _cell(r.get("goodput_cap"), ".1%")),
        ("net goodput (heals)", lambda r: _cell(r.get("net_goodput"), ".1%")),
        ("global downtime s", lambda r: (f"{r['downtime']['seconds']:.1f} / {r['downtime']['window_seconds']:.0f}"
                                         if r.get("downtime") else "-")),
        ("longest gap s", lambda r: _cell((r.get("downtime") or {}).get("longest_gap"), ".1f")),
        ("final loss", lambda r: _cell(r.get("final_loss"), ".4f")),
        ("tokens processed", lambda r: _cell(r.get("tokens_processed"), ",d")),
        ("tokens merged", lambda r: _cell(r.get("tokens_merged"), ",.0f")),
        ("tokens thrown away", lambda r: _cell((r.get("thrown_away") or {}).get("total"), ",d")),
        ("commits", lambda r: _cell(r.get("commits"), "d")),
        ("kills applied", lambda r: _cell(r.get("kills_applied"), "d")),
        ("faults applied", lambda r: r.get("faults_applied") or "-"),
        ("incarnations", lambda r: _cell(r.get("incarnations"), "d")),
        ("checks", lambda r: r.get("checks") or "-"),
        ("run seconds", lambda r: _cell(r.get("elapsed_seconds"), ".0f")),
    ]
    fields = [(label, fn) for label, fn in fields
              if label != "net goodput (heals)" or any(r.get("net_goodput") is not None for r in rows.values())]
    cells = {n: [fn(rows[n]) if not rows[n].get("error") else "" for _, fn in fields] for n in names}
    for n in names:
        if rows[n].get("error"):
            cells[n][0] = "not run"
    label_w = max(len(label) for label, _ in fields)
    widths = {n: max(len(n), *(len(c) for c in cells[n])) for n in names}
    head = f"{'':<{label_w}}  " + "  ".join(f"{n:>{widths[n]}}" for n in names)
    lines = [head, "-" * len(head)]
    for k, (label, _) in enumerate(fields):
        lines.append(f"{label:<{label_w}}  " + "  ".join(f"{cells[n][k]:>{widths[n]}}" for n in names))
    for n in names:
        if rows[n].get("error"):
            lines.append(f"{n}: {rows[n]['error']}")
    return "\n".join(lines)


def format_goals(results: list[dict]) -> str:
    word = {True: "yes", False: "no", None: "n/a"}
    return "\n".join(f"  {word[g['met']]:<4} {g['goal']}: {g['detail']}" for g in results)


# --------------------------------------------------------------------------- running the systems
def step_time_flags(step_time: float) -> list[str]:
    """Learner flags for an emulated accelerator taking `step_time` s per step (0: bare CPU)."""
    return ["--step-time", repr(step_time)] if step_time > 0 else []


def eval_config(trainer_args: list[str], learners: int = LEARNERS):
    """The TrainConfig `python -m trainer eval` would build for this model (batch size 16,
    so torchft's parameters are scored on exactly the held-out windows Islands' are)."""
    from trainer.cli_args import add_common_args, add_syncer_args, add_train_args, train_config
    from trainer.config import TrainConfig
    parser = Parser(prog="goodput")
    add_common_args(parser)
    add_train_args(parser)
    add_syncer_args(parser)
    train = train_config(parser.parse_args(trainer_args), parser, learners)
    return TrainConfig(model=train.model, seed=train.seed, fragments=1)


def common_row(system: str, events: list[dict], history: list[dict], summary: dict,
               threshold: float = GAP_THRESHOLD, learners: int = LEARNERS) -> dict:
    from trainer.metrics import summarize
    summary = summary or summarize(events, learners)
    start, end = schedule_window(history, events)
    applied = [h for h in history if h.get("event") == "start" and h.get("ok")]
    return {
        "system": system,
        "goodput": summary.get("goodput"),
        **available_goodput(events, history, summary, (start, end), learners),
        "tokens_processed": summary.get("tokens_processed"),
        "tokens_merged": summary.get("tokens_merged"),
        "capacity_tokens": summary.get("capacity_tokens"),
        "wall_seconds": summary.get("wall_seconds"),
        "commits": len(commit_times(events, system)),
        "thrown_away": thrown_away(events),
        "downtime": downtime(commit_times(events, system), start, end, threshold),
        "kills_applied": sum(1 for h in applied if h.get("kind") == "kill"),
        "faults_failed": [h.get("error") for h in history if h.get("event") in ("start", "stop") and not h.get("ok")],
        "incarnations": summary.get("learner_incarnations"),
        "train_loss_recent": summary.get("train_loss_recent"),
        "learner_rates_tokens_per_s": summary.get("learner_rates_tokens_per_s"),
        "summary": summary,
        "throughput": throughput_series(events, start, end),
        "window": [start, end],
    }


def run_islands(mode: str, schedule: Schedule, run_dir: Path, duration: float,
                threshold: float = GAP_THRESHOLD, step_time: float = 0.0, warm_spares: int = 0,
                adopt: str = "mix", learners: int = LEARNERS) -> dict:
    from chaos.checkers import not_passed
    from chaos.controller import HISTORY_FILE, read_history
    from chaos.runner import run_schedule
    from trainer.events import read_events

    result = run_schedule(schedule, run_dir, backend="local", learners=learners, duration=duration, mode=mode,
                          data=DATA, trainer_args=FAST_TRAINER_ARGS + (["--adopt", adopt] if mode == "decoupled" else []),
                          evaluate=True, learner_args={i: step_time_flags(step_time) for i in range(1, learners + 1)},
                          warm_spares=warm_spares, reference="off")  # the bench compares losses itself
    events = read_events(run_dir)
    row = common_row(mode, events, read_history(run_dir / HISTORY_FILE), result.summary, threshold, learners)
    failed = result.document["failed"]
    row.update({
        "final_loss": result.summary.get("final_loss"),
        "eval_error": result.summary.get("eval_error"),
        "loss_floor": result.summary.get("loss_floor"),
        "faults_applied": "all",
        "checks": "pass" if result.passed else "FAIL: " + ", ".join(not_passed(result.document)),
        "verdict": {"passed": result.passed, "failed": failed, "unknown": result.document["unknown"],
                    "required": result.document["required"], "undecided": result.document["undecided"],
                    "checks": {c["name"]: {"status": c["status"], "detail": c["detail"]}
                               for c in result.document["checks"]}},
    })
    return row


def torchft_final_loss(params_dir: Path) -> dict:
    """Held-out loss of the newest committed parameters a group wrote (see torchft_diloco.py)."""
    import torch

    from trainer.data import load_corpus
    from trainer.launch import evaluate

    dumps = []
    for path in sorted(params_dir.glob("group-*.pt")):
        try:
            dumps.append((path, torch.load(path, map_location="cpu", weights_only=True)))
        except Exception as exc:  # noqa: BLE001 - one bad file: use the others
            print(f"  torchft: could not read {path}: {exc}", file=sys.stderr)
    if not dumps:
        return {"final_loss": None, "eval_error": f"no group wrote its final parameters to {params_dir}"}
    path, best = max(dumps, key=lambda d: (d[1]["manager_step"], d[1]["step"]))
    corpus = load_corpus(DATA)
    loss = evaluate(best["params"], eval_config(FAST_TRAINER_ARGS), corpus)
    return {"final_loss": round(loss, 4), "loss_floor": corpus.entropy_rate, "eval_of": path.name,
            "eval_manager_step": best["manager_step"], "eval_participants": best.get("participants")}


def run_torchft(schedule: Schedule, run_dir: Path, duration: float, python: Path,
                threshold: float = GAP_THRESHOLD, step_time: float = 0.0, warm_spares: int = 0,
                learners: int = LEARNERS, extra_peer_args: list[str] | None = None) -> dict:
    from bench.peers.torchft_cluster import TorchftCluster, net_merged_tokens, report
    from chaos.controller import HISTORY_FILE, Controller, History, read_history
    from trainer.events import read_events
    from trainer.metrics import summarize

    kills_only = process_faults_only(schedule)
    run_dir.mkdir(parents=True, exist_ok=True)
    kills_only.dump(run_dir / "schedule.yaml")
    params_dir = run_dir / "final-params"
    h = int(FAST_TRAINER_ARGS[FAST_TRAINER_ARGS.index("--sync-every") + 1])
    cluster = TorchftCluster(run_dir, groups=learners, sync_every=h, data=DATA, trainer_args=FAST_TRAINER_ARGS,
                             python=python, peer_args=["--final-params-dir", str(params_dir), *step_time_flags(step_time),
                                                       *(extra_peer_args or [])],
                             warm_spares=warm_spares)
    problems = cluster.unsupported(kills_only)
    if problems:
        raise ValueError("; ".join(problems))
    (run_dir / "run.json").write_text(json.dumps({
        "backend": "torchft", "learners": learners, "mode": "torchft-diloco", "data": DATA,
        "trainer_args": FAST_TRAINER_ARGS, "seed": schedule.seed, "duration": duration}, indent=2))
    history = History(run_dir / HISTORY_FILE)
    try:
        cluster.start()
        cluster.wait_until_training()
        Controller(cluster, kills_only, history).run(duration)
    finally:
        try:
            cluster.stop()
        finally:
            history.close()
    events = read_events(run_dir)
    summary = summarize(events, learners)
    row = common_row("torchft", events, read_history(run_dir / HISTORY_FILE), summary, threshold, learners)
    net = net_merged_tokens(events)
    capacity = summary.get("capacity_tokens") or 0
    rep = report(events, learners)
    skipped = [f.kind for f in schedule.faults if f.kind not in ("kill", "pause")]
    row.update({
        "net_goodput": round(net / capacity, 4) if capacity else None,
        "net_goodput_available": round(net / row["capacity_available_tokens"], 4)
        if row.get("capacity_available_tokens") else None,
        "retracted_tokens": rep["retracted_tokens"],
        "faults_applied": "kills only",
        "faults_not_applied": skipped,
        "checks": "n/a (torchft)",
        "failed_syncs": sum(g["failed_syncs"] for g in rep["groups"].values()),
        "solo_commits": sum(g["solo_commits"] for g in rep["groups"].values()),
        "heals": sum(g["heals"] for g in rep["groups"].values()),
        "stops": {k: g["stops"] for k, g in rep["groups"].items()},
    })
    try:
        row.update(torchft_final_loss(params_dir))
    except Exception as exc:  # noqa: BLE001 - the rest of the row stands
        row.update({"final_loss": None, "eval_error": f"{type(exc).__name__}: {exc}"})
    return row


def run_systems(systems: list[str], runs: Path, run_one: Callable[[str, Path], dict],
                report: Callable[[str, dict, Path], None]) -> dict[str, dict]:
    """Each system in turn, in a fresh runs/<system> (a syncer resumes from an existing state
    dir): its row with its elapsed seconds and run dir, reported as soon as it is done; a
    system that fails gets an error row, so it never hides the others."""
    rows: dict[str, dict] = {}
    for system in systems:
        run_dir = runs / system
        if run_dir.exists():
            shutil.rmtree(run_dir)
        started = time.monotonic()
        print(f"\n[{system}] running ...", flush=True)
        try:
            row = run_one(system, run_dir)
        except Exception as exc:  # noqa: BLE001 - one system failing must not hide the others
            row = {"system": system, "error": f"{type(exc).__name__}: {exc}"}
            print(f"  {system}: {row['error']}", flush=True)
        row["elapsed_seconds"] = round(time.monotonic() - started, 1)
        row["run_dir"] = str(run_dir)
        rows[system] = row
        if not row.get("error"):
            report(system, row, run_dir)
    return rows


# --------------------------------------------------------------------------- plot
def plot_system(row: dict, run_dir: Path, path: Path, learners: int = LEARNERS) -> None:
    """Fault windows per target over the throughput, the global-downtime gaps marked."""
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    from chaos.report import fault_windows, kind_color, load_run, target_key

    run = load_run(run_dir)
    start = row["window"][0]
    windows = [w for w in fault_windows(run) if w.start is not None]
    targets = sorted({f"learner-{i}" for i in range(1, learners + 1)}
                     | {t.split("/", 1)[0] for w in windows for t in w.targets}, key=target_key)
    ys = {t: len(targets) - 1 - k for k, t in enumerate(targets)}
    fig = Figure(figsize=(13, 6.5), dpi=110, layout="constrained")
    ax_f, ax_t = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [1.1, 2.6]})
    extra: dict[str, str] = {}
    kinds: list[str] = []
    for w in windows:
        color = kind_color(w.kind, extra)
        if w.kind not in kinds:
            kinds.append(w.kind)
        a, b = w.start - start, w.stop - start
        for t in w.targets:
            ax_f.broken_barh([(a, max(b - a, 0.3))], (ys[t.split("/", 1)[0]] - 0.35, 0.7), facecolors=color,
                             edgecolor="black", linewidth=0.4)
        ax_t.axvspan(a, b, color=color, alpha=0.12, lw=0)
    ax_f.set_yticks(list(ys.values()), list(ys))
    ax_f.set_ylim(-0.6, len(targets) - 0.4)
    ax_f.legend(handles=[Patch(facecolor=kind_color(k, extra), label=k) for k in kinds], loc="upper left",
                bbox_to_anchor=(1.005, 1.0), fontsize=8, frameon=False)
    skipped = row.get("faults_not_applied")
    note = f" (not applied, no link proxies: {', '.join(skipped)})" if skipped else ""
    ax_f.set_title(f"{row['system']}: goodput {_cell(row.get('goodput_available'), '.1%')} of available capacity "
                   f"({_cell(row.get('goodput'), '.1%')} of all), global downtime "
                   f"{row['downtime']['seconds']:.1f} s of {row['downtime']['window_seconds']:.0f} s, final loss "
                   f"{_cell(row.get('final_loss'), '.4f')}{note}", fontsize=10)
    tp = row["throughput"]
    edges = tp["edges"]
    for learner, series in tp["per_learner"].items():
        ax_t.stairs(series, edges, linewidth=0.8, alpha=0.55, label=f"learner-{learner} processed")
    ax_t.stairs(tp["processed"], edges, color="black", linewidth=1.6, label="processed (all learners)")
    ax_t.stairs(tp["merged"], edges, color="#2ca02c", linewidth=1.6, linestyle="--", label="merged / committed")
    for a, b in row["downtime"]["gaps"]:
        ax_t.axvspan(a, b, ymin=0, ymax=0.04, color="#cf222e", lw=0)
    handles, _ = ax_t.get_legend_handles_labels()
    handles.append(Patch(color="#cf222e", label="global downtime (no commit)"))
    ax_t.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=8, frameon=False)
    ax_t.set_ylabel(f"tokens/s ({BIN_SECONDS:g} s bins)")
    ax_t.set_xlabel("seconds since the schedule began")
    ax_t.set_ylim(bottom=0)
    ax_t.set_xlim(0, edges[-1])
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, facecolor="white")


# --------------------------------------------------------------------------- medians of runs
MEDIAN_FIELDS = ("goodput_available", "goodput", "goodput_cap", "net_goodput", "final_loss", "tokens_processed",
                 "tokens_merged", "commits", "kills_applied", "incarnations", "elapsed_seconds")


def _median(values: list) -> float | None:
    """The median of the values that are there (a run may lack a figure), or None."""
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def median_rows(docs: list[dict]) -> dict[str, dict]:
    """One row per system holding the median of each figure over the runs `docs` (the JSON
    of separate `bench/goodput.py` runs); `runs` lists each run's goodput of the available
    capacity, and `checks` every run's verdict."""
    systems = [s for s in SYSTEMS if any(s in d.get("systems", {}) for d in docs)]
    rows: dict[str, dict] = {}
    for system in systems:
        ok = [d["systems"][system] for d in docs if not d.get("systems", {}).get(system, {}).get("error")
              and system in d.get("systems", {})]
        if not ok:
            rows[system] = {"system": system, "error": "no run of it succeeded"}
            continue
        row: dict = {"system": system, "runs": [r.get("goodput_available") for r in ok]}
        for key in MEDIAN_FIELDS:
            row[key] = _median([r.get(key) for r in ok])
        for key in ("tokens_processed", "tokens_merged", "commits", "kills_applied", "incarnations"):
            if row[key] is not None:
                row[key] = int(row[key])
        row["downtime"] = {k: _median([r["downtime"][k] for r in ok]) for k in ("seconds", "window_seconds",
                                                                                   "longest_gap")}
        row["thrown_away"] = {"total": int(_median([r["thrown_away"]["total"] for r in ok]))}
        row["faults_applied"] = ok[0].get("faults_applied")
        row["checks"] = ", ".join(sorted({str(r.get("checks")) for r in ok}))
        rows[system] = row
    return rows


def ratio_per_run(docs: list[dict]) -> list[float | None]:
    """Islands decoupled ÷ torchft goodput (available capacity) within each run."""
    out = []
    for d in docs:
        dec = (d.get("systems", {}).get("decoupled") or {}).get("goodput_available")
        tft = (d.get("systems", {}).get("torchft") or {}).get("goodput_available")
        out.append(round(dec / tft, 3) if dec and tft else None)
    return out


def summarize_runs(paths: list[str], out: Path | None) -> int:
    docs = []
    for path in paths:
        try:
            docs.append(json.loads(Path(path).read_text()))
        except (OSError, ValueError) as exc:
            print(f"--median-of: cannot read {path}: {exc}", file=sys.stderr)
            return 2
    rows = median_rows(docs)
    verdicts = goals(rows)
    ratios = ratio_per_run(docs)
    print(f"median of {len(docs)} runs ({', '.join(paths)}):")
    print(format_table(rows))
    for system, row in rows.items():
        if not row.get("error"):
            print(f"{system}: goodput of available capacity per run "
                  + ", ".join(_cell(v, ".1%") for v in row["runs"]))
    print("Islands / torchft per run: " + ", ".join(_cell(r, ".2f") + "x" for r in ratios))
    print("goals (on the medians):")
    print(format_goals(verdicts))
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"runs": paths, "configs": [d.get("config") for d in docs], "systems": rows,
                                   "ratio_per_run": ratios, "goals": verdicts}, indent=1, default=str))
        print(f"wrote {out}")
    return 0


# --------------------------------------------------------------------------- main
def parse_args(argv: list[str]) -> argparse.Namespace:
    p = Parser(description=__doc__, formatter_class=DescriptionFormatter)
    p.add_argument("--quick", action="store_true",
                   help=f"a smoke run (~3 min): --duration {QUICK['duration']:g}, latency {QUICK['latency_seconds']:g} s")
    p.add_argument("--systems", default=",".join(SYSTEMS), help=f"comma-separated subset of {', '.join(SYSTEMS)}")
    p.add_argument("--seed", type=int, default=7, help="the schedule's seed (the trainer's stays 0)")
    p.add_argument("--duration", type=float, help=f"seconds of training under the schedule per system "
                                                  f"(default {DEFAULTS['duration']:g})")
    p.add_argument("--latency-seconds", type=float, help="how long the 100 ms latency lasts "
                                                         f"(default {DEFAULTS['latency_seconds']:g})")
    p.add_argument("--kill-mean", type=float, default=KILL_MEAN, help="mean seconds between kills of a learner")
    p.add_argument("--gap-threshold", type=float, default=GAP_THRESHOLD,
                   help="gaps without a commit longer than this many seconds count as global downtime")
    p.add_argument("--step-time", type=float, default=STEP_TIME,
                   help="seconds per inner step of an emulated accelerator, for every learner of every system "
                        f"(default {STEP_TIME:g}; 0 = bare CPU, the learners competing for the cores)")
    p.add_argument("--warm-spares", type=int, default=WARM_SPARES,
                   help=f"warm spare processes each system's restarts take (default {WARM_SPARES}; 0 = cold "
                        "starts: python and torch imported after every kill)")
    p.add_argument("--adopt", choices=("mix", "rebase"), default=ADOPT,
                   help=f"Islands decoupled learners' --adopt (default {ADOPT}: a learner keeps the steps it "
                        "made since its push when it adopts the merged version; mix with alpha 0 throws them away)")
    p.add_argument("--out", type=output_file, default=str(OUT_DIR / "goodput.json"),
                   help="JSON path; the plots goodput-<system>.png go beside it, the runs in goodput-runs/")
    args = p.parse_args(argv)
    preset = QUICK if args.quick else DEFAULTS
    for key, value in preset.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    unknown = [s for s in systems if s not in SYSTEMS]
    if unknown or not systems:
        p.error(f"--systems: unknown {', '.join(unknown) or '(empty)'} (known: {', '.join(SYSTEMS)})")
    args.systems = [s for s in SYSTEMS if s in systems]
    # Everything written beside --out is checked now, not after the runs (the JSON last).
    check_output(p, "--out", Path(args.out).parent / "goodput-runs", output_dir)
    for system in args.systems:
        check_output(p, "--out", Path(args.out).parent / f"goodput-{system}.png")
    if not args.step_time >= 0:
        p.error(f"--step-time: must be >= 0, got {args.step_time}")
    if args.warm_spares < 0:
        p.error(f"--warm-spares: must be >= 0, got {args.warm_spares}")
    try:
        args.schedule = make_schedule(args.seed, args.duration, kill_mean=args.kill_mean,
                                      latency_seconds=args.latency_seconds)
    except ValueError as exc:
        p.error(str(exc))
    return args


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--median-of"]:
        if len(argv) < 2:
            print("usage: goodput.py --median-of RUN.json [RUN.json ...]  (writes bench/out/goodput-median.json)",
                  file=sys.stderr)
            return 2
        median = OUT_DIR / "goodput-median.json"
        try:
            output_file(median)
        except argparse.ArgumentTypeError as exc:
            print(f"--median-of: {exc}", file=sys.stderr)
            return 2
        return summarize_runs(argv[1:], median)
    args = parse_args(argv)
    os.environ.setdefault("ISLANDS_HOME", str(OUT_DIR / "work" / "goodput-home"))
    out = Path(args.out)
    runs = out.parent / "goodput-runs"
    schedule = args.schedule
    began = time.monotonic()
    print(f"goodput: {LEARNERS} learners per system, {args.duration:g} s under the schedule each, "
          f"systems {', '.join(args.systems)}; trainer args {' '.join(FAST_TRAINER_ARGS)}; data {DATA}", flush=True)
    print(describe_schedule(schedule), flush=True)
    def run_one(system: str, run_dir: Path) -> dict:
        if system == "torchft":
            from bench.peers.torchft_env import ensure_torchft
            python = ensure_torchft()
            if python is None:
                raise RuntimeError("torchft could not be installed (reason above); the Islands rows stand")
            print("  torchft has no proxy on its links: applying the kills only "
                  "(the partition and the latency are skipped)", flush=True)
            return run_torchft(schedule, run_dir, args.duration, python, args.gap_threshold, args.step_time,
                               args.warm_spares)
        return run_islands(system, schedule, run_dir, args.duration, args.gap_threshold, args.step_time,
                           args.warm_spares, args.adopt)

    def report(system: str, row: dict, run_dir: Path) -> None:
        print(f"  goodput {_cell(row['goodput_available'], '.1%')} of available capacity "
              f"({_cell(row['goodput'], '.1%')} of all), downtime {row['downtime']['seconds']:.1f} s, "
              f"final loss {_cell(row.get('final_loss'), '.4f')}, {row['tokens_processed']:,} tokens, "
              f"checks {row['checks']}, {row['elapsed_seconds']:.0f} s", flush=True)
        try:
            png = out.parent / f"goodput-{system}.png"
            plot_system(row, run_dir, png)
            row["plot"] = str(png)
        except Exception as exc:  # noqa: BLE001 - the numbers stand without the plot
            print(f"  plot failed: {type(exc).__name__}: {exc}", flush=True)

    rows = run_systems(args.systems, runs, run_one, report)
    verdicts = goals(rows)
    total = time.monotonic() - began
    print(f"\ngoodput under one schedule (seed {schedule.seed}, {args.duration:g} s each, {LEARNERS} learners; "
          "same wall time per system, not the same token count):")
    print(format_table(rows))
    if "torchft" in rows and not rows["torchft"].get("error"):
        print("torchft: kills only; its links have no proxy, so the partition and the latency were not applied.")
    print("goals:")
    print(format_goals(verdicts))
    out.parent.mkdir(parents=True, exist_ok=True)
    doc = {"machine": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count(),
           "seconds": round(total, 1),
           "config": {"learners": LEARNERS, "duration": args.duration, "seed": args.seed, "quick": args.quick,
                      "kill_mean": args.kill_mean, "restart_after": RESTART_AFTER,
                      "partition_seconds": PARTITION_SECONDS, "latency_ms": LATENCY_MS,
                      "latency_seconds": args.latency_seconds, "gap_threshold": args.gap_threshold,
                      "trainer_args": FAST_TRAINER_ARGS, "data": DATA, "systems": args.systems,
                      "step_time": args.step_time, "warm_spares": args.warm_spares, "adopt": args.adopt,
                      "budget": "same wall time under the same schedule per system (tokens reported)"},
           "schedule": schedule.to_dict(), "systems": rows, "goals": verdicts}
    out.write_text(json.dumps(doc, indent=1, default=str))
    print(f"\n{total:.0f} s in all; wrote {out} and the plots beside it; runs in {runs}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
