"""The outer step (Nesterov momentum, checked against torch.optim.SGD) and token-weighted merging."""
from __future__ import annotations

import pytest
import torch

from trainer.outer import (Contribution, OuterConfig, merge, merge_weights, nesterov_step, push_id, round_fraction,
                           round_scale)


def _torch_reference(params0: dict[str, torch.Tensor], grads: list[dict[str, torch.Tensor]],
                     lr: float, momentum: float) -> dict[str, torch.Tensor]:
    ps = {n: torch.nn.Parameter(t.clone()) for n, t in params0.items()}
    # torch refuses nesterov=True without momentum; with momentum 0 both are plain SGD.
    opt = torch.optim.SGD(list(ps.values()), lr=lr, momentum=momentum, nesterov=momentum > 0, dampening=0.0)
    for g in grads:
        opt.zero_grad(set_to_none=True)
        for n, p in ps.items():
            p.grad = g[n].clone()
        opt.step()
    return {n: p.detach() for n, p in ps.items()}


@pytest.mark.parametrize("lr,momentum", [(0.7, 0.9), (0.1, 0.0), (1.0, 0.5), (0.35, 0.99)])
@pytest.mark.parametrize("steps", [1, 2, 7])
def test_nesterov_step_matches_torch_sgd(lr: float, momentum: float, steps: int) -> None:
    g = torch.Generator().manual_seed(steps * 1000 + int(momentum * 100))
    shapes = {"a": (5, 3), "b": (11,), "c": (2, 2, 2)}
    params0 = {n: torch.randn(s, generator=g) for n, s in shapes.items()}
    grads = [{n: torch.randn(s, generator=g) * 0.1 for n, s in shapes.items()} for _ in range(steps)]

    params = {n: t.clone() for n, t in params0.items()}
    mom = {n: torch.zeros_like(t) for n, t in params0.items()}
    cfg = OuterConfig(lr=lr, momentum=momentum)
    for d in grads:
        nesterov_step(params, mom, d, cfg)

    expected = _torch_reference(params0, grads, lr, momentum)
    for n in shapes:
        torch.testing.assert_close(params[n], expected[n], rtol=1e-6, atol=1e-7)


def test_nesterov_first_step_closed_form() -> None:
    # buf starts at 0, so step one is p - lr*(1+mu)*delta and buf = delta.
    p = {"w": torch.tensor([1.0, -2.0])}
    m = {"w": torch.zeros(2)}
    d = {"w": torch.tensor([0.5, 0.25])}
    nesterov_step(p, m, d, OuterConfig(lr=0.7, momentum=0.9))
    torch.testing.assert_close(p["w"], torch.tensor([1.0 - 0.7 * 1.9 * 0.5, -2.0 - 0.7 * 1.9 * 0.25]))
    torch.testing.assert_close(m["w"], d["w"])


def test_nesterov_step_touches_only_named_tensors_in_grad() -> None:
    p = {"a": torch.ones(2), "b": torch.ones(2)}
    m = {"a": torch.zeros(2), "b": torch.zeros(2)}
    nesterov_step(p, m, {"a": torch.ones(2)}, OuterConfig())
    assert torch.equal(p["b"], torch.ones(2)) and torch.equal(m["b"], torch.zeros(2))
    assert not torch.equal(p["a"], torch.ones(2))


# ----------------------------------------------------------------------------- momentum per round

def _state(values: list[float]) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    return {"w": torch.tensor(values)}, {"w": torch.zeros(len(values))}


def test_fraction_one_is_the_full_step_bit_for_bit() -> None:
    p1, m1 = _state([1.0, 2.0])
    p2, m2 = _state([1.0, 2.0])
    for d in (torch.tensor([0.3, -0.1]), torch.tensor([0.2, 0.4])):
        nesterov_step(p1, m1, {"w": d}, OuterConfig())
        nesterov_step(p2, m2, {"w": d}, OuterConfig(), fraction=1.0)
    assert torch.equal(p1["w"], p2["w"]) and torch.equal(m1["w"], m2["w"])


def test_partial_merge_closed_form() -> None:
    # p ← p − lr·((1+μ)·g + μ²·c·buf), c = (1 − μ^W)/(1 − μ);  buf ← μ^W·buf + g
    lr, mu, w = 0.7, 0.9, 1 / 3
    p, m = {"w": torch.tensor([1.0])}, {"w": torch.tensor([2.0])}
    nesterov_step(p, m, {"w": torch.tensor([0.5])}, OuterConfig(lr, mu), fraction=w)
    c = (1 - mu ** w) / (1 - mu)
    torch.testing.assert_close(p["w"], torch.tensor([1.0 - lr * ((1 + mu) * 0.5 + mu * mu * c * 2.0)]))
    torch.testing.assert_close(m["w"], torch.tensor([mu ** w * 2.0 + 0.5]))


