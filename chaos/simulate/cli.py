"""`python -m chaos simulate-goodput`: the goodput simulator's command line.

Scale mode (the default) simulates three systems under one seeded failure stream:

  python -m chaos simulate-goodput --chips 1200000 --learners 8 --mtbi-years 1 [--seed 0] [--json]
      [--preset paper|islands-warm|islands-cold] [--learner-failure shrink|kill]
      [--sweep-chips] [--plot PATH] [--sensitivity]

Schedule mode replays an explicit fault schedule on a simulated Islands cluster and predicts
the decoupled system's goodput as bench/goodput.py measures it:

  python -m chaos simulate-goodput --schedule FILE.yaml --learners 4 --duration 150 [--json]
  python -m chaos simulate-goodput --from-run bench/out/goodput.json [--measured] [--json]

`--json` prints one object whose keys are the systems. `--inputs-json` prints the resolved
inputs with their assumptions instead of simulating.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import sys
import time
from pathlib import Path

from faults import Schedule, ScheduleError
from trainer.argtypes import Parser, non_negative_float, non_negative_int, positive_float, positive_int

from .dists import SPEC_FORMS, Dist, Empirical
from .inputs import ASSUMPTIONS, COMMON, LEARNER_FAILURES, PRESETS, ScaleInputs
from .result import LOSSES, SYSTEMS
from .runfile import load_run, measured_pace, measured_restarts, parse_recovery, run_inputs
from .scale import simulate
from .scheduled import RunInputs, predict_schedule
from .sweep import sensitivity, sweep
from .tables import grid, inputs_table, pct, results_table, sensitivity_table, sweep_table

SCALE_FIELDS = ("chips", "learners", "chips_per_learner", "mtbi_years", "step_time", "sync_every", "fragments",
                "quorum", "grace", "max_staleness", "detection", "recovery_decoupled", "reconfigure",
                "slice_return", "recovery_dp", "checkpoint_every", "slice_chips", "learner_failure", "duration",
                "seed")
SCALE_ONLY = ("chips", "chips_per_learner", "mtbi_years", "reconfigure", "slice_return", "recovery_dp",
              "checkpoint_every", "slice_chips", "learner_failure", "sweep_chips", "plot", "sensitivity", "preset")
SCHEDULE_ONLY = ("pace", "heartbeat_interval", "heartbeat_timeout", "repeats", "measured")
RUN_FIELDS = ("learners", "duration", "step_time", "sync_every", "fragments", "quorum", "grace", "max_staleness",
              "heartbeat_interval", "heartbeat_timeout", "detection", "pace", "seed")
SCHEDULE_HELP = ("Schedule mode (--schedule or --from-run) defaults to the goodput benchmark's settings: "
                 "4 learners, 150 s, --step-time 0.025, H=10, P=1, K=0 (every live learner), grace 0.5 s, "
                 "max staleness 4, heartbeat 0.2 s / lease 1.0 s, detection 0.069 s, recovery "
                 "lognormal:0.042,0.71 (warm spares: restart -> join, BENCHMARKS 'Recovery').")


# ----------------------------------------------------------------------------- value types
def chip_count(text: str) -> int:
    """An integer, also written as 1.2e6."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if not math.isfinite(value) or value != int(value) or value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}")
    return int(value)


def finite_positive(text: str) -> float:
    value = positive_float(text)
    if math.isinf(value):
        raise argparse.ArgumentTypeError(f"must be finite, got {text!r}")
    return value


def fraction(text: str) -> float:
    value = finite_positive(text)
    if value > 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {text!r}")
    return value


