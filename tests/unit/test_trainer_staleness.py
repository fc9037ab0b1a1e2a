"""Staleness policies (drop, discount, delayed Nesterov) and the grace policies (fixed, adaptive).

Pure arithmetic first, each expectation written out by hand from outer.py's docstring;
then the flags and their validation; then durability of the delayed-Nesterov accumulator;
then one merge end to end with each policy on an in-process Syncer (the ledger tests' rig).
"""
from __future__ import annotations

import math
import time
from collections import deque
from pathlib import Path

import pytest
import torch

from trainer.__main__ import build_parser
from trainer.cli_args import forward_flags, syncer_config
from trainer.config import SyncerConfig
from trainer.outer import (Contribution, OuterConfig, delayed_nesterov_step, merge, merge_weights, nesterov_step,
                           staleness_discount, staleness_factors)
from trainer.state import StateDir, save_tensors
from trainer.syncer import Syncer, grace_window, predict_arrival

from .test_trainer_ledger import (LR, MU, SECRET, TOKENS, Rig, initial_params, push_frame, sgd_reference,
                                  train_config, wait_until)

H = 4


def _c(learner: int, tokens: int, delta: dict[str, torch.Tensor], base: int = 0, steps: int = H) -> Contribution:
    return Contribution(learner, 1, 1, tokens, base, delta, steps)


def _delta(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"x": torch.randn(4, 3, generator=g), "y": torch.randn(6, generator=g)}


# ----------------------------------------------------------------------------- discount arithmetic

@pytest.mark.parametrize("s,expected", [(0, 1.0), (1, 1 / math.sqrt(2)), (3, 0.5), (8, 1 / 3), (99, 0.1),
                                        (-2, 1.0)])
def test_staleness_discount(s: int, expected: float) -> None:
    assert staleness_discount(s) == pytest.approx(expected, rel=1e-12)


def test_staleness_factors_by_policy() -> None:
    assert staleness_factors("drop", [0, 1, 3]) == [1.0, 1.0, 1.0]
    assert staleness_factors("delayed-nesterov", [0, 1, 3]) == [1.0, 1.0, 1.0]
    assert staleness_factors("discount", [0, 1, 3]) == pytest.approx([1.0, 2 ** -0.5, 0.5])
    with pytest.raises(ValueError, match="^staleness-policy:"):
        staleness_factors("forget", [0])


def test_discounted_merge_matches_hand_computation_and_is_not_renormalised() -> None:
    # Three live learners, 100 tokens per round each; learners 1 (fresh) and 2 (3 versions
    # stale) reported, learner 3 is absent: raw w = 100/300 each, discounts 1 and 1/2.
    d1, d2 = _delta(1), _delta(2)
    contribs = [_c(1, 100, d1, base=5), _c(2, 100, d2, base=2)]
    factors = staleness_factors("discount", [5 - 5, 5 - 2])
    delta, weights = merge(contribs, 300.0, H, factors)
    assert merge_weights(contribs, 300.0) == pytest.approx([1 / 3, 1 / 3])
    assert weights == pytest.approx([1 / 3, 1 / 6])
    assert sum(weights) == pytest.approx(0.5)  # not renormalised to the drop policy's 2/3 (nor to 1)
    for n in d1:
        torch.testing.assert_close(delta[n], d1[n] / 3 + d2[n] / 6)


def test_lone_stale_push_keeps_its_discount() -> None:
    # Renormalising would give it weight 1 back; the rule keeps w_i · d_i = 1 · 1/2.
    d = _delta(3)
    delta, weights = merge([_c(1, 100, d)], 100.0, H, [staleness_discount(3)])
    assert weights == pytest.approx([0.5])
    for n in d:
        torch.testing.assert_close(delta[n], d[n] / 2)


