"""Goodput at scale (issue 17): 32 learners through 30 minutes of chaos, against a fault-free twin.

A public write-up of torchft + DiLoCo ran 32 replica groups on one 16-core machine for
30 minutes under 62 faults (27 kill -9s, the rest SIGSTOPs and partitions, one every ~29 s)
and kept 97.7% of the throughput it would have had with no faults. This script runs the
same shape on Islands, on this machine's two cores:

  chaos   Islands decoupled (local backend: a syncer, 32 learners, one proxy per link),
          under the seeded schedule below, for --duration s from the controller's `begin`
          (every learner has stepped);
  twin    the same configuration, the same length, no faults;
  torchft optional (--systems ...,torchft; --torchft-learners N, default --learners):
          torchft 0.2.0 DiLoCo with N replica groups under the schedule's process faults
          (it has no proxy on its links) for --torchft-duration s, reported with the
          goodput definitions of bench/goodput.py.

The schedule (make_scale_schedule, a pure function of its arguments): the write-up's 62
faults in its proportions, 27 kills (restarted --restart-after s later), 18 pauses (SIGSTOP
then SIGCONT, 5-15 s) and 17 partitions (both directions blackholed, 5-25 s), plus
--latency-faults 100 ms latencies of 60 s (the issue asks for latency; the write-up had
none). The write-up gives the counts, not the split of its 35 non-kill faults nor their
lengths: those are ours, printed and recorded. Fault i starts at a uniformly drawn point of
the i-th of N equal slots of the window (so one every duration/N s on average, ~29 s for 62
faults in 30 min), on a learner drawn uniformly among those with no fault in progress or
in the last --rest s.

The emulated accelerator: --step-time 0.5. A learner's own work per inner step of the small
model is ~14 ms on this machine (the `compute_s` of its `inner_step` events); 32 learners
then need 32 x 14 ms / 0.5 s = 0.9 of the two cores, which leaves one core for the syncer,
the proxies, the warm spares that restarted learners take and the controller. At 25 ms (the
4-learner bench's) 32 learners would need 18 cores, and the run would measure the CPU.

Figures:
  merged ratio       the write-up's own measure: tokens merged during the window under chaos
                     / tokens merged during the same-length window of the twin;
  goodput            of the available capacity and of all capacity, as bench/goodput.py
                     defines them (available_goodput, trainer.metrics.summarize);
  downtime           global downtime, as bench/goodput.py: the gaps without a merge longer than
                     --gap-threshold, by default two fault-free rounds (2 x H x step time, 10 s):
                     at a 0.5 s step a round takes 5 s, so the 4-learner bench's 1 s threshold
                     would count every gap between two rounds as downtime;
  thrown away        tokens processed then discarded, by cause (goodput.thrown_away);
  final loss         held-out loss of the final global parameters, chaos against twin;
  memory             RSS of the syncer, of each learner (median and max), of the proxy server
                     and the warm spares, their sum, and the machine's used memory (MemTotal -
                     MemAvailable), sampled every --memory-every s: the peak and the median.

Outputs: the table on stdout, --out (JSON: config, schedule, each system's row, the
comparison) and, when chaos and twin both ran, goodput-scale.png beside it: the faults per
learner, merged tokens/s of both runs, and the running ratio of chaos to twin.

    python bench/goodput_scale.py [--learners 32] [--duration 1800] [--seed 17] [--step-time 0.5]
                                  [--systems chaos,twin] [--torchft-learners 0] [--out bench/out/goodput_scale.json]
    python bench/goodput_scale.py --quick     # 8 learners, 120 s, the same code path (a smoke run)
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shlex
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import goodput  # noqa: E402
from faults import Kill, Latency, Partition, Pause, Schedule  # noqa: E402
from trainer.metrics import event_merged_tokens  # noqa: E402
from trainer.argtypes import Parser, DescriptionFormatter  # noqa: E402
from bench.outputs import check_output, output_dir, output_file  # noqa: E402

OUT = ROOT / "bench" / "out" / "goodput_scale.json"
WRITEUP = {"learners": 32, "duration": 1800.0, "faults": 62, "kills": 27, "kept": 0.977}
COUNTS = {"kill": 27, "pause": 18, "partition": 17}   # the write-up's 62 (27 kills; the split of the rest is ours)
LATENCY_FAULTS = 4
PAUSE_SECONDS = (5.0, 15.0)
PARTITION_SECONDS = (5.0, 25.0)
LATENCY_SECONDS = 60.0
LATENCY_MS = 100
RESTART_AFTER = 5.0
REST = 5.0                 # a learner takes no new fault for this long after one ends
STEP_TIME = 0.5
WARM_SPARES = 2
MEMORY_EVERY = 5.0
SYSTEMS = ("chaos", "twin")
SYNC_EVERY = int(goodput.FAST_TRAINER_ARGS[goodput.FAST_TRAINER_ARGS.index("--sync-every") + 1])  # H
QUICK = {"learners": 8, "duration": 120.0, "scale": 120.0 / 1800.0}


# --------------------------------------------------------------------------- the schedule
def make_scale_schedule(seed: int, learners: int, duration: float, counts: dict[str, int] | None = None,
                        latency_faults: int = LATENCY_FAULTS, restart_after: float = RESTART_AFTER,
                        pause_seconds: tuple[float, float] = PAUSE_SECONDS,
                        partition_seconds: tuple[float, float] = PARTITION_SECONDS,
                        latency_seconds: float = LATENCY_SECONDS, latency_ms: int = LATENCY_MS,
                        rest: float = REST, margin: float = goodput.MARGIN,
                        first: float = goodput.FIRST_FAULT) -> Schedule:
    """The seeded schedule of the module docstring. Every fault ends `margin` s before
    `duration`; a fault that would not is shortened (a kill keeps its restart delay, so it
    moves earlier instead)."""
    counts = dict(COUNTS if counts is None else counts)
    kinds = [k for k, n in counts.items() for _ in range(n)] + ["latency"] * latency_faults
    if learners < 2:
        raise ValueError("learners: the schedule spreads faults over several learners (>= 2)")
    last_end = duration - margin
    if not kinds or last_end - first <= restart_after:
        raise ValueError(f"duration {duration:g}: too short for a schedule ending {margin:g} s before the end")
    rng = random.Random(seed)
    rng.shuffle(kinds)
    slot = (last_end - first) / len(kinds)
    free_at = {i: 0.0 for i in range(1, learners + 1)}
    faults: list = []
    for n, kind in enumerate(kinds):
        at = first + (n + rng.random()) * slot
        length = {"kill": restart_after, "pause": rng.uniform(*pause_seconds),
                  "partition": rng.uniform(*partition_seconds), "latency": latency_seconds}[kind]
        if kind == "kill":
            at = min(at, last_end - restart_after)
        length = min(length, last_end - at)
        free = [i for i, t in free_at.items() if t <= at]
        if not free or length <= 0:
            raise ValueError(f"fault {n} ({kind}) at {at:.1f} s: no learner is free; lower the fault count "
                             "or the fault lengths, or add learners")
        learner = rng.choice(free)
        target = f"learner-{learner}"
        at, length = round(at, 2), round(length, 2)
        free_at[learner] = at + length + rest
        if kind == "kill":
            faults.append(Kill(at=at, duration=length, target=target))
        elif kind == "pause":
            faults.append(Pause(at=at, duration=length, target=target))
        elif kind == "partition":
            faults.append(Partition(at=at, duration=length, targets=(target,)))
        else:
            faults.append(Latency(at=at, duration=length, target=target, latency_ms=latency_ms))
    schedule = Schedule(seed=seed, faults=tuple(faults), learners=learners,
                        name=f"goodput-scale-{learners}-seed-{seed}").sorted()
    return schedule.validate()


def within(schedule: Schedule, seconds: float, margin: float = goodput.MARGIN) -> Schedule:
    """The faults of `schedule` that end `margin` s before `seconds` (a shorter run of the
    same schedule: the controller applies every fault it is given, whatever its duration)."""
    kept = tuple(f for f in schedule.faults if f.at + f.duration <= seconds - margin)
    return Schedule(seed=schedule.seed, faults=kept, learners=schedule.learners,
                    name=f"{schedule.name}-first-{seconds:g}s")


def fault_counts(schedule: Schedule) -> dict[str, int]:
    out: dict[str, int] = {}
    for f in schedule.faults:
        out[f.kind] = out.get(f.kind, 0) + 1
    return out


# --------------------------------------------------------------------------- accounting
def merged_in(events: list[dict], start: float, seconds: float) -> float:
    """Tokens merged in [start, start + seconds] (each push weighted by its fragment's share)."""
    end = start + seconds
    return sum(event_merged_tokens(e) for e in events if start <= float(e["t"]) <= end)


def merged_ratio(chaos_tokens: float, twin_tokens: float) -> float | None:
    """The write-up's measure: what chaos kept of what the fault-free twin merged."""
    return round(chaos_tokens / twin_tokens, 4) if twin_tokens > 0 else None


# --------------------------------------------------------------------------- memory
def _children(root: int) -> list[int]:
    """Every descendant of `root` (from /proc's ppid links)."""
    parent: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                fields = Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()
                parent[int(name)] = int(fields[1])
            except (OSError, IndexError, ValueError):
                continue
    out, frontier = [], [root]
    while frontier:
        p = frontier.pop()
        kids = [c for c, pp in parent.items() if pp == p]
        out += kids
        frontier += kids
    return out


def role_of(cmdline: str) -> str:
    """Which part of the cluster a process is, from its command line."""
    if " syncer" in cmdline:
        return "syncer"
    if "spare" in cmdline:
        return "spare"
    if " learner" in cmdline or " unit" in cmdline:
        return "learner"
    if "toxiproxy" in cmdline:
        return "proxy"
    return "other"


def _rss_kib(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def machine_used_mib() -> float:
    info = {}
    for line in Path("/proc/meminfo").read_text().splitlines():
        key, value = line.split(":", 1)
        info[key] = int(value.split()[0])
    return (info["MemTotal"] - info["MemAvailable"]) / 1024


class ProcessNames:
    """pid -> role from the run's own events, each of which carries its process's pid (a
    learner started from a warm spare keeps the spare's command line, so the command line
    alone cannot tell a learner from an idle spare). Read incrementally."""

    def __init__(self, run_dir: Path) -> None:
        self.events = run_dir / "events"
        self.offsets: dict[Path, int] = {}
        self.roles: dict[int, str] = {}

    def update(self) -> dict[int, str]:
        for path in sorted(self.events.glob("*.jsonl")) if self.events.is_dir() else []:
            with open(path, "rb") as fh:
                fh.seek(self.offsets.get(path, 0))
                data = fh.read()
            end = data.rfind(b"\n") + 1
            self.offsets[path] = self.offsets.get(path, 0) + end
            role = "syncer" if path.stem == "syncer" else "learner"
            for line in data[:end].splitlines():
                try:
                    pid = json.loads(line).get("pid")
                except ValueError:
                    continue
                if isinstance(pid, int):
                    self.roles[pid] = role
        return self.roles


class MemorySampler(threading.Thread):
    """RSS per role of this process's descendants, and the machine's used memory, every `every` s."""

    def __init__(self, run_dir: Path, every: float = MEMORY_EVERY) -> None:
        super().__init__(daemon=True, name="memory-sampler")
        self.every = every
        self.names = ProcessNames(run_dir)
        self.samples: list[dict] = []
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.wait(self.every):
            roles: dict[str, list[float]] = {}
            known = self.names.update()
            for pid in _children(os.getpid()):
                try:
                    cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                except OSError:
                    continue
                kib = _rss_kib(pid)
                if kib:
                    roles.setdefault(known.get(pid) or role_of(" " + cmd), []).append(kib / 1024)
            self.samples.append({"t": time.monotonic(), "machine_used_mib": round(machine_used_mib(), 1),
                                 "roles": {k: [round(x, 1) for x in v] for k, v in roles.items()}})

    def stop(self) -> dict:
        self._stop_event.set()
        self.join(timeout=self.every + 5)
        return summarize_memory(self.samples)


def summarize_memory(samples: list[dict]) -> dict:
    """Peak and median over the samples: per role the sum, the largest single process; per
    learner the median process; and the machine's used memory."""
    if not samples:
        return {}

    def stat(values: list[float]) -> dict:
        return {"peak": round(max(values), 1), "median": round(statistics.median(values), 1)} if values else {}

    roles = sorted({r for s in samples for r in s["roles"]})
    out: dict = {"samples": len(samples), "machine_used_mib": stat([s["machine_used_mib"] for s in samples]),
                 "cluster_total_mib": stat([sum(sum(v) for v in s["roles"].values()) for s in samples])}
    for role in roles:
        per = [s["roles"].get(role, []) for s in samples]
        out[role] = {"total_mib": stat([sum(p) for p in per if p]),
                     "largest_process_mib": stat([max(p) for p in per if p]),
                     "median_process_mib": stat([statistics.median(p) for p in per if p]),
                     "processes": stat([float(len(p)) for p in per])}
    return out


# --------------------------------------------------------------------------- runs
def run_system(system: str, schedule: Schedule, run_dir: Path, args: argparse.Namespace) -> dict:
    """One system's run with memory sampled throughout; its row as bench/goodput.py builds it."""
    sampler = MemorySampler(run_dir, args.memory_every)
    sampler.start()
    try:
        if system == "torchft":
            from bench.peers.torchft_env import ensure_torchft
            python = ensure_torchft()
            if python is None:
                raise RuntimeError("torchft could not be installed (reason above)")
            row = goodput.run_torchft(within(schedule, args.torchft_duration), run_dir, args.torchft_duration, python,
                                      args.gap_threshold, args.step_time, args.warm_spares,
                                      learners=args.torchft_learners, extra_peer_args=shlex.split(args.torchft_args))
        else:
            plan = schedule if system == "chaos" else Schedule(seed=schedule.seed, faults=(), learners=args.learners,
                                                               name="fault-free-twin")
            row = goodput.run_islands("decoupled", plan, run_dir, args.duration, args.gap_threshold,
                                      args.step_time, args.warm_spares, "rebase", learners=args.learners)
    finally:
        row_memory = sampler.stop()
    row["memory"] = row_memory
    return row


def window_tokens(run_dir: Path, row: dict, duration: float) -> float:
    from trainer.events import read_events
    return merged_in(read_events(run_dir), float(row["window"][0]), duration)


def faults_applied(run_dir: Path) -> int:
    """Faults the controller started successfully (its history's `start` entries)."""
    from chaos.controller import HISTORY_FILE, read_history
    return sum(1 for h in read_history(run_dir / HISTORY_FILE) if h.get("event") == "start" and h.get("ok"))


def compare(rows: dict[str, dict], duration: float) -> dict:
    """The write-up's measure and the loss against the twin, when both ran."""
    chaos, twin = rows.get("chaos"), rows.get("twin")
    if not chaos or not twin or chaos.get("error") or twin.get("error"):
        return {}
    ct, tt = chaos["tokens_merged_window"], twin["tokens_merged_window"]
    out = {"tokens_merged_chaos": round(ct, 1), "tokens_merged_twin": round(tt, 1), "merged_ratio": merged_ratio(ct, tt),
           "writeup_kept": WRITEUP["kept"]}
    out["beats_writeup"] = out["merged_ratio"] is not None and out["merged_ratio"] >= WRITEUP["kept"]
    if chaos.get("final_loss") is not None and twin.get("final_loss") is not None:
        out["final_loss_chaos"], out["final_loss_twin"] = chaos["final_loss"], twin["final_loss"]
        out["final_loss_difference"] = round(chaos["final_loss"] - twin["final_loss"], 4)
    return out


def _pct(x) -> str:
    return "-" if x is None else f"{x:.1%}"


def format_report(rows: dict[str, dict], comparison: dict) -> str:
    lines = [f"{'':38} " + " ".join(f"{s:>16}" for s in rows)]

    def line(label: str, fn) -> None:
        cells = []
        for row in rows.values():
            try:
                cells.append(fn(row) if not row.get("error") else "error")
            except (KeyError, TypeError):
                cells.append("-")
        lines.append(f"{label:38} " + " ".join(f"{c:>16}" for c in cells))

    line("tokens merged in the window", lambda r: f"{r['tokens_merged_window'] / 1e6:.2f} M")
    line("goodput, available capacity", lambda r: _pct(r["goodput_available"]))
    line("goodput, all capacity", lambda r: _pct(r["goodput"]))
    line("global downtime s", lambda r: f"{r['downtime']['seconds']:.1f}")
    line("longest gap s", lambda r: f"{r['downtime']['longest_gap']:.1f}")
    line("tokens thrown away", lambda r: f"{r['thrown_away']['total'] / 1e6:.3f} M")
    line("  of which stale pushes", lambda r: f"{r['thrown_away']['stale_push'] / 1e6:.3f} M")
    line("final held-out loss", lambda r: f"{r['final_loss']:.4f}")
    line("faults applied", lambda r: str(r.get("faults_applied_count", 0)))
    line("checks", lambda r: str(r.get("checks", "-"))[:16])
    line("syncer RSS MiB peak", lambda r: f"{r['memory']['syncer']['total_mib']['peak']:.0f}")
    line("learner RSS MiB median / max", lambda r: f"{r['memory']['learner']['median_process_mib']['median']:.0f}"
         f" / {r['memory']['learner']['largest_process_mib']['peak']:.0f}")
    line("all learners RSS MiB peak", lambda r: f"{r['memory']['learner']['total_mib']['peak']:.0f}")
    line("cluster RSS MiB peak", lambda r: f"{r['memory']['cluster_total_mib']['peak']:.0f}")
    line("machine used MiB peak", lambda r: f"{r['memory']['machine_used_mib']['peak']:.0f}")
    if comparison:
        lines.append("")
        lines.append(f"merged under chaos / merged by the fault-free twin: {_pct(comparison['merged_ratio'])} "
                     f"(the write-up kept {WRITEUP['kept']:.1%}: "
                     f"{'beaten' if comparison['beats_writeup'] else 'NOT beaten'})")
        if "final_loss_difference" in comparison:
            lines.append(f"final held-out loss: chaos {comparison['final_loss_chaos']:.4f}, "
                         f"twin {comparison['final_loss_twin']:.4f} ({comparison['final_loss_difference']:+.4f})")
    return "\n".join(lines)


# --------------------------------------------------------------------------- plot
PLOT_BIN = 30.0


def merged_series(events: list[dict], start: float, seconds: float, width: float = PLOT_BIN) -> list[float]:
    """Tokens merged per `width` s bin of [start, start + seconds], as tokens/s."""
    bins = [0.0] * max(1, int(seconds // width) + (1 if seconds % width else 0))
    for e in events:
        offset = float(e["t"]) - start
        if 0 <= offset <= seconds:
            bins[min(len(bins) - 1, int(offset // width))] += event_merged_tokens(e)
    return [b / width for b in bins]


def plot_scale(rows: dict[str, dict], duration: float, learners: int, path: Path) -> None:
    """The chaos run's faults per learner over its merged tokens/s beside the twin's, and
    the running ratio of what chaos merged to what the twin merged: 32 learners' own
    throughput lines (bench/goodput.py's plot) are unreadable."""
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    from chaos.report import fault_windows, kind_color, load_run
    from trainer.events import read_events

    chaos, twin = rows["chaos"], rows["twin"]
    start = float(chaos["window"][0])
    windows = [w for w in fault_windows(load_run(Path(chaos["run_dir"]))) if w.start is not None]
    fig = Figure(figsize=(12, 8), dpi=110, layout="constrained")
    ax_f, ax_m, ax_r = fig.subplots(3, 1, sharex=True, gridspec_kw={"height_ratios": [2.2, 1.6, 1.0]})
    extra: dict[str, str] = {}
    kinds: list[str] = []
    for w in windows:
        color = kind_color(w.kind, extra)
        kinds += [] if w.kind in kinds else [w.kind]
        for t in w.targets:
            learner = int(t.split("/", 1)[0].split("-")[1])
            ax_f.broken_barh([(w.start - start, max(w.stop - w.start, 4.0))], (learner - 0.4, 0.8), facecolors=color)
    ax_f.set_ylim(learners + 0.7, 0.3)
    ax_f.set_yticks([1, *range(4, learners + 1, 4)])
    ax_f.set_ylabel("learner")
    ax_f.legend(handles=[Patch(facecolor=kind_color(k, extra), label=k) for k in kinds], loc="upper left",
                bbox_to_anchor=(1.005, 1.0), fontsize=8, frameon=False)
    cmp = compare(rows, duration)
    ax_f.set_title(f"{learners} learners, {len(windows)} faults: merged {_pct(cmp.get('merged_ratio'))} of the "
                   f"fault-free twin (the write-up kept {WRITEUP['kept']:.1%}); global downtime "
                   f"{chaos['downtime']['seconds']:.0f} s", fontsize=10)
    series = {}
    for name, row in (("chaos", chaos), ("twin", twin)):
        series[name] = merged_series(read_events(Path(row["run_dir"])), float(row["window"][0]), duration)
    edges = [i * PLOT_BIN for i in range(len(series["chaos"]) + 1)]
    ax_m.stairs(series["twin"], edges, color="#888888", linewidth=1.4, label="fault-free twin")
    ax_m.stairs(series["chaos"], edges, color="#2ca02c", linewidth=1.4, label="under chaos")
    ax_m.set_ylabel(f"tokens/s merged ({PLOT_BIN:g} s bins)")
    ax_m.set_ylim(bottom=0)
    ax_m.legend(loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=8, frameon=False)
    made = twin_made = 0.0
    ratio = []
    for a, b in zip(series["chaos"], series["twin"]):
        made, twin_made = made + a, twin_made + b
        ratio.append(100 * made / twin_made if twin_made else float("nan"))
    ax_r.plot([e + PLOT_BIN for e in edges[:-1]], ratio, color="#2ca02c")
    ax_r.axhline(100 * WRITEUP["kept"], color="#cf222e", linestyle="--", linewidth=1, label="the write-up's 97.7%")
    ax_r.set_ylabel("merged so far,\n% of the twin")
    ax_r.set_ylim(95, 101)
    ax_r.legend(loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=8, frameon=False)
    ax_r.set_xlabel("seconds since the schedule began")
    ax_r.set_xlim(0, duration)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, facecolor="white")


# --------------------------------------------------------------------------- CLI
def parse_args(argv: list[str]) -> argparse.Namespace:
    p = Parser(prog="goodput_scale.py", description=__doc__.split("\n\n")[0],
                                formatter_class=DescriptionFormatter)
    p.add_argument("--quick", action="store_true", help="8 learners, 120 s, the counts scaled down (a smoke run)")
    p.add_argument("--learners", type=int, default=WRITEUP["learners"], help="learners per Islands run (32)")
    p.add_argument("--duration", type=float, default=WRITEUP["duration"], help="seconds under the schedule (1800)")
    p.add_argument("--seed", type=int, default=17, help="the schedule's seed")
    p.add_argument("--step-time", type=float, default=STEP_TIME, help="the emulated accelerator's step (0.5 s; see above)")
    p.add_argument("--warm-spares", type=int, default=WARM_SPARES, help="warm spare processes for restarts (2)")
    p.add_argument("--latency-faults", type=int, default=LATENCY_FAULTS, help="100 ms latency faults beyond the 62")
    p.add_argument("--systems", default=",".join(SYSTEMS), help="comma-separated subset of chaos, twin, torchft")
    p.add_argument("--torchft-learners", type=int, default=0, help="replica groups for torchft (0: skip it)")
    p.add_argument("--torchft-args", default="", help="more flags for every torchft peer (bench/peers/"
                   "torchft_diloco.py), e.g. '--collective-timeout 30 --connect-timeout 30'")
    p.add_argument("--torchft-duration", type=float, help="seconds of torchft under the schedule's first faults "
                   "(default --duration)")
    p.add_argument("--gap-threshold", type=float, help="a gap without a merge longer than this is global "
                   "downtime (default: two fault-free rounds, 2 x H x --step-time)")
    p.add_argument("--memory-every", type=float, default=MEMORY_EVERY, help="seconds between memory samples (5)")
    p.add_argument("--out", type=output_file, default=str(OUT),
                   help="the JSON written; goodput-scale.png and the runs (goodput-scale-runs/) go beside it")
    args = p.parse_args(argv)
    args.counts = dict(COUNTS)
    if args.quick:
        args.learners, args.duration = QUICK["learners"], QUICK["duration"]
        args.counts = {k: max(1, round(n * QUICK["scale"] * 2)) for k, n in COUNTS.items()}
        args.latency_faults = min(args.latency_faults, 1)
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    unknown = [s for s in systems if s not in (*SYSTEMS, "torchft")]
    if not systems or unknown:
        p.error(f"--systems: expected names among chaos, twin, torchft, got {args.systems!r}")
    if "torchft" in systems and args.torchft_learners < 2:
        args.torchft_learners = args.learners
    if args.torchft_duration is None:
        args.torchft_duration = args.duration
    args.systems = systems
    if args.gap_threshold is None:
        args.gap_threshold = 2 * SYNC_EVERY * args.step_time
    for name in ("learners", "duration", "step_time", "memory_every", "gap_threshold", "torchft_duration"):
        if getattr(args, name) <= 0:
            p.error(f"--{name.replace('_', '-')}: must be > 0, got {getattr(args, name)}")
    if args.warm_spares < 0 or args.latency_faults < 0:
        p.error("--warm-spares and --latency-faults: must be >= 0")
    # What main writes beside --out, checked before the runs.
    check_output(p, "--out", Path(args.out).parent / "goodput-scale-runs", output_dir)
    check_output(p, "--out", Path(args.out).parent / "goodput-scale.png")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(list(sys.argv[1:] if argv is None else argv))
    os.environ.setdefault("ISLANDS_HOME", str(goodput.OUT_DIR / "work" / "goodput-scale-home"))
    try:
        schedule = make_scale_schedule(args.seed, args.learners, args.duration, args.counts, args.latency_faults)
    except ValueError as exc:
        print(f"goodput_scale.py: {exc}", file=sys.stderr)
        return 2
    out = Path(args.out)
    runs = out.parent / "goodput-scale-runs"
    print(f"goodput at scale: {args.learners} learners, {args.duration:g} s, step time {args.step_time:g} s, "
          f"systems {', '.join(args.systems)}; schedule {schedule.name}: {len(schedule.faults)} faults "
          f"{fault_counts(schedule)}", flush=True)
    began = time.monotonic()

    def run_one(system: str, run_dir: Path) -> dict:
        row = run_system(system, schedule, run_dir, args)
        row["tokens_merged_window"] = window_tokens(run_dir, row, args.torchft_duration if system == "torchft"
                                                    else args.duration)
        row["faults_applied_count"] = faults_applied(run_dir)
        return row

    def report(system: str, row: dict, run_dir: Path) -> None:
        print(f"  {row['tokens_merged_window'] / 1e6:.2f} M tokens merged in the window, goodput "
              f"{_pct(row['goodput_available'])} of available capacity, downtime {row['downtime']['seconds']:.1f} s, "
              f"final loss {row.get('final_loss')}, {row['elapsed_seconds']:.0f} s", flush=True)

    rows = goodput.run_systems(args.systems, runs, run_one, report)
    comparison = compare(rows, args.duration)
    if comparison:
        try:
            plot_scale(rows, args.duration, args.learners, out.parent / "goodput-scale.png")
        except Exception as exc:  # noqa: BLE001 - the numbers stand without the plot
            print(f"plot failed: {type(exc).__name__}: {exc}", flush=True)
    print()
    print(format_report(rows, comparison))
    doc = {"machine": platform.platform(), "cpus": os.cpu_count(), "seconds": round(time.monotonic() - began, 1),
           "config": {"learners": args.learners, "duration": args.duration, "seed": args.seed,
                      "step_time": args.step_time, "warm_spares": args.warm_spares, "counts": args.counts,
                      "latency_faults": args.latency_faults, "gap_threshold": args.gap_threshold, "restart_after": RESTART_AFTER,
                      "pause_seconds": PAUSE_SECONDS, "partition_seconds": PARTITION_SECONDS,
                      "latency_seconds": LATENCY_SECONDS, "latency_ms": LATENCY_MS, "rest": REST,
                      "trainer_args": goodput.FAST_TRAINER_ARGS, "adopt": "rebase", "data": goodput.DATA,
                      "torchft_learners": args.torchft_learners, "torchft_duration": args.torchft_duration,
                      "torchft_args": args.torchft_args, "systems": args.systems, "quick": args.quick},
           "writeup": WRITEUP, "schedule": schedule.to_dict(), "comparison": comparison,
           "systems": {k: {kk: vv for kk, vv in v.items() if kk != "throughput"} for k, v in rows.items()}}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1, default=str))
    print(f"\nwrote {out}; runs in {runs}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
