"""The pure parts of bench/parity.py: arms, byte accounting, loss curves, verdict, table.

No cluster is started here; bench/parity.py itself runs the clusters.
"""
from __future__ import annotations

import math

import pytest

from .bench_scripts import load_bench

parity = load_bench("parity.py", "bench_parity")


def _step(t: float, learner: int, loss: float, tokens: int = 100, **extra) -> dict:
    return {"t": t, "kind": "inner_step", "learner": learner, "loss": loss, "tokens": tokens, **extra}


# ----------------------------------------------------------------------------- arms
def _flag(flags: tuple[str, ...], name: str) -> str:
    """The value of the last occurrence of `name` (argparse's rule for a repeated flag)."""
    return flags[len(flags) - 1 - flags[::-1].index(name) + 1]


def test_every_arm_has_the_same_token_budget_and_its_defining_flags():
    arms = {a.name: a for a in parity.build_arms(learners=3, steps=100, sync_every=80)}
    assert list(arms)[:2] == ["sync-dp", "streaming"] and {"diloco-p1-fp32", "single"} <= set(arms)
    assert {a.learners * a.steps for a in arms.values()} == {300}
    assert arms["single"].learners == 1 and arms["single"].mode == "sync"
    target = arms["streaming"].flags
    assert [_flag(target, f) for f in ("--fragments", "--encoding", "--pull-encoding", "--overlap", "--sync-every",
                                       "--fragment-layout", "--final-round")] == \
        ["4", "int4", "delta-int4", "1", "80", "strided", "on"]
    p1 = arms["diloco-p1-fp32"].flags
    assert _flag(p1, "--fragments") == "1" and _flag(p1, "--encoding") == "fp32"


def test_each_lever_arm_is_the_streaming_arm_with_one_change():
    arms = {a.name: a for a in parity.build_arms(learners=2, steps=100, sync_every=80)}
    target = arms["streaming"].flags
    levers = {n: a for n, a in arms.items() if a.lever}
    assert {n.removeprefix("lever:") for n in levers} >= {"no-final-round", "balanced-fragments", "alpha-0.5",
                                                          "overlap-0", "h-half", "h-double", "nesterov", "outer-lr-2", "pull-bf16"}
    for name, arm in levers.items():
        assert arm.flags[:len(target)] == target, name
        assert len(arm.flags) > len(target) and arm.lever, name
    assert _flag(levers["lever:h-half"].flags, "--sync-every") == "40"
    assert _flag(levers["lever:no-final-round"].flags, "--final-round") == "off"


def test_arms_are_selected_by_name_and_levers_bring_the_streaming_arm():
    arms = parity.build_arms(learners=2, steps=100, sync_every=80)
    assert [a.name for a in parity.select_arms(arms, None)] == ["sync-dp", "streaming"]
    picked = [a.name for a in parity.select_arms(arms, "nesterov,single")]
    assert picked == ["sync-dp", "lever:nesterov", "single"]
    with_levers = [a.name for a in parity.select_arms(arms, "levers")]
    assert "streaming" in with_levers and sum(n.startswith("lever:") for n in with_levers) >= 8
    with pytest.raises(ValueError, match="--arms: unknown arm 'nope'"):
        parity.select_arms(arms, "nope")


@pytest.mark.parametrize("h", [12, 4, 8])
def test_sync_every_must_allow_four_fragments_and_overlap_one_at_half_h(h):
    with pytest.raises(ValueError, match="--sync-every"):
        parity.build_arms(learners=2, steps=10, sync_every=h)


def test_arm_configs_build_the_trainers_own_config():
    arm = {a.name: a for a in parity.build_arms(learners=4, steps=10, sync_every=80)}["streaming"]
    small = parity.MODELS["small"].flags
    train, syncer_argv = parity.arm_configs(arm, [*small, "--seed", "7", "--inner-lr", "0.002"])
    assert (train.fragments, train.encoding, train.overlap, train.sync_every) == (4, "int4", 1, 80)
    assert (train.fragment_layout, train.final_round, train.pull_encoding) == ("strided", True, "delta-int4")
    assert (train.model.n_layer, train.model.n_embd, train.batch_size, train.seed) == (4, 32, 8, 7)
    assert train.num_learners == 4 and train.inner_lr == 0.002 and train.mode == "decoupled"
    assert syncer_argv[syncer_argv.index("--fragments") + 1] == "4"
    assert syncer_argv[syncer_argv.index("--fragment-layout") + 1] == "strided"
    assert syncer_argv[syncer_argv.index("--mode") + 1] == "decoupled"


