"""The goodput simulator (chaos/simulate): its invariants, the paper's figures, the CLI.

Pure computation, no processes: the whole file runs in a few seconds."""
from __future__ import annotations

import json
import math

import pytest

from chaos.simulate import PAPER, RunInputs, ScaleInputs, predict_schedule, simulate
from chaos.simulate.cli import SCALE_FIELDS, main
from chaos.simulate.decoupled import unpushed_steps
from chaos.simulate.dists import Empirical, ExpWeibull, Fixed, LogNormal, parse_dist
from chaos.simulate.inputs import YEAR
from chaos.simulate.result import SYSTEMS
from faults import Kill, Partition, Schedule

PAPER_FIGURES = {"decoupled": 0.88, "elastic-dp": 0.58, "dp": 0.27}  # arXiv 2604.21428, 1.2M chips, M=8
# its learner ablation at 1.2M chips (Table 11, as summaries of the paper quote it): M -> decoupled goodput
PAPER_ABLATION = {2: 0.70, 4: 0.82, 8: 0.88, 16: 0.93}


def short(inp: ScaleInputs, failures: int = 3000) -> ScaleInputs:
    """The same inputs over a window holding about `failures` cluster failures (fast)."""
    return inp.replace(duration=failures / inp.cluster_rate)


def goodputs(inp: ScaleInputs) -> dict[str, float]:
    return {s: r.goodput for s, r in simulate(inp).items()}


def run_cli(capsys, *argv: str) -> str:
    assert main(list(argv)) == 0
    return capsys.readouterr().out


# ----------------------------------------------------------------------------- invariants
def test_without_failures_every_system_keeps_all_its_goodput():
    results = simulate(PAPER.replace(mtbi_years=math.inf))
    assert {s: r.goodput for s, r in results.items()} == {s: 1.0 for s in SYSTEMS}
    assert all(r.info["failures"] == 0 for r in results.values())


def test_a_huge_mtbi_loses_almost_nothing():
    assert all(g > 0.9999 for g in goodputs(PAPER.replace(mtbi_years=1e9, duration=YEAR)).values())


@pytest.mark.parametrize("chips", [10_000, 1_200_000, 10_000_000])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_doubling_the_mtbi_never_lowers_goodput(chips, seed):
    base = short(PAPER.replace(chips=chips, seed=seed))
    once, twice = goodputs(base), goodputs(base.replace(mtbi_years=2.0))
    for system in SYSTEMS:
        assert twice[system] >= once[system], system


@pytest.mark.parametrize("chips", [1_000, 100_000, 1_200_000, 5_000_000])
@pytest.mark.parametrize("seed", [0, 3])
def test_non_elastic_data_parallel_never_beats_elastic(chips, seed):
    for inp in (PAPER, PAPER.replace(checkpoint_every=30.0, slice_return=LogNormal(60, 300))):
        g = goodputs(short(inp.replace(chips=chips, seed=seed), failures=1500))
        assert g["dp"] <= g["elastic-dp"]


def test_goodput_and_the_losses_add_up_to_one():
    for system, r in simulate(short(PAPER)).items():
        assert r.goodput + sum(r.fractions().values()) == pytest.approx(1.0), system


def test_decoupled_loses_half_a_round_per_kill_whatever_the_fragments():
    for fragments in (1, 4, 24):
        mean = sum(unpushed_steps(1000 + k / 10, 24, fragments) for k in range(2400)) / 2400
        assert mean == pytest.approx(12, abs=0.1)
    assert unpushed_steps(5, 24, 1) == 5  # before its first push, all it made since the start


# ----------------------------------------------------------------------------- the paper
def test_the_paper_figures_at_the_paper_inputs():
    g = goodputs(PAPER)
    for system, figure in PAPER_FIGURES.items():
        assert abs(g[system] - figure) <= 0.05, f"{system}: {g[system]:.3f} against the paper's {figure}"


@pytest.mark.parametrize("learners", sorted(PAPER_ABLATION))
def test_the_papers_learners_reproduce_its_learner_ablation(learners):
    g = simulate(PAPER.replace(learners=learners))["decoupled"].goodput
    assert abs(g - PAPER_ABLATION[learners]) <= 0.05, f"M={learners}: {g:.3f}"


def test_islands_learners_on_the_paper_cluster_also_meet_the_headline_figure():
    g = simulate(PAPER.replace(learner_failure="kill"))["decoupled"].goodput
    assert abs(g - PAPER_FIGURES["decoupled"]) <= 0.05


