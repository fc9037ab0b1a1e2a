"""Goodput of a small, fast task under `trainer run` with default settings (issue 26).

A conv net on synthetic 8x8 images (bench/tasks/conv8.py) steps in about a millisecond, so
a round of H=20 steps is shorter than a push's trip to the syncer and back. With the old
defaults most of what the learners computed was thrown away at adoption. This runs the
task with the defaults (and any other arms given), prints a table of goodput, where the
processed tokens went and the push round trip, and writes JSON.

    python bench/small_task_goodput.py                     # defaults, 3 runs
    python bench/small_task_goodput.py --arms default mix  # beside --adopt mix
"""
from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.outputs import output_file  # noqa: E402
from trainer.argtypes import DescriptionFormatter, Parser, positive_float, positive_int  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
TASK = f"{ROOT / 'bench' / 'tasks' / 'conv8.py'}:task"
# Each arm: the flags it adds to `trainer run`'s defaults.
ARMS = {
    "default": [],
    "mix": ["--adopt", "mix"],  # the adoption of before issue 26: the steps made while a push waits are overwritten
}


def run_arm(name: str, duration: float, work: Path) -> dict:
    out = work / f"{name}-{len(list(work.iterdir()))}"
    done = subprocess.run([sys.executable, "-m", "trainer", "run", "--task", TASK, "--duration", str(duration),
                           "--quiet", "--out", str(out), *ARMS[name]], cwd=ROOT, capture_output=True, text=True,
                          timeout=duration + 300)
    if done.returncode != 0:
        return {"arm": name, "error": done.stderr[-2000:]}
    s = json.loads((out / "summary.json").read_text())
    processed = float(s.get("tokens_processed") or 1)
    return {"arm": name, "goodput": s.get("goodput"), "goodput_solo": s.get("goodput_solo"),
            "final_loss": s.get("final_loss"), "accuracy": (s.get("metrics") or {}).get("accuracy"),
            "tokens_processed": s.get("tokens_processed"), "tokens_merged": s.get("tokens_merged"),
            "fates": {k: round(v / processed, 4) for k, v in (s.get("token_fates") or {}).items()},
            "push_round_trip_seconds": s.get("push_round_trip_seconds"), "round_seconds": s.get("round_seconds"),
            "cpu_wait_seconds": s.get("cpu_wait_seconds"), "advice": s.get("advice")}


def median(runs: list[dict], key: str) -> float | None:
    values = [r[key] for r in runs if r.get(key) is not None]
    return statistics.median(values) if values else None


def table(rows: list[dict]) -> str:
    head = (f"{'arm':<8} {'runs':>4} {'goodput':>8} {'solo':>6} {'merged':>7} {'discarded':>9} {'rtt ms':>7} "
            f"{'round ms':>8} {'loss':>7} {'acc':>6}")
    lines = [head, "-" * len(head)]
    for r in rows:
        def pct(v):
            return "-" if v is None else f"{v:.1%}"

        def num(v, f=".4f"):
            return "-" if v is None else format(v, f)
        lines.append(f"{r['arm']:<8} {r['runs']:>4} {pct(r['goodput']):>8} {pct(r['goodput_solo']):>6} "
                     f"{pct(r['merged']):>7} {pct(r['discarded']):>9} "
                     f"{num(r['rtt'] and r['rtt'] * 1000, '.0f'):>7} {num(r['round'] and r['round'] * 1000, '.0f'):>8} "
                     f"{num(r['final_loss']):>7} {pct(r['accuracy']):>6}")
    return "\n".join(lines)


def parse_args(argv: list[str]):
    p = Parser(description=__doc__, formatter_class=DescriptionFormatter)
    p.add_argument("--arms", nargs="+", choices=sorted(ARMS), default=["default"], help="configurations to run")
    p.add_argument("--runs", type=positive_int, default=3, help="runs of each arm (the table gives medians)")
    p.add_argument("--duration", type=positive_float, default=60.0, help="seconds of training per run")
    p.add_argument("--out", type=output_file, default=ROOT / "bench" / "out" / "small_task_goodput.json",
                   help="the JSON written at the end")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(list(sys.argv[1:] if argv is None else argv))
    work = Path(tempfile.mkdtemp(prefix="islands-small-task-"))
    rows, raw = [], {}
    try:
        for arm in args.arms:
            runs = [run_arm(arm, args.duration, work) for _ in range(args.runs)]
            raw[arm] = runs
            good = [r for r in runs if "error" not in r]
            for r in runs:
                if "error" in r:
                    print(f"{arm}: a run failed:\n{r['error']}", file=sys.stderr)
            rows.append({"arm": arm, "runs": len(good), "goodput": median(good, "goodput"),
                         "goodput_solo": median(good, "goodput_solo"),
                         "merged": statistics.median([r["fates"].get("merged", 0) for r in good]) if good else None,
                         "discarded": statistics.median([r["fates"].get("discarded_at_adoption", 0) for r in good])
                         if good else None,
                         "rtt": median(good, "push_round_trip_seconds"), "round": median(good, "round_seconds"),
                         "final_loss": median(good, "final_loss"), "accuracy": median(good, "accuracy")})
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(table(rows))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"task": TASK, "duration": args.duration, "rows": rows, "runs": raw}, indent=2))
    print(f"\nwrote {args.out}")
    return 0 if all(r["runs"] == args.runs for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