@pytest.mark.parametrize("flags", [["--mode", "sync"], ["--fragments=2"], ["-H", "8"], ["--encoding", "fp32"],
                                   ["--seed", "3"]])
def test_passthrough_may_not_redefine_the_arms(flags):
    with pytest.raises(ValueError, match="define the arms"):
        parity.check_passthrough(flags)


def test_passthrough_of_other_trainer_flags_is_allowed():
    parity.check_passthrough(["--inner-lr", "1e-3", "--outer-lr", "0.5", "--grace", "2"])


def test_quick_preset_and_explicit_values(capsys):
    args, passthrough = parity.parse_args(["--quick", "--steps", "50", "--", "--inner-lr", "0.001"])
    assert (args.learners, args.steps, args.sync_every) == (parity.QUICK["learners"], 50, parity.QUICK["sync_every"])
    assert passthrough == ["--inner-lr", "0.001"]
    with pytest.raises(SystemExit):
        parity.parse_args(["--sync-every", "30"])
    with pytest.raises(SystemExit):
        parity.parse_args(["--seeds", "0"])
    args, _ = parity.parse_args(["--model", "default"])
    preset = parity.MODELS["default"]
    assert (args.steps, args.sync_every, args.seeds) == (preset.steps, preset.sync_every, 5)
    assert args.steps // args.sync_every >= 20  # the budget: 20 outer rounds on the 0.83M model
    with pytest.raises(SystemExit):
        parity.parse_args(["--", "--overlap", "2"])
    capsys.readouterr()


# ----------------------------------------------------------------------------- bytes
def test_wire_accounting_splits_directions_and_payloads():
    events = [
        {"t": 0.0, "kind": "connect", "wire_bytes": 1000},
        {"t": 1.0, "kind": "push", "wire_bytes": 120},
        {"t": 1.1, "kind": "push", "wire_bytes": 80},
        {"t": 1.2, "kind": "pull", "wire_bytes": 400},
        _step(1.3, 1, 2.0),
        {"t": 9.0, "kind": "final_state", "counters": {"bytes_in": 260, "bytes_out": 1500}},
    ]
    w = parity.wire_accounting(events)
    assert (w["up"], w["down"], w["bytes"]) == (260, 1500, 1760)
    assert (w["push_up"], w["pull_down"], w["welcome_down"]) == (200, 400, 1000)
    assert (w["other_up"], w["other_down"]) == (60, 100)
    assert (w["pushes"], w["pulls"], w["mean_down"]) == (2, 1, 0)


def test_wire_accounting_of_sync_mode_counts_the_means_received():
    events = [_step(1.0, 1, 2.0, wire_bytes=500), _step(1.1, 2, 2.0, wire_bytes=500),
              {"t": 2.0, "kind": "final_state", "counters": {"bytes_in": 1100, "bytes_out": 1050}}]
    w = parity.wire_accounting(events)
    assert w["mean_down"] == 1000 and w["other_down"] == 50 and w["other_up"] == 1100


def test_wire_accounting_without_a_final_state_is_zero_not_a_guess():
    assert parity.wire_accounting([_step(1.0, 1, 2.0)])["bytes"] == 0


def test_tokens_processed_sums_inner_steps_only():
    events = [_step(1, 1, 2.0, tokens=512), _step(2, 2, 2.0, tokens=512), {"t": 3, "kind": "push", "tokens": 99}]
    assert parity.tokens_processed(events) == 1024


# ----------------------------------------------------------------------------- loss curve
def test_loss_curve_buckets_tokens_of_all_learners_in_time_order():
    # Two learners interleaved (given out of order): 8 steps of 100 tokens = 800 tokens.
    events = [_step(t, 1 + t % 2, loss) for t, loss in enumerate([8, 8, 6, 6, 4, 4, 2, 2])]
    curve = parity.loss_curve(list(reversed(events)), buckets=4)
    assert curve == [(100.0, 8.0), (300.0, 6.0), (500.0, 4.0), (700.0, 2.0)]


