"""A chaos run's report: `RUN_DIR/timeline.png` and a self-contained `RUN_DIR/timeline.html`.

Read only from the run directory: `events/*.jsonl` (every process), `history.jsonl` (the
controller), `verdict.json`, `schedule.yaml` and `run.json`; every one of them may be
missing or cut short by a SIGKILL, and the report shows whatever exists.

The figure has four panels on one x axis, seconds since the schedule began (the history's
`begin` entry; the first event when there is no history, so warm-up is negative):

1. fault windows, one row per target (syncer, learner-1..N), coloured by kind, with the
   syncer's `heartbeat_lost` (x) and rejoins (triangle) marked on each learner's row;
2. each learner's training loss (raw faint, rolling mean solid) and Θ's held-out loss as
   the syncer sampled it (`global_eval`, black dashed), fault windows shaded;
3. the global version: the highest merged fragment version (or sync round) over time;
4. each learner's inner steps per second in fixed bins.

The HTML embeds the PNG as a data URI and holds the verdict, the summary, the faults as
the controller really applied them, and the schedule text. No scripts, no external URLs.

CLI: `report RUN_DIR` (wired as `python -m chaos report RUN_DIR`).
"""
from __future__ import annotations

from faults import OUTAGE_KINDS

import argparse
import base64
import html
import json
import math
import re
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from trainer.argtypes import Parser

from .applied import FaultWindow
from .applied import fault_windows as applied_windows
from .nemesis import NEMESES

PNG_NAME = "timeline.png"
HTML_NAME = "timeline.html"
HISTORY_FILE = "history.jsonl"
VERDICT_FILE = "verdict.json"
SCHEDULE_FILE = "schedule.yaml"
RUN_FILE = "run.json"

FIGSIZE = (14.0, 9.0)
DPI = 110
LOSS_SMOOTH_POINTS = 10
GLOBAL_LOSS_CLIP = 1.5  # Θ samples above this x the highest training loss are drawn clipped

KIND_COLORS = NEMESES.colors()  # each kind's colour lives on its nemesis
_EXTRA_COLORS = ["#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173", "#3182bd"]
STATUS_COLORS = {"pass": "#1a7f37", "fail": "#cf222e", "unknown": "#9a6700"}


# --------------------------------------------------------------------------- reading


@dataclass
class Run:
    run_dir: Path
    events: list[dict]
    history: list[dict]
    verdict: dict | None
    schedule_text: str | None
    run_info: dict | None
    torn: dict[str, int] = field(default_factory=dict)  # file -> lines that could not be read
    notes: list[str] = field(default_factory=list)  # problems met while reading

    @property
    def t0(self) -> float:
        for h in self.history:
            if h.get("event") == "begin" and _num(h.get("t")) is not None:
                return float(h["t"])
        if self.events:
            return float(self.events[0]["t"])
        times = [_num(h.get("t")) for h in self.history]
        times = [t for t in times if t is not None]
        return min(times) if times else 0.0

    @property
    def t_end(self) -> float:
        """The last moment the run's files know of."""
        times = [float(self.events[-1]["t"])] if self.events else []
        times += [t for t in (_num(h.get("t")) for h in self.history) if t is not None]
        return max(times) if times else self.t0

    def rel(self, t: float | None) -> float | None:
        return None if t is None else t - self.t0

    @property
    def has_schedule(self) -> bool:
        return any(h.get("event") == "begin" for h in self.history)


def _num(value: Any) -> float | None:
    """A finite float, or None (for missing, non-numeric, NaN, inf)."""
    if isinstance(value, bool):
        return None
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return out if math.isfinite(out) else None


def _loss(value: Any) -> float | None:
    """A loss as float: NaN/inf kept (they are the interesting ones), None if unreadable."""
    if isinstance(value, bool) or value is None:
        return None
    try:
        return float(value)  # float("nan"), float("inf") parse the strings EventLog writes
    except (TypeError, ValueError):
        return None


def _read_jsonl(path: Path) -> tuple[list[dict], int]:
    """Objects from a JSONL file; (objects, lines skipped as torn or unreadable)."""
    out: list[dict] = []
    bad = 0
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if not line.strip():
                    continue
                if not line.endswith("\n"):
                    bad += 1  # a process was killed mid-write
                    continue
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError:
                    bad += 1
                    continue
                if isinstance(obj, dict):
                    out.append(obj)
                else:
                    bad += 1
    except OSError:
        pass
    return out, bad