@pytest.mark.parametrize("pieces", [2, 3, 7])
def test_a_round_merged_in_pieces_carries_the_momentum_of_one_round(pieces: int) -> None:
    # The old buffer's share: k merges of a k-th of a round carry μ²·buf and decay it to μ·buf,
    # exactly as one full merge would, instead of k full carries (k·μ²·buf).
    buf = torch.tensor([1.0, -3.0])
    p_full, m_full = {"w": torch.zeros(2)}, {"w": buf.clone()}
    nesterov_step(p_full, m_full, {"w": torch.zeros(2)}, OuterConfig())
    p_split, m_split = {"w": torch.zeros(2)}, {"w": buf.clone()}
    p_merge, m_merge = {"w": torch.zeros(2)}, {"w": buf.clone()}
    for _ in range(pieces):
        nesterov_step(p_split, m_split, {"w": torch.zeros(2)}, OuterConfig(), fraction=1 / pieces)
        nesterov_step(p_merge, m_merge, {"w": torch.zeros(2)}, OuterConfig())
    torch.testing.assert_close(p_split["w"], p_full["w"])
    torch.testing.assert_close(m_split["w"], m_full["w"])
    # Per merge, the old unit would have carried the momentum `pieces` times over.
    assert p_merge["w"].abs().sum() > 1.5 * p_full["w"].abs().sum()


def test_a_round_in_pieces_moves_theta_about_as_far_as_one_merge() -> None:
    g = torch.Generator().manual_seed(3)
    buf0, delta = torch.randn(50, generator=g), torch.randn(50, generator=g)
    p_full, m_full = {"w": torch.zeros(50)}, {"w": buf0.clone()}
    nesterov_step(p_full, m_full, {"w": delta}, OuterConfig())
    p_split, m_split = {"w": torch.zeros(50)}, {"w": buf0.clone()}
    for _ in range(3):
        nesterov_step(p_split, m_split, {"w": delta / 3}, OuterConfig(), fraction=1 / 3)
    # Only second-order terms differ: a piece's Δ gains momentum within its own round.
    assert float((p_split["w"] - p_full["w"]).norm() / p_full["w"].norm()) < 0.15


def test_round_fraction_is_the_weight_sum_capped_at_one() -> None:
    assert round_fraction([1 / 3, 1 / 3, 1 / 3]) == pytest.approx(1.0)
    assert round_fraction([1 / 3]) == pytest.approx(1 / 3)
    assert round_fraction([0.6, 0.6]) == 1.0
    assert round_fraction([]) == 0.0


def test_zero_momentum_fraction_is_plain_sgd() -> None:
    p, m = {"w": torch.tensor([1.0])}, {"w": torch.tensor([5.0])}
    nesterov_step(p, m, {"w": torch.tensor([0.5])}, OuterConfig(lr=0.1, momentum=0.0), fraction=0.5)
    torch.testing.assert_close(p["w"], torch.tensor([0.95]))


@pytest.mark.parametrize("kwargs,field", [
    ({"lr": 0.0}, "outer-lr"), ({"lr": -1.0}, "outer-lr"), ({"lr": float("nan")}, "outer-lr"),
    ({"momentum": 1.0}, "outer-momentum"), ({"momentum": -0.1}, "outer-momentum"),
    ({"momentum": float("nan")}, "outer-momentum"),
])
def test_outer_config_validation_names_the_field(kwargs: dict, field: str) -> None:
    with pytest.raises(ValueError, match=f"^{field}:"):
        OuterConfig(**kwargs)


def test_outer_config_defaults() -> None:
    cfg = OuterConfig()
    assert (cfg.lr, cfg.momentum) == (0.7, 0.9)


# ----------------------------------------------------------------------------- merging
#
# The documented rule (outer.py): push i carries Δ_i over s_i steps on T_i tokens;
#   g_i = Δ_i / max(1, s_i / H),   w_i = T_i / max(Σ_k T_k, expected),   Δ = Σ_i w_i g_i,
# and equal weights 1/n when every T_i is 0. The expectations below are written out by hand.

H = 4


def _c(learner: int, tokens: int, delta: dict[str, torch.Tensor], seq: int = 1, inc: int = 1,
       base: int = 0, steps: int = H) -> Contribution:
    return Contribution(learner, inc, seq, tokens, base, delta, steps)


def _delta(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"x": torch.randn(4, 3, generator=g), "y": torch.randn(6, generator=g)}


def test_push_id_format() -> None:
    assert push_id(2, 3, 17) == "2:3:17"
    assert _c(2, 10, {}, seq=17, inc=3).ident == "2:3:17"


def test_merge_weights_are_token_proportional() -> None:
    contribs = [_c(1, 300, {}), _c(2, 100, {}), _c(3, 600, {})]
    w = merge_weights(contribs)
    assert w == pytest.approx([0.3, 0.1, 0.6])
    assert sum(w) == pytest.approx(1.0)


def test_merge_token_weighted_matches_hand_computation() -> None:
    d1, d2, d3 = _delta(1), _delta(2), _delta(3)
    contribs = [_c(1, 200, d1), _c(2, 600, d2), _c(3, 200, d3)]
    delta, weights = merge(contribs, 0.0, H)
    assert weights == pytest.approx([0.2, 0.6, 0.2])
    for n in d1:
        torch.testing.assert_close(delta[n], 0.2 * d1[n] + 0.6 * d2[n] + 0.2 * d3[n])