def test_discount_applies_on_top_of_round_scaling_and_equal_weights() -> None:
    d1, d2 = _delta(4), _delta(5)
    # All tokens 0: raw weights 1/2 each; push 1 spans two rounds (g = Δ/2) and is 1 version stale.
    contribs = [_c(1, 0, d1, steps=2 * H), _c(2, 0, d2)]
    delta, weights = merge(contribs, 1e9, H, [staleness_discount(1), 1.0])
    assert weights == pytest.approx([0.5 / math.sqrt(2), 0.5])
    for n in d1:
        torch.testing.assert_close(delta[n], 0.5 / math.sqrt(2) * d1[n] / 2 + 0.5 * d2[n])


def test_unit_factors_equal_the_drop_merge_bit_for_bit() -> None:
    contribs = [_c(1, 123, _delta(6)), _c(2, 456, _delta(7))]
    a, wa = merge(contribs, 1000.0, H)
    b, wb = merge(contribs, 1000.0, H, [1.0, 1.0])
    assert wa == wb
    for n in a:
        assert torch.equal(a[n], b[n])


def test_merge_refuses_a_factor_count_mismatch() -> None:
    with pytest.raises(ValueError, match="2 factors for 1"):
        merge([_c(1, 1, _delta(8))], 0.0, H, [1.0, 1.0])


# ----------------------------------------------------------------------------- delayed Nesterov

def test_delayed_nesterov_with_k1_is_nesterov_bit_for_bit() -> None:
    g = torch.Generator().manual_seed(9)
    shapes = {"a": (5, 3), "b": (11,)}
    p0 = {n: torch.randn(s, generator=g) for n, s in shapes.items()}
    grads = [{n: torch.randn(s, generator=g) * 0.1 for n, s in shapes.items()} for _ in range(6)]
    cfg = OuterConfig(lr=0.7, momentum=0.9)
    pa, ma = {n: t.clone() for n, t in p0.items()}, {n: torch.zeros_like(t) for n, t in p0.items()}
    pb, mb = {n: t.clone() for n, t in p0.items()}, {n: torch.zeros_like(t) for n, t in p0.items()}
    acc: dict[str, torch.Tensor] = {}
    count = 0
    for d in grads:
        nesterov_step(pa, ma, d, cfg)
        count, stepped = delayed_nesterov_step(pb, mb, acc, count, d, cfg, delay=1)
        assert stepped and count == 0 and acc == {}
        for n in shapes:
            assert torch.equal(pa[n], pb[n]) and torch.equal(ma[n], mb[n])


def test_delayed_nesterov_k2_sequence_by_hand() -> None:
    # lr = μ = 1/2 and dyadic values: every number below is exact in fp32.
    cfg = OuterConfig(lr=0.5, momentum=0.5)
    p, m, acc = {"w": torch.tensor([1.0])}, {"w": torch.zeros(1)}, {}
    count = 0
    steps = []
    for d in (0.5, 0.25, 1.0, 0.5):
        count, stepped = delayed_nesterov_step(p, m, acc, count, {"w": torch.tensor([d])}, cfg, delay=2)
        steps.append((p["w"].item(), m["w"].item(), count, stepped, acc.get("w", torch.zeros(1)).item()))
    assert steps == [
        # merge 1: c=1 < 2: A = 0.5; p = 1 - 0.5·0.5
        (0.75, 0.0, 1, False, 0.5),
        # merge 2: ḡ = (0.5 + 0.25)/2 = 0.375; buf = 0.375; p = 0.75 - 0.5·(0.25 + 0.5·0.375)
        (0.53125, 0.375, 0, True, 0.0),
        # merge 3: SGD: p = 0.53125 - 0.5·1.0; A = 1.0
        (0.03125, 0.375, 1, False, 1.0),
        # merge 4: ḡ = (1.0 + 0.5)/2 = 0.75; buf = 0.5·0.375 + 0.75 = 0.9375; p -= 0.5·(0.5 + 0.5·0.9375)
        (-0.453125, 0.9375, 0, True, 0.0),
    ]


