"""Every planted defect is found by `explore` in the simulator and shrunk to at most 2
faults, failing the check that guards against it. The searches are seeded: schedule i of
seed 1 is always the same schedule, so each test always runs the same search."""
from __future__ import annotations

from pathlib import Path

import pytest

import json
import shlex

from chaos.sim.cli import sim_main
from chaos.sim.explore import LIVE_TRAINER_ARGS, Space, explore
from trainer import defects

# defect -> (the environment variable that plants it, the check that must fail, the search budget)
CASES = {
    "ack_before_durable": (defects.ENV, "no_lost_acks", 100),
    "ack_before_sync": (defects.ENV, "no_lost_acks", 100),     # found by a power_loss alone
    "double_apply": (defects.ENV, "no_double_apply", 200),
    "merge_nothing": (defects.ENV, "progress", 20),
    "forget_ledger": (defects.ENV, "no_double_apply", 100),
    "forget_members": (defects.ENV, "rejoined", 500),
    "drop_pending": (defects.ENV, "no_lost_acks", 100),
    "version_from_zero": (defects.ENV, "monotonic_versions", 100),
    "living_quorum": (defects.ENV, "no_lost_acks", 100),
    "never_adopt": (defects.LEARNER_ENV, "converged", 20),
    "fresh_id_on_retry": (defects.LEARNER_ENV, "no_double_apply", 100),
    "ignore_push_window": (defects.LEARNER_ENV, "push_window", 100),
}


def test_every_planted_defect_has_a_case() -> None:
    assert set(CASES) == set(defects.DEFECTS) | set(defects.LEARNER_DEFECTS)


@pytest.mark.parametrize("defect", sorted(CASES))
def test_explore_finds_the_defect_and_shrinks_it_to_two_faults_at_most(defect: str, tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    env, check, budget = CASES[defect]
    monkeypatch.setenv(env, defect)
    report = explore(budget, 1, Space(), tmp_path, jobs=1)
    failure = report["first_failure"]
    assert report["violations"] == 1 and failure is not None, f"{defect}: not found in {budget} schedules"
    assert failure["faults"] <= 2, failure["schedule"]
    assert check in failure["failed"], failure["details"]
    assert (tmp_path / "first-failure.yaml").is_file() and (tmp_path / "first-failure" / "verdict.json").is_file()
    live = f"{env}={defect} python -m chaos run {tmp_path / 'first-failure.yaml'} --learners 2 --duration "
    assert failure["live_command"].startswith(live), failure["live_command"]
    assert failure["live_command"].endswith(" --reference off -- " + " ".join(LIVE_TRAINER_ARGS))
    # The printed `chaos sim` command replays the shrunk failure exactly as explore ran it.
    argv = shlex.split(failure["sim_command"])
    assert argv[:4] == ["python", "-m", "chaos", "sim"] and "--defect" in argv, failure["sim_command"]
    monkeypatch.delenv(env)  # the command plants it itself
    assert sim_main(argv[4:] + ["--out", str(tmp_path / "replay")]) == 1
    replayed = json.loads((tmp_path / "replay" / "verdict.json").read_text())
    assert check in replayed["failed"], f"{check} did not fail in the replay: {replayed['failed']}"