def test_loss_curve_leaves_empty_buckets_out_and_handles_no_steps():
    events = [_step(0, 1, 3.0, tokens=100), _step(1, 1, 1.0, tokens=300)]
    assert parity.loss_curve(events, buckets=4) == [(50.0, 3.0), (350.0, 1.0)]
    assert parity.loss_curve([], buckets=4) == []


def test_loss_curve_keeps_non_finite_losses_visible():
    curve = parity.loss_curve([_step(0, 1, "nan"), _step(1, 1, 1.0)], buckets=2)
    assert math.isnan(curve[0][1]) and curve[1][1] == 1.0


# ----------------------------------------------------------------------------- verdict and table
def _row(name: str, losses: dict[int, float], bpt: float, lever: str = "", learners: int = 2) -> dict:
    tokens = 1000
    return {"arm": name, "lever": lever, "learners": learners, "steps": 10, "tokens": tokens,
            "losses": losses, "final_loss": sum(losses.values()) / len(losses), "loss_sd": None,
            "bytes_per_token": bpt, "bytes_per_token_by_seed": {s: bpt for s in losses},
            "wall_seconds": 1.5, "elapsed_seconds": 2.0,
            "wire": {"bytes": bpt * tokens, "up": bpt * tokens / 4, "down": bpt * tokens * 3 / 4}}


def _rows(target: dict[int, float], target_bpt: float = 0.4, sync_bpt: float = 400.0) -> dict:
    sync = {0: 2.0, 1: 2.2, 2: 1.9}
    rows = {"sync-dp": _row("sync-dp", sync, sync_bpt), "streaming": _row("streaming", target, target_bpt),
            "lever:nesterov": _row("lever:nesterov", {s: v * 1.02 for s, v in target.items()}, target_bpt,
                                   lever="outer Nesterov")}
    parity.add_comparisons(rows)
    return rows


def test_the_gap_is_paired_by_seed_with_a_student_t_interval():
    rows = _rows({0: 2.02, 1: 2.2 * 1.01, 2: 1.9 * 1.005})
    gap = rows["streaming"]["gap"]
    assert gap["seeds"] == [0, 1, 2] and gap["gaps"] == pytest.approx([0.01, 0.01, 0.005])
    assert gap["mean"] == pytest.approx(0.025 / 3)
    half = 4.303 * gap["sd"] / math.sqrt(3)  # t(0.975, 2 df)
    assert (gap["low"], gap["high"]) == pytest.approx((gap["mean"] - half, gap["mean"] + half))
    assert rows["lever:nesterov"]["effect"]["mean"] == pytest.approx(0.02)  # the lever against streaming
    assert rows["sync-dp"]["gap"]["mean"] == 0 and rows["sync-dp"]["reduction_vs_sync"] == 1


def test_verdict_passes_within_one_percent_and_a_thousandfold_reduction_on_every_seed():
    v = parity.verdict(_rows({0: 2.019, 1: 2.2, 2: 1.9}, target_bpt=0.4))
    assert v["loss_ok"] and v["reduction_ok"] and v["met"] and v["seeds"] == 3
    assert v["loss_gap"] == pytest.approx(0.0095 / 3) and v["reduction"] == pytest.approx(1000.0)


def test_verdict_fails_each_goal_on_its_own():
    loss_missed = parity.verdict(_rows({0: 2.03, 1: 2.25, 2: 1.93}))
    assert not loss_missed["loss_ok"] and loss_missed["reduction_ok"] and not loss_missed["met"]
    bytes_missed = parity.verdict(_rows({0: 2.0, 1: 2.2, 2: 1.9}, target_bpt=0.5))
    assert bytes_missed["loss_ok"] and not bytes_missed["reduction_ok"] and bytes_missed["reduction"] == 800.0


def test_a_lower_loss_than_sync_dp_passes():
    v = parity.verdict(_rows({0: 1.9, 1: 2.1, 2: 1.8}))
    assert v["loss_ok"] and v["loss_gap"] < 0