def test_delayed_nesterov_k3_accumulates_two_then_steps_with_the_mean() -> None:
    cfg = OuterConfig(lr=1.0, momentum=0.5)
    p, m, acc = {"w": torch.tensor([0.0, 0.0])}, {"w": torch.tensor([2.0, -2.0])}, {}
    count = 0
    for d, want_count in (([1.0, 2.0], 1), ([3.0, 4.0], 2)):
        count, stepped = delayed_nesterov_step(p, m, acc, count, {"w": torch.tensor(d)}, cfg, delay=3)
        assert not stepped and count == want_count
    assert torch.equal(acc["w"], torch.tensor([4.0, 6.0]))
    assert torch.equal(m["w"], torch.tensor([2.0, -2.0])), "the momentum only moves on the k-th merge"
    assert torch.equal(p["w"], torch.tensor([-4.0, -6.0]))
    count, stepped = delayed_nesterov_step(p, m, acc, count, {"w": torch.tensor([2.0, 0.0])}, cfg, delay=3)
    assert stepped and count == 0 and acc == {}
    # ḡ = ([4, 6] + [2, 0]) / 3 = [2, 2]; buf = 0.5·[2, -2] + [2, 2] = [3, 1];
    # p = [-4, -6] - 1·([2, 0] + 0.5·[3, 1]) = [-7.5, -6.5]
    assert torch.equal(m["w"], torch.tensor([3.0, 1.0]))
    assert torch.equal(p["w"], torch.tensor([-7.5, -6.5]))


def test_delayed_nesterov_count_above_k_steps_with_the_mean_of_what_it_holds() -> None:
    # k lowered from 4 to 2 across a restart with 3 Δs accumulated: the next merge steps,
    # averaging the 4 Δs it really has.
    cfg = OuterConfig(lr=1.0, momentum=0.5)
    p, m, acc = {"w": torch.tensor([0.0])}, {"w": torch.zeros(1)}, {"w": torch.tensor([6.0])}
    count, stepped = delayed_nesterov_step(p, m, acc, 3, {"w": torch.tensor([2.0])}, cfg, delay=2)
    assert stepped and count == 0
    assert torch.equal(m["w"], torch.tensor([2.0]))          # (6 + 2) / 4
    assert torch.equal(p["w"], torch.tensor([-3.0]))         # 0 - (2 + 0.5·2)


def test_delayed_nesterov_does_not_touch_the_delta_and_refuses_k0() -> None:
    d = {"w": torch.tensor([1.0])}
    acc: dict[str, torch.Tensor] = {}
    delayed_nesterov_step({"w": torch.zeros(1)}, {"w": torch.zeros(1)}, acc, 0, d, OuterConfig(), delay=3)
    acc["w"].add_(5.0)
    assert torch.equal(d["w"], torch.tensor([1.0])), "the accumulator must not alias the merged Δ"
    with pytest.raises(ValueError, match="^nesterov-delay:"):
        delayed_nesterov_step({"w": torch.zeros(1)}, {"w": torch.zeros(1)}, {}, 0, d, OuterConfig(), delay=0)


# ----------------------------------------------------------------------------- grace estimator

def test_predict_arrival_needs_two_pushes() -> None:
    assert predict_arrival([]) is None
    assert predict_arrival([10.0]) is None


def test_predict_arrival_last_plus_median_interval_plus_mad() -> None:
    assert predict_arrival([0.0, 1.0, 2.0, 3.0]) == pytest.approx(4.0)
    # intervals 1.0, 1.2, 0.8: median 1.0, |deviations| 0, 0.2, 0.2 -> MAD 0.2
    assert predict_arrival([0.0, 1.0, 2.2, 3.0]) == pytest.approx(4.2)
    # even count of intervals 1, 2, 3, 10: median 2.5, deviations 1.5, 0.5, 0.5, 7.5 -> MAD 1.0
    assert predict_arrival([0.0, 1.0, 3.0, 6.0, 16.0]) == pytest.approx(19.5)
    assert predict_arrival(deque([5.0, 5.5], maxlen=6)) == pytest.approx(6.0)