def _read_events(run_dir: Path, notes: list[str]) -> tuple[list[dict], dict[str, int]]:
    torn: dict[str, int] = {}
    events_dir = run_dir / "events"
    paths = sorted(events_dir.glob("*.jsonl")) if events_dir.is_dir() else []
    for path in paths:
        _, bad = _read_jsonl(path)
        if bad:
            torn[path.name] = bad
    events: list[dict] | None = None
    try:
        from .timeline import run_events

        events, placement = run_events(run_dir)
        if placement.hosts or placement.unplaced:
            notes.append(f"events of {len(placement.hosts)} host(s) placed on the controller's timeline within "
                         f"±{placement.error * 1000:.1f} ms" + (f"; not placed (no clock probe came back): "
                                                                 f"{', '.join(placement.unplaced)}"
                                                                 if placement.unplaced else ""))
    except Exception as exc:  # noqa: BLE001 - a report is still worth having; read tolerantly below
        notes.append(f"reading the events failed ({type(exc).__name__}: {exc}); read tolerantly")
    if events is None:
        events = []
        for path in paths:
            events.extend(_read_jsonl(path)[0])
    clean = [e for e in events if isinstance(e, dict) and _num(e.get("t")) is not None]
    if len(clean) < len(events):
        notes.append(f"{len(events) - len(clean)} event(s) without a usable time were left out")
    clean.sort(key=lambda e: float(e["t"]))
    return clean, torn


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None


def _read_json(path: Path, notes: list[str]) -> dict | None:
    text = _read_text(path)
    if text is None:
        return None
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        notes.append(f"{path.name} is not valid JSON ({exc}); ignored")
        return None
    if not isinstance(obj, dict):
        notes.append(f"{path.name} does not hold a JSON object; ignored")
        return None
    return obj


def load_run(run_dir: str | Path) -> Run:
    run_dir = Path(run_dir)
    notes: list[str] = []
    events, torn = _read_events(run_dir, notes)
    history, bad = _read_jsonl(run_dir / HISTORY_FILE)
    if bad:
        torn[HISTORY_FILE] = bad
    history = [h for h in history if _num(h.get("t")) is not None or h.get("event") is not None]
    return Run(run_dir=run_dir, events=events, history=history,
               verdict=_read_json(run_dir / VERDICT_FILE, notes),
               schedule_text=_read_text(run_dir / SCHEDULE_FILE),
               run_info=_read_json(run_dir / RUN_FILE, notes), torn=torn, notes=notes)


# --------------------------------------------------------------------------- derived data


def loss_unit(events: list[dict]) -> str:
    """The task's unit of loss, as its learners said (`describe()`'s loss_unit; nats/byte for
    the built-in task), else a neutral name: a user's MSE is not nats per byte."""
    for e in events:
        if e.get("kind") == "process_start" and e.get("role") == "learner" and e.get("loss_unit"):
            return str(e["loss_unit"])
    tasks = {str(e.get("task")) for e in events if e.get("kind") == "process_start" and e.get("role") == "learner"}
    return "nats/byte" if tasks == {"gpt"} else "the task's units"


def fault_windows(run: Run) -> list[FaultWindow]:
    """Every start entry of the history paired with its stop (or the heal that ended it)."""
    return applied_windows(run.history, run.t_end)


def _unit(target: str) -> str:
    return target.split("/", 1)[0]


def target_key(name: str) -> tuple:
    """Natural order: syncer, learner-1, learner-2, ..., learner-10, then anything else."""
    if name == "syncer":
        return (0, 0, "")
    m = re.fullmatch(r"learner-(\d+)", name)
    if m:
        return (1, int(m.group(1)), "")
    return (2, 0, name)


def learner_ids(run: Run) -> list[int]:
    ids: set[int] = set()
    for e in run.events:
        learner = e.get("learner")
        if isinstance(learner, int) and not isinstance(learner, bool):
            ids.add(learner)
        elif str(e.get("process", "")).startswith("learner-"):
            m = re.fullmatch(r"learner-(\d+)", str(e["process"]))
            if m:
                ids.add(int(m.group(1)))
    return sorted(ids)


def kind_color(kind: str, extra: dict[str, str]) -> str:
    if kind in KIND_COLORS:
        return KIND_COLORS[kind]
    if kind not in extra:
        extra[kind] = _EXTRA_COLORS[len(extra) % len(_EXTRA_COLORS)]
    return extra[kind]


def _learner_color(learner: int) -> str:
    palette = ["#1f77b4", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22",
               "#7f7f7f", "#d62728"]
    return palette[(learner - 1) % len(palette)]


def rolling_mean(values: np.ndarray, window: int) -> np.ndarray:
    """Trailing mean over up to `window` points (shorter at the start), NaN-aware."""
    if len(values) == 0 or window <= 1:
        return values.astype(float)
    finite = np.isfinite(values)
    vals = np.where(finite, values, 0.0)
    csum = np.concatenate([[0.0], np.cumsum(vals)])
    ccount = np.concatenate([[0], np.cumsum(finite)])
    idx = np.arange(1, len(values) + 1)
    lo = np.maximum(idx - window, 0)
    count = ccount[idx] - ccount[lo]
    with np.errstate(invalid="ignore", divide="ignore"):
        out = (csum[idx] - csum[lo]) / count
    out[count == 0] = np.nan
    return out


