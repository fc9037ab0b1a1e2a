"""Parity: does decoupled DiLoCo (P=4 fragments, int4 pushes, overlap tau=1) match
synchronous data parallelism on the same data and token budget, with far fewer bytes?

Four arms, each a real local cluster (syncer + learner processes on 127.0.0.1, the
trainer's own `LocalCluster`), all with the same model, seed, data and total tokens
(learners x steps x batch x block):

  sync-dp               --mode sync, N learners, S steps each (the all-reduce baseline)
  single                --mode sync, 1 learner, N*S steps (plain AdamW on one device; the
                        sync protocol still ships its gradients, so it has wire bytes)
  decoupled-p1-fp32     N learners, S steps, --fragments 1 --encoding fp32 (plain DiLoCo)
  decoupled-p4-int4-t1  N learners, S steps, --fragments 4 --encoding int4 --overlap 1

Every learner is started with --max-steps and exits by itself; then the syncer is stopped
(which merges whatever pushes are still pending) and the final global parameters are
evaluated on the corpus's held-out tail (every window of it, not the 8 batches of
`trainer.launch.evaluate`: a 1% goal needs a less noisy estimate). Bytes are the syncer's
byte counters (every frame, both directions: handshakes with the initial parameters,
heartbeats, acks and payloads); `up` is learner -> syncer, `down` syncer -> learner.

Corpora (--corpus, repeatable; default both):
  markov  the trainer's synthetic order-1 Markov source (its entropy rate, the best
          possible loss, is known exactly).
  docs    real English prose: CPython's own documentation topics shipped with every
          CPython (`pydoc_data.topics`: the language reference's help texts, ~0.46 MB),
          concatenated in sorted topic order into bench/out/parity-data/python-docs.txt.
          If a stripped Python lacks pydoc_data, the sorted top-level *.py files of the
          standard library (first 1 MiB) are used instead; the JSON records which, its
          size and sha256. Deterministic for a given Python version.
  PATH    any text file or folder `--data` accepts.

Prints one table per corpus and a verdict on the goal (P=4 int4 within 1% of sync DP's
final loss, with >= 1000x fewer bytes per token), writes bench/out/parity.json and a plot
bench/out/parity.png (training loss vs tokens per arm, bytes per token on a log scale).
The run directories (events, logs, state) stay under bench/out/parity-runs/.

Reading the numbers:
  * Sync DP moves 8 B per parameter per step (fp32 gradient up, fp32 mean down). A
    decoupled learner pushes each fragment once per H steps (int4: 0.5625 B/param) but
    pulls the merged fragment back in fp32 (4 B/param), so the reduction is at most
    ~8H/4.56 ~ 1.75H, less the one-off download of the initial parameters (1/(2S) of sync
    DP's bytes per token) and heartbeats: 1000x needs H of roughly 700 or more. The table
    shows up and down separately; the JSON splits them into push, pull, handshake, control.
  * Decoupled arms depend on timing (which pushes meet in which merge), so their losses
    vary from run to run by about a percent; sync DP and single do not.
  * The line "merge weight applied per fragment after the first learner left" shows how
    far the final residual pushes moved the global parameters (1 = one round's mean); see
    `end_merge_weights`.

    python bench/parity.py [--quick] [--learners N] [--steps S] [--sync-every H]
                           [--corpus markov --corpus docs] [-- TRAINER FLAGS...]

Trainer flags after `--` (e.g. `-- --inner-lr 2e-3 --outer-lr 0.5`) go to every arm after
the script's defaults (MODEL_FLAGS, SYNCER_FLAGS below), so they override them; the flags
that define the arms (--mode, --fragments, --encoding, --overlap, --sync-every) are refused.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import platform
import shutil
import sys
import sysconfig
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

OUT_DIR = ROOT / "bench" / "out"
LOSS_GOAL = 0.01        # P=4 int4 final loss at most 1% above sync DP's
REDUCTION_GOAL = 1000.0  # ... with at least 1000x fewer bytes per token
SYNC = "sync-dp"
TARGET = "decoupled-p4-int4-t1"
# A small model (as in the chaos and property suites): two shared cores must train 4 arms
# x 2 corpora x millions of tokens in ~10 minutes. Bytes per token scale with the
# parameter count in every arm alike, so the ratios do not depend on the size.
MODEL_FLAGS = ["--n-layer", "1", "--n-embd", "32", "--n-head", "2", "--batch-size", "8"]
# Syncer settings of both decoupled arms (sync mode ignores them), chosen by measurement:
# - outer SGD with lr 1 and no momentum, i.e. plain averaging of the learners' progress.
#   With only S/H ~ 4 outer rounds the trainer's default Nesterov step (lr 0.7, momentum
#   0.9) overshoots: the momentum keeps pushing along the first, large round's direction
#   after the learners have converged, and every partial merge applies it once more.
# - a grace of 5 s instead of 0.5 s: a round of H=800 steps takes 10-20 s here, and two
#   learners sharing two busy cores drift apart by more than 0.5 s, so with the default
#   grace the first staggered fragment pushes merged alone and the learners stayed out of
#   phase (solo merges at half weight). Sync DP waits for every learner at every step.
# `-- --outer-lr 0.7 --outer-momentum 0.9 --grace 0.5` restores the trainer's defaults.
SYNCER_FLAGS = ["--outer-lr", "1.0", "--outer-momentum", "0", "--grace", "5"]
ARM_FLAGS = {"--mode", "--fragments", "-P", "--encoding", "--pull-encoding", "--overlap", "--sync-every", "-H"}
OWN_FLAGS = ARM_FLAGS | {"--seed"}  # --seed is this script's (--repeats runs seed, seed+1, ...)
# N=2: with N=4 on two cores the same token budget gives each learner half the steps, so
# S/H halves and the one-off download of the initial parameters (4 B/param per learner)
# alone costs 1/(2S) of sync DP's bytes per token: H=800 could no longer reach 1000x.
DEFAULTS = {"learners": 2, "steps": 3000, "sync_every": 800}
QUICK = {"learners": 2, "steps": 240, "sync_every": 80}


# --------------------------------------------------------------------------- arms
@dataclass(frozen=True)
class Arm:
    name: str
    mode: str
    learners: int
    steps: int              # per learner
    flags: tuple[str, ...]  # trainer flags that define the arm


# Issue 7's bytes-per-token set, run only when named in --arms: plain DiLoCo at H=50,
# decoupled at H=100 with int8 pushes, and streaming with bf16 pulls as well.
EXTRA_ARMS = ("diloco-h50-fp32", "decoupled-h100-int8", "streaming-p4-int4-bf16")


def build_arms(learners: int, steps: int, sync_every: int, extra: bool = False) -> list[Arm]:
    """The four arms with one token budget: learners x steps inner steps of one batch
    (and with `extra` the EXTRA_ARMS, on the same budget)."""
    if sync_every % 4:
        raise ValueError(f"--sync-every: {sync_every} must be divisible by 4 (P=4 fragments)")
    if sync_every // 4 <= 1:
        raise ValueError(f"--sync-every: {sync_every} leaves H/P <= 1, so overlap 1 is impossible")
    h = ("--sync-every", str(sync_every))
    return [
        Arm(SYNC, "sync", learners, steps, ("--mode", "sync")),
        Arm("single", "sync", 1, learners * steps, ("--mode", "sync")),
        Arm("decoupled-p1-fp32", "decoupled", learners, steps,
            ("--mode", "decoupled", *h, "--fragments", "1", "--encoding", "fp32", "--overlap", "0")),
        Arm(TARGET, "decoupled", learners, steps,
            ("--mode", "decoupled", *h, "--fragments", "4", "--encoding", "int4", "--overlap", "1")),
    ] + ([
        Arm(EXTRA_ARMS[0], "decoupled", learners, steps,
            ("--mode", "decoupled", "--sync-every", "50", "--fragments", "1", "--encoding", "fp32", "--overlap", "0")),
        Arm(EXTRA_ARMS[1], "decoupled", learners, steps,
            ("--mode", "decoupled", "--sync-every", "100", "--fragments", "1", "--encoding", "int8", "--overlap", "0")),
        Arm(EXTRA_ARMS[2], "decoupled", learners, steps,
            ("--mode", "decoupled", *h, "--fragments", "4", "--encoding", "int4", "--overlap", "1",
             "--pull-encoding", "bf16")),
    ] if extra else [])


def check_passthrough(flags: list[str]) -> None:
    """The arm-defining flags and --seed belong to this script; the rest is the trainer's to judge."""
    bad = sorted({f.split("=", 1)[0] for f in flags} & OWN_FLAGS)
    if bad:
        raise ValueError(f"trainer flags {', '.join(bad)} define the arms or seeds; use this script's own options")


