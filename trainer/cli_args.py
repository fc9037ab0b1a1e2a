"""Command-line flags shared by `syncer`, `learner` and `run`, and their conversion to configs.

Every flag is validated by the config dataclasses; a bad value becomes an argparse error
that names the flag, and the process exits 2 before starting anything.
"""
from __future__ import annotations

import argparse

from .codec import ENCODINGS
from .fragments import FRAGMENT_LAYOUTS
from .config import ADOPT_MODES, GRACE_POLICIES, MODES, MOMENTUM_UNITS, PULL_ENCODINGS, SyncerConfig, TrainConfig
from .outer import STALENESS_POLICIES
from .model import ModelConfig
from .device import PRECISIONS
from .task import TaskError, resolve_spec
from .argtypes import device_arg, non_negative_float, non_negative_int, on_off, positive_float, positive_int, rounds_or_auto  # noqa: F401 (re-exported)


def add_common_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--mode", choices=MODES, default="decoupled",
                   help="decoupled DiLoCo, or the synchronous data-parallel baseline (default: decoupled)")
    p.add_argument("--secret-file", help="file holding the run's secret, from which every learner's key is "
                                         "derived (keys.py): the syncer's; a learner given it derives its own key "
                                         "but could derive any, so give a learner --key-file instead "
                                         "(default: $ISLANDS_SECRET_FILE, else $ISLANDS_SECRET)")