def _bin_width(span: float) -> float:
    """2 s bins for runs up to ~10 minutes, coarser beyond so a bin still holds a few steps."""
    if span <= 600:
        return 2.0
    return float(max(2.0, math.ceil(span / 300)))


# --------------------------------------------------------------------------- figure


def _title(run: Run) -> str:
    parts = [run.run_dir.resolve().name or str(run.run_dir)]
    verdict = run.verdict
    if verdict is not None and "passed" in verdict:
        parts.append("PASS" if verdict.get("passed") else "FAIL")
    else:
        parts.append("no verdict")
    goodput = _num(((verdict or {}).get("summary") or {}).get("goodput"))
    if goodput is not None:
        parts.append(f"goodput {goodput:.1%}")
    mode = (run.run_info or {}).get("mode")
    if not mode:
        modes = [e.get("mode") for e in run.events if e.get("kind") == "process_start" and e.get("role") == "syncer"]
        mode = next((m for m in modes if m), None)
    if mode:
        parts.append(f"mode {mode}")
    return "  |  ".join(parts)


def global_losses(run: Run) -> list[tuple[float, float]]:
    """(seconds since t0, Θ's held-out loss) of every `global_eval` the syncer wrote; a
    non-finite loss is left out (the verdicts name it)."""
    out = []
    for e in run.events:
        if e.get("kind") == "global_eval":
            loss, t = _num(e.get("loss")), _num(e.get("t"))
            if loss is not None and t is not None:
                out.append((run.rel(t), loss))
    return out


def _plot_global_loss(run: Run, ax, all_finite: list[float]) -> bool:
    """Θ's held-out loss beside the learners' training losses. A one-version overshoot of
    the outer step can reach 3x the untrained loss; the axis stops at GLOBAL_LOSS_CLIP x
    the highest training loss and such a sample is drawn as a triangle at the top, its
    value beside it, so the curves stay readable."""
    points = global_losses(run)
    if not points:
        return False
    xs = np.array([p[0] for p in points])
    ys = np.array([p[1] for p in points])
    top = max(all_finite) * GLOBAL_LOSS_CLIP if all_finite else None
    shown = ys if top is None else np.minimum(ys, top)
    ax.plot(xs, shown, color="black", linewidth=1.4, linestyle="--", marker="o", markersize=3, zorder=4,
            label="Θ held-out (syncer)")
    if top is not None:
        clipped = ys > top
        if clipped.any():
            ax.scatter(xs[clipped], [top] * int(clipped.sum()), marker="^", s=45, color="black", zorder=5)
            for x, y in zip(xs[clipped], ys[clipped]):
                ax.annotate(f"{y:.1f}", (x, top), textcoords="offset points", xytext=(4, -9), fontsize=7)
        all_finite.extend(shown.tolist())
    else:
        all_finite.extend(ys.tolist())
    return True