# --------------------------------------------------------------------------- pure accounting
def wire_accounting(events: Iterable[dict]) -> dict:
    """Bytes on the wire of one run, split by direction and by what they carried.

    Totals come from the syncer's counters in its `final_state` event (every frame it read
    or answered): bytes_in is up (learner -> syncer), bytes_out is down. The payload
    shares come from the learners' own events: `push` (decoupled up), `pull` (decoupled
    down), `connect` (the WELCOME with the initial state, down) and, in sync mode, the
    MEAN each `inner_step` received (down). What is left of each direction is control
    traffic (heartbeats, acks, hellos) and, in sync mode, the GRAD frames (up).
    """
    up = down = 0
    push = pull = welcome = mean = 0
    pushes = pulls = 0
    for e in events:
        kind = e["kind"]
        if kind == "final_state":
            counters = e.get("counters", {})
            up, down = int(counters.get("bytes_in", 0)), int(counters.get("bytes_out", 0))
        elif kind == "push":
            push += int(e.get("wire_bytes", 0))
            pushes += 1
        elif kind == "pull":
            pull += int(e.get("wire_bytes", 0))
            pulls += 1
        elif kind == "connect":
            welcome += int(e.get("wire_bytes", 0))
        elif kind == "inner_step":
            mean += int(e.get("wire_bytes", 0))
    return {"bytes": up + down, "up": up, "down": down, "push_up": push, "pull_down": pull,
            "welcome_down": welcome, "mean_down": mean, "other_up": up - push,
            "other_down": down - pull - welcome - mean, "pushes": pushes, "pulls": pulls}