def recovery(text: str) -> Dist:
    try:
        return parse_recovery(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _help(field: str, extra: str = "") -> str:
    return ASSUMPTIONS[field].replace("%", "%%") + extra


# ----------------------------------------------------------------------------- parser
def build_parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="python -m chaos simulate-goodput",
        description="Seeded discrete-event goodput simulator: decoupled DiLoCo (the paper's learners, or "
                    "Islands' with --learner-failure kill), elastic and non-elastic data-parallel, under one "
                    "stream of chip failures; or one "
                    "explicit fault schedule replayed on a simulated Islands cluster. Every default below "
                    "is the paper preset (arXiv 2604.21428), with the assumption that sets it: 'Paper [X]' "
                    "is what the paper states, X naming the source that quotes it (docs/simulate-goodput.md, "
                    "'What the paper says'; its simulation appendix itself could not be read); 'calibrated' "
                    "is fitted to its figures; 'our choice' is a value it does not give. "
                    + COMMON + " " + SCHEDULE_HELP + " See docs/simulate-goodput.md.",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    size = p.add_argument_group("cluster and failures")
    size.add_argument("--preset", choices=tuple(PRESETS), default=None,
                      help="paper (default): the paper's assumptions below; islands-warm / islands-cold: the "
                           "same cluster with Islands' learners (--learner-failure kill) and their measured "
                           "detection and rejoin")
    size.add_argument("--chips", type=chip_count, help=_help("chips"))
    size.add_argument("--learners", type=positive_int, help=_help("learners", " Schedule mode: the schedule's."))
    size.add_argument("--chips-per-learner", type=chip_count, help=_help("chips_per_learner"))
    size.add_argument("--mtbi-years", type=positive_float, help=_help("mtbi_years"))
    size.add_argument("--duration", type=finite_positive, help=_help("duration", " Schedule mode: the window."))
    size.add_argument("--seed", type=int, default=None, help=_help("seed"))
    work = p.add_argument_group("workload and syncer")
    work.add_argument("--step-time", type=finite_positive, help=_help("step_time"))
    work.add_argument("--sync-every", type=positive_int, metavar="H", help=_help("sync_every"))
    work.add_argument("--fragments", type=positive_int, metavar="P", help=_help("fragments"))
    work.add_argument("--quorum", type=non_negative_int, metavar="K", help=_help("quorum"))
    work.add_argument("--grace", type=non_negative_float, help=_help("grace"))
    work.add_argument("--max-staleness", type=non_negative_int, help=_help("max_staleness"))
    work.add_argument("--learner-failure", choices=LEARNER_FAILURES, help=_help("learner_failure"))
    rec = p.add_argument_group(f"recovery times (each a distribution: {SPEC_FORMS}, or restarts:RUN_DIR, "
                               "a chaos run's measured restart -> first step)")
    rec.add_argument("--detection", type=recovery, metavar="SPEC", help=_help("detection"))
    rec.add_argument("--recovery-decoupled", type=recovery, metavar="SPEC", help=_help("recovery_decoupled"))
    rec.add_argument("--reconfigure", type=recovery, metavar="SPEC", help=_help("reconfigure"))
    rec.add_argument("--slice-return", type=recovery, metavar="SPEC", help=_help("slice_return"))
    rec.add_argument("--recovery-dp", type=recovery, metavar="SPEC", help=_help("recovery_dp"))
    dp = p.add_argument_group("data-parallel (both variants are always simulated: elastic-dp and dp, "
                              "the non-elastic one)")
    dp.add_argument("--checkpoint-every", type=finite_positive, metavar="SECONDS", help=_help("checkpoint_every"))
    dp.add_argument("--slice-chips", type=chip_count, help=_help("slice_chips"))
    out = p.add_argument_group("output")
    out.add_argument("--json", action="store_true", help="print one JSON object keyed by system instead of tables")
    out.add_argument("--inputs-json", action="store_true", help="print the resolved inputs and their assumptions "
                                                                "as JSON and stop")
    out.add_argument("--sweep-chips", action="store_true", help="goodput over chip counts 10^3 .. 10^7 (learners "
                                                                "kept, or sized by --chips-per-learner)")
    out.add_argument("--plot", type=Path, metavar="PATH", help="PNG of goodput against chips 10^3 .. 10^7, one line "
                                                               "per system (matplotlib, Agg)")
    out.add_argument("--sensitivity", action="store_true", help="one input at a time at x0.5 and x2: which moves "
                                                                "goodput most")
    sched = p.add_argument_group("schedule mode (decoupled only)")
    src = sched.add_mutually_exclusive_group()
    src.add_argument("--schedule", type=Path, metavar="FILE", help="a fault schedule (.yaml/.json, faults.Schedule: "
                                                                   "kill, pause, partition, latency)")
    src.add_argument("--from-run", type=Path, metavar="JSON",
                     help="a bench/goodput.py or goodput_scale.py JSON: its schedule, settings and measured goodput, "
                          "side by side")
    sched.add_argument("--measured", action="store_true", help="with --from-run: also predict with the run "
                                                               "directory's measured restarts and pace")
    sched.add_argument("--pace", type=fraction, help="a learner's step rate while up / its credited rate (default 1)")
    sched.add_argument("--heartbeat-interval", type=finite_positive, help="seconds (default 0.2)")
    sched.add_argument("--heartbeat-timeout", type=finite_positive, help="the syncer's lease, seconds (default 1.0)")
    sched.add_argument("--repeats", type=positive_int, help="seeds averaged, seed .. seed+N-1 (default 5)")
    return p


# ----------------------------------------------------------------------------- scale mode
def scale_inputs(args: argparse.Namespace) -> ScaleInputs:
    base = PRESETS[args.preset or "paper"]
    given = {f: getattr(args, f) for f in SCALE_FIELDS if getattr(args, f) is not None}
    if "chips" in given and "learners" not in given and "chips_per_learner" in given:
        given["learners"] = max(1, given["chips"] // given["chips_per_learner"])
    return base.replace(**given)


def _value(inp: ScaleInputs, field: str) -> str:
    value = getattr(inp, field)
    if field == "recovery_decoupled":
        return inp.decoupled_recovery.spec()
    if field == "recovery_dp":
        return inp.dp_restart.spec()
    if field == "chips_per_learner":
        return f"{inp.per_learner:,.0f}"
    if field == "duration":
        return f"{inp.sim_duration:,.0f} s" + (" (auto)" if value is None else "")
    if hasattr(value, "spec"):
        return value.spec()
    if isinstance(value, str):
        return value
    return f"{value:,}" if isinstance(value, int) else f"{value:g}"


def input_rows(inp: ScaleInputs) -> list[tuple[str, str, str]]:
    return [("--" + f.replace("_", "-"), _value(inp, f), ASSUMPTIONS[f]) for f in SCALE_FIELDS]


def is_paper_cluster(inp: ScaleInputs) -> bool:
    return (inp.chips, inp.learners, inp.mtbi_years) == (1_200_000, 8, 1.0)


def run_scale(args: argparse.Namespace, inp: ScaleInputs) -> int:
    if args.inputs_json:
        print(json.dumps({f: {"value": _value(inp, f), "assumption": ASSUMPTIONS[f]} for f in SCALE_FIELDS},
                         indent=2))
        return 0
    if args.sweep_chips or args.plot:
        curves = sweep(inp)
        if args.plot:
            from .plot import plot_sweep
            title = (f"{inp.learners} learners, MTBI {inp.mtbi_years:g} chip-years, preset "
                     f"{args.preset or 'paper'} (python -m chaos simulate-goodput)")
            print(f"wrote {plot_sweep(curves, args.plot, title)}", file=sys.stderr if args.json else sys.stdout)
        if args.json:
            print(json.dumps(curves))
        elif args.sweep_chips:
            print(sweep_table(curves))
        return 0
    started = time.monotonic()
    results = simulate(inp)
    if args.sensitivity:
        swings = sensitivity(inp)
        if args.json:
            print(json.dumps({s: {"goodput": round(results[s].goodput, 6), "sensitivity": [
                {"input": w.parameter, "low": w.low, "high": w.high, "goodput_low": round(w.goodput_low[s], 6),
                 "goodput_high": round(w.goodput_high[s], 6)} for w in swings]} for s in SYSTEMS}))
        else:
            print(sensitivity_table({s: results[s].goodput for s in SYSTEMS}, swings))
        return 0
    if args.json:
        print(json.dumps({s: results[s].to_json() for s in SYSTEMS}))
        return 0
    print(f"inputs (preset {args.preset or 'paper'}; flags override):")
    print(inputs_table(input_rows(inp)))
    print(f"  {COMMON}\n")
    print(results_table(results, paper=is_paper_cluster(inp)))
    print("\nlosses, as fractions of all chips x the simulated time:")
    for k, text in LOSSES.items():
        print(f"  {k}: {text}")
    print(f"\nsimulated {inp.sim_duration / 86400:.1f} days in {time.monotonic() - started:.1f} s")
    return 0


# ----------------------------------------------------------------------------- schedule mode
def _overrides(args: argparse.Namespace) -> dict[str, object]:
    out = {f: getattr(args, f) for f in RUN_FIELDS}
    out["recovery"] = args.recovery_decoupled
    return out


def _predict(schedule: Schedule, inp: RunInputs, repeats: int) -> dict:
    """The mean over `repeats` seeds (which kill draws which restart time moves a few points),
    with the write-up's measure beside it: merged under the schedule / merged by a fault-free twin."""
    twin = predict_schedule(Schedule(seed=schedule.seed, faults=(), learners=schedule.learners), inp)
    runs = [predict_schedule(schedule, dataclasses.replace(inp, seed=inp.seed + k)) for k in range(repeats)]
    doc = runs[0].to_json()
    doc.update(goodput=round(statistics.mean(r.goodput for r in runs), 6),
               goodput_all=round(statistics.mean(r.info["goodput_all"] for r in runs), 6),
               goodput_range=[round(min(r.goodput for r in runs), 6), round(max(r.goodput for r in runs), 6)],
               merged_vs_fault_free=round(statistics.mean(r.info["merged_learner_s"] for r in runs)
                                          / twin.info["merged_learner_s"], 6),
               lost={k: round(statistics.mean(r.fractions()[k] for r in runs), 6) for k in LOSSES},
               seeds=[inp.seed, inp.seed + repeats - 1],
               inputs={k: (v.spec() if hasattr(v, "spec") else v) for k, v in vars(inp).items()})
    return doc


def schedule_inputs(args: argparse.Namespace) -> tuple[Schedule, RunInputs, dict[str, float], RunInputs | None]:
    """(schedule, inputs, measured goodput, inputs with the run's own measured restarts and pace)."""
    over = _overrides(args)
    if args.schedule:
        schedule = Schedule.load(args.schedule)
        if over["learners"] is None and schedule.learners:
            over["learners"] = schedule.learners
        return schedule, RunInputs(**{k: v for k, v in over.items() if v is not None}), {}, None
    run = load_run(args.from_run)
    inp = run_inputs(run, over)
    own = None
    if args.measured:
        if run.run_dir is None:
            raise ValueError(f"--measured: {run.note}")
        restarts = Empirical(measured_restarts(run.run_dir), f"restarts of {run.run_dir}")
        own = dataclasses.replace(inp, recovery=restarts, pace=measured_pace(run.run_dir, run.rates))
    return run.schedule, inp, run.measured, own


def run_schedule(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    source = "--from-run" if args.from_run else "--schedule"
    try:
        schedule, inp, measured, own = schedule_inputs(args)
    except FileNotFoundError as exc:
        parser.error(f"{source}: no such file: {exc.filename}")
    except (ScheduleError, ValueError) as exc:
        parser.error(f"{source}: {exc}")
    for candidate in (inp, own):
        problems = candidate.problems() if candidate else []
        if problems:
            parser.error("; ".join(problems))
    repeats = args.repeats or 5
    try:
        rows = [(f"predicted (recovery {inp.recovery.spec()}, pace {inp.pace:g})", _predict(schedule, inp, repeats))]
        if own is not None:
            rows.append((f"with the run's measured restarts and pace {own.pace:.3f}", _predict(schedule, own, repeats)))
    except ValueError as exc:
        parser.error(f"{source}: {exc}")
    if args.json:
        doc = dict(rows[0][1])
        if own is not None:
            doc["with_measured_inputs"] = rows[1][1]
        if measured:
            doc["measured"] = measured
        print(json.dumps({"decoupled": doc}))
        return 0
    print(f"schedule: {len(schedule.faults)} faults over {inp.learners} learners, window {inp.duration:g} s, "
          f"step {inp.step_time:g} s, H={inp.sync_every}, P={inp.fragments}, K={inp.quorum}, "
          f"grace {inp.grace:g} s, max staleness {inp.max_staleness}; mean of {repeats} seeds from {inp.seed}\n")
    shown = [k for k in LOSSES if any(r["lost"][k] for _, r in rows)]
    head = ["decoupled", "goodput, available capacity (seed range)", "goodput, all capacity",
            "merged / fault-free twin", *(f"lost: {k}" for k in shown)]
    table = [[name, f"{pct(r['goodput'])} ({pct(r['goodput_range'][0])} .. {pct(r['goodput_range'][1])})",
              pct(r["goodput_all"]), pct(r["merged_vs_fault_free"]), *(pct(r["lost"][k]) for k in shown)]
             for name, r in rows]
    if measured:
        table.append([f"measured ({args.from_run})", pct(measured.get("goodput_available")),
                      pct(measured.get("goodput")), pct(measured.get("merged_ratio")), *([""] * len(shown))])
    print(grid(head, table))
    print("\nlosses: fractions of the available capacity (the window less the seconds the schedule held each "
          "learner killed)")
    return 0


# ----------------------------------------------------------------------------- main
def _misplaced(args: argparse.Namespace, schedule_mode: bool) -> str | None:
    wrong = SCALE_ONLY if schedule_mode else SCHEDULE_ONLY
    for name in wrong:
        if getattr(args, name) not in (None, False):
            flag = "--" + name.replace("_", "-")
            return f"{flag}: only with {'the scale mode' if schedule_mode else '--schedule or --from-run'}"
    return None


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    schedule_mode = bool(args.schedule or args.from_run)
    problem = _misplaced(args, schedule_mode)
    if problem:
        parser.error(problem)
    if args.measured and not args.from_run:
        parser.error("--measured: only with --from-run")
    if schedule_mode:
        return run_schedule(args, parser)
    inp = scale_inputs(args)
    problems = inp.problems()
    if problems:
        parser.error("; ".join(problems))
    return run_scale(args, inp)


if __name__ == "__main__":
    sys.exit(main())
