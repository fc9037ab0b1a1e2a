"""Learner overhead and bytes per token.

1. A learner's inner-step throughput (a real 1-learner cluster: syncer + learner processes,
   pushes every H steps, events written) beside a bare torch loop with the same model,
   batch, data sampler and thread count. Goal: >= 95%.
2. Bytes on the wire per token processed, decoupled vs sync mode, 2 learners each.

Runs alternate (bare, learner, bare, learner, ...) and each figure is the median over
--repeats runs. Prints a table and writes bench/out/trainer_overhead.json.

    python bench/trainer_overhead.py [--steps 200] [--repeats 3] [--mode-seconds 25]
"""
from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from trainer.config import TrainConfig  # noqa: E402
from trainer.data import ShardSampler, load_corpus  # noqa: E402
from trainer.events import read_events  # noqa: E402
from trainer.launch import ClusterSpec, LocalCluster  # noqa: E402
from trainer.runspec import RunSpec  # noqa: E402
from trainer.metrics import summarize  # noqa: E402
from trainer.model import build_model  # noqa: E402
from trainer.sync_state import make_inner_optimizer  # noqa: E402
from trainer.argtypes import Parser, DescriptionFormatter  # noqa: E402
from bench.outputs import output_file  # noqa: E402


def bare_loop(steps: int, threads: int) -> float:
    """Tokens/s of a plain AdamW loop: the ceiling a learner is measured against."""
    torch.set_num_threads(threads)
    cfg = TrainConfig(num_learners=1)
    model = build_model(cfg.model, cfg.seed)
    opt = make_inner_optimizer(model, cfg)
    train, _ = load_corpus("markov").split()
    sampler = ShardSampler(train, 0, 1, cfg.model.block_size, cfg.batch_size, cfg.seed, 1)
    warmup = 5
    for i in range(steps + warmup):
        if i == warmup:
            started = time.perf_counter()
        x, y = sampler.next_batch()
        _, loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        float(loss.detach())
    return steps * cfg.tokens_per_step / (time.perf_counter() - started)


def learner_run(steps: int, threads: int) -> float:
    """Tokens/s of learner-1 in a real cluster, from its inner_step events."""
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        spec = ClusterSpec(run_dir, RunSpec(learners=1).with_learner_flags(
            ["--threads", str(threads), "--max-steps", str(steps + 5)]))
        cluster = LocalCluster(spec)
        cluster.start()
        deadline = time.monotonic() + 600
        while cluster.learners[1].alive() and time.monotonic() < deadline:
            time.sleep(0.2)
        cluster.stop()
        stepped = [e for e in read_events(run_dir) if e["kind"] == "inner_step"]
        if len(stepped) < steps:
            raise RuntimeError(f"the learner made only {len(stepped)} steps; see {run_dir}/logs")
        window = stepped[5:]  # the same warm-up as the bare loop
        return (len(window) - 1) * window[0]["tokens"] / (window[-1]["t"] - window[0]["t"])


def bytes_per_token(mode: str, seconds: float) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        spec = ClusterSpec(run_dir, RunSpec(learners=2, mode=mode))
        cluster = LocalCluster(spec)
        cluster.start()
        time.sleep(seconds)
        cluster.stop()
        s = summarize(read_events(run_dir), 2)
        return {"bytes_per_token": s["bytes_per_token"], "tokens": s["tokens_processed"],
                "bytes": s["bytes_on_wire"]}


def main() -> int:
    parser = Parser(description=__doc__, formatter_class=DescriptionFormatter)
    parser.add_argument("--steps", type=int, default=200,
                        help="inner steps timed per run, of the bare loop and of the learner (after 5 of warm-up)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads of the bare loop and of the learner (its --threads)")
    parser.add_argument("--repeats", type=int, default=3,
                        help="bare and learner runs, alternated; each figure is their median")
    parser.add_argument("--mode-seconds", type=float, default=25.0,
                        help="seconds each 2-learner cluster (decoupled, then sync) trains for the bytes per token")
    parser.add_argument("--out", type=output_file, default=str(ROOT / "bench" / "out" / "trainer_overhead.json"),
                        help="the JSON written: throughputs of every run, their ratio and the bytes per token")
    args = parser.parse_args()

    bare, learner = [], []
    for _ in range(args.repeats):
        bare.append(bare_loop(args.steps, args.threads))
        learner.append(learner_run(args.steps, args.threads))
    modes = {m: bytes_per_token(m, args.mode_seconds) for m in ("decoupled", "sync")}
    result = {
        "steps": args.steps, "threads": args.threads, "repeats": args.repeats,
        "bare_tokens_per_s": statistics.median(bare), "learner_tokens_per_s": statistics.median(learner),
        "bare_runs": bare, "learner_runs": learner,
        "learner_vs_bare": statistics.median(learner) / statistics.median(bare),
        "bytes_per_token": modes,
        "sync_over_decoupled": modes["sync"]["bytes_per_token"] / modes["decoupled"]["bytes_per_token"],
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(f"{'measure':<40} {'value':>14}")
    print(f"{'bare torch loop (tokens/s, median)':<40} {result['bare_tokens_per_s']:>14.0f}")
    print(f"{'learner inner loop (tokens/s, median)':<40} {result['learner_tokens_per_s']:>14.0f}")
    print(f"{'learner / bare (goal >= 0.95)':<40} {result['learner_vs_bare']:>14.3f}")
    for m, v in modes.items():
        print(f"{'bytes per token, ' + m:<40} {v['bytes_per_token']:>14.1f}")
    print(f"{'sync / decoupled bytes per token':<40} {result['sync_over_decoupled']:>14.1f}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
