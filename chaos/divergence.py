"""no_divergence: Θ's held-out loss, as the syncer sampled it (`global_eval` events), must
not run away.

Why these rules. A learner's training loss describes its own model; only Θ's loss says
whether the outer step is sound (a compose run ended at 14.26 while every learner read
2.57; another at 4.33 against ~2). Before issue 13's fix a healthy DiLoCo run was not even
monotone: the outer Nesterov step (lr 0.7, momentum 0.9) overshot early in training, fully
synchronous (on the property suite's model, 2 learners, H=10, no faults: one version at
6.6, 11.0 and 17.1 nats against 5.53 untrained in 3 of 5 runs). The momentum now warms up
over its first ten rounds (trainer/syncer/), and the same five runs rose at most 0.011
above their running best. One transient remains, with no momentum at all: on the default
model the first merge can land between the initial parameters and the learners' own
(35% of the way at weight 0.5 and lr 0.7), and that point scored 6.78 against 5.50
untrained, recovered by the next merges (2.03 four versions later). So a single sample is
not a divergence; these are:

1. **worse than untrained, for a round**: two samples at least a fragment's round apart
   (`untrained_versions` = 1, times P versions) both above the untrained Θ's loss (the
   `start` sample at version 0, 5.5 nats/byte for the byte vocabulary; ln(vocab) when the
   run has none). The pipelined pushes of the issue (staleness 2-4, one learner's pushes
   twice in a merge) held Θ at 14.6, 14.8 and 13.8 for four versions: caught.
2. **sustained rise**: the loss stays more than `rise` (1.0) nats above the best so far,
   or above the fault-free reference's best by the same merged tokens, from one sample
   to another `sustain_versions` (3) versions per fragment later. Faults cost a healthy
   run a few hundredths (stale pushes, partial rounds); 1.0 is far above that and far
   below the 2-12 nats of the divergences above.
3. **ended high**: the final sample is more than `rise` above the best (or the
   reference): a run cannot recover after it stopped (14.26 and 4.33 above are caught).

The evidence names the sample (version, tokens, loss), the best before it, the merges
between the two (version, contributors with staleness and weight, the momentum's
round fraction) and each learner's training loss around both points; a pass lists the
lone samples worse than untrained that the next merge recovered from.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .checkers import RunView, Verdict
    from .reference import ReferenceCurve

RISE = 1.0              # nats above the best so far (or the reference) that count as high
SUSTAIN_VERSIONS = 3    # versions per fragment a high stretch may last before it is a divergence
UNTRAINED_VERSIONS = 1  # versions per fragment a stretch worse than the untrained model may last
TRAINING_LOSS_STEPS = 10  # inner steps per learner averaged around a point, for the evidence
MAX_MERGES_SHOWN = 12


@dataclass(frozen=True)
class Sample:
    """One `global_eval`: Θ at these versions, after these merged tokens, scored `loss`."""

    t: float
    version: int
    versions: tuple[int, ...]
    tokens: float
    loss: float  # NaN/Inf kept: they are divergences too
    reason: str

    def describe(self, view: RunView) -> dict:
        return {"version": self.version, "versions": list(self.versions), "tokens": self.tokens,
                "loss": round(self.loss, 4) if math.isfinite(self.loss) else str(self.loss),
                "at": view.rel(self.t), "reason": self.reason}


def samples(events: list[dict]) -> list[Sample]:
    out = []
    for e in events:
        if e["kind"] != "global_eval":
            continue
        try:
            loss = float(e["loss"])  # the event log writes NaN and Inf as strings
        except (TypeError, ValueError, KeyError):
            continue
        versions = tuple(int(v) for v in (e.get("versions") or [e.get("version", 0)]))
        out.append(Sample(float(e["t"]), int(e.get("version", sum(versions))), versions,
                          float(e.get("tokens") or 0.0), loss, str(e.get("reason") or "merge")))
    return sorted(out, key=lambda s: s.t)


BYTE_LOSS = math.log(256)  # the built-in task's untrained loss, nats per byte: what RISE is sized for


def run_task(events: list[dict]) -> str:
    """The task the run's syncer trained (`gpt` for runs from before tasks)."""
    for e in events:
        if e["kind"] == "process_start" and e.get("role") == "syncer":
            return str((e.get("config") or {}).get("task") or "gpt")
    return "gpt"