def render_figure(run: Run, path: Path) -> None:
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    windows = [w for w in fault_windows(run) if w.start is not None]
    learners = learner_ids(run)
    rows = {"syncer"} | {f"learner-{i}" for i in learners}
    for w in windows:
        rows.update(_unit(t) for t in w.targets)
    row_names = sorted(rows, key=target_key)
    row_y = {name: len(row_names) - 1 - i for i, name in enumerate(row_names)}  # syncer on top

    height = FIGSIZE[1] + max(0, len(row_names) - 6) * 0.25
    fig = Figure(figsize=(FIGSIZE[0], height), dpi=DPI, layout="constrained")
    ratios = [max(1.3, 0.32 * len(row_names)), 2.2, 1.2, 1.4]
    axes = fig.subplots(4, 1, sharex=True, gridspec_kw={"height_ratios": ratios})
    ax_faults, ax_loss, ax_version, ax_rate = axes
    fig.suptitle(_title(run), fontsize=13, fontweight="bold")

    # x range: every event and every fault window, plus 0 when a schedule began
    xs = [run.rel(float(e["t"])) for e in (run.events[:1] + run.events[-1:])]
    xs += [run.rel(w.start) for w in windows] + [run.rel(w.stop) for w in windows]
    if run.has_schedule:
        xs.append(0.0)
    xs = [x for x in xs if x is not None]
    x_lo, x_hi = (min(xs), max(xs)) if xs else (0.0, 1.0)
    if x_hi - x_lo < 1.0:
        x_hi = x_lo + 1.0
    pad = 0.01 * (x_hi - x_lo)

    extra_colors: dict[str, str] = {}

    # ---- panel 1: fault windows per target
    for name in row_names:
        if row_y[name] % 2 == 0:
            ax_faults.axhspan(row_y[name] - 0.5, row_y[name] + 0.5, color="#f3f3f3", zorder=0, lw=0)
    kinds_seen: list[str] = []
    # data units per character of an 8 pt bold label, from the axis' approximate width in pixels
    char_width = 6.5 / (fig.get_figwidth() * DPI * 0.82) * (x_hi - x_lo)
    for w in windows:
        color = kind_color(w.kind, extra_colors)
        if w.kind not in kinds_seen:
            kinds_seen.append(w.kind)
        a, b = run.rel(w.start), run.rel(w.stop)
        width = max(b - a, 0.002 * (x_hi - x_lo))  # an instant fault still shows
        for target in w.targets:
            y = row_y[_unit(target)]
            # the bar fills the upper part of the row; markers go in the lower part
            ax_faults.broken_barh([(a, width)], (y - 0.08, 0.48), facecolors=color, edgecolor="black",
                                  linewidth=0.5, alpha=0.85, zorder=2)
            label = w.kind + (f" {target.split('/', 1)[1]}" if "/" in target else "")
            if w.stop_note:
                label += " …"
            if width < (len(label) + 1) * char_width:
                label = w.kind
            if width >= (len(label) + 1) * char_width:
                ax_faults.text(a + width / 2, y + 0.16, label, ha="center", va="center", fontsize=8,
                               color="white", fontweight="bold", zorder=3, clip_on=True)
    lost_x: list[float] = []
    lost_y: list[float] = []
    rejoin_x: list[float] = []
    rejoin_y: list[float] = []
    for e in run.events:
        learner = e.get("learner")
        if not isinstance(learner, int) or f"learner-{learner}" not in row_y:
            continue
        if e.get("kind") == "heartbeat_lost" and e.get("process") == "syncer":
            lost_x.append(run.rel(float(e["t"])))
            lost_y.append(row_y[f"learner-{learner}"] - 0.28)
        elif e.get("kind") == "join" and e.get("rejoin"):
            rejoin_x.append(run.rel(float(e["t"])))
            rejoin_y.append(row_y[f"learner-{learner}"] - 0.28)
    ax_faults.scatter(lost_x, lost_y, marker="x", s=60, color="black", linewidths=2, zorder=4)
    ax_faults.scatter(rejoin_x, rejoin_y, marker="^", s=55, color="#2da44e", edgecolors="black",
                      linewidths=0.6, zorder=4)
    ax_faults.set_yticks([row_y[n] for n in row_names], row_names)
    ax_faults.set_ylim(-0.6, len(row_names) - 0.4)
    ax_faults.set_ylabel("faults")
    handles = [Patch(facecolor=kind_color(k, extra_colors), edgecolor="black", linewidth=0.5, label=k)
               for k in kinds_seen]
    if lost_x:
        handles.append(Line2D([], [], marker="x", color="black", linestyle="none", markersize=7,
                              markeredgewidth=2, label="heartbeat lost"))
    if rejoin_x:
        handles.append(Line2D([], [], marker="^", color="#2da44e", markeredgecolor="black", linestyle="none",
                              markersize=7, label="rejoin"))
    if handles:
        ax_faults.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=8,
                         frameon=False, borderaxespad=0)
    if not run.history:
        ax_faults.text(0.5, 0.5, "no controller history: no faults were scheduled", transform=ax_faults.transAxes,
                       ha="center", va="center", fontsize=9, color="#555555")
    elif not windows:
        ax_faults.text(0.5, 0.5, "no fault was in force", transform=ax_faults.transAxes,
                       ha="center", va="center", fontsize=9, color="#555555")

    # light fault shading behind the data panels
    for ax in (ax_loss, ax_version, ax_rate):
        for w in windows:
            ax.axvspan(run.rel(w.start), run.rel(w.stop), color=kind_color(w.kind, extra_colors), alpha=0.09,
                       lw=0, zorder=0)
    for ax in axes:
        if run.has_schedule:
            ax.axvline(0.0, color="#444444", linestyle=":", linewidth=0.9, zorder=1)
        ax.grid(axis="x", color="#dddddd", linewidth=0.6)
        ax.set_axisbelow(True)

    # ---- panel 2: loss per learner
    steps_by_learner: dict[int, list[dict]] = defaultdict(list)
    for e in run.events:
        if e.get("kind") == "inner_step" and isinstance(e.get("learner"), int):
            steps_by_learner[e["learner"]].append(e)
    all_finite: list[float] = []
    bad_x: list[float] = []
    loss_lines = []
    for learner in sorted(steps_by_learner):
        steps = steps_by_learner[learner]
        color = _learner_color(learner)
        t = np.array([run.rel(float(e["t"])) for e in steps])
        loss = np.array([_loss(e.get("loss")) if _loss(e.get("loss")) is not None else np.nan for e in steps],
                        dtype=float)
        inc = [e.get("incarnation") for e in steps]
        bad = ~np.isfinite(loss) & np.array([_loss(e.get("loss")) is not None for e in steps], dtype=bool)
        bad_x.extend(t[bad].tolist())
        finite = np.isfinite(loss)
        all_finite.extend(loss[finite].tolist())
        # break the line where an incarnation ends, so a kill shows as a gap
        starts = [0] + [i for i in range(1, len(steps)) if inc[i] != inc[i - 1]] + [len(steps)]
        for seg, (a, b) in enumerate(zip(starts, starts[1:])):
            ts, ls = t[a:b], loss[a:b]
            ok = np.isfinite(ls)
            ax_loss.plot(ts[ok], ls[ok], color=color, alpha=0.2, linewidth=0.7)
            smooth = rolling_mean(ls, LOSS_SMOOTH_POINTS)
            (line,) = ax_loss.plot(ts, smooth, color=color, linewidth=1.6,
                                   label=f"learner-{learner}" if seg == 0 else None)
            if seg == 0:
                loss_lines.append(line)
    plotted_global = _plot_global_loss(run, ax_loss, all_finite)
    if all_finite:
        lo, hi = min(all_finite), max(all_finite)
        if lo > 0 and hi / lo > 30:
            ax_loss.set_yscale("log")
    if bad_x:
        ax_loss.scatter(bad_x, [0.97] * len(bad_x), marker="|", s=80, color="#cf222e",
                        transform=ax_loss.get_xaxis_transform(), zorder=5, label="non-finite loss")
    unit = loss_unit(run.events)
    ax_loss.set_ylabel(f"loss ({unit})" if plotted_global else f"training loss ({unit})")
    if steps_by_learner or plotted_global:
        ax_loss.legend(loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=8, frameon=False, borderaxespad=0)
    else:
        ax_loss.text(0.5, 0.5, "no inner steps recorded", transform=ax_loss.transAxes, ha="center",
                     va="center", fontsize=9, color="#555555")

    # ---- panel 3: global version
    merges = [e for e in run.events if e.get("kind") == "merge"]
    syncs = [e for e in run.events if e.get("kind") == "sync_step"]
    plotted_version = False
    if merges:
        by_fragment: dict[Any, list[tuple[float, float]]] = defaultdict(list)
        best = -math.inf
        xs_v, ys_v = [], []
        for e in merges:
            v = _num(e.get("version"))
            if v is None:
                continue
            x = run.rel(float(e["t"]))
            by_fragment[e.get("fragment")].append((x, v))
            best = max(best, v)
            xs_v.append(x)
            ys_v.append(best)
        if len(by_fragment) > 1:
            for frag, pts in sorted(by_fragment.items(), key=lambda kv: str(kv[0])):
                ax_version.step([p[0] for p in pts], [p[1] for p in pts], where="post", linewidth=0.8,
                                alpha=0.45, label=f"fragment {frag}")
        if xs_v:
            ax_version.step(xs_v + [x_hi], ys_v + [ys_v[-1]], where="post", color="black", linewidth=1.6,
                            label="max merged version")
            ax_version.plot(xs_v, ys_v, linestyle="none", marker=".", markersize=3, color="black")
            plotted_version = True
        ax_version.set_ylabel("merged version")
    if syncs:
        xs_s = [run.rel(float(e["t"])) for e in syncs]
        ys_s = [_num(e.get("round")) for e in syncs]
        pts = [(x, y) for x, y in zip(xs_s, ys_s) if y is not None]
        if pts:
            ax_version.step([p[0] for p in pts] + [x_hi], [p[1] for p in pts] + [pts[-1][1]], where="post",
                            color="#0969da", linewidth=1.6, label="sync round")
            plotted_version = True
        if not merges:
            ax_version.set_ylabel("sync round")
    if plotted_version:
        ax_version.legend(loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=8, frameon=False,
                          borderaxespad=0)
    else:
        ax_version.set_ylabel("version")
        ax_version.text(0.5, 0.5, "no merge or sync step recorded", transform=ax_version.transAxes,
                        ha="center", va="center", fontsize=9, color="#555555")

    # ---- panel 4: inner steps per second per learner
    width = _bin_width(x_hi - x_lo)
    edges = np.arange(math.floor(x_lo / width) * width, x_hi + width, width)
    if len(edges) < 2:
        edges = np.array([x_lo, x_lo + width])
    for learner in sorted(steps_by_learner):
        t = np.array([run.rel(float(e["t"])) for e in steps_by_learner[learner]])
        counts, _ = np.histogram(t, bins=edges)
        rate = counts / width
        # only from this learner's first step: before it, it had not started
        first = np.searchsorted(edges, t.min(), side="right") - 1
        rate = rate.astype(float)
        rate[: max(first, 0)] = np.nan
        ax_rate.stairs(rate, edges, color=_learner_color(learner), linewidth=1.4, label=f"learner-{learner}",
                       baseline=None)
    ax_rate.set_ylabel(f"steps/s ({width:g} s bins)")
    ax_rate.set_ylim(bottom=0)
    if steps_by_learner:
        ax_rate.legend(loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=8, frameon=False, borderaxespad=0)
    else:
        ax_rate.text(0.5, 0.5, "no inner steps recorded", transform=ax_rate.transAxes, ha="center", va="center",
                     fontsize=9, color="#555555")
    ax_rate.set_xlabel("seconds since the schedule began" if run.has_schedule else "seconds since the first event")
    ax_rate.set_xlim(x_lo - pad, x_hi + pad)

    fig.savefig(path, dpi=DPI, facecolor="white")


