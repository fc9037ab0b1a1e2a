"""Run configuration: what the syncer decides and hands every learner in WELCOME.

The syncer is the single authority on the model shape and the training hyperparameters,
so a learner started with nothing but an address can never train a different model.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields

from .codec import check_encoding
from .device import PRECISIONS
from .fragments import FRAGMENT_LAYOUTS, validate_schedule
from .model import ModelConfig
from .outer import STALENESS_POLICIES, OuterConfig

MODES = ("decoupled", "sync")
ADOPT_MODES = ("mix", "rebase")
# Global parameters (fp32, bf16), or quantized steps between versions of them (served.py).
PULL_ENCODINGS = ("fp32", "bf16", "delta-int8", "delta-int4")
GRACE_POLICIES = ("fixed", "adaptive")
MOMENTUM_UNITS = ("round", "merge")


@dataclass(frozen=True)
class TrainConfig:
    model: ModelConfig = field(default_factory=ModelConfig)  # the built-in gpt task's shape
    task: str = "gpt"              # --task: a built-in name, FILE.py:NAME or MODULE:NAME (trainer/task.py)
    precision: str = "fp32"        # inner steps: fp32, or bf16 autocast (trainer/device.py)
    mode: str = "decoupled"
    seed: int = 0
    num_learners: int = 3          # number of data shards
    sync_every: int = 20           # H: inner steps between two exchanges of a fragment
    fragments: int = 1             # P
    overlap: int = 0               # τ: steps between a push and applying its merge
    alpha: float = 0.0             # mixing on apply: θ ← α·θ_local + (1−α)·Θ
    adopt: str = "rebase"          # rebase: θ ← Θ + (θ_local − θ_at_last_push); mix: the line above
    encoding: str = "fp32"
    pull_encoding: str = "fp32"    # how the syncer sends merged fragments (PULL replies)
    inner_lr: float = 3e-3
    inner_warmup: int = 10         # AdamW steps over which the inner LR ramps up linearly from inner_lr/W
    inner_decay: int = 0           # steps over which the inner LR decays (cosine) to a tenth; 0: constant
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    batch_size: int = 16
    heartbeat_interval: float = 0.2
    heartbeat_timeout: float = 1.0
    request_timeout: float = 5.0
    max_unsent_pushes: int = 8
    push_window: int = 1           # pushes of one fragment sent and not yet adopted (1: no pipelining)
    final_round: bool = True       # a clean stop pushes every fragment as `final`: the syncer averages them together
    fragment_layout: str = "balanced"  # balanced | strided (fragments.py)

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode: must be one of {', '.join(MODES)}, got {self.mode!r}")
        if not isinstance(self.task, str) or not self.task:
            raise ValueError(f"task: must name a task, got {self.task!r}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision: must be one of {', '.join(PRECISIONS)}, got {self.precision!r}")
        if self.num_learners < 1:
            raise ValueError(f"learners: must be >= 1, got {self.num_learners}")
        validate_schedule(self.sync_every, self.fragments, self.overlap)
        if isinstance(self.inner_decay, bool) or not isinstance(self.inner_decay, int) or self.inner_decay < 0:
            raise ValueError(f"inner-decay: must be an integer >= 0 (steps; 0: constant), got {self.inner_decay!r}")
        if self.fragment_layout not in FRAGMENT_LAYOUTS:
            raise ValueError(f"fragment-layout: must be one of {', '.join(FRAGMENT_LAYOUTS)}, "
                             f"got {self.fragment_layout!r}")
        if self.fragment_layout == "strided" and self.task == "gpt" and self.model.n_layer < self.fragments:
            raise ValueError(f"fragment-layout: strided puts layer i in fragment i mod P, so it needs at least P "
                             f"layers; the model has {self.model.n_layer} (--n-layer) for {self.fragments} fragments")
        if not isinstance(self.final_round, bool):
            raise ValueError(f"final-round: must be true or false, got {self.final_round!r}")
        if not 0.0 <= self.alpha < 1.0:
            raise ValueError(f"alpha: must be in [0, 1), got {self.alpha}")
        if self.adopt not in ADOPT_MODES:
            raise ValueError(f"adopt: must be one of {', '.join(ADOPT_MODES)}, got {self.adopt!r}")
        if self.adopt == "rebase" and self.alpha != 0.0:
            raise ValueError(f"alpha: mixes only with --adopt mix (rebase keeps all unpushed progress), got {self.alpha}")
        check_encoding(self.encoding)
        if self.pull_encoding not in PULL_ENCODINGS:
            raise ValueError(f"pull-encoding: must be one of {', '.join(PULL_ENCODINGS)}, got {self.pull_encoding!r}")
        for name in ("inner_lr", "heartbeat_interval", "heartbeat_timeout", "request_timeout"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name.replace('_', '-')}: must be > 0, got {getattr(self, name)}")
        if self.heartbeat_timeout <= self.heartbeat_interval:
            raise ValueError(
                f"heartbeat-timeout: {self.heartbeat_timeout} must exceed heartbeat-interval {self.heartbeat_interval}"
            )
        if self.batch_size < 1:
            raise ValueError(f"batch-size: must be >= 1, got {self.batch_size}")
        if isinstance(self.inner_warmup, bool) or not isinstance(self.inner_warmup, int) or self.inner_warmup < 0:
            raise ValueError(f"inner-warmup: must be an integer >= 0 steps, got {self.inner_warmup!r}")
        if isinstance(self.push_window, bool) or not isinstance(self.push_window, int) or self.push_window < 1:
            raise ValueError(f"push-window: must be an integer >= 1, got {self.push_window!r}")
        if self.max_unsent_pushes < self.fragments + 1:
            raise ValueError(f"max-unsent-pushes: must be >= fragments + 1 = {self.fragments + 1}, "
                             f"got {self.max_unsent_pushes}")

    @property
    def tokens_per_step(self) -> int:
        """Of the built-in gpt task, per rank (benches size their runs with it); the trainer
        counts what `task.tokens` says of every batch."""
        return self.batch_size * self.model.block_size

    def task_options(self, data: str = "markov") -> dict:
        """What a built-in task takes from the run's flags (a user's task takes nothing)."""
        return {"model": self.model, "batch_size": self.batch_size, "data": data}

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "TrainConfig":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"config: unknown field {unknown[0]!r}")
        values = dict(data)
        model = values.get("model", {})
        unknown_model = sorted(set(model) - {f.name for f in fields(ModelConfig)})
        if unknown_model:
            raise ValueError(f"config: unknown field 'model.{unknown_model[0]}'")
        values["model"] = ModelConfig.from_dict(model)
        return cls(**values)


@dataclass(frozen=True)
class SyncerConfig:
    host: str = "127.0.0.1"
    port: int = 0
    state_dir: str = "state"
    outer_lr: float = 0.7
    outer_momentum: float = 0.9
    quorum: int = 0                # K; 0 means every live learner
    grace: float = 0.5             # seconds to wait for more pushes once one is pending (adaptive: the cap)
    max_staleness: int = 4         # versions; older pushes are dropped and counted
    staleness_policy: str = "drop"  # drop | discount | delayed-nesterov (outer.py)
    nesterov_delay: int = 1        # k: merges per momentum step under delayed-nesterov
    grace_policy: str = "fixed"    # fixed | adaptive (merge_rule.py, grace_window)
    momentum_unit: str = "round"   # round: a partial merge carries its share of momentum; merge: every merge a full step
    momentum_warmup: float | None = None  # rounds over which the momentum ramps up from 0; None: its horizon
    max_payload: int = 64 * 1024 * 1024
    max_connections: int = 256     # authenticated connections (learners that proved the secret)
    max_unauthenticated: int = 64  # connections still in their handshake; the oldest of the busiest peer goes first
    handshake_timeout: float = 10.0  # from accept to a verified HELLO
    idle_timeout: float = 30.0     # an authenticated connection silent this long is closed
    # Inner steps per second a learner can have done, at most (push bounds): ten times the
    # fastest task measured here (the digits example's MLP does about 2,000/s on one CPU core,
    # and a default of 2,000 refused a restarted learner's honest pushes in a compose run).
    max_step_rate: float = 20000.0
    max_step_tokens: int = 0       # tokens one inner step of a unit can weigh; 0: 2^30
    max_norm_ratio: float = 10.0   # a push's per-round norm over the median of recent accepted ones
    sync_checkpoint_every: int = 50  # sync mode: rounds between durable checkpoints
    eval_data: str = ""            # held-out data for sampling Θ's loss during the run ("" = none)
    eval_budget: float = 0.1       # ... using at most this fraction of one core
    final_wait: float = 10.0       # seconds a final round waits for the live learners' last pushes
    start_wait: float = 10.0       # sync mode: seconds the first round waits for every learner to join

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port: must be in [0, 65535], got {self.port}")
        if self.quorum < 0:
            raise ValueError(f"quorum: must be >= 0, got {self.quorum}")
        if self.grace < 0:
            raise ValueError(f"grace: must be >= 0, got {self.grace}")
        if self.max_staleness < 0:
            raise ValueError(f"max-staleness: must be >= 0, got {self.max_staleness}")
        if self.staleness_policy not in STALENESS_POLICIES:
            raise ValueError(f"staleness-policy: must be one of {', '.join(STALENESS_POLICIES)}, "
                             f"got {self.staleness_policy!r}")
        if isinstance(self.nesterov_delay, bool) or not isinstance(self.nesterov_delay, int) \
                or self.nesterov_delay < 1:
            raise ValueError(f"nesterov-delay: must be an integer >= 1, got {self.nesterov_delay!r}")
        if self.nesterov_delay > 1 and self.staleness_policy != "delayed-nesterov":
            raise ValueError(f"nesterov-delay: {self.nesterov_delay} needs --staleness-policy delayed-nesterov, "
                             f"got --staleness-policy {self.staleness_policy}")
        if self.momentum_warmup is not None and not self.momentum_warmup >= 0:
            raise ValueError(f"momentum-warmup: must be >= 0 rounds or auto, got {self.momentum_warmup}")
        if self.momentum_unit not in MOMENTUM_UNITS:
            raise ValueError(f"momentum-unit: must be one of {', '.join(MOMENTUM_UNITS)}, got {self.momentum_unit!r}")
        if self.grace_policy not in GRACE_POLICIES:
            raise ValueError(f"grace-policy: must be one of {', '.join(GRACE_POLICIES)}, got {self.grace_policy!r}")
        for name in ("max_connections", "max_unauthenticated"):
            if isinstance(getattr(self, name), bool) or not getattr(self, name) >= 1:
                raise ValueError(f"{name.replace('_', '-')}: must be an integer >= 1, got {getattr(self, name)!r}")
        for name in ("handshake_timeout", "idle_timeout", "max_step_rate"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name.replace('_', '-')}: must be > 0, got {getattr(self, name)}")
        if not self.max_norm_ratio > 1:
            raise ValueError(f"max-norm-ratio: must be > 1, got {self.max_norm_ratio}")
        if not 0 <= self.max_step_tokens <= 2 ** 40:
            raise ValueError(f"max-step-tokens: must be in [0, 2^40] (0: 2^30), got {self.max_step_tokens}")
        if self.max_payload < 1024:
            raise ValueError(f"max-payload: must be >= 1024 bytes, got {self.max_payload}")
        OuterConfig(self.outer_lr, self.outer_momentum)  # raises naming outer_lr / outer_momentum
        if not 0 < self.eval_budget <= 1:
            raise ValueError(f"eval-budget: must be in (0, 1], got {self.eval_budget}")
        if not 0 <= self.start_wait <= 3600:
            raise ValueError(f"start-wait: must be in [0, 3600] seconds, got {self.start_wait}")
        if not 0 <= self.final_wait <= 3600:
            raise ValueError(f"final-wait: must be in [0, 3600] seconds, got {self.final_wait}")
        if self.sync_checkpoint_every < 1:
            raise ValueError(f"sync-checkpoint-every: must be >= 1, got {self.sync_checkpoint_every}")

    @property
    def warmup_rounds(self) -> float:
        """--momentum-warmup, where `auto` is the momentum's own horizon 1/(1−μ) (10 rounds at 0.9)."""
        if self.momentum_warmup is not None:
            return self.momentum_warmup
        return 1.0 / (1.0 - self.outer_momentum)
