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
def test_every_arm_has_the_same_token_budget_and_its_defining_flags():
    arms = {a.name: a for a in parity.build_arms(learners=3, steps=100, sync_every=40)}
    assert list(arms) == ["sync-dp", "single", "decoupled-p1-fp32", "decoupled-p4-int4-t1"]
    assert {a.learners * a.steps for a in arms.values()} == {300}
    assert arms["single"].learners == 1 and arms["single"].mode == "sync"
    p4 = arms["decoupled-p4-int4-t1"].flags
    assert p4[p4.index("--fragments") + 1] == "4" and p4[p4.index("--encoding") + 1] == "int4"
    assert p4[p4.index("--overlap") + 1] == "1" and p4[p4.index("--sync-every") + 1] == "40"
    p1 = arms["decoupled-p1-fp32"].flags
    assert p1[p1.index("--fragments") + 1] == "1" and p1[p1.index("--encoding") + 1] == "fp32"


@pytest.mark.parametrize("h", [10, 4])
def test_sync_every_must_allow_four_fragments_and_overlap_one(h):
    with pytest.raises(ValueError, match="--sync-every"):
        parity.build_arms(learners=2, steps=10, sync_every=h)


def test_arm_configs_build_the_trainers_own_config():
    arm = parity.build_arms(learners=4, steps=10, sync_every=80)[3]
    train, syncer_argv = parity.arm_configs(arm, [*parity.MODEL_FLAGS, "--seed", "7", "--inner-lr", "0.002"])
    assert (train.fragments, train.encoding, train.overlap, train.sync_every) == (4, "int4", 1, 80)
    assert (train.model.n_layer, train.model.n_embd, train.batch_size, train.seed) == (1, 32, 8, 7)
    assert train.num_learners == 4 and train.inner_lr == 0.002 and train.mode == "decoupled"
    assert syncer_argv[syncer_argv.index("--fragments") + 1] == "4"
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
def _rows(sync_loss=2.0, target_loss=2.01, sync_bpt=400.0, target_bpt=0.4) -> dict:
    def row(name, loss, bpt, learners=2, steps=10):
        tokens = 1000
        return {"arm": name, "learners": learners, "steps": steps, "tokens": tokens, "final_loss": loss,
                "bytes_per_token": bpt, "wall_seconds": 1.5,
                "wire": {"bytes": bpt * tokens, "up": bpt * tokens / 4, "down": bpt * tokens * 3 / 4}}
    return {"sync-dp": row("sync-dp", sync_loss, sync_bpt), "single": row("single", 1.99, sync_bpt, 1, 20),
            "decoupled-p1-fp32": row("decoupled-p1-fp32", 2.1, 4.0),
            "decoupled-p4-int4-t1": row("decoupled-p4-int4-t1", target_loss, target_bpt)}


def test_verdict_passes_within_one_percent_and_a_thousandfold_reduction():
    v = parity.verdict(_rows(target_loss=2.019, target_bpt=0.4))
    assert v["loss_ok"] and v["reduction_ok"] and v["met"]
    assert v["loss_gap"] == pytest.approx(0.0095) and v["reduction"] == pytest.approx(1000.0)


def test_verdict_fails_each_goal_on_its_own():
    loss_missed = parity.verdict(_rows(target_loss=2.03))
    assert not loss_missed["loss_ok"] and loss_missed["reduction_ok"] and not loss_missed["met"]
    bytes_missed = parity.verdict(_rows(target_bpt=0.5))
    assert bytes_missed["loss_ok"] and not bytes_missed["reduction_ok"] and bytes_missed["reduction"] == 800.0


def test_a_lower_loss_than_sync_dp_passes():
    v = parity.verdict(_rows(target_loss=1.9))
    assert v["loss_ok"] and v["loss_gap"] < 0


def test_table_and_verdict_lines_report_gaps_and_reductions():
    rows = _rows(target_loss=2.03, target_bpt=0.5)
    parity.add_comparisons(rows)
    assert rows["sync-dp"]["gap_vs_sync"] == 0 and rows["sync-dp"]["reduction_vs_sync"] == 1
    table = parity.format_table(rows)
    lines = table.splitlines()
    assert len(lines) == 2 + 4 and lines[0].startswith("arm")
    target = next(line for line in lines if line.startswith("decoupled-p4-int4-t1"))
    assert "+1.50%" in target and "800.0x" in target and "0.500" in target
    text = parity.format_verdict(parity.verdict(rows))
    assert "within 1% of sync DP: no (gap +1.50%)" in text and "bytes/token: no (800x)" in text


# ----------------------------------------------------------------------------- corpus
def test_real_text_corpus_is_deterministic_and_large_enough(tmp_path):
    first, source = parity.python_docs_corpus(tmp_path)
    content = first.read_bytes()
    again, _ = parity.python_docs_corpus(tmp_path)
    assert again == first and again.read_bytes() == content
    assert len(content) > 100_000 and source
    assert parity.resolve_corpus("markov", tmp_path)[0] == "markov"


def test_end_merge_weights_sum_the_merges_after_the_first_departure():
    def merge(t, fragment, *weights):
        return {"t": t, "kind": "merge", "fragment": fragment, "contributors": [{"weight": w} for w in weights]}
    events = [merge(1.0, 0, 0.5, 0.5), {"t": 2.0, "kind": "leave", "learner": 1},
              merge(2.1, 0, 0.6), merge(2.2, 1, 0.3), {"t": 2.5, "kind": "leave", "learner": 2}, merge(2.6, 0, 0.7)]
    assert parity.end_merge_weights(events) == {0: 1.3, 1: 0.3}
    assert parity.end_merge_weights([merge(1.0, 0, 1.0)]) == {}


def test_combine_seeds_averages_the_verdicts_figures_and_keeps_each_seed():
    def run(seed, loss, bpt):
        return {"seed": seed, "final_loss": loss, "bytes_per_token": bpt, "wall_seconds": 2.0 * seed,
                "wire": {"bytes": bpt * 10, "up": 1, "down": 3}, "end_merge_weights": {0: 1.0}, "merges": 3,
                "sync_rounds": 0, "run_dir": f"r{seed}", "curve": [(1.0, loss)]}
    row = parity.combine_seeds([run(1, 2.0, 0.4), run(2, 2.2, 0.6)])
    assert row["final_loss"] == pytest.approx(2.1) and row["bytes_per_token"] == pytest.approx(0.5)
    assert row["final_losses"] == [2.0, 2.2] and row["seeds"] == [1, 2] and row["wire"]["bytes"] == pytest.approx(5)
    assert row["curve"] == [(1.0, 2.0)] and [r["run_dir"] for r in row["per_seed"]] == ["r1", "r2"]


def test_the_bytes_per_token_arms_are_extra_and_valid():
    four = parity.build_arms(2, 100, 80)
    every = parity.build_arms(2, 100, 80, extra=True)
    assert [a.name for a in every] == [a.name for a in four] + list(parity.EXTRA_ARMS)
    for arm in every[len(four):]:
        assert arm.learners * arm.steps == 200
        parity.arm_configs(arm, list(parity.MODEL_FLAGS))  # the trainer accepts every arm's flags
    streaming = every[-1]
    assert "--pull-encoding" in streaming.flags and "bf16" in streaming.flags