def test_grace_window_waits_for_the_latest_predicted_learner() -> None:
    closes, why = grace_window(100.0, 0.5, {2: 100.1, 3: 100.21})
    assert closes == pytest.approx(100.21) and why == "predicted learner 3 at +0.21 s"


def test_grace_window_is_capped() -> None:
    closes, why = grace_window(100.0, 0.5, {3: 101.0})
    assert closes == pytest.approx(100.5) and why == "cap 0.50 s (predicted learner 3 at +1.00 s)"


def test_grace_window_no_wait_without_estimate_or_when_overdue_or_nobody_missing() -> None:
    assert grace_window(100.0, 0.5, {}) == (100.0, "all live learners reported")
    assert grace_window(100.0, 0.5, {2: None}) == (100.0, "no estimate for learner 2: no wait")
    closes, why = grace_window(100.0, 0.5, {2: 99.7})
    assert closes == 100.0 and why == "learner 2 overdue (predicted at -0.30 s): no wait"


def test_grace_window_learner_without_estimate_adds_nothing_to_one_with() -> None:
    closes, why = grace_window(100.0, 0.5, {2: None, 3: 100.3})
    assert closes == pytest.approx(100.3) and why == "predicted learner 3 at +0.30 s"


def test_grace_window_zero_cap_never_waits() -> None:
    assert grace_window(100.0, 0.0, {3: 100.2})[0] == 100.0


# ----------------------------------------------------------------------------- config and flags

