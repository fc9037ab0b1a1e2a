"""Goodput against chip count, one line per system (matplotlib, imported only here)."""
from __future__ import annotations

from pathlib import Path

from .result import SYSTEMS

LABELS = {"decoupled": "decoupled DiLoCo", "elastic-dp": "elastic data-parallel",
          "dp": "data-parallel (not elastic)"}
COLORS = {"decoupled": "tab:green", "elastic-dp": "tab:orange", "dp": "tab:red"}
PAPER_POINTS = {"decoupled": 0.88, "elastic-dp": 0.58, "dp": 0.27}  # arXiv 2604.21428 at 1.2M chips
PAPER_CHIPS = 1_200_000


def plot_sweep(curves: dict[str, dict[str, list]], path: Path, title: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    for system in SYSTEMS:
        c = curves[system]
        ax.plot(c["chips"], [100 * g for g in c["goodput"]], marker="o", ms=3, color=COLORS[system],
                label=LABELS[system])
        ax.scatter([PAPER_CHIPS], [100 * PAPER_POINTS[system]], marker="x", s=60, color=COLORS[system])
    ax.scatter([], [], marker="x", color="black", label="the paper's figures at 1.2M chips")
    ax.set_xscale("log")
    ax.set_ylim(0, 102)
    ax.set_xlabel("chips")
    ax.set_ylabel("goodput (%)")
    ax.set_title(title, fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="lower left", fontsize=8)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
