"""Delta pulls: what the syncer serves of a fragment, as quantized steps between versions.

With a pull encoding `delta-int8` or `delta-int4` the syncer keeps, per fragment, a served
copy Φ of the global parameters Θ and the last few quantized steps that built it:

    at each merge (version v):  s_v = Q(Θ_v − Φ_{v−1}),  Φ_v = Φ_{v−1} + s_v

Every learner holds Φ exactly (never Θ), so a learner at version h needs only the steps
s_{h+1..v}: 1 byte (int8) or half a byte (int4) per parameter per version instead of 2
(bf16) or 4 (fp32). The quantization error does not accumulate: each step is measured
from Φ, not from the previous Θ, so whatever one step missed the next one carries
(error feedback) and Φ stays within one step's rounding of Θ. A learner further behind
than the steps kept, or one that never held a version (a new one), gets Φ whole, in fp32.

Nothing here is durable: after a syncer restart Φ starts again from the recovered Θ with
no steps, and every learner's next pull is a whole Φ.
"""
from __future__ import annotations

from collections import deque

import torch

from .codec import decode, encode

DELTA_ENCODINGS = {"delta-int8": "int8", "delta-int4": "int4"}
KEPT_STEPS = 8   # versions a learner may lag and still get steps (beyond: Φ whole)
WHOLE = "fp32"   # how Φ goes whole: exact, so later steps apply to exactly what the syncer holds


def step_key(version: int, name: str) -> str:
    return f"v{version}/{name}"


class ServedFragment:
    """Φ of one fragment and its last KEPT_STEPS quantized steps."""

    def __init__(self, params: dict[str, torch.Tensor], version: int, encoding: str) -> None:
        if encoding not in DELTA_ENCODINGS:
            raise ValueError(f"pull-encoding: {encoding!r} is not a delta encoding "
                             f"({', '.join(DELTA_ENCODINGS)})")
        self.step_encoding = DELTA_ENCODINGS[encoding]
        self.params = {n: t.detach().clone() for n, t in params.items()}
        self.version = version
        self.steps: deque[tuple[int, dict[str, torch.Tensor]]] = deque(maxlen=KEPT_STEPS)

    def advance(self, target: dict[str, torch.Tensor], version: int) -> None:
        """A merge made `version` with parameters `target` (Θ): serve one more step."""
        delta = {n: target[n] - self.params[n] for n in self.params}
        parts = encode(delta, self.step_encoding)
        applied = decode(parts, self.step_encoding, {n: t.shape for n, t in self.params.items()})
        for n, d in applied.items():
            self.params[n].add_(d)
        self.version = version
        self.steps.append((version, parts))

    def reply(self, have: int | None) -> tuple[str, int | None, dict[str, torch.Tensor]]:
        """(encoding, the version the steps start from or None, tensors) for a learner that
        holds Φ at version `have` (None: it holds none)."""
        first = self.steps[0][0] if self.steps else self.version + 1
        if have is None or not first - 1 <= have < self.version:
            return WHOLE, None, {n: t.clone() for n, t in self.params.items()}
        tensors = {step_key(v, key): t for v, parts in self.steps if v > have for key, t in parts.items()}
        return self.step_encoding, have, tensors


def apply_steps(base: dict[str, torch.Tensor], parts: dict[str, torch.Tensor], encoding: str,
                start: int, version: int) -> dict[str, torch.Tensor]:
    """Φ at `version` from Φ at `start` (base, not modified) and the steps in between.
    Raises ValueError naming what is missing or malformed: a reply that does not add up
    to the version it claims is refused, never half applied."""
    if version <= start:
        raise ValueError(f"steps from version {start} to {version}: nothing to apply")
    shapes = {n: t.shape for n, t in base.items()}
    out = {n: t.clone() for n, t in base.items()}
    used = 0
    for v in range(start + 1, version + 1):
        prefix = step_key(v, "")
        mine = {k[len(prefix):]: t for k, t in parts.items() if k.startswith(prefix)}
        if not mine:
            raise ValueError(f"step to version {v} is missing")
        for n, d in decode(mine, encoding, shapes).items():
            out[n].add_(d.to(out[n].device))
        used += len(mine)
    if used != len(parts):
        raise ValueError(f"{len(parts) - used} tensors outside versions {start + 1}..{version}")
    return out
