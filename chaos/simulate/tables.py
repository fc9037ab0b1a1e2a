"""Plain-text tables of the simulator's inputs and results, as the CLI prints them."""
from __future__ import annotations

from .result import LOSSES, SYSTEMS, SystemResult
from .sweep import Swing

PAPER_FIGURES = {"decoupled": 0.88, "elastic-dp": 0.58, "dp": 0.27}  # arXiv 2604.21428, 1.2M chips, M=8


def pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def inputs_table(rows: list[tuple[str, str, str]]) -> str:
    """(flag, value, assumption) rows."""
    width = max(len(f) for f, _, _ in rows)
    vwidth = max(len(v) for _, v, _ in rows)
    return "\n".join(f"  {f:<{width}}  {v:<{vwidth}}  {a}" for f, v, a in rows)


def results_table(results: dict[str, SystemResult], paper: bool) -> str:
    losses = [k for k in LOSSES if any(r.lost[k] for r in results.values())]
    head = ["system", "goodput"] + (["paper"] if paper else []) + [f"lost: {k}" for k in losses] + [
        "failures", "absorbed", "global downtime"]
    rows = []
    for system in SYSTEMS:
        r = results[system]
        frac = r.fractions()
        rows.append([system, pct(r.goodput)] + ([pct(PAPER_FIGURES[system])] if paper else [])
                    + [pct(frac[k]) for k in losses]
                    + [str(r.info.get("failures", "-")), str(r.info.get("absorbed", "-")),
                       f"{r.info.get('global_downtime_s', 0.0) / r.seconds:.1%} of time"])
    return grid(head, rows)


def grid(head: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)]

    def line(cells: list[str]) -> str:
        return "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()

    return "\n".join([line(head), line(["-" * w for w in widths]), *(line(r) for r in rows)])


def sweep_table(curves: dict[str, dict[str, list]]) -> str:
    chips = curves["decoupled"]["chips"]
    rows = [[f"{n:,}"] + [pct(curves[s]["goodput"][i]) for s in SYSTEMS] for i, n in enumerate(chips)]
    return grid(["chips", *SYSTEMS], rows)


def sensitivity_table(base: dict[str, float], swings: list[Swing]) -> str:
    head = ["input", "x0.5", "x2"] + [f"{s} (base {pct(base[s])})" for s in SYSTEMS]
    rows = [[w.parameter, w.low, w.high]
            + [f"{pct(w.goodput_low[s])} .. {pct(w.goodput_high[s])}" for s in SYSTEMS] for w in swings]
    return grid(head, rows)