# --------------------------------------------------------------------------- HTML

_CSS = """
body { font-family: -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; margin: 24px; color: #1f2328; }
h1 { font-size: 22px; margin-bottom: 4px; }
h2 { font-size: 17px; margin-top: 28px; border-bottom: 1px solid #d0d7de; padding-bottom: 4px; }
.sub { color: #57606a; font-size: 13px; }
.badge { display: inline-block; padding: 2px 10px; border-radius: 12px; color: white; font-weight: bold; }
table { border-collapse: collapse; font-size: 13px; margin-top: 6px; }
th, td { border: 1px solid #d0d7de; padding: 4px 8px; text-align: left; vertical-align: top; }
th { background: #f6f8fa; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
.status { font-weight: bold; text-transform: uppercase; }
pre { background: #f6f8fa; border: 1px solid #d0d7de; padding: 10px; overflow-x: auto; font-size: 12px; }
img { max-width: 100%; border: 1px solid #d0d7de; }
details summary { cursor: pointer; color: #0969da; }
.note { color: #9a6700; }
.err { color: #cf222e; }
"""


def _e(value: Any) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def _fmt_num(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        if value != 0 and abs(value) < 1e-3:
            return f"{value:.3g}"
        return f"{value:,.0f}" if abs(value) >= 1e4 else f"{value:.4g}"
    if isinstance(value, (list, tuple)):
        return ", ".join(_fmt_num(v) for v in value)
    if isinstance(value, dict):
        return json.dumps(value, default=str)
    return str(value)


def _fmt_t(value: float | None) -> str:
    return "" if value is None else f"{value:+.2f}"


def _status_cell(status: Any) -> str:
    s = str(status or "unknown").lower()
    color = STATUS_COLORS.get(s, "#57606a")
    return f'<td class="status" style="color:{color}">{_e(s)}</td>'


def _verdict_html(run: Run) -> str:
    verdict = run.verdict
    if verdict is None:
        return "<p class='note'>No verdict.json: the checkers did not run (a plain trainer run, or the run " \
               "stopped before its evaluation).</p>"
    checks = verdict.get("checks") if isinstance(verdict.get("checks"), list) else []
    if not checks:
        return "<p class='note'>verdict.json holds no checks.</p>"
    from .checkers import describe_required  # report reads verdict.json; this only words it

    required = set(verdict.get("required") or [])
    rows = []
    for c in checks:
        if not isinstance(c, dict):
            continue
        evidence = c.get("evidence")
        ev = ""
        if evidence:
            ev = (f"<details><summary>evidence</summary><pre>{_e(json.dumps(evidence, indent=2, default=str))}"
                  f"</pre></details>")
        must = "yes" if c.get("name") in required else ""
        rows.append(f"<tr><td>{_e(c.get('name'))}</td>{_status_cell(c.get('status'))}<td>{must}</td>"
                    f"<td>{_e(c.get('detail'))}{ev}</td></tr>")
    return (f"<p class='sub'>{_e(describe_required(verdict))}. A run passes when no check fails and every "
            "required check passes: unknown is not pass for safety.</p>"
            "<table><tr><th>check</th><th>status</th><th>required</th><th>detail</th></tr>"
            + "".join(rows) + "</table>")


def _summary_html(run: Run) -> str:
    summary = (run.verdict or {}).get("summary")
    if not isinstance(summary, dict) or not summary:
        return ""
    rows = []
    for key, value in summary.items():
        shown = f"{value:.1%}" if key == "goodput" and _num(value) is not None else _fmt_num(value)
        rows.append(f"<tr><th>{_e(key)}</th><td class='num'>{_e(shown)}</td></tr>")
    return "<h2>Summary</h2><table>" + "".join(rows) + "</table>"


def _faults_html(run: Run) -> str:
    windows = fault_windows(run)
    if not run.history:
        return "<h2>Faults</h2><p class='note'>No history.jsonl: no fault schedule was applied to this run.</p>"
    if not windows:
        return "<h2>Faults</h2><p>The controller started no fault.</p>"
    head = ("<tr><th>#</th><th>kind</th><th>target(s)</th><th>planned start</th><th>actual start</th>"
            "<th>planned stop</th><th>actual stop</th><th>in force (s)</th><th>ok</th><th>what was done</th>"
            "<th>parameters</th></tr>")
    rows = []
    for w in windows:
        s = w.start_entry
        fault = s.get("fault") if isinstance(s.get("fault"), dict) else {}
        planned = _num(s.get("planned"))
        if planned is None:
            planned = _num(fault.get("at"))
        duration = _num(fault.get("duration"))
        planned_stop = planned + duration if planned is not None and duration is not None else None
        if fault.get("kind") in OUTAGE_KINDS and fault.get("restart") is False:
            planned_stop_text = "final heal"
        else:
            planned_stop_text = _fmt_t(planned_stop)
        actual_start = _num(s.get("at"))
        if actual_start is None and _num(s.get("t")) is not None:
            actual_start = run.rel(float(s["t"]))
        stop_rel = run.rel(w.stop)
        actual_stop = _fmt_t(stop_rel)
        if w.stop_note:
            actual_stop += f" <span class='note'>({_e(w.stop_note)})</span>"
        in_force = f"{w.stop - w.start:.2f}" if w.start is not None and w.stop is not None else ""
        ok_parts, did_parts = [], []
        for label, entry in (("start", s), ("stop", w.stop_entry)):
            if entry is None:
                continue
            if entry.get("ok"):
                ok_parts.append(f"{label} ok")
            else:
                ok_parts.append(f"<span class='err'>{label} failed: {_e(entry.get('error'))}</span>")
            if entry.get("did"):
                did_parts.append(f"{label}: {_e(entry.get('did'))}")
        params = {k: v for k, v in fault.items() if k not in ("kind", "at", "duration", "target", "targets")}
        rows.append(
            f"<tr><td>{_e(w.index)}</td><td style='color:{KIND_COLORS.get(w.kind, '#1f2328')};font-weight:bold'>"
            f"{_e(w.kind)}</td><td>{_e(', '.join(w.targets))}</td><td class='num'>{_e(_fmt_t(planned))}</td>"
            f"<td class='num'>{_e(_fmt_t(actual_start))}</td><td class='num'>{_e(planned_stop_text)}</td>"
            f"<td class='num'>{actual_stop if w.start is not None else ''}</td><td class='num'>{in_force}</td>"
            f"<td>{'<br>'.join(ok_parts)}</td><td>{'<br>'.join(did_parts)}</td>"
            f"<td>{_e(json.dumps(params, default=str)) if params else ''}</td></tr>")
    note = "<p class='sub'>Times are seconds since the schedule began.</p>"
    return "<h2>Faults</h2>" + note + "<table>" + head + "".join(rows) + "</table>"


def _controller_html(run: Run) -> str:
    entries = [h for h in run.history if h.get("event") not in ("start", "stop")]
    if not entries:
        return ""
    rows = []
    for h in entries:
        t = _num(h.get("t"))
        rest = {k: v for k, v in h.items() if k not in ("t", "wall", "event")}
        ok = h.get("ok")
        cls = " class='err'" if ok is False or h.get("errors") else ""
        rows.append(f"<tr><td class='num'>{_e(_fmt_t(run.rel(t)))}</td><td>{_e(h.get('event'))}</td>"
                    f"<td{cls}>{_e(json.dumps(rest, default=str))}</td></tr>")
    return ("<h2>Controller</h2><table><tr><th>t (s)</th><th>event</th><th>fields</th></tr>"
            + "".join(rows) + "</table>")


def _processes_html(run: Run) -> str:
    per: dict[str, dict] = {}
    for e in run.events:
        p = str(e.get("process", "?"))
        d = per.setdefault(p, {"n": 0, "first": float(e["t"]), "last": float(e["t"]), "kinds": defaultdict(int),
                               "pids": []})
        d["n"] += 1
        d["last"] = float(e["t"])
        d["kinds"][str(e.get("kind"))] += 1
        if e.get("pid") is not None and e["pid"] not in d["pids"]:
            d["pids"].append(e["pid"])
    if not per:
        return ""
    rows = []
    for p in sorted(per, key=target_key):
        d = per[p]
        kinds = ", ".join(f"{k} {n}" for k, n in sorted(d["kinds"].items(), key=lambda kv: -kv[1]))
        torn = run.torn.get(f"{p}.jsonl")
        torn_text = f"<span class='note'>{torn} unreadable line(s)</span>" if torn else ""
        rows.append(f"<tr><td>{_e(p)}</td><td class='num'>{d['n']}</td>"
                    f"<td class='num'>{_e(_fmt_t(run.rel(d['first'])))}</td>"
                    f"<td class='num'>{_e(_fmt_t(run.rel(d['last'])))}</td><td>{_e(', '.join(str(p) for p in d['pids']))}</td>"
                    f"<td>{_e(kinds)}</td><td>{torn_text}</td></tr>")
    return ("<h2>Processes</h2><table><tr><th>process</th><th>events</th><th>first (s)</th><th>last (s)</th>"
            "<th>pids</th><th>event kinds</th><th></th></tr>" + "".join(rows) + "</table>")


def render_html(run: Run, png: bytes | None, path: Path) -> None:
    title = _title(run)
    verdict = run.verdict
    if verdict is not None and "passed" in verdict:
        passed = bool(verdict.get("passed"))
        badge = (f"<span class='badge' style='background:{STATUS_COLORS['pass' if passed else 'fail']}'>"
                 f"{'PASS' if passed else 'FAIL'}</span>")
    else:
        badge = "<span class='badge' style='background:#57606a'>NO VERDICT</span>"
    parts = [
        "<!DOCTYPE html>",
        "<html lang='en'><head><meta charset='utf-8'>",
        f"<title>{_e(title)}</title><style>{_CSS}</style></head><body>",
        f"<h1>{_e(run.run_dir.resolve().name)} {badge}</h1>",
        f"<div class='sub'>{_e(title)} &middot; {len(run.events)} events, {len(run.history)} history entries"
        f" &middot; {_e(run.run_dir)}</div>",
    ]
    notes = list(run.notes)
    for name, n in sorted(run.torn.items()):
        notes.append(f"{name}: {n} torn or unreadable line(s) skipped (a process killed mid-write)")
    if notes:
        parts.append("<ul class='note'>" + "".join(f"<li>{_e(n)}</li>" for n in notes) + "</ul>")
    parts.append("<h2>Verdict</h2>" + _verdict_html(run))
    parts.append(_summary_html(run))
    parts.append("<h2>Timeline</h2>")
    if png is not None:
        data = base64.b64encode(png).decode("ascii")
        parts.append(f"<img alt='timeline of {_e(run.run_dir.name)}' src='data:image/png;base64,{data}'>")
        parts.append("<p class='sub'>Top: fault windows per target (x: the syncer marked the learner's heartbeat "
                     "lost; triangle: the learner rejoined). Then training loss per learner (faint: raw; solid: "
                     f"rolling mean of {LOSS_SMOOTH_POINTS} steps; red ticks: non-finite loss) beside the global "
                     "parameters' held-out loss as the syncer sampled it (black, dashed; a triangle at the top: a "
                     "sample above the axis, its value beside it), the highest merged "
                     "version (or sync round), and inner steps per second. Fault windows are shaded in every "
                     "panel; the dotted line is the start of the schedule.</p>")
    else:
        parts.append("<p class='err'>The figure could not be drawn.</p>")
    parts.append(_faults_html(run))
    parts.append(_controller_html(run))
    parts.append(_processes_html(run))
    if run.schedule_text is not None:
        parts.append(f"<h2>Schedule ({SCHEDULE_FILE})</h2><pre>{_e(run.schedule_text)}</pre>")
    if run.run_info is not None:
        parts.append(f"<h2>Run ({RUN_FILE})</h2><pre>{_e(json.dumps(run.run_info, indent=2, default=str))}</pre>")
    parts.append("</body></html>")
    path.write_text("\n".join(p for p in parts if p) + "\n", encoding="utf-8")


# --------------------------------------------------------------------------- entry points


def write_report(run_dir: str | Path) -> tuple[Path, Path]:
    """Write RUN_DIR/timeline.png and RUN_DIR/timeline.html from whatever the run left; return their paths."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"no such run directory: {run_dir}")
    run = load_run(run_dir)
    png_path, html_path = run_dir / PNG_NAME, run_dir / HTML_NAME
    png: bytes | None = None
    try:
        render_figure(run, png_path)
        png = png_path.read_bytes()
    except Exception as exc:  # noqa: BLE001 - the HTML is still worth having; say what went wrong
        run.notes.append(f"the figure failed: {type(exc).__name__}: {exc}")
    render_html(run, png, html_path)
    return png_path, html_path


def has_events(run_dir: str | Path) -> bool:
    events_dir = Path(run_dir) / "events"
    if not events_dir.is_dir():
        return False
    return any(_read_jsonl(p)[0] for p in events_dir.glob("*.jsonl"))


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="python -m chaos report", description="Draw a chaos run's timeline: RUN_DIR/timeline.png and RUN_DIR/timeline.html.")
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a run directory holding events/*.jsonl")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(list(argv) if argv is not None else None)
    run_dir = Path(args.run_dir)
    if not run_dir.is_dir():
        print(f"report: RUN_DIR {run_dir} is not a directory", file=sys.stderr)
        return 2
    if not has_events(run_dir):
        print(f"report: RUN_DIR {run_dir} has no events (expected {run_dir / 'events'}/*.jsonl with at least "
              "one complete line); nothing to report", file=sys.stderr)
        return 2
    png_path, html_path = write_report(run_dir)
    print(png_path)
    print(html_path)
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
