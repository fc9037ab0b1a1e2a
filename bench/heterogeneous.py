"""Heterogeneous learners: does a slow learner slow the fast ones?

Two learners on this machine; learner-2 runs at --speed 0.25 (4x slower). For each mode
(decoupled, sync) the fast learner's median step time is measured with an even peer and
with the slow one, in alternating runs, and the change is reported both ways. The slow
peer spins by default (`--slowdown spin`) so that it occupies its core as a real slower
chip would; `--slowdown sleep` frees the CPU instead and shows how much of any change is
CPU sharing on one machine rather than coupling.

Goal (issue 6): decoupled, the fast learner's step rate is unchanged within 10%.
Prints a table and writes bench/out/heterogeneous.json.

    python bench/heterogeneous.py [--repeats 3] [--steps 150] [--slowdown spin]
"""
from __future__ import annotations

import json
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from trainer.events import read_events  # noqa: E402
from trainer.launch import ClusterSpec, LocalCluster  # noqa: E402
from trainer.runspec import RunSpec  # noqa: E402
from trainer.argtypes import Parser, DescriptionFormatter  # noqa: E402
from bench.outputs import output_file  # noqa: E402

FAST = ["--n-layer", "1", "--n-embd", "32", "--n-head", "2", "--batch-size", "8", "--sync-every", "10"]
WARMUP = 20
RUN_TIMEOUT = 300.0


def _steps(events: list[dict], learner: int) -> list[float]:
    return [e["t"] for e in events if e["kind"] == "inner_step" and e["learner"] == learner]


def run(mode: str, slow_speed: float, slowdown: str, steps: int) -> tuple[float, float]:
    """Median step seconds of (learner-1, learner-2) while both train."""
    import time
    with tempfile.TemporaryDirectory(prefix="islands-hetero-") as tmp:
        run_dir = Path(tmp)
        run = RunSpec(learners=2, mode=mode, trainer_args=FAST).with_learner_flags(["--slowdown", slowdown])
        cluster = LocalCluster(ClusterSpec(run_dir, run, speeds={2: slow_speed}))
        try:
            cluster.start()
            deadline = time.monotonic() + RUN_TIMEOUT
            while len(_steps(read_events(run_dir), 1)) < WARMUP + steps:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{mode}: learner-1 did not make {WARMUP + steps} steps in {RUN_TIMEOUT:.0f}s")
                time.sleep(0.5)
        finally:
            cluster.stop()
        events = read_events(run_dir)
    fast, slow = _steps(events, 1), _steps(events, 2)
    end = min(fast[WARMUP + steps - 1], slow[-1])
    out = []
    for times in (fast, slow):
        window = [t for t in times if fast[WARMUP] <= t <= end]
        out.append(statistics.median(b - a for a, b in zip(window, window[1:])) if len(window) > 2 else float("nan"))
    return out[0], out[1]


def main() -> int:
    ap = Parser(description=__doc__, formatter_class=DescriptionFormatter)
    ap.add_argument("--repeats", type=int, default=3,
                    help="runs per mode with an even peer and with the slow one, alternated; the medians are reported")
    ap.add_argument("--steps", type=int, default=150, help="measured steps of the fast learner per run")
    ap.add_argument("--slowdown", choices=("spin", "sleep"), default="spin",
                    help="how the slow learner (speed 0.25) waits out its extra time: spin keeps its core busy "
                         "like a slower chip, sleep frees the CPU")
    ap.add_argument("--out", type=output_file, default=str(ROOT / "bench" / "out" / "heterogeneous.json"),
                    help="the JSON written: the table's rows and the goal's verdict")
    args = ap.parse_args()
    if args.repeats < 1 or args.steps < 20:
        ap.error("--repeats must be >= 1 and --steps >= 20")

    rows = []
    for mode in ("decoupled", "sync"):
        even, uneven, slow = [], [], []
        for _ in range(args.repeats):  # alternate, so that drifts in machine load hit both alike
            even.append(run(mode, 1.0, args.slowdown, args.steps)[0])
            fast_s, slow_s = run(mode, 0.25, args.slowdown, args.steps)
            uneven.append(fast_s)
            slow.append(slow_s)
        e, u, s = statistics.median(even), statistics.median(uneven), statistics.median(slow)
        rows.append({"mode": mode, "fast_even_ms": round(e * 1e3, 3), "fast_with_slow_peer_ms": round(u * 1e3, 3),
                     "slow_peer_ms": round(s * 1e3, 3), "change": round(u / e - 1, 4),
                     "runs_even_ms": [round(x * 1e3, 3) for x in even],
                     "runs_with_slow_peer_ms": [round(x * 1e3, 3) for x in uneven]})

    print(f"\nfast learner's median step time, 2 learners, learner-2 at speed 0.25 ({args.slowdown}), "
          f"median of {args.repeats} runs")
    print(f"{'mode':<10} {'even peer':>10} {'slow peer':>10} {'change':>8} {'slow learner':>13}")
    for r in rows:
        print(f"{r['mode']:<10} {r['fast_even_ms']:>8.2f}ms {r['fast_with_slow_peer_ms']:>8.2f}ms "
              f"{r['change']:>+8.1%} {r['slow_peer_ms']:>11.2f}ms")
    decoupled = rows[0]
    verdict = abs(decoupled["change"]) <= 0.10
    print(f"\ngoal: decoupled fast learner unchanged within 10%: {'yes' if verdict else 'no'} "
          f"({decoupled['change']:+.1%})")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"slowdown": args.slowdown, "repeats": args.repeats, "steps": args.steps,
                               "rows": rows, "goal_met": verdict}, indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