def loss_scale(events: list[dict]) -> tuple[float, str]:
    """What one unit of the checks' margins is worth in this run's loss: 1 for the built-in
    task (nats per byte, which the margins are sized in), else the untrained model's loss
    over ln(256). A user's loss may be MSE in the hundreds or a cross-entropy of 0.1, and
    "1.0 above the best" means nothing across such scales; "18% of the untrained loss",
    what 1.0 nats is to the byte-level GPT, means the same for every task."""
    if run_task(events) == "gpt":
        return 1.0, "nats per byte"
    found = samples(events)
    untrained, _ = untrained_loss(found, events)
    if untrained is None or not untrained > 0 or not math.isfinite(untrained):
        return 1.0, "the task's loss (no untrained score to scale by)"
    return untrained / BYTE_LOSS, f"the task's untrained loss {untrained:.4f} / ln 256"


def untrained_loss(found: list[Sample], events: list[dict]) -> tuple[float | None, str]:
    """The untrained Θ's loss: the syncer's first `start` sample at version 0, else
    ln(vocab_size) (a uniform guess, which an initialised model is close to)."""
    for s in found:
        if s.reason == "start" and s.version == 0 and math.isfinite(s.loss):
            return s.loss, "Θ's loss at version 0"
    for e in events:
        if e["kind"] == "process_start" and e.get("role") == "syncer":
            vocab = ((e.get("config") or {}).get("model") or {}).get("vocab_size")
            if vocab:
                return math.log(int(vocab)), f"ln(vocab_size {vocab})"
    return None, "unknown"


def _between(view: RunView, low: Sample, high: Sample) -> list[dict]:
    """The merges that took Θ from `low`'s versions to `high`'s (by fragment versions when
    both have one per fragment, else by time)."""
    out = []
    for e in view.events:
        if e["kind"] != "merge":
            continue
        f = e.get("fragment", 0)
        if len(low.versions) == len(high.versions) and f < len(low.versions):
            inside = low.versions[f] < e["version"] <= high.versions[f]
        else:
            inside = low.t < e["t"] <= high.t
        if inside:
            outer = e.get("outer") or {}
            out.append({"version": e["version"], "fragment": f, "at": view.rel(e["t"]), "reason": e.get("reason"),
                        "round_fraction": outer.get("round_fraction"), "momentum_step": outer.get("momentum_step"),
                        "contributors": [{"learner": c.get("learner"), "staleness": c.get("staleness"),
                                          "weight": c.get("weight")} for c in e.get("contributors", [])]})
    return out[-MAX_MERGES_SHOWN:]


def training_losses(view: RunView, t: float) -> dict[str, float]:
    """Each learner's mean training loss over its last TRAINING_LOSS_STEPS steps before `t`."""
    recent: dict[int, list[float]] = {}
    for e in view.events:
        if e["kind"] == "inner_step" and e.get("learner") is not None and e["t"] <= t:
            try:
                recent.setdefault(e["learner"], []).append(float(e["loss"]))
            except (TypeError, ValueError):
                continue
    return {f"learner-{k}": round(sum(v[-TRAINING_LOSS_STEPS:]) / len(v[-TRAINING_LOSS_STEPS:]), 4)
            for k, v in sorted(recent.items()) if v}


def _finding(view: RunView, rule: str, point: Sample, best: Sample | None, limit: float, why: str,
             first: Sample | None = None) -> dict:
    row = {"rule": rule, "why": why, "sample": point.describe(view), "limit": round(limit, 4),
           "training_loss": training_losses(view, point.t)}
    if first is not None and first is not point:
        row["high_since"] = first.describe(view)
    if best is not None:
        row["best"] = best.describe(view)
        row["training_loss_at_best"] = training_losses(view, best.t)
        row["merges_since_best"] = _between(view, best, point)
    return row


def _long_stretch(view: RunView, findings: list[dict], reported: set[tuple[str, float]], rule: str, first: Sample,
                  point: Sample, span: int, best: Sample | None, limit: float, why: str) -> None:
    """A finding once a stretch above its limit, begun at `first`, has lasted `span`
    versions by `point`; one per stretch."""
    if point.version - first.version < span or (rule, first.t) in reported:
        return
    reported.add((rule, first.t))
    findings.append(_finding(view, rule, point, best, limit, f"{why}, still above it "
                             f"{point.version - first.version} version(s) after it first was", first))


def _spikes(found: list[Sample], untrained: float | None) -> list[dict]:
    """Every sample worse than the untrained model (a lone one is a transient: shown, not failed)."""
    if untrained is None:
        return []
    return [{"version": s.version, "loss": round(s.loss, 3) if math.isfinite(s.loss) else str(s.loss)}
            for s in found if s.version > 0 and not s.loss <= untrained][:10]