def test_merge_does_not_modify_contributions() -> None:
    d1, d2 = _delta(1), _delta(2)
    keep1 = {n: t.clone() for n, t in d1.items()}
    merge([_c(1, 5, d1), _c(2, 7, d2)], 0.0, H)
    for n in d1:
        assert torch.equal(d1[n], keep1[n])


def test_two_pushes_of_one_learner_both_count_by_their_tokens() -> None:
    a1, a2, b = _delta(10), _delta(11), _delta(12)
    contribs = [_c(1, 100, a1, seq=1), _c(1, 100, a2, seq=2), _c(2, 200, b)]
    delta, weights = merge(contribs, 0.0, H)
    # Σ T = 400: each of learner 1's pushes weighs 100/400, learner 2's 200/400; both of
    # learner 1's increments enter the sum (neither is dropped nor double-counted).
    assert weights == pytest.approx([0.25, 0.25, 0.5])
    for n in b:
        torch.testing.assert_close(delta[n], 0.25 * a1[n] + 0.25 * a2[n] + 0.5 * b[n])


def test_one_of_three_live_learners_gets_a_third() -> None:
    d = _delta(4)
    tokens_per_round = H * 128
    delta, weights = merge([_c(2, tokens_per_round, d)], 3 * tokens_per_round, H)
    assert weights == pytest.approx([1 / 3])
    for n in d:
        torch.testing.assert_close(delta[n], d[n] / 3)


def test_full_round_is_not_scaled_down_by_expected_tokens() -> None:
    contribs = [_c(1, 100, _delta(1)), _c(2, 100, _delta(2)), _c(3, 100, _delta(3))]
    assert merge_weights(contribs, 300.0) == pytest.approx([1 / 3, 1 / 3, 1 / 3])
    assert sum(merge_weights(contribs, 300.0)) == pytest.approx(1.0)


def test_expected_tokens_below_total_do_not_inflate_weights() -> None:
    contribs = [_c(1, 100, {}), _c(2, 300, {})]
    assert merge_weights(contribs, expected_tokens=10.0) == pytest.approx([0.25, 0.75])


def test_coalesced_push_counts_as_the_rounds_it_spans() -> None:
    d1, d2 = _delta(20), _delta(21)
    # Learner 1's push covers 3 rounds (3H steps, 3x the tokens): g_1 = Δ_1 / 3.
    contribs = [_c(1, 300, d1, steps=3 * H), _c(2, 100, d2, steps=H)]
    delta, weights = merge(contribs, 0.0, H)
    assert weights == pytest.approx([0.75, 0.25])
    for n in d1:
        torch.testing.assert_close(delta[n], 0.75 * d1[n] / 3 + 0.25 * d2[n])


def test_short_push_is_not_scaled_up() -> None:
    d = _delta(22)
    delta, _ = merge([_c(1, 10, d, steps=1)], 0.0, H)  # fewer than H steps: factor 1, not H
    for n in d:
        torch.testing.assert_close(delta[n], d[n])


def test_round_scale() -> None:
    assert round_scale(H, H) == 1.0
    assert round_scale(2 * H, H) == 0.5
    assert round_scale(1, H) == 1.0
    assert round_scale(0, H) == 1.0
    assert round_scale(10, 0) == 1.0  # sync_every unknown: no scaling


def test_all_zero_tokens_give_equal_weights() -> None:
    d1, d2, d3 = _delta(5), _delta(6), _delta(7)
    contribs = [_c(1, 0, d1), _c(2, 0, d2), _c(3, 0, d3)]
    delta, weights = merge(contribs, 1e9, H)
    assert weights == pytest.approx([1 / 3, 1 / 3, 1 / 3])
    for n in d1:
        torch.testing.assert_close(delta[n], (d1[n] + d2[n] + d3[n]) / 3)


def test_negative_tokens_count_as_zero() -> None:
    assert merge_weights([_c(1, -50, {}), _c(2, 50, {})]) == pytest.approx([0.0, 1.0])


def test_merge_refuses_empty() -> None:
    with pytest.raises(ValueError, match="at least one"):
        merge([])


def test_merge_then_step_matches_torch_on_the_weighted_sum() -> None:
    # End to end: merging two pushes and stepping equals SGD with grad = the hand-made sum.
    d1, d2 = _delta(30), _delta(31)
    params0 = {n: torch.randn(t.shape, generator=torch.Generator().manual_seed(32)) for n, t in d1.items()}
    delta, _ = merge([_c(1, 100, d1), _c(2, 300, d2)], 800.0, H)
    params = {n: t.clone() for n, t in params0.items()}
    nesterov_step(params, {n: torch.zeros_like(t) for n, t in params0.items()}, delta, OuterConfig())
    by_hand = {n: (100 * d1[n] + 300 * d2[n]) / 800 for n in d1}
    for n, t in _torch_reference(params0, [by_hand], 0.7, 0.9).items():
        torch.testing.assert_close(params[n], t, rtol=1e-6, atol=1e-7)