def add_train_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("training (decided by the syncer, sent to learners)")
    g.add_argument("--task", default=TrainConfig.task, metavar="TASK",
                   help="what to train: FILE.py:NAME or MODULE:NAME, an object (or a zero-argument callable "
                        "returning one) with model(), batches(shard, shards, seed), loss(model, batch), "
                        "tokens(batch) and eval_batches() (README, 'Your own model'); default: gpt, the "
                        "built-in byte-level GPT on --data, shaped by the model flags below")
    g.add_argument("--precision", choices=PRECISIONS, default=TrainConfig.precision,
                   help="inner steps in fp32, or under bf16 autocast (default fp32)")
    g.add_argument("--seed", type=int, default=0, help="seeds Θ₀, the data shards' order and every learner's batches")
    g.add_argument("--n-layer", type=positive_int, default=ModelConfig.n_layer,
                   help="transformer blocks of the built-in gpt task")
    g.add_argument("--n-head", type=positive_int, default=ModelConfig.n_head,
                   help="attention heads per block of the built-in gpt task (must divide --n-embd)")
    g.add_argument("--n-embd", type=positive_int, default=ModelConfig.n_embd,
                   help="width of the built-in gpt task's embeddings and blocks")
    g.add_argument("--block-size", type=positive_int, default=ModelConfig.block_size,
                   help="context length of the built-in gpt task, in bytes")
    g.add_argument("--batch-size", type=positive_int, default=TrainConfig.batch_size,
                   help="sequences per inner step of each rank (built-in gpt task)")
    g.add_argument("--inner-lr", type=positive_float, default=TrainConfig.inner_lr,
                   help="the learners' inner AdamW learning rate (a task's own inner optimizer keeps its own)")
    g.add_argument("--inner-warmup", type=non_negative_int, default=TrainConfig.inner_warmup, metavar="STEPS",
                   help="AdamW steps over which the inner LR ramps up linearly (0: none)")
    g.add_argument("--inner-decay", type=non_negative_int, default=TrainConfig.inner_decay, metavar="STEPS",
                   help="inner steps (of a learner's data position; sync rounds in sync mode) over which the inner "
                        "LR decays along a cosine to a tenth of --inner-lr (0: constant, the default)")
    g.add_argument("--sync-every", "-H", type=positive_int, default=TrainConfig.sync_every,
                   help="H: inner steps between two exchanges of a fragment")
    g.add_argument("--fragments", "-P", type=positive_int, default=TrainConfig.fragments,
                   help="P: parameter fragments synced on staggered schedules (Streaming DiLoCo); 1 is plain DiLoCo")
    g.add_argument("--fragment-layout", choices=FRAGMENT_LAYOUTS, default=TrainConfig.fragment_layout,
                   help="balanced: fragments of equal parameter counts; strided: layer i in fragment i mod P, as in "
                        "Streaming DiLoCo (needs at least P numbered layers) (default balanced)")
    g.add_argument("--overlap", type=non_negative_int, default=TrainConfig.overlap, help="τ: inner steps between a fragment's push and adopting its merge (Streaming DiLoCo's overlap)")
    g.add_argument("--alpha", type=float, default=TrainConfig.alpha, help="α of --adopt mix: θ ← α·θ + (1−α)·Θ on adoption (0: the global version alone)")
    g.add_argument("--adopt", choices=ADOPT_MODES, default=None,
                   help="how a learner adopts a merged fragment: rebase (θ ← Θ + the steps made since the push, "
                        "which the next push then carries; nothing is thrown away) or mix (θ ← α·θ + (1−α)·Θ; "
                        "with α = 0 the steps made since the push are thrown away) (default rebase; mix when "
                        "--alpha is not 0)")
    g.add_argument("--encoding", choices=ENCODINGS, default=TrainConfig.encoding,
                   help="pseudo-gradients pushed to the syncer (default fp32)")
    g.add_argument("--pull-encoding", choices=PULL_ENCODINGS, default=TrainConfig.pull_encoding,
                   help="merged fragments pulled from the syncer (default fp32; bf16 halves the download)")
    g.add_argument("--push-window", type=positive_int, default=TrainConfig.push_window,
                   help="pushes of one fragment a learner may have sent before it adopts the merge holding the "
                        "first; a due push waits (the learner keeps training) until then (default 1: every push "
                        "is measured from a global version its learner adopted)")
    g.add_argument("--final-round", type=on_off, default=TrainConfig.final_round, metavar="on|off",
                   help="on: a learner's clean stop pushes every fragment as its last, and the syncer merges the live "
                        "learners' last pushes together into their token-weighted mean; off: the residual pushes "
                        "merge like any other, weighed by their share of a round (default on)")
    g.add_argument("--heartbeat-interval", type=positive_float, default=TrainConfig.heartbeat_interval,
                   help="seconds of a quiet link after which a learner heartbeats (and the longest a long poll "
                        "waits, at most 1 s)")
    g.add_argument("--heartbeat-timeout", type=positive_float, default=TrainConfig.heartbeat_timeout,
                   help="seconds without a word from a learner after which the syncer counts it gone")
    g.add_argument("--request-timeout", type=positive_float, default=TrainConfig.request_timeout,
                   help="seconds a learner waits for the syncer's answer before reconnecting")