def test_the_papers_learner_is_an_elastic_job_on_its_own_chips():
    one = simulate(PAPER.replace(learners=1, duration=2e5))  # fixed recovery times: the very same run
    assert one["decoupled"].goodput == pytest.approx(one["elastic-dp"].goodput, abs=1e-12)
    # the paper's rule: M learners do as well as one elastic job on M times fewer chips
    eight = simulate(PAPER)["decoupled"].goodput
    alone = simulate(PAPER.replace(chips=PAPER.chips // 8, learners=1))["elastic-dp"].goodput
    assert eight == pytest.approx(alone, abs=0.01)


def test_only_the_mean_reconfiguration_moves_goodput():
    shaped = ExpWeibull(7.0, 1.5, 3.0)  # skewed, mean ~10 s
    fixed = goodputs(short(PAPER.replace(reconfigure=Fixed(shaped.mean())), failures=6000))
    weibull = goodputs(short(PAPER.replace(reconfigure=shaped), failures=6000))
    assert weibull["elastic-dp"] == pytest.approx(fixed["elastic-dp"], abs=0.01)
    assert weibull["decoupled"] == pytest.approx(fixed["decoupled"], abs=0.01)


# ----------------------------------------------------------------------------- seeds and the CLI
def test_a_seed_reproduces_a_run_exactly_and_another_seed_differs(capsys):
    argv = ["--chips", "100000", "--learners", "8", "--mtbi-years", "1", "--duration", "300000", "--json"]
    first, again = run_cli(capsys, *argv, "--seed", "4"), run_cli(capsys, *argv, "--seed", "4")
    assert first == again
    assert run_cli(capsys, *argv, "--seed", "5") != first


def test_json_keys_are_exactly_the_systems_each_with_a_goodput_fraction(capsys):
    doc = json.loads(run_cli(capsys, "--chips", "1.2e6", "--learners", "8", "--mtbi-years", "1", "--json"))
    assert list(doc) == list(SYSTEMS)
    assert all(0 <= doc[s]["goodput"] <= 1 for s in SYSTEMS)
    assert all(set(doc[s]["lost"]) >= {"stall", "recovery", "rollback", "lost_with_learner", "stale_pushes"}
               for s in SYSTEMS)


@pytest.mark.parametrize("argv, flag", [
    (["--chips", "0"], "--chips"),
    (["--mtbi-years", "-1"], "--mtbi-years"),
    (["--learners", "x"], "--learners"),
    (["--fragments", "5"], "--fragments"),
    (["--recovery-dp", "gamma:3"], "--recovery-dp"),
    (["--recovery-decoupled", "lognormal:2,1"], "--recovery-decoupled"),
    (["--chips-per-learner", "7"], "--chips-per-learner"),
    (["--quorum", "9"], "--quorum"),
    (["--pace", "0.5"], "--pace"),
    (["--learner-failure", "die"], "--learner-failure"),
    (["--reconfigure", "expweibull:10,0,1"], "--reconfigure"),
])
def test_a_bad_flag_is_an_error_naming_it(capsys, argv, flag):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    assert flag in capsys.readouterr().err


def test_help_mentions_every_input(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    text = capsys.readouterr().out
    for field in SCALE_FIELDS:
        assert "--" + field.replace("_", "-") in text, field
    for flag in ("--preset", "--schedule", "--from-run", "--sweep-chips", "--plot", "--sensitivity",
                 "--pace", "--heartbeat-timeout", "--inputs-json", "elastic-dp", "lognormal:MEDIAN,P90"):
        assert flag in text, flag


def test_the_table_prints_the_inputs_and_their_assumptions(capsys):
    out = run_cli(capsys, "--chips", "50000", "--learners", "4")
    assert "--reconfigure" in out and "Calibrated" in out and "goodput" in out


def test_sweep_json_keys_are_the_systems(capsys):
    doc = json.loads(run_cli(capsys, "--sweep-chips", "--json", "--duration", "86400"))
    assert list(doc) == list(SYSTEMS)
    assert doc["decoupled"]["chips"][0] == 1000 and doc["decoupled"]["chips"][-1] == 10 ** 7


# ----------------------------------------------------------------------------- distributions
def test_recovery_specs():
    assert parse_dist("fixed:60") == Fixed(60.0)
    lognormal = parse_dist("lognormal:0.32,1.0")
    assert isinstance(lognormal, LogNormal) and lognormal.mean() > 0.32
    with pytest.raises(ValueError, match="MEDIAN <= P90"):
        parse_dist("lognormal:1,0.5")
    weibull = parse_dist("expweibull:10,2,1")  # A=1: a plain Weibull, mean 10 * Gamma(1.5)
    assert weibull == ExpWeibull(10.0, 2.0, 1.0)
    assert weibull.mean() == pytest.approx(10 * math.gamma(1.5), rel=1e-4)
    assert parse_dist(weibull.spec()) == weibull
    assert ExpWeibull(10.0, 1.0, 1.0).scaled(2).mean() == pytest.approx(20, rel=1e-4)  # an exponential


def test_empirical_reads_a_list_or_bench_recovery_output(tmp_path):
    plain = tmp_path / "seconds.json"
    plain.write_text("[1, 2, 3]")
    assert parse_dist(f"empirical:{plain}") == Empirical((1.0, 2.0, 3.0), str(plain))
    rec = tmp_path / "recovery.json"
    rec.write_text(json.dumps({"rows": [{"rejoin_s": 0.3, "startup_s": 0.1}, {"rejoin_s": None, "startup_s": 0.2}]}))
    assert parse_dist(f"empirical:{rec}").values == (0.3,)
    assert parse_dist(f"empirical:{rec}#startup_s").values == (0.1, 0.2)
    with pytest.raises(ValueError, match="no row"):
        parse_dist(f"empirical:{rec}#missing")


# ----------------------------------------------------------------------------- schedule mode
def test_a_schedule_without_faults_merges_nearly_everything():
    r = predict_schedule(Schedule(seed=0, faults=(), learners=3), RunInputs(learners=3, duration=60))
    assert r.goodput > 0.99 and r.info["merges"] > 100


def test_a_kill_costs_the_unpushed_steps_and_the_restart():
    kill = Schedule(seed=0, faults=(Kill(at=10, duration=5, target="learner-1"),), learners=2)
    r = predict_schedule(kill, RunInputs(learners=2, duration=60, recovery=Fixed(2.0)))
    lost = r.fractions()
    assert lost["recovery"] == pytest.approx(2.0 / 115)
    assert 0 < lost["lost_with_learner"] <= 0.5 / 115  # at most a round and its merge round trip
    assert r.info["held_down_s"] == pytest.approx(5.0)


def test_a_long_partition_throws_away_the_push_it_held():
    cut = Schedule(seed=0, faults=(Partition(at=10, duration=10, targets=("learner-2",)),), learners=3)
    r = predict_schedule(cut, RunInputs(learners=3, duration=60))
    assert r.info["stale_pushes"] == 1
    assert 0 < r.fractions()["stale_pushes"] < 0.01  # one push, not the partition's 10 s (rebase keeps them)


@pytest.mark.parametrize("row", ["decoupled", "chaos"])  # bench/goodput.py, bench/goodput_scale.py
def test_from_run_reads_any_learner_count(tmp_path, capsys, row):
    faults = [Kill(at=5.0 + 3 * i, duration=2, target=f"learner-{i}") for i in range(1, 7)]
    doc = {"schedule": Schedule(seed=1, faults=tuple(faults), learners=6).to_dict(),
           "config": {"learners": 6, "duration": 40.0, "step_time": 0.025, "trainer_args": ["--sync-every", "8"]},
           "systems": {row: {"goodput_available": 0.9, "goodput": 0.8, "run_dir": str(tmp_path / "gone")}},
           "comparison": {"merged_ratio": 0.85}}
    path = tmp_path / "goodput.json"
    path.write_text(json.dumps(doc))
    out = json.loads(run_cli(capsys, "--from-run", str(path), "--json", "--repeats", "2"))
    assert list(out) == ["decoupled"]
    assert out["decoupled"]["inputs"]["learners"] == 6 and out["decoupled"]["inputs"]["sync_every"] == 8
    assert out["decoupled"]["measured"] == {"goodput_available": 0.9, "goodput": 0.8, "merged_ratio": 0.85}
    assert 0.8 < out["decoupled"]["goodput"] < 1
    assert out["decoupled"]["merged_vs_fault_free"] < out["decoupled"]["goodput"]  # the kills' own downtime counts
    with pytest.raises(SystemExit):
        main(["--from-run", str(path), "--measured"])
    assert "--measured" in capsys.readouterr().err