@pytest.mark.parametrize("kwargs,match", [
    ({"staleness_policy": "forget"}, "^staleness-policy: must be one of drop, discount, delayed-nesterov"),
    ({"grace_policy": "psychic"}, "^grace-policy: must be one of fixed, adaptive"),
    ({"staleness_policy": "delayed-nesterov", "nesterov_delay": 0}, "^nesterov-delay: must be an integer >= 1"),
    ({"staleness_policy": "delayed-nesterov", "nesterov_delay": 1.5}, "^nesterov-delay:"),
    ({"nesterov_delay": 3}, "^nesterov-delay: 3 needs --staleness-policy delayed-nesterov"),
])
def test_syncer_config_policy_validation_names_the_flag(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        SyncerConfig(**kwargs)


def test_syncer_config_policy_defaults_are_todays_behaviour() -> None:
    cfg = SyncerConfig()
    assert (cfg.staleness_policy, cfg.nesterov_delay, cfg.grace_policy) == ("drop", 1, "fixed")


def _run_parser():
    parser = build_parser()
    return parser, parser._subparsers._group_actions[0].choices["run"]  # type: ignore[union-attr]


def test_policy_flags_reach_the_syncer_config_and_are_forwarded() -> None:
    parser, run_parser = _run_parser()
    args = parser.parse_args(["run", "--staleness-policy", "delayed-nesterov", "--nesterov-delay", "3",
                              "--grace-policy", "adaptive", "--grace", "0.8"])
    cfg = syncer_config(args, run_parser, "unused")
    assert (cfg.staleness_policy, cfg.nesterov_delay, cfg.grace_policy, cfg.grace) == \
        ("delayed-nesterov", 3, "adaptive", 0.8)
    # `run` hands them to its syncer subprocess: the syncer parser must read them back.
    flags = forward_flags(args)
    again = parser.parse_args(["syncer", "--state-dir", "x", *flags])
    assert (again.staleness_policy, again.nesterov_delay, again.grace_policy) == ("delayed-nesterov", 3, "adaptive")


@pytest.mark.parametrize("argv,flag", [
    (["--staleness-policy", "forget"], "--staleness-policy"),
    (["--grace-policy", "psychic"], "--grace-policy"),
    (["--nesterov-delay", "0"], "--nesterov-delay"),
    (["--nesterov-delay", "two"], "--nesterov-delay"),
])
def test_bad_policy_flags_are_refused_naming_the_flag(argv: list[str], flag: str, capsys) -> None:
    parser, _ = _run_parser()
    with pytest.raises(SystemExit) as exc:
        parser.parse_args(["run", *argv])
    assert exc.value.code == 2
    assert flag in capsys.readouterr().err


def test_nesterov_delay_without_its_policy_is_refused_before_anything_starts(capsys) -> None:
    parser, run_parser = _run_parser()
    args = parser.parse_args(["run", "--nesterov-delay", "3"])
    with pytest.raises(SystemExit):
        syncer_config(args, run_parser, "unused")
    assert "nesterov-delay: 3 needs --staleness-policy delayed-nesterov" in capsys.readouterr().err


# ----------------------------------------------------------------------------- durability

def test_fragment_file_round_trips_the_accumulator(tmp_path: Path) -> None:
    store = StateDir(tmp_path)
    params = {"a": torch.randn(3, 2), "b": torch.randn(4)}
    momentum = {n: torch.randn_like(t) for n, t in params.items()}
    accum = {n: torch.randn_like(t) for n, t in params.items()}
    store.write_fragment(0, params, momentum, 5, ["1:1:1"], accum, 2)
    f = store.read_fragment_file(0)
    assert f is not None and (f.version, f.applied, f.accum_count) == (5, ["1:1:1"], 2)
    for n in params:
        assert torch.equal(f.params[n], params[n]) and torch.equal(f.momentum[n], momentum[n])
        assert torch.equal(f.accum[n], accum[n])
    # The 4-tuple reader is unchanged.
    p, m, version, applied = store.read_fragment(0)
    assert set(p) == set(params) and set(m) == set(params) and (version, applied) == (5, ["1:1:1"])

    # A momentum step empties the accumulator: nothing of it is written any more.
    store.write_fragment(0, params, momentum, 6, ["1:1:1", "2:1:1"], {}, 0)
    f = store.read_fragment_file(0)
    assert f.accum == {} and f.accum_count == 0 and f.version == 6


def test_fragment_file_written_without_accumulator_loads_with_an_empty_one(tmp_path: Path) -> None:
    store = StateDir(tmp_path)
    # Exactly what the code before the accumulator wrote: params, momentum, version, applied.
    save_tensors(store.fragment_path(0), {"param/a": torch.ones(2), "momentum/a": torch.zeros(2)},
                 {"version": 3, "applied": ["1:1:1"]})
    f = store.read_fragment_file(0)
    assert f is not None and f.accum == {} and f.accum_count == 0 and f.version == 3
    assert torch.equal(f.params["a"], torch.ones(2))


# ----------------------------------------------------------------------------- end to end

class PolicyRig(Rig):
    def make(self, quorum: int = 1, grace: float = 0.0, max_staleness: int = 4, fragments: int = 1,
             **policy) -> Syncer:
        policy.setdefault("momentum_warmup", 0.0)  # the arithmetic is checked against torch's step
        cfg = SyncerConfig(host="127.0.0.1", port=0, state_dir=str(self.state_dir), outer_lr=LR,
                           outer_momentum=MU, quorum=quorum, grace=grace, max_staleness=max_staleness, **policy)
        s = Syncer(cfg, train_config(fragments), SECRET, str(self.run_dir))
        self.syncers.append(s)
        return s


@pytest.fixture
def prig(tmp_path: Path):
    torch.set_num_threads(1)
    r = PolicyRig(tmp_path)
    try:
        yield r
    finally:
        r.close()


def test_drop_policy_merge_event_logs_policies_and_unit_discounts(prig: PolicyRig) -> None:
    s = prig.start()
    c = prig.client(s)
    c.hello(1, "n")
    assert c.send(push_frame(1, 1, 1, prig.delta(s, 1))).header["status"] == "accepted"
    wait_until(s, lambda: s.frags[0].version >= 1, "the merge")
    s.stop()
    [m] = prig.events("merge")
    assert (m["staleness_policy"], m["grace_policy"]) == ("drop", "fixed")
    assert m["outer"] == {"step": "nesterov", "momentum_step": True, "round_fraction": 1.0, "momentum": MU}
    assert m["grace"]["policy"] == "fixed" and m["grace"]["why"] == "1 of quorum 1 reported"
    [contrib] = m["contributors"]
    assert (contrib["raw_weight"], contrib["discount"], contrib["weight"], contrib["staleness"]) == (1.0, 1.0, 1.0, 0)
    start = prig.events("process_start")[-1]["syncer"]
    assert (start["staleness_policy"], start["nesterov_delay"], start["grace_policy"]) == ("drop", 1, "fixed")


def test_discount_policy_end_to_end(prig: PolicyRig) -> None:
    s = prig.start(staleness_policy="discount", max_staleness=1)
    c = prig.client(s)
    c.hello(1, "n")
    d1, d2, d3 = (prig.delta(s, i) for i in (1, 2, 3))
    assert c.send(push_frame(1, 1, 1, d1, base_version=0)).header["status"] == "accepted"
    wait_until(s, lambda: s.frags[0].version >= 1, "merge 1")
    assert c.send(push_frame(1, 1, 2, d2, base_version=0)).header["status"] == "accepted"  # 1 version stale
    wait_until(s, lambda: s.frags[0].version >= 2, "merge 2")
    # Beyond --max-staleness the push is still dropped: the cap holds under discount.
    assert c.send(push_frame(1, 1, 3, d3, base_version=0)).header["status"] == "stale"
    # Merge 2 is a lone push discounted to weight 1/√2: a partial round, which carries that
    # share of the momentum (--momentum-unit round): p ← p − lr·((1+μ)·g + μ²·c·buf).
    w = 2 ** -0.5
    c = (1 - MU ** w) / (1 - MU)
    after_one = sgd_reference(initial_params(), [d1])
    for n, t in after_one.items():
        expected = t - LR * ((1 + MU) * d2[n] * w + MU * MU * c * d1[n])
        torch.testing.assert_close(s.frags[0].params[n], expected, rtol=1e-5, atol=1e-7)
    s.stop()
    merges = prig.events("merge")
    assert [m["staleness_policy"] for m in merges] == ["discount", "discount"]
    got = [(x["staleness"], x["raw_weight"], x["discount"], x["weight"]) for m in merges for x in m["contributors"]]
    assert got == [(0, 1.0, 1.0, 1.0), (1, 1.0, 0.7071, 0.7071)]


def test_delayed_nesterov_end_to_end_survives_a_crash_between_momentum_steps(prig: PolicyRig) -> None:
    policy = {"staleness_policy": "delayed-nesterov", "nesterov_delay": 2}
    s = prig.start(**policy)
    c = prig.client(s)
    c.hello(1, "n")
    d1, d2 = prig.delta(s, 1), prig.delta(s, 2)
    assert c.send(push_frame(1, 1, 1, d1)).header["status"] == "accepted"
    wait_until(s, lambda: s.frags[0].version >= 1, "merge 1")
    assert s.frags[0].accum_count == 1
    prig.crash(s)  # as SIGKILL: no final write; only what the merge committed survives

    s2 = prig.start(**policy)
    frag = s2.frags[0]
    assert frag.version == 1 and frag.accum_count == 1
    for n, t in d1.items():
        assert torch.equal(frag.accum[n], t), "the accumulator must come back from the fragment file"
    assert prig.events("state_loaded")[-1]["accum_counts"] == [1]
    c2 = prig.client(s2)
    assert c2.hello(1, "n").header["incarnation"] == 1
    assert c2.send(push_frame(1, 1, 2, d2, base_version=1)).header["status"] == "accepted"
    wait_until(s2, lambda: s2.frags[0].version >= 2, "merge 2")
    assert frag.accum_count == 0 and frag.accum == {}

    # The same two merges without any crash, from the pure function.
    params = initial_params()
    params = {n: params[n].clone() for n in d1}
    mom = {n: torch.zeros_like(t) for n, t in params.items()}
    acc: dict[str, torch.Tensor] = {}
    count = 0
    for d in (d1, d2):
        count, _ = delayed_nesterov_step(params, mom, acc, count, d, OuterConfig(LR, MU), 2)
    for n in params:
        assert torch.equal(frag.params[n], params[n]) and torch.equal(frag.momentum[n], mom[n])
    s2.stop()
    outers = [m["outer"] for m in prig.events("merge")]
    assert outers == [
        {"step": "delayed-nesterov", "delay": 2, "momentum_step": False, "accum_count": 1, "averaged": 0},
        {"step": "delayed-nesterov", "delay": 2, "momentum_step": True, "accum_count": 0, "averaged": 2},
    ]


def test_accumulator_is_discarded_and_counted_when_the_policy_changes(prig: PolicyRig) -> None:
    s = prig.start(staleness_policy="delayed-nesterov", nesterov_delay=3)
    c = prig.client(s)
    c.hello(1, "n")
    assert c.send(push_frame(1, 1, 1, prig.delta(s, 1))).header["status"] == "accepted"
    wait_until(s, lambda: s.frags[0].version >= 1, "merge 1")
    prig.crash(s)
    s2 = prig.make()  # drop policy now
    assert s2.frags[0].accum_count == 0 and s2.frags[0].accum == {}
    assert s2.counters["accumulators_discarded"] == 1


def _two_learners(prig: PolicyRig, **kw) -> tuple[Syncer, object, object]:
    s = prig.start(quorum=1, grace_policy="adaptive", **kw)
    c1, c2 = prig.client(s), prig.client(s)
    c1.hello(1, "n1")
    c2.hello(2, "n2")
    return s, c1, c2


def _history(s: Syncer, learner: int, predicted_in: float) -> float:
    """Give `learner` two past pushes one second apart, so it is predicted `predicted_in` s from now."""
    now = time.monotonic()
    with s.cond:
        s.frags[0].arrivals.note(learner, 1, now + predicted_in - 2.0)
        s.frags[0].arrivals.note(learner, 1, now + predicted_in - 1.0)
    return now


def test_adaptive_grace_waits_for_a_predicted_learner_then_merges_without_it(prig: PolicyRig) -> None:
    s, c1, _ = _two_learners(prig, grace=5.0)
    _history(s, 2, 0.6)
    started = time.monotonic()
    assert c1.send(push_frame(1, 1, 1, prig.delta(s, 1))).header["status"] == "accepted"
    wait_until(s, lambda: s.frags[0].version >= 1, "the merge after the predicted arrival")
    elapsed = time.monotonic() - started
    s.stop()
    [m] = prig.events("merge")
    assert m["reason"] == "grace" and [x["learner"] for x in m["contributors"]] == [1]
    g = m["grace"]
    assert g["policy"] == "adaptive" and g["missing"] == [2]
    assert g["why"].startswith("predicted learner 2 at +0.") and g["why"].endswith(" s")
    assert 0.0 < g["window"] <= 0.61 and g["waited"] >= g["window"]
    assert elapsed < 4.0, "it waited the prediction, not the cap"


def test_adaptive_grace_includes_a_learner_that_arrives_as_predicted(prig: PolicyRig) -> None:
    s, c1, c2 = _two_learners(prig, grace=5.0)
    _history(s, 2, 3.0)
    assert c1.send(push_frame(1, 1, 1, prig.delta(s, 1))).header["status"] == "accepted"
    assert c2.send(push_frame(2, 1, 1, prig.delta(s, 2))).header["status"] == "accepted"
    wait_until(s, lambda: s.frags[0].version >= 1, "the merge")
    s.stop()
    [m] = prig.events("merge")
    # With --grace-policy fixed and quorum 1, learner 1 would have merged alone at once.
    assert m["reason"] == "quorum" and sorted(x["learner"] for x in m["contributors"]) == [1, 2]
    assert m["grace"]["why"] == "all live learners reported"
    assert [x["weight"] for x in m["contributors"]] == [0.5, 0.5]


def test_adaptive_grace_is_capped(prig: PolicyRig) -> None:
    s, c1, _ = _two_learners(prig, grace=0.3)
    _history(s, 2, 30.0)
    assert c1.send(push_frame(1, 1, 1, prig.delta(s, 1))).header["status"] == "accepted"
    wait_until(s, lambda: s.frags[0].version >= 1, "the capped merge")
    s.stop()
    [m] = prig.events("merge")
    assert m["reason"] == "grace" and m["grace"]["why"].startswith("cap 0.30 s (predicted learner 2 at +")
    assert m["grace"]["window"] == pytest.approx(0.3) and m["grace"]["waited"] >= 0.3


def test_adaptive_grace_without_estimate_merges_at_quorum(prig: PolicyRig) -> None:
    s, c1, _ = _two_learners(prig, grace=5.0)
    assert c1.send(push_frame(1, 1, 1, prig.delta(s, 1))).header["status"] == "accepted"
    wait_until(s, lambda: s.frags[0].version >= 1, "the merge")
    s.stop()
    [m] = prig.events("merge")
    assert m["reason"] == "quorum" and m["grace"]["why"] == "no estimate for learner 2: no wait"
    assert m["grace"]["window"] == 0.0
    # One of two live learners, a full round of tokens: weight 1/2.
    assert m["contributors"][0]["tokens"] == TOKENS and m["contributors"][0]["weight"] == 0.5


# ----------------------------------------------------------------------------- momentum warm-up

def test_warmup_auto_is_the_momentum_horizon_and_flags_parse() -> None:
    assert SyncerConfig().warmup_rounds == pytest.approx(10.0)  # 1 / (1 - 0.9)
    assert SyncerConfig(outer_momentum=0.5).warmup_rounds == pytest.approx(2.0)
    assert SyncerConfig(momentum_warmup=0.0).warmup_rounds == 0.0
    with pytest.raises(ValueError, match="^momentum-warmup:"):
        SyncerConfig(momentum_warmup=-1.0)
    parser = build_parser()
    for value, expected, forwarded in (("auto", None, "auto"), ("3.5", 3.5, "3.5"), ("0", 0.0, "0.0")):
        args = parser.parse_args(["syncer", "--state-dir", "s", "--momentum-warmup", value])
        assert syncer_config(args, parser, "s").momentum_warmup == expected
        flags = forward_flags(args)
        assert flags[flags.index("--momentum-warmup") + 1] == forwarded
    with pytest.raises(SystemExit):
        parser.parse_args(["syncer", "--state-dir", "s", "--momentum-warmup", "-1"])


def test_momentum_ramps_up_over_the_warmup_rounds(prig: PolicyRig) -> None:
    # Warm-up over 2 rounds: the first merge has μ = 0 (a plain step of lr·Δ), the second
    # μ = 0.9 · 1/2, the third the full 0.9.
    s = prig.start(momentum_warmup=2.0)
    c = prig.client(s)
    c.hello(1, "n")
    deltas = [prig.delta(s, i) for i in (1, 2, 3)]
    for i, d in enumerate(deltas):
        assert c.send(push_frame(1, 1, i + 1, d, base_version=i)).header["status"] == "accepted"
        wait_until(s, lambda i=i: s.frags[0].version >= i + 1, f"merge {i + 1}")
    s.stop()
    assert [m["outer"]["momentum"] for m in prig.events("merge")] == [0.0, pytest.approx(0.45), MU]
    p, buf = initial_params(), {n: torch.zeros_like(t) for n, t in initial_params().items()}
    for mu, d in zip((0.0, 0.45, MU), deltas):
        for n in d:
            buf[n] = mu * buf[n] + d[n]
            p[n] = p[n] - LR * (d[n] + mu * buf[n])
    for n, t in p.items():
        torch.testing.assert_close(s.frags[0].params[n], t, rtol=1e-5, atol=1e-7)
    assert s.frags[0].rounds == pytest.approx(3.0)