def end_merge_weights(events: Iterable[dict]) -> dict[int, float]:
    """Per fragment, the summed merge weight of the merges made once a learner had left.

    A learner that reaches --max-steps pushes its residual progress and says BYE; the
    syncer then counts only the learners still live, so each residual can merge alone at
    up to its full weight (steps/H), and the residuals of successive leavers add up
    instead of being averaged. A sum above 1 means the final global parameters moved
    further than any one learner's residual progress. Empty for sync mode.
    """
    events = sorted(events, key=lambda e: e["t"])
    first_leave = next((e["t"] for e in events if e["kind"] == "leave"), None)
    if first_leave is None:
        return {}
    out: dict[int, float] = {}
    for e in events:
        if e["kind"] == "merge" and e["t"] >= first_leave:
            f = int(e["fragment"])
            out[f] = round(out.get(f, 0.0) + sum(float(c["weight"]) for c in e["contributors"]), 4)
    return dict(sorted(out.items()))


def tokens_processed(events: Iterable[dict]) -> int:
    return sum(int(e["tokens"]) for e in events if e["kind"] == "inner_step")


def loss_curve(events: Iterable[dict], buckets: int = 40) -> list[tuple[float, float]]:
    """Training loss vs tokens processed by all learners together, in `buckets` equal
    token buckets: (bucket midpoint in tokens, mean loss of the steps that ended in it).

    The x axis is the shared token budget, so arms with different learner counts line
    up; averaging within a bucket averages over learners. Empty buckets are left out,
    and non-finite losses (a diverged learner) are kept: they show as gaps in the plot.
    """
    steps = sorted((e for e in events if e["kind"] == "inner_step"), key=lambda e: e["t"])
    total = sum(int(e["tokens"]) for e in steps)
    if not steps or buckets < 1:
        return []
    width = total / buckets
    sums = [0.0] * buckets
    counts = [0] * buckets
    seen = 0
    for e in steps:
        seen += int(e["tokens"])
        b = min(buckets - 1, max(0, math.ceil(seen / width) - 1))
        sums[b] += float(e["loss"])
        counts[b] += 1
    return [((b + 0.5) * width, sums[b] / counts[b]) for b in range(buckets) if counts[b]]


def verdict(rows: dict[str, dict], loss_goal: float = LOSS_GOAL, reduction_goal: float = REDUCTION_GOAL) -> dict:
    """The goal, for one corpus: TARGET's loss at most `loss_goal` above sync DP's (a
    lower loss passes) and sync DP's bytes per token at least `reduction_goal` x TARGET's."""
    base, target = rows[SYNC], rows[TARGET]
    gap = target["final_loss"] / base["final_loss"] - 1.0
    reduction = base["bytes_per_token"] / target["bytes_per_token"] if target["bytes_per_token"] else math.inf
    loss_ok, reduction_ok = gap <= loss_goal, reduction >= reduction_goal
    return {"loss_gap": gap, "loss_ok": loss_ok, "reduction": reduction, "reduction_ok": reduction_ok,
            "met": loss_ok and reduction_ok}


