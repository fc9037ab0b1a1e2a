"""Property (b): a state machine whose rules inject and heal faults on one live cluster.

Each rule applies one fault through the controller and heals it; after every rule the
safety invariants must hold on everything recorded so far (versions only rise, no
update applied twice, nothing non-finite, merges keep coming). At the end every learner
must contribute to, and adopt, every fragment again, no acknowledged push may be lost,
and learners converge.
"""
from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from chaos.pytest_plugin import live_settings
from chaos.checkers import FAIL, RunView, check_converged, check_finite, check_monotonic_versions, \
    check_no_double_apply, check_no_lost_acks
from chaos.controller import HISTORY_FILE, Controller, History, read_history
from chaos.runner import make_cluster, wait_until_training
from faults import Kill, Latency, Partition, Pause, Schedule
from trainer.events import read_events
from trainer.runspec import RunSpec

from .support import not_rejoined, suite_trainer_args

pytestmark = [pytest.mark.property, pytest.mark.integration]
LEARNERS = 3
SETTLE = 1.0           # seconds after each heal before the invariants are read
PROGRESS_WINDOW = 20.0  # a merge must have happened this recently after every rule
REJOIN_TIMEOUT = 60.0

learner_ids = st.integers(1, LEARNERS)
outages = st.integers(5, 30).map(lambda tenths: tenths / 10)


class ChaosMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.run_dir = Path(tempfile.mkdtemp(prefix="islands-machine-"))
        self.cluster = make_cluster(RunSpec(backend="local", learners=LEARNERS, mode="decoupled", data="markov",
                                            trainer_args=suite_trainer_args()), self.run_dir)
        self.cluster.start()
        wait_until_training(self.run_dir, LEARNERS)
        self.history = History(self.run_dir / HISTORY_FILE)
        self.steps = 0

    def _inject(self, fault) -> None:
        Controller(self.cluster, Schedule(seed=0, faults=(fault,)), self.history).run(
            duration=fault.duration + SETTLE, heal_first=False)
        self.steps += 1

    def _view(self) -> RunView:
        return RunView(read_events(self.run_dir), read_history(self.run_dir / HISTORY_FILE))

    @rule(learner=learner_ids, outage=outages)
    def kill_and_restart_learner(self, learner: int, outage: float) -> None:
        self._inject(Kill(at=0, duration=outage, target=f"learner-{learner}"))

    @rule(learner=learner_ids, outage=outages)
    def pause_learner(self, learner: int, outage: float) -> None:
        self._inject(Pause(at=0, duration=outage, target=f"learner-{learner}"))

    @rule(learners=st.sets(learner_ids, min_size=1, max_size=2), outage=outages,
          mode=st.sampled_from(("blackhole", "refuse")))
    def partition_links(self, learners: set[int], outage: float, mode: str) -> None:
        self._inject(Partition(at=0, duration=outage, targets=tuple(f"learner-{i}" for i in sorted(learners)),
                               mode=mode))

    @rule(learner=learner_ids, outage=outages, ms=st.integers(10, 300))
    def slow_link(self, learner: int, outage: float, ms: int) -> None:
        self._inject(Latency(at=0, duration=outage, target=f"learner-{learner}", latency_ms=float(ms)))

    @rule(outage=outages)
    def kill_and_restart_syncer(self, outage: float) -> None:
        self._inject(Kill(at=0, duration=outage, target="syncer"))

    @invariant()
    def safety_holds(self) -> None:
        view = self._view()
        for verdict in (check_monotonic_versions(view), check_no_double_apply(view), check_finite(view)):
            assert verdict.status != FAIL, f"{verdict.name}: {verdict.detail} {verdict.evidence}"

    @invariant()
    def merges_keep_coming(self) -> None:
        if self.steps == 0:
            return
        deadline = time.monotonic() + PROGRESS_WINDOW
        while True:
            merges = [e["t"] for e in read_events(self.run_dir) if e["kind"] == "merge"]
            if merges and time.monotonic() - merges[-1] < PROGRESS_WINDOW:
                return
            assert time.monotonic() < deadline, f"no merge in the last {PROGRESS_WINDOW}s after healing"
            time.sleep(0.25)

    def teardown(self) -> None:
        try:
            healed_at = time.monotonic()
            self.cluster.heal_all()
            deadline = healed_at + REJOIN_TIMEOUT
            # Every learner pushes into, and adopts, every fragment again (P of them with streaming).
            missing = not_rejoined(read_events(self.run_dir), healed_at, LEARNERS)
            while missing and time.monotonic() < deadline:
                time.sleep(0.25)
                missing = not_rejoined(read_events(self.run_dir), healed_at, LEARNERS)
            assert not missing, f"not back in sync {REJOIN_TIMEOUT}s after healing: {'; '.join(missing)}"
        finally:
            self.cluster.stop()
            self.history.close()
        view = self._view()
        for verdict in (check_no_lost_acks(view), check_converged(view)):
            assert verdict.status != FAIL, f"{verdict.name}: {verdict.detail} {verdict.evidence}"
        shutil.rmtree(self.run_dir, ignore_errors=True)


# Examples come from the active profile (ci or nightly); each one runs a few rules.
ChaosMachine.TestCase.settings = settings(live_settings(), stateful_step_count=4)
TestChaosMachine = ChaosMachine.TestCase