def add_syncer_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("syncer")
    g.add_argument("--outer-lr", type=positive_float, default=SyncerConfig.outer_lr,
                   help="the outer Nesterov step's learning rate (DiLoCo's 0.7)")
    g.add_argument("--outer-momentum", type=float, default=SyncerConfig.outer_momentum,
                   help="the outer Nesterov step's momentum in [0, 1) (DiLoCo's 0.9; 0: averaging)")
    g.add_argument("--quorum", "-K", type=non_negative_int, default=SyncerConfig.quorum,
                   help="minimum learners per merge; 0 = every live learner")
    g.add_argument("--grace", type=float, default=SyncerConfig.grace,
                   help="seconds to wait for more pushes before merging below quorum "
                        "(with --grace-policy adaptive: the cap of every wait)")
    g.add_argument("--grace-policy", choices=GRACE_POLICIES, default=SyncerConfig.grace_policy,
                   help="fixed: wait --grace below quorum, merge at once at quorum; adaptive: also wait for "
                        "missing learners until their predicted arrival, at most --grace (default: fixed)")
    g.add_argument("--max-staleness", type=non_negative_int, default=SyncerConfig.max_staleness,
                   help="versions; a push more stale than this is dropped under every policy")
    g.add_argument("--staleness-policy", choices=STALENESS_POLICIES, default=SyncerConfig.staleness_policy,
                   help="drop: stale pushes beyond --max-staleness are dropped; discount: also weigh each push "
                        "by (1+s)^-1/2; delayed-nesterov: momentum step every --nesterov-delay merges "
                        "(default: drop)")
    g.add_argument("--nesterov-delay", type=positive_int, default=SyncerConfig.nesterov_delay,
                   help="k: merges per outer momentum step with --staleness-policy delayed-nesterov "
                        "(default 1: every merge)")
    g.add_argument("--momentum-unit", choices=MOMENTUM_UNITS, default=SyncerConfig.momentum_unit,
                   help="round: the outer momentum decays and carries per round's worth of merged weight, so a "
                        "merge of a third of the learners carries a third of it; merge: every merge is a full "
                        "Nesterov step (default: round)")
    g.add_argument("--momentum-warmup", type=rounds_or_auto, default="auto", metavar="ROUNDS",
                   help="ramp the outer momentum linearly from 0 to --outer-momentum over the first ROUNDS outer "
                        "rounds of each fragment; auto: the momentum's own horizon 1/(1-momentum), 10 rounds at "
                        "0.9; 0: no ramp (default auto)")
    g.add_argument("--max-payload", type=positive_int, default=SyncerConfig.max_payload,
                   help="frame payload cap in bytes, for authenticated connections (a HELLO carries none)")
    a = p.add_argument_group("admission and push bounds (syncer; docs/wire.md, docs/durability.md)")
    a.add_argument("--max-connections", type=positive_int, default=SyncerConfig.max_connections,
                   help="authenticated connections held at once; a HELLO past it is refused (default 256)")
    a.add_argument("--max-unauthenticated", type=positive_int, default=SyncerConfig.max_unauthenticated,
                   help="connections still in their handshake; when full, a new one evicts the oldest of the "
                        "peer holding the most (default 64)")
    a.add_argument("--handshake-timeout", type=positive_float, default=SyncerConfig.handshake_timeout,
                   help="seconds from accept to a verified HELLO (default 10)")
    a.add_argument("--idle-timeout", type=positive_float, default=SyncerConfig.idle_timeout,
                   help="seconds an authenticated connection may stay silent (default 30)")
    a.add_argument("--max-step-rate", type=positive_float, default=SyncerConfig.max_step_rate,
                   help="inner steps per second a learner can do at most: bounds the steps a push may claim "
                        "(default 20000)")
    a.add_argument("--max-step-tokens", type=int, default=SyncerConfig.max_step_tokens,
                   help="tokens one inner step of a unit may weigh; bounds a push's tokens (default 0: 2^30)")
    a.add_argument("--max-norm-ratio", type=positive_float, default=SyncerConfig.max_norm_ratio,
                   help="refuse a push whose per-round pseudo-gradient norm exceeds this multiple of the median "
                        "of the fragment's recent accepted pushes (default 10)")
    g.add_argument("--final-wait", type=non_negative_float, default=SyncerConfig.final_wait, metavar="SECONDS",
                   help="how long the final round waits for the live learners' last pushes after the first "
                        "(default 10)")
    g.add_argument("--start-wait", type=non_negative_float, default=SyncerConfig.start_wait, metavar="SECONDS",
                   help="sync mode: how long the first round waits for every learner to join (default 10)")
    g.add_argument("--eval-budget", type=positive_float, default=SyncerConfig.eval_budget,
                   help="share of one core the syncer may spend sampling the global parameters' held-out "
                        "loss during the run (global_eval events; needs --eval-data) (default 0.1)")