def check_no_divergence(view: RunView, rise: float = RISE, sustain_versions: int = SUSTAIN_VERSIONS,
                        untrained_versions: int = UNTRAINED_VERSIONS,
                        reference: ReferenceCurve | None = None) -> Verdict:
    """Θ's held-out loss never gets worse than the untrained model's, never stays more than
    `rise` nats above its best so far (or the reference at the same tokens) for
    `sustain_versions` versions per fragment, and does not end that high (module docstring).
    Unknown when Θ was never sampled after a merge, or never improved on the untrained
    model by the learning margin: a frozen Θ never diverges, and must not pass for it."""
    from .checkers import FAIL, PASS, UNKNOWN, Verdict

    found = samples(view.events)
    if not found:
        return Verdict("no_divergence", UNKNOWN, "no sample of Θ's held-out loss (a syncer started without "
                                                 "--eval-data writes no global_eval events)")
    untrained, untrained_source = untrained_loss(found, view.events)
    scale, _ = loss_scale(view.events)
    rise = round(rise * scale, 6)  # in this task's units (1.0 nats per byte for the built-in task)
    fragments = max(len(s.versions) for s in found)
    best: Sample | None = None
    first_high: Sample | None = None
    first_worse: Sample | None = None
    findings: list[dict] = []
    reported: set[tuple[str, float]] = set()  # (rule, first sample's time): one finding per stretch
    high = False
    limit, why = math.inf, ""
    for s in found:
        limit, why = math.inf, ""
        if best is not None:
            limit, why = best.loss + rise, f"best {best.loss:.4f} + {rise}"
        if reference is not None:
            ref = reference.best_by(s.tokens)
            if ref + rise < limit:
                limit, why = ref + rise, f"reference {ref:.4f} by {s.tokens:.0f} tokens + {rise}"
        worse = untrained is not None and s.version > 0 and not s.loss <= untrained
        first_worse = (first_worse or s) if worse else None
        if first_worse is not None:
            _long_stretch(view, findings, reported, "worse_than_untrained", first_worse, s,
                          untrained_versions * fragments, best, untrained,
                          f"untrained {untrained:.4f} ({untrained_source})")
        high = not s.loss <= limit
        first_high = (first_high or s) if high else None
        if first_high is not None:
            _long_stretch(view, findings, reported, "sustained_rise", first_high, s, sustain_versions * fragments,
                          best, limit, why)
        if math.isfinite(s.loss) and (best is None or s.loss < best.loss):
            best = s
    last = found[-1]
    if high and not any(f["sample"]["at"] == view.rel(last.t) for f in findings):
        findings.append(_finding(view, "ended_high", last, best, limit, why, first_high))
    curve = {"samples": len(found), "untrained": round(untrained, 4) if untrained is not None else None,
             "best": best.describe(view) if best else None, "final": last.describe(view),
             "rise": rise, "sustain_versions": sustain_versions, "untrained_versions": untrained_versions,
             "fragments": fragments, "worse_than_untrained": _spikes(found, untrained)}
    if reference is not None:
        curve["reference"] = reference.describe()
    if findings:
        worst = findings[0]
        return Verdict("no_divergence", FAIL,
                       f"Θ's held-out loss diverged: {worst['rule'].replace('_', ' ')} at version "
                       f"{worst['sample']['version']} (loss {worst['sample']['loss']}, limit {worst['limit']}: "
                       f"{worst['why']})", {**curve, "findings": findings[:10]})
    from .checkers import learning_margin
    merged = [s for s in found if s.version > 0]
    if not merged:
        return Verdict("no_divergence", UNKNOWN, "Θ was never sampled after a merge (nothing was merged, or the "
                                                 "sampler never ran): nothing shows it stays away from divergence",
                       curve)
    margin = learning_margin(view)
    if untrained is not None and best is not None and not best.loss <= untrained - margin:
        return Verdict("no_divergence", UNKNOWN, f"Θ never improved on the untrained model (best {best.loss:.4f} "
                                                 f"against {untrained:.4f}, by less than the learning margin "
                                                 f"{margin:.4g}): a frozen Θ shows nothing about divergence; "
                                                 f"final_loss judges whether it learned", curve)
    b = curve["best"]
    spikes = curve["worse_than_untrained"]
    transient = (f"; {len(spikes)} lone overshoot(s) above the untrained loss, recovered at the next merge "
                 f"(version {', '.join(str(x['version']) for x in spikes)})" if spikes else "")
    return Verdict("no_divergence", PASS,
                   f"Θ's held-out loss went from {found[0].loss:.3f} to {last.loss:.3f} (best {b['loss']} at version "
                   f"{b['version']}) over {len(found)} samples, never {rise} above its best for {sustain_versions} "
                   f"versions{transient}", curve)