def combine_seeds(runs: list[dict]) -> dict:
    """One row from the runs of one arm with different seeds: the mean final loss and
    bytes per token (the verdict's figures), each seed's loss, and the first run's curve.

    Why repeats: a run's final loss is one point of a noisy constant-learning-rate
    trajectory, and decoupled and sync DP runs also depend on timing (which pushes meet
    in a merge; the rounds a late-starting learner misses), so one seed can be off by a
    few percent on real text, more than the 1% goal.
    """
    row = dict(runs[0])
    losses = [r["final_loss"] for r in runs]
    row["final_losses"] = losses
    row["seeds"] = [r["seed"] for r in runs]
    row["final_loss"] = sum(losses) / len(losses)
    row["bytes_per_token"] = sum(r["bytes_per_token"] for r in runs) / len(runs)
    row["wire"] = {k: sum(r["wire"][k] for r in runs) / len(runs) for k in runs[0]["wire"]}
    row["wall_seconds"] = sum(r["wall_seconds"] for r in runs) / len(runs)
    row["per_seed"] = [{k: r[k] for k in ("seed", "final_loss", "bytes_per_token", "end_merge_weights", "merges",
                                          "sync_rounds", "run_dir")} for r in runs]
    return row


def add_comparisons(rows: dict[str, dict]) -> None:
    """Each arm's loss gap and byte reduction relative to sync DP, in place."""
    base = rows[SYNC]
    for row in rows.values():
        row["gap_vs_sync"] = row["final_loss"] / base["final_loss"] - 1.0
        bpt = row["bytes_per_token"]
        row["reduction_vs_sync"] = base["bytes_per_token"] / bpt if bpt else math.inf


def _bytes(n: float) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n:.0f} B"


def format_table(rows: dict[str, dict]) -> str:
    """One line per arm: loss, gap and bytes relative to sync DP (add_comparisons first)."""
    head = (f"{'arm':<22} {'N':>2} {'steps':>6} {'tokens':>9} {'loss':>7} {'vs sync':>8} {'wire':>10} "
            f"{'B/token':>9} {'up B/t':>8} {'down B/t':>9} {'vs sync':>9} {'wall s':>7}")
    lines = [head, "-" * len(head)]
    for name, r in rows.items():
        tok = r["tokens"]
        lines.append(
            f"{name:<22} {r['learners']:>2} {r['steps']:>6} {tok / 1e6:>8.2f}M {r['final_loss']:>7.4f} "
            f"{r['gap_vs_sync'] * 100:>+7.2f}% {_bytes(r['wire']['bytes']):>10} {r['bytes_per_token']:>9.3f} "
            f"{r['wire']['up'] / tok:>8.3f} {r['wire']['down'] / tok:>9.3f} "
            f"{r['reduction_vs_sync']:>8.1f}x {r['wall_seconds']:>7.1f}")
    return "\n".join(lines)


def format_verdict(v: dict) -> str:
    return (f"P=4 int4 within {LOSS_GOAL:.0%} of sync DP: {'yes' if v['loss_ok'] else 'no'} "
            f"(gap {v['loss_gap'] * 100:+.2f}%); >= {REDUCTION_GOAL:.0f}x fewer bytes/token: "
            f"{'yes' if v['reduction_ok'] else 'no'} ({v['reduction']:.0f}x)")


# --------------------------------------------------------------------------- corpora
def python_docs_corpus(dest_dir: Path) -> tuple[Path, str]:
    """Real text available offline wherever Python is: see the module docstring."""
    dest_dir.mkdir(parents=True, exist_ok=True)
    try:
        from pydoc_data.topics import topics
        text = "\n\n".join(topics[k] for k in sorted(topics)).encode("utf-8")
        source = f"pydoc_data.topics (CPython {platform.python_version()} documentation topics)"
    except ImportError:
        stdlib = Path(sysconfig.get_paths()["stdlib"])
        text = b"\n".join(p.read_bytes() for p in sorted(stdlib.glob("*.py")))[: 1 << 20]
        source = f"{stdlib}/*.py, sorted, first 1 MiB (CPython {platform.python_version()})"
    path = dest_dir / "python-docs.txt"
    if not path.exists() or path.read_bytes() != text:
        path.write_bytes(text)
    return path, source


