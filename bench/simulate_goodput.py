"""The goodput simulator's figures for docs/simulate-goodput.md (issue 17): pure computation.

  1. the paper preset against the paper's figures (88 / 58 / 27 at 1.2M chips, M=8), and
     against its other figures (M=2, 4 and 16; 2.4M chips), its decoupled learners both as
     the paper has them (--learner-failure shrink, the preset) and as Islands has them (kill);
  2. Islands at 1.2M chips with its own measured recovery (presets islands-warm and
     islands-cold), and which input moves it most (one at a time, x0.5 and x2);
  3. goodput against chips, 10^3 .. 10^7, as a table and docs/benchmarks/goodput-vs-chips.png;
  4. each recorded goodput benchmark given (bench/goodput.py JSONs; default: those under
     bench/out), predicted against measured: with the benchmark's documented warm-spare
     recovery, and, where its run directory is here, with that run's measured restarts
     and pace.
Writes bench/out/simulate-goodput.json.

    python bench/simulate_goodput.py [--runs RUN.json ...] [--repeats 8] [--out PATH] [--png PATH]
"""
from __future__ import annotations

import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from chaos.simulate import PAPER, PRESETS, SYSTEMS, Empirical, predict_schedule, simulate  # noqa: E402
from chaos.simulate.plot import plot_sweep  # noqa: E402
from chaos.simulate.runfile import load_run, measured_pace, measured_restarts, run_inputs  # noqa: E402
from chaos.simulate.sweep import sensitivity, sweep  # noqa: E402
from chaos.simulate.tables import grid, pct, sensitivity_table, sweep_table  # noqa: E402
from trainer.argtypes import Parser, DescriptionFormatter  # noqa: E402
from bench.outputs import output_file  # noqa: E402

OUT = ROOT / "bench" / "out" / "simulate-goodput.json"
PNG = ROOT / "docs" / "benchmarks" / "goodput-vs-chips.png"
DEFAULT_RUNS = ("bench/out/goodput.json", "bench/out/goodput-rerun14", "bench/out/goodput/r4", "bench/out/goodput/r5")
# (chips, learners) -> the paper's figures (arXiv 2604.21428; its Table 1 and learner ablation,
# Table 11, as the copies in docs/simulate-goodput.md quote them)
PAPER_FIGURES = {
    (1_200_000, 8): {"decoupled": 0.88, "elastic-dp": 0.58, "dp": 0.27},
    (1_200_000, 2): {"decoupled": 0.70},
    (1_200_000, 4): {"decoupled": 0.82},
    (1_200_000, 16): {"decoupled": 0.93},
    (2_400_000, 8): {"decoupled": 0.80, "elastic-dp": 0.40, "dp": 0.18},
    (2_400_000, 16): {"decoupled": 0.86},
}


def paper_rows() -> list[dict]:
    rows = []
    for (chips, learners), figures in PAPER_FIGURES.items():
        inp = PAPER.replace(chips=chips, learners=learners)
        results = simulate(inp)
        islands = simulate(inp.replace(learner_failure="kill"))["decoupled"]
        for system, figure in figures.items():
            row = {"chips": chips, "learners": learners, "system": system, "paper": figure,
                   "simulated": round(results[system].goodput, 6)}
            if system == "decoupled":
                row["islands_learners"] = round(islands.goodput, 6)
                row["uptime"] = round(1 - results[system].info["global_downtime_s"] / results[system].seconds, 6)
            rows.append(row)
    return rows


def islands_rows() -> dict[str, dict]:
    out = {}
    for preset in ("paper", "islands-warm", "islands-cold"):
        started = time.monotonic()
        results = simulate(PRESETS[preset])
        out[preset] = {"seconds": round(time.monotonic() - started, 2),
                       **{s: results[s].to_json() for s in SYSTEMS}}
    return out


