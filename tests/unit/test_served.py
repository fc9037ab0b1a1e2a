"""trainer/served.py: delta pulls with a served copy Φ and error feedback."""
from __future__ import annotations

import pytest
import torch

from trainer.served import KEPT_STEPS, ServedFragment, apply_steps, step_key


def _params(seed: int, scale: float = 1.0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"a": torch.randn(64, 8, generator=g) * scale, "b": torch.randn(8, generator=g) * scale}


@pytest.mark.parametrize("encoding", ["delta-int8", "delta-int4"])
def test_a_learner_following_the_steps_holds_exactly_what_the_syncer_serves(encoding: str) -> None:
    theta = _params(0)
    served = ServedFragment(theta, 0, encoding)
    held, have = {n: t.clone() for n, t in theta.items()}, 0
    errors = []
    for v in range(1, 31):
        theta = {n: t - 0.01 * d for (n, t), d in zip(theta.items(), _params(v).values())}  # a merge
        served.advance(theta, v)
        enc, start, parts = served.reply(have)
        assert enc == encoding.removeprefix("delta-") and start == have
        held, have = apply_steps(held, parts, enc, start, v), v
        for n in held:
            assert torch.equal(held[n], served.params[n]), "the learner holds Φ exactly"
        errors.append(max(float((served.params[n] - theta[n]).abs().max()) for n in theta))
    # Error feedback: Φ stays within one step's rounding of Θ; it does not drift away.
    step = 0.01 * max(float(t.abs().max()) for t in _params(30).values())
    assert max(errors[-10:]) < step, errors


def test_a_learner_behind_gets_every_step_since_its_version_or_phi_whole() -> None:
    served = ServedFragment(_params(0), 0, "delta-int8")
    start = {n: t.clone() for n, t in served.params.items()}
    for v in range(1, 4):
        served.advance(_params(v), v)
    enc, first, parts = served.reply(1)
    assert first == 1 and sorted({k.split("/")[0] for k in parts}) == ["v2", "v3"]
    enc0, first0, parts0 = served.reply(0)
    assert apply_steps(start, parts0, enc0, first0, 3)["a"].equal(served.params["a"])
    for have in (None, 3, -1):  # never held one, already current, unknown
        whole, none, tensors = served.reply(have)
        assert whole == "fp32" and none is None and torch.equal(tensors["a"], served.params["a"])
    for v in range(4, 5 + KEPT_STEPS):
        served.advance(_params(v), v)
    assert served.reply(0)[0] == "fp32", "a learner further behind than the steps kept gets Φ whole"


def test_steps_that_do_not_add_up_are_refused_naming_what_is_wrong() -> None:
    served = ServedFragment(_params(0), 0, "delta-int8")
    base = {n: t.clone() for n, t in served.params.items()}
    served.advance(_params(1), 1)
    served.advance(_params(2), 2)
    _, _, parts = served.reply(0)
    with pytest.raises(ValueError, match="step to version 3 is missing"):
        apply_steps(base, parts, "int8", 0, 3)
    with pytest.raises(ValueError, match="4 tensors outside versions 1..1"):
        apply_steps(base, parts, "int8", 0, 1)
    broken = {k: t for k, t in parts.items() if k != step_key(2, "a")}
    with pytest.raises(ValueError, match="missing tensor"):
        apply_steps(base, broken, "int8", 0, 2)
    with pytest.raises(ValueError, match="pull-encoding"):
        ServedFragment(base, 0, "bf16")