def resolve_corpus(label: str, data_dir: Path) -> tuple[str, str]:
    """(the --data spec for learners, a description)."""
    if label == "markov" or label.startswith("markov:"):
        return label, "synthetic Markov source"
    if label == "docs":
        path, source = python_docs_corpus(data_dir)
        return str(path), source
    return str(Path(label).resolve()), "user text"


# --------------------------------------------------------------------------- running an arm
def arm_configs(arm: Arm, flags: list[str]):
    """The trainer's own parser turns the arm's flags into its TrainConfig and the syncer argv,
    so the evaluation builds exactly the model the cluster trained."""
    from trainer.cli_args import add_common_args, add_syncer_args, add_train_args, forward_flags, train_config
    parser = argparse.ArgumentParser(prog=f"parity arm {arm.name}")
    add_common_args(parser)
    add_train_args(parser)
    add_syncer_args(parser)
    args = parser.parse_args([*flags, *arm.flags])
    return train_config(args, parser, arm.learners), forward_flags(args)


def held_out_loss(params: dict, train, corpus, max_windows: int = 4096) -> float:
    """Token-weighted cross-entropy (nats/byte) over every window of the held-out tail
    (up to `max_windows`), with the trainer's own deterministic windows."""
    import torch

    from trainer.data import evaluation_batches
    from trainer.model import build_model
    model = build_model(train.model, train.seed)
    model.load_state_dict(params)
    model.eval()
    _, val = corpus.split()
    total = weight = 0.0
    batches = math.ceil(max_windows / train.batch_size)
    with torch.no_grad():
        for x, y in evaluation_batches(val, train.model.block_size, train.batch_size, max_batches=batches):
            total += float(model(x, y)[1]) * x.numel()
            weight += x.numel()
    return total / weight


def run_arm(arm: Arm, data: str, corpus, flags: list[str], run_dir: Path, timeout: float) -> dict:
    """Train one arm to its step budget and measure it; raises with the logs on failure."""
    from trainer.events import read_events
    from trainer.launch import ClusterSpec, LocalCluster, final_parameters, learner_logs_tail
    from trainer.runspec import RunSpec
    from trainer.metrics import summarize

    train, syncer_flags = arm_configs(arm, flags)
    if run_dir.exists():
        shutil.rmtree(run_dir)  # a syncer resumes from an existing state dir: always start fresh
    run = RunSpec(learners=arm.learners, mode=arm.mode, data=data, trainer_args=syncer_flags)
    spec = ClusterSpec(run_dir, run.with_learner_flags(["--max-steps", str(arm.steps)]))
    cluster = LocalCluster(spec)
    started = time.monotonic()
    try:
        cluster.start()
        deadline = started + timeout
        while any(p.alive() for p in cluster.learners.values()):
            if time.monotonic() > deadline:
                alive = [p.name for p in cluster.learners.values() if p.alive()]
                raise TimeoutError(f"{arm.name}: {', '.join(alive)} still training after {timeout:.0f}s "
                                   f"(raise --arm-timeout?); see {run_dir}/logs")
            time.sleep(0.2)
        failed = {p.name: p.popen.returncode for p in cluster.learners.values() if p.popen.returncode != 0}
        if failed:
            raise RuntimeError(f"{arm.name}: learners exited with {failed}:\n{learner_logs_tail(run_dir)}")
    except BaseException:
        cluster.kill()
        cluster.stop()
        raise
    cluster.stop()
    elapsed = time.monotonic() - started
    events = read_events(run_dir)
    summary = summarize(events, arm.learners)
    tokens = tokens_processed(events)
    expected = arm.learners * arm.steps * train.tokens_per_step
    if tokens != expected:
        raise RuntimeError(f"{arm.name}: processed {tokens} tokens, expected {expected}; see {run_dir}")
    wire = wire_accounting(events)
    loss = held_out_loss(final_parameters(run_dir, train), train, corpus)
    return {"arm": arm.name, "mode": arm.mode, "learners": arm.learners, "steps": arm.steps, "seed": train.seed,
            "flags": [*flags, *arm.flags], "tokens": tokens, "final_loss": loss,
            "wire": wire, "bytes_per_token": wire["bytes"] / tokens,
            "wall_seconds": summary["wall_seconds"], "elapsed_seconds": round(elapsed, 2),
            "train_loss_recent": summary.get("train_loss_recent"), "merges": summary["merges"],
            "sync_rounds": summary["sync_rounds"], "heartbeats_lost": summary["heartbeats_lost"],
            "dropped_stale": summary["dropped_stale"], "end_merge_weights": end_merge_weights(events),
            "curve": loss_curve(events),
            "run_dir": str(run_dir)}


