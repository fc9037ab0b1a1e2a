"""The chaos state machine, in the simulator: rules inject one fault at a time into one
running simulated cluster and heal it; after every rule the safety invariants hold on
everything recorded so far and merges keep coming, and at the end every check passes.

It is tests/properties/test_state_machine.py's machine on the simulator's world (the real
syncer, the learners' real protocol, a virtual clock): an example costs a tenth of a
second instead of minutes, so the `ci` profile runs 1,000 of them with shrinking on, in
SHARDS tests of their own seeds (the live machine keeps a few examples as the cross-check)."""
from __future__ import annotations

from hypothesis import seed, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from chaos.checkers import FAIL, RunView, check_finite, check_monotonic_versions, check_no_double_apply
from chaos.runner import check_events
from chaos.sim.explore import MEMORY_RUN_DIR, Space
from chaos.sim.world import SimSettings, World
from faults import Kill, Latency, Partition, Pause, PowerLoss, Schedule

LEARNERS = 3
SETTLE = 1.0            # simulated seconds after each heal before the invariants are read
PROGRESS_WINDOW = 20.0  # after a heal, a merge must come within this (simulated) time
# Before the end, the cluster trains on with no fault for explore's tail, as every schedule
# run does: a run stopped a second after its start has not trained long enough for
# `converged` (its learners' last steps are most of their distance from Θ).
TAIL = Space().tail
EXAMPLES = {"nightly": 10_000}.get(settings.get_current_profile_name(), 1_000)
SHARDS = 4

learner_ids = st.integers(1, LEARNERS)
outages = st.integers(5, 30).map(lambda tenths: tenths / 10)


class SimChaosMachine(RuleBasedStateMachine):
    world: World | None = None

    @initialize(seed=st.integers(0, 2**31 - 1))
    def start_cluster(self, seed: int) -> None:
        self.world = World(Schedule(seed=seed, faults=()), MEMORY_RUN_DIR, SimSettings(learners=LEARNERS),
                           memory=True)
        t0 = self.world.begin()
        self.world.history.record(event="begin", seed=seed, faults=0, duration=None, tolerance=0.001)
        assert t0 == self.world.time.now
        self.merges_seen = 0

    def _inject(self, fault) -> None:
        assert self.world is not None
        self.world.inject(fault)
        self.world.advance(fault.duration + SETTLE)

    def _view(self) -> RunView:
        assert self.world is not None
        return RunView(self.world.events(), self.world.history_entries(), state_dir=None)

    @precondition(lambda self: self.world is not None)
    @rule(learner=learner_ids, outage=outages)
    def kill_and_restart_learner(self, learner: int, outage: float) -> None:
        self._inject(Kill(at=0, duration=outage, target=f"learner-{learner}"))

    @precondition(lambda self: self.world is not None)
    @rule(learner=learner_ids, outage=outages)
    def pause_learner(self, learner: int, outage: float) -> None:
        self._inject(Pause(at=0, duration=outage, target=f"learner-{learner}"))

    @precondition(lambda self: self.world is not None)
    @rule(learners=st.sets(learner_ids, min_size=1, max_size=2), outage=outages,
          mode=st.sampled_from(("blackhole", "refuse")))
    def partition_links(self, learners: set[int], outage: float, mode: str) -> None:
        self._inject(Partition(at=0, duration=outage, targets=tuple(f"learner-{i}" for i in sorted(learners)),
                               mode=mode))

    @precondition(lambda self: self.world is not None)
    @rule(learner=learner_ids, outage=outages, ms=st.integers(10, 300))
    def slow_link(self, learner: int, outage: float, ms: int) -> None:
        self._inject(Latency(at=0, duration=outage, target=f"learner-{learner}", latency_ms=float(ms)))

    @precondition(lambda self: self.world is not None)
    @rule(outage=outages)
    def kill_and_restart_syncer(self, outage: float) -> None:
        self._inject(Kill(at=0, duration=outage, target="syncer"))

    @precondition(lambda self: self.world is not None)
    @rule(outage=outages)
    def power_loss_of_the_syncer(self, outage: float) -> None:
        self._inject(PowerLoss(at=0, duration=outage, target="syncer"))

    @invariant()
    def safety_holds(self) -> None:
        if self.world is None:
            return
        view = self._view()
        for verdict in (check_monotonic_versions(view), check_no_double_apply(view), check_finite(view)):
            assert verdict.status != FAIL, f"{verdict.name}: {verdict.detail} {verdict.evidence}"

    @invariant()
    def merges_keep_coming(self) -> None:
        """After every heal a merge comes within PROGRESS_WINDOW simulated seconds."""
        if self.world is None:
            return
        for _ in range(int(PROGRESS_WINDOW / 0.5)):
            merges = sum(1 for e in self.world.events() if e["kind"] == "merge")
            if merges > self.merges_seen:
                self.merges_seen = merges
                return
            self.world.advance(0.5)
        raise AssertionError(f"no merge within {PROGRESS_WINDOW:g} simulated seconds after healing")

    def teardown(self) -> None:
        if self.world is None:
            return
        self.world.advance(TAIL)
        self.world.finish()
        failed = [v for v in check_events(self._view()) if v.status == FAIL]
        assert not failed, "; ".join(f"{v.name}: {v.detail}" for v in failed)


def _shard(number: int) -> type:
    """Shard `number` of SHARDS: EXAMPLES // SHARDS machines drawn from seed `number`, a test
    of its own so the suite's two workers share the 1,000 (one 3-minute test that started
    last would end the suite alone)."""
    machine = seed(number)(type(f"SimChaosMachineShard{number}", (SimChaosMachine,), {}))
    machine.TestCase.settings = settings(max_examples=EXAMPLES // SHARDS, stateful_step_count=5, deadline=None)
    return machine.TestCase


TestSimChaosMachineShard0 = _shard(0)
TestSimChaosMachineShard1 = _shard(1)
TestSimChaosMachineShard2 = _shard(2)
TestSimChaosMachineShard3 = _shard(3)