def test_tables_and_verdict_lines_report_paired_gaps_and_reductions():
    rows = _rows({0: 2.03, 1: 2.2 * 1.015, 2: 1.9 * 1.015}, target_bpt=0.5)
    lines = parity.format_table(rows).splitlines()
    assert len(lines) == 2 + 3 and lines[0].startswith("arm")
    target = next(line for line in lines if line.startswith("streaming"))
    assert "+1.50% [+1.50, +1.50]" in target and "800x" in target and "0.500" in target
    levers = parity.format_levers(rows)
    assert "nesterov" in levers and "+2.00%" in levers and "outer Nesterov" in levers
    text = parity.format_verdict(parity.verdict(rows))
    assert "over 3 seeds: no (mean gap +1.50% [+1.50, +1.50])" in text and "(at least 800x)" in text


def test_combine_seeds_averages_the_figures_keeps_each_seed_and_the_mean_curve():
    def run(seed, loss, bpt):
        return {"arm": "a", "seed": seed, "final_loss": loss, "bytes_per_token": bpt, "wall_seconds": 2.0 * seed,
                "elapsed_seconds": 3.0, "wire": {"bytes": bpt * 10, "up": 1, "down": 3},
                "end_merge_weights": {0: 1.0}, "final_round": {0: 1.0}, "merges": 3, "sync_rounds": 0,
                "run_dir": f"r{seed}", "curve": [(1.0, loss), (2.0, loss / 2)] if seed == 1 else [(1.0, loss)]}
    row = parity.combine_seeds([run(1, 2.0, 0.4), run(2, 2.2, 0.6)])
    assert row["final_loss"] == pytest.approx(2.1) and row["bytes_per_token"] == pytest.approx(0.5)
    assert row["losses"] == {1: 2.0, 2: 2.2} and row["wire"]["bytes"] == pytest.approx(5)
    assert row["loss_sd"] == pytest.approx(0.1414, abs=1e-4)
    assert row["curve"] == [(1.0, pytest.approx(2.1))]  # the bucket only one seed has is left out
    assert [r["run_dir"] for r in row["per_seed"]] == ["r1", "r2"]


def test_final_round_counts_each_learners_share_once():
    def merge(fragment, *contribs, final=True):
        return {"t": 1.0, "kind": "merge", "fragment": fragment, "final": final,
                "contributors": [{"learner": l, "weight": w} for l, w in contribs]}
    events = [merge(0, (1, 0.5), (1, 0.5), (2, 0.5)), merge(1, (1, 0.6), (2, 0.4)), merge(2, (1, 1.0), final=False)]
    assert parity.final_round(events) == {0: 1.0, 1: 1.0}


# ----------------------------------------------------------------------------- corpus
def test_real_text_corpus_is_deterministic_and_large_enough(tmp_path):
    first, source = parity.python_docs_corpus(tmp_path)
    content = first.read_bytes()
    again, _ = parity.python_docs_corpus(tmp_path)
    assert again == first and again.read_bytes() == content
    assert len(content) > 100_000 and source
    assert parity.resolve_corpus("markov", tmp_path)[0] == "markov"


def test_the_code_corpus_is_python_source_of_a_fixed_size(tmp_path):
    path, source = parity.python_code_corpus(tmp_path, limit=200_000)
    text = path.read_bytes()
    assert len(text) == 200_000 and b"def " in text and b"import " in text and "*.py" in source
    assert parity.resolve_corpus("code", tmp_path)[0].endswith("python-code.txt")


def test_end_merge_weights_sum_the_merges_after_the_first_departure():
    def merge(t, fragment, *weights):
        return {"t": t, "kind": "merge", "fragment": fragment, "contributors": [{"weight": w} for w in weights]}
    events = [merge(1.0, 0, 0.5, 0.5), {"t": 2.0, "kind": "leave", "learner": 1},
              merge(2.1, 0, 0.6), merge(2.2, 1, 0.3), {"t": 2.5, "kind": "leave", "learner": 2}, merge(2.6, 0, 0.7)]
    assert parity.end_merge_weights(events) == {0: 1.3, 1: 0.3}
    assert parity.end_merge_weights([merge(1.0, 0, 1.0)]) == {}