# --------------------------------------------------------------------------- plot
def plot(results: dict[str, dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(results), 2, figsize=(13, 4.2 * len(results)), squeeze=False,
                             gridspec_kw={"width_ratios": [3, 2]})
    for (label, res), (ax_loss, ax_bytes) in zip(results.items(), axes):
        rows = res["arms"]
        for name, r in rows.items():
            xs, ys = zip(*r["curve"]) if r["curve"] else ((), ())
            ax_loss.plot([x / 1e6 for x in xs], ys, label=f"{name} (held-out {r['final_loss']:.3f})")
        if res.get("loss_floor"):
            ax_loss.axhline(res["loss_floor"], color="grey", ls=":", label="entropy rate (floor)")
        ax_loss.set(title=f"{label}: training loss (mean over learners)", xlabel="tokens processed (millions)",
                    ylabel="nats/byte")
        finals = [r["final_loss"] for r in rows.values()]
        ax_loss.set_ylim(min(finals + [res.get("loss_floor") or min(finals)]) * 0.97, max(finals) * 1.6)
        ax_loss.legend(fontsize=8)
        names = list(rows)
        bpt = [rows[n]["bytes_per_token"] for n in names]
        bars = ax_bytes.bar(range(len(names)), bpt, color=[f"C{i}" for i in range(len(names))])
        ax_bytes.set_yscale("log")
        ax_bytes.set_xticks(range(len(names)), [n.replace("decoupled-", "dec-") for n in names], rotation=15,
                            fontsize=8)
        for b, n in zip(bars, names):
            ax_bytes.annotate(f"{rows[n]['bytes_per_token']:.3g}\n({rows[n]['reduction_vs_sync']:.0f}x)",
                              (b.get_x() + b.get_width() / 2, b.get_height()), ha="center", va="bottom", fontsize=7)
        ax_bytes.set_ylim(min(bpt) / 2, max(bpt) * 8)  # room for the labels above the bars
        ax_bytes.set(title=f"{label}: bytes on the wire per token (log)", ylabel="bytes/token")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


# --------------------------------------------------------------------------- main
def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    own, passthrough = (argv[: argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help=f"a smoke run: {QUICK['learners']} learners, {QUICK['steps']} steps, "
                             f"H={QUICK['sync_every']} (unless given)")
    parser.add_argument("--learners", "-N", type=int, help=f"N (default {DEFAULTS['learners']})")
    parser.add_argument("--steps", "-S", type=int, help=f"inner steps per learner (default {DEFAULTS['steps']})")
    parser.add_argument("--sync-every", "-H", type=int,
                        help=f"H of both decoupled arms, divisible by 4 (default {DEFAULTS['sync_every']})")
    parser.add_argument("--corpus", action="append", help="markov | docs | PATH; repeatable (default: markov, docs)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the model and the data sampling")
    parser.add_argument("--repeats", type=int, default=1,
                        help="runs per arm with seeds SEED, SEED+1, ...; the table shows mean losses")
    parser.add_argument("--arms", help="comma-separated subset of the arms (sync-dp is always run)")
    parser.add_argument("--arm-timeout", type=float, default=600.0, help="seconds one arm may train")
    parser.add_argument("--out", default=str(OUT_DIR / "parity.json"), help="JSON path; the plot goes beside it")
    parser.add_argument("--runs-dir", default=str(OUT_DIR / "parity-runs"))
    args = parser.parse_args(own)
    preset = QUICK if args.quick else DEFAULTS
    for key, value in preset.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.learners < 1 or args.steps < 1 or args.repeats < 1:
        parser.error("--learners, --steps and --repeats must be >= 1")
    try:
        check_passthrough(passthrough)
        arms = build_arms(args.learners, args.steps, args.sync_every, extra=True)
    except ValueError as exc:
        parser.error(str(exc))
    unknown = sorted(set((args.arms or "").split(",")) - {a.name for a in arms} - {""})
    if unknown:
        parser.error(f"--arms: unknown arm {unknown[0]!r} (known: {', '.join(a.name for a in arms)})")
    for arm in arms:  # bad trainer flags fail here, before any cluster starts
        arm_configs(arm, [*MODEL_FLAGS, *SYNCER_FLAGS, *passthrough])
    return args, passthrough


def main(argv: list[str] | None = None) -> int:
    args, passthrough = parse_args(sys.argv[1:] if argv is None else argv)
    from trainer.data import load_corpus

    flags = [*MODEL_FLAGS, *SYNCER_FLAGS, *passthrough]
    seeds = [args.seed + i for i in range(args.repeats)]
    arms = build_arms(args.learners, args.steps, args.sync_every, extra=bool(args.arms))
    if args.arms:
        wanted = set(args.arms.split(",")) | {SYNC}
        arms = [a for a in arms if a.name in wanted]
    out = Path(args.out)
    runs = Path(args.runs_dir)
    results: dict[str, dict] = {}
    began = time.monotonic()
    print(f"parity: N={args.learners} learners, S={args.steps} steps each, H={args.sync_every}, "
          f"seeds {', '.join(map(str, seeds))}, trainer flags: {' '.join(flags)}", flush=True)
    for label in args.corpus or ["markov", "docs"]:
        data, source = resolve_corpus(label, out.parent / "parity-data")
        corpus = load_corpus(data)
        info = {"data": data, "source": source, "name": corpus.name, "bytes": int(len(corpus.data)),
                "sha256": hashlib.sha256(corpus.data.tobytes()).hexdigest(),
                "loss_floor": corpus.entropy_rate, "unigram_entropy": corpus.unigram_entropy}
        rows: dict[str, dict] = {}
        safe = "".join(c if c.isalnum() else "_" for c in label)[:40]
        for arm in arms:
            done = []
            for seed in seeds:
                print(f"  {label}: {arm.name} ({arm.learners} x {arm.steps} steps, seed {seed}) ...", end="", flush=True)
                run_dir = runs / safe / arm.name / f"seed-{seed}"
                done.append(run_arm(arm, data, corpus, [*flags, "--seed", str(seed)], run_dir, args.arm_timeout))
                print(f" loss {done[-1]['final_loss']:.4f}, {done[-1]['elapsed_seconds']:.0f} s", flush=True)
            rows[arm.name] = combine_seeds(done)
        add_comparisons(rows)
        results[label] = {**info, "arms": rows, "verdict": verdict(rows) if TARGET in rows else None}
    print()
    for label, res in results.items():
        floor = f"{res['loss_floor']:.4f}" if res["loss_floor"] is not None else "unknown (real text)"
        print(f"{label}: {res['name']} ({res['bytes'] / 1e6:.2f} MB; {res['source']}); "
              f"loss floor {floor}, unigram entropy {res['unigram_entropy']:.4f}")
        print(format_table(res["arms"]))
        if len(seeds) > 1:
            print("final loss per seed: " + "; ".join(
                f"{n}: " + ", ".join(f"{v:.4f}" for v in r["final_losses"]) for n, r in res["arms"].items()))
        if res["verdict"]:
            print(format_verdict(res["verdict"]))
        ends = {n: r["end_merge_weights"] for n, r in res["arms"].items() if r["end_merge_weights"]}
        if ends:
            print("merge weight applied per fragment after the first learner left (1 = one round's mean): "
                  + "; ".join(f"{n}: " + ", ".join(f"{w:.2f}" for w in ws.values()) for n, ws in ends.items()))
        print()
    total = time.monotonic() - began
    plot_path = out.with_suffix(".png")
    plot(results, plot_path)
    config = {"learners": args.learners, "steps": args.steps, "sync_every": args.sync_every, "seeds": seeds,
              "trainer_flags": flags, "arms": [asdict(a) for a in arms], "quick": args.quick,
              "loss_goal": LOSS_GOAL, "reduction_goal": REDUCTION_GOAL}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"machine": platform.platform(), "python": platform.python_version(),
                               "seconds": round(total, 1), "config": config, "corpora": results}, indent=2))
    print(f"{total:.0f} s in all; wrote {out} and {plot_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