def predict_run(path: str, repeats: int) -> dict:
    run = load_run(path)
    inp = run_inputs(run, {})

    def mean_of(inputs) -> dict:
        runs = [predict_schedule(run.schedule, dataclasses.replace(inputs, seed=k)) for k in range(repeats)]
        return {"goodput_available": round(statistics.mean(r.goodput for r in runs), 4),
                "range": [round(min(r.goodput for r in runs), 4), round(max(r.goodput for r in runs), 4)],
                "goodput_all": round(statistics.mean(r.info["goodput_all"] for r in runs), 4),
                "lost": {k: round(statistics.mean(r.fractions()[k] for r in runs), 4) for k in runs[0].lost}}

    row = {"run": path, "learners": inp.learners, "faults": len(run.schedule.faults),
           "measured": run.measured, "predicted": mean_of(inp),
           "run_dir": str(run.run_dir) if run.run_dir else None, "run_dir_note": run.note}
    if run.run_dir is not None:
        restarts = measured_restarts(run.run_dir)
        pace = measured_pace(run.run_dir, run.rates)
        own = dataclasses.replace(inp, recovery=Empirical(restarts, str(run.run_dir)), pace=pace)
        row["measured_inputs"] = {"restart_mean_s": round(statistics.mean(restarts), 3),
                                  "restart_median_s": round(statistics.median(restarts), 3), "pace": round(pace, 3)}
        row["predicted_with_measured_inputs"] = mean_of(own)
    return row


def run_table(rows: list[dict]) -> str:
    table = []
    for r in rows:
        m = r["measured"]
        table.append([r["run"], "warm-spare recovery", pct(r["predicted"]["goodput_available"]),
                      pct(m.get("goodput_available")), pct(r["predicted"]["goodput_all"]), pct(m.get("goodput"))])
        own = r.get("predicted_with_measured_inputs")
        if own:
            mi = r["measured_inputs"]
            table.append(["", f"run's restarts (mean {mi['restart_mean_s']:.1f} s), pace {mi['pace']:.2f}",
                          pct(own["goodput_available"]), "", pct(own["goodput_all"]), ""])
        elif r["run_dir_note"]:
            table.append(["", f"(no measured inputs: {r['run_dir_note']})", "", "", "", ""])
    return grid(["run", "simulated with", "available: predicted", "measured", "all: predicted", "measured"], table)


def main(argv: list[str] | None = None) -> int:
    ap = Parser(description=__doc__, formatter_class=DescriptionFormatter)
    ap.add_argument("--runs", nargs="*", default=None, help="bench/goodput.py JSONs (default: those under bench/out)")
    ap.add_argument("--repeats", type=int, default=8, help="seeds averaged per schedule prediction (default 8)")
    ap.add_argument("--out", type=output_file, default=OUT,
                    help="the JSON written: every table's figures (paper, presets, sensitivity, sweep, runs)")
    ap.add_argument("--png", type=output_file, default=PNG, help="the plot of simulated goodput against chips")
    args = ap.parse_args(argv)
    started = time.monotonic()

    paper = paper_rows()
    print("The paper's figures, simulated with the paper preset (decoupled: the paper's learners; beside "
          "them Islands' learners, --learner-failure kill):")
    print(grid(["chips", "M", "system", "paper", "simulated", "Islands' learners", "uptime"],
               [[f"{r['chips']:,}", str(r["learners"]), r["system"], pct(r["paper"]), pct(r["simulated"]),
                 pct(r.get("islands_learners")), pct(r.get("uptime"))] for r in paper]))

    presets = islands_rows()
    print("\nAt 1.2M chips, MTBI 1 chip-year, M=8 (goodput; seconds to simulate):")
    print(grid(["preset", *SYSTEMS, "seconds"],
               [[p, *(pct(v[s]["goodput"]) for s in SYSTEMS), f"{v['seconds']:.2f}"] for p, v in presets.items()]))

    swings = sensitivity(PRESETS["islands-warm"])
    base = {s: presets["islands-warm"][s]["goodput"] for s in SYSTEMS}
    print("\nSensitivity, preset islands-warm (one input at a time):")
    print(sensitivity_table(base, swings))

    curves = sweep(PAPER)
    print("\nGoodput against chips (paper preset, M=8):")
    print(sweep_table(curves))
    plot_sweep(curves, args.png, "simulated goodput, M=8 learners, MTBI 1 chip-year, paper preset "
                                 "(python -m chaos simulate-goodput --plot)")

    runs = [p for p in (args.runs if args.runs is not None else DEFAULT_RUNS) if (ROOT / p).is_file() or
            Path(p).is_file()]
    run_rows = [predict_run(p, args.repeats) for p in runs]
    if run_rows:
        print(f"\nRecorded goodput benchmarks, decoupled, predicted (mean of {args.repeats} seeds) against measured:")
        print(run_table(run_rows))

    doc = {"paper": paper, "presets": presets, "sweep": curves, "runs": run_rows,
           "sensitivity_islands_warm": [dataclasses.asdict(w) for w in swings],
           "seconds": round(time.monotonic() - started, 1)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2))
    print(f"\nwrote {args.out} and {args.png} in {doc['seconds']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
