"""Goodput over chip counts, and which input moves it most (one at a time, x0.5 and x2)."""
from __future__ import annotations

from dataclasses import dataclass

from .inputs import ScaleInputs
from .result import SYSTEMS
from .scale import simulate

SWEEP_CHIPS = tuple(m * 10 ** e for e in range(3, 7) for m in (1, 2, 5)) + (10 ** 7,)  # 10^3 ... 10^7


def at_chips(inp: ScaleInputs, chips: int) -> ScaleInputs:
    """The same system at another size: learners keep their count (or, given
    --chips-per-learner, their size: then M = chips / that, rounded)."""
    if inp.chips_per_learner:
        learners = max(1, round(chips / inp.chips_per_learner))
    else:
        learners = min(inp.learners, chips)
    return inp.replace(chips=chips, learners=learners, chips_per_learner=None,
                       slice_chips=min(inp.slice_chips, chips), quorum=min(inp.quorum, learners))


def sweep(inp: ScaleInputs, chips: tuple[int, ...] = SWEEP_CHIPS) -> dict[str, dict[str, list]]:
    """{system: {"chips": [...], "goodput": [...]}} over the chip counts."""
    out: dict[str, dict[str, list]] = {s: {"chips": [], "goodput": []} for s in SYSTEMS}
    for n in chips:
        sized = at_chips(inp, n)
        for system, result in simulate(sized).items():
            out[system]["chips"].append(sized.chips)
            out[system]["goodput"].append(round(result.goodput, 6))
    return out


@dataclass(frozen=True)
class Swing:
    parameter: str   # the flag
    low: str         # the input at x0.5 and at x2, as printed
    high: str
    goodput_low: dict[str, float]
    goodput_high: dict[str, float]

    def span(self, system: str) -> float:
        return abs(self.goodput_high[system] - self.goodput_low[system])


def _divisor_at_most(n: int, cap: int) -> int:
    return max(d for d in range(1, min(n, cap) + 1) if n % d == 0)


def _variants(inp: ScaleInputs) -> list[tuple[str, str, ScaleInputs, str, ScaleInputs]]:
    """(flag, low label, low inputs, high label, high inputs) for every input that can move goodput."""
    out = []

    def scaled(flag: str, field: str) -> None:
        value = getattr(inp, field)
        lo, hi = value / 2, value * 2
        out.append((flag, f"{lo:g}", inp.replace(**{field: lo}), f"{hi:g}", inp.replace(**{field: hi})))

    def dist(flag: str, field: str, current) -> None:
        out.append((flag, f"x0.5 (mean {current.mean() / 2:.3g} s)", inp.replace(**{field: current.scaled(0.5)}),
                    f"x2 (mean {current.mean() * 2:.3g} s)", inp.replace(**{field: current.scaled(2)})))

    def sized(flag: str, low: ScaleInputs, high: ScaleInputs, what: str) -> None:
        out.append((flag, f"{getattr(low, what):g}", low, f"{getattr(high, what):g}", high))

    scaled("--mtbi-years", "mtbi_years")
    sized("--chips", at_chips(inp, inp.chips // 2), at_chips(inp, inp.chips * 2), "chips")
    half, double = max(1, inp.learners // 2), inp.learners * 2
    sized("--learners", inp.replace(learners=half, chips_per_learner=None, quorum=min(inp.quorum, half)),
          inp.replace(learners=min(inp.chips, double), chips_per_learner=None), "learners")
    scaled("--step-time", "step_time")
    h_lo, h_hi = max(1, inp.sync_every // 2), inp.sync_every * 2
    sized("--sync-every", inp.replace(sync_every=h_lo, fragments=_divisor_at_most(h_lo, inp.fragments)),
          inp.replace(sync_every=h_hi), "sync_every")
    dist("--detection", "detection", inp.detection)
    dist("--recovery-decoupled", "recovery_decoupled", inp.decoupled_recovery)
    dist("--reconfigure", "reconfigure", inp.reconfigure)
    dist("--slice-return", "slice_return", inp.slice_return)
    dist("--recovery-dp", "recovery_dp", inp.dp_restart)
    scaled("--checkpoint-every", "checkpoint_every")
    sized("--slice-chips", inp.replace(slice_chips=max(1, inp.slice_chips // 2)),
          inp.replace(slice_chips=min(inp.chips, inp.slice_chips * 2)), "slice_chips")
    return out


def sensitivity(inp: ScaleInputs) -> list[Swing]:
    """One input at a time at x0.5 and x2, the rest as given; the largest decoupled swing first."""
    swings = []
    for flag, lo_label, lo, hi_label, hi in _variants(inp):
        low, high = simulate(lo), simulate(hi)
        swings.append(Swing(flag, lo_label, hi_label, {s: low[s].goodput for s in SYSTEMS},
                            {s: high[s].goodput for s in SYSTEMS}))
    return sorted(swings, key=lambda w: -w.span("decoupled"))