def train_config(args: argparse.Namespace, parser: argparse.ArgumentParser, num_learners: int) -> TrainConfig:
    try:
        model = ModelConfig(block_size=args.block_size, n_layer=args.n_layer, n_head=args.n_head,
                            n_embd=args.n_embd)
        return TrainConfig(
            model=model, task=resolve_spec(args.task), precision=args.precision, mode=args.mode, seed=args.seed, num_learners=num_learners,
            sync_every=args.sync_every, fragments=args.fragments, overlap=args.overlap, alpha=args.alpha,
            fragment_layout=args.fragment_layout, final_round=args.final_round,
            adopt=adopt_mode(args),
            encoding=args.encoding, pull_encoding=args.pull_encoding, inner_lr=args.inner_lr,
            inner_warmup=args.inner_warmup, inner_decay=args.inner_decay,
            batch_size=args.batch_size,
            heartbeat_interval=args.heartbeat_interval, heartbeat_timeout=args.heartbeat_timeout,
            request_timeout=args.request_timeout, max_unsent_pushes=max(8, args.fragments + 1),
            push_window=args.push_window)
    except (ValueError, TaskError) as exc:
        parser.error(str(exc))
        raise  # unreachable: parser.error exits


def adopt_mode(args: argparse.Namespace) -> str:
    """--adopt, else rebase, or mix when --alpha asks for mixing (rebase keeps everything)."""
    if args.adopt is not None:
        return args.adopt
    return "mix" if args.alpha != 0.0 else TrainConfig.adopt


def syncer_config(args: argparse.Namespace, parser: argparse.ArgumentParser, state_dir: str,
                  host: str = "127.0.0.1", port: int = 0, eval_data: str = "") -> SyncerConfig:
    try:
        return SyncerConfig(host=host, port=port, state_dir=state_dir, outer_lr=args.outer_lr,
                            eval_data=eval_data, eval_budget=args.eval_budget, final_wait=args.final_wait, start_wait=args.start_wait,
                            outer_momentum=args.outer_momentum, quorum=args.quorum, grace=args.grace,
                            max_staleness=args.max_staleness, max_payload=args.max_payload,
                            max_connections=args.max_connections, max_unauthenticated=args.max_unauthenticated,
                            handshake_timeout=args.handshake_timeout, idle_timeout=args.idle_timeout,
                            max_step_rate=args.max_step_rate, max_step_tokens=args.max_step_tokens,
                            max_norm_ratio=args.max_norm_ratio,
                            staleness_policy=args.staleness_policy, nesterov_delay=args.nesterov_delay,
                            grace_policy=args.grace_policy, momentum_unit=args.momentum_unit,
                            momentum_warmup=None if args.momentum_warmup == "auto" else args.momentum_warmup)
    except ValueError as exc:
        parser.error(str(exc))
        raise


def add_device_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", type=device_arg, default="auto",
                   help="where learners train: auto (CUDA when present), cpu, cuda or cuda:N; rank r of a unit "
                        "takes the r-th GPU from there (default auto; the syncer always stays on CPU)")


def forward_flags(args: argparse.Namespace) -> list[str]:
    """The training and syncer flags again, to hand a `run` to its syncer subprocess."""
    out = ["--mode", args.mode]
    out += ["--adopt", adopt_mode(args)]
    for flag in ("precision", "seed", "n_layer", "n_head", "n_embd", "block_size", "batch_size", "inner_lr", "inner_warmup", "inner_decay", "sync_every",
                 "fragments", "fragment_layout", "final_round", "final_wait", "start_wait", "overlap", "alpha", "encoding", "pull_encoding", "push_window",
                 "heartbeat_interval", "heartbeat_timeout",
                 "request_timeout", "outer_lr", "outer_momentum", "quorum", "grace", "max_staleness",
                 "max_payload", "max_connections", "max_unauthenticated", "handshake_timeout", "idle_timeout",
                 "max_step_rate", "max_step_tokens", "max_norm_ratio", "staleness_policy", "nesterov_delay", "grace_policy", "momentum_unit",
                 "momentum_warmup",
                 "eval_budget"):
        out += ["--" + flag.replace("_", "-"), str(getattr(args, flag))]
    return out
