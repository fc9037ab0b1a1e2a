"""pytest plugin: chaos tests with fixtures and a marker, and a replay command for every failure.

Registered through the ``pytest11`` entry point ``islands`` (or ``-p chaos.pytest_plugin``).

Options (group "islands chaos"): ``--chaos-backend``, ``--chaos-seed``, ``--chaos-learners``,
``--chaos-artifacts``, ``--chaos-streaming``, ``--chaos-reference``.

``--chaos-reference`` (auto, the default, or off): the chaos marker and the property suites
judge final_loss and no_divergence against a fault-free run of the same configuration
(chaos/reference.py), cached under the islands home and run once when missing.

``--chaos-streaming`` runs every chaos cluster with streaming DiLoCo: the trainer args of the
``cluster`` fixture, of ``@pytest.mark.chaos`` and of the property suites
(``tests/properties/support.py``) go through ``streaming_trainer_args``, which adds
``--fragments 4 --encoding int4 --overlap 1`` and rounds H (``--sync-every``) up to a
multiple of P with tau < H/P. The replay commands and run.json carry the resulting args.

Fixtures:

- ``chaos_options`` (session): the parsed options, a frozen ``ChaosOptions``.
- ``cluster``: a started cluster in ``tmp_path/"run"`` whose learners all train; teardown heals
  and stops it, whatever happened. Built from the ``cluster_settings`` fixture (learners, mode,
  data, trainer args), which a module or conftest may override.
- ``toxiproxy``: the cluster's ``ToxiproxyClient``.
- ``chaos``: a ``ChaosSession`` on that cluster: ``run(schedule)``, ``verdicts()``,
  ``assert_ok()``, ``replay_command()``.
- ``chaos_result``: for ``@pytest.mark.chaos(schedule="file.yaml", ...)``: the ``RunResult`` of
  ``chaos.runner.run_schedule``; a marked test requests it by itself and fails when a check fails.

When a test that used any of them fails, the plugin copies the last schedule, the history,
the event logs and the verdicts into ``ARTIFACTS/<test id>/`` and prints one command that
replays the run. The runner, the controller and the cluster are imported only when a chaos
fixture runs, so other tests are not slowed down. Hypothesis profiles ``ci`` (the default
unless ``--hypothesis-profile`` is given) and ``nightly`` are registered at configure.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import shlex
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from trainer.argtypes import non_negative_int, positive_int
from trainer.runspec import RunSpec

if TYPE_CHECKING:
    from faults import Schedule

    from .checkers import Verdict
    from .runner import RunResult

SECTION = "islands chaos replay"
MAX_COPY_BYTES = 50 * 1024 * 1024
DEFAULT_MODE = "decoupled"
DEFAULT_DATA = "markov"
SESSION_TAIL_SECONDS = 10.0
CHAOS_FIXTURES = ("cluster", "toxiproxy", "chaos", "chaos_result")

MARKERS = {
    "chaos(schedule=PATH, learners=None, duration=None, mode='decoupled', trainer_args=None, task=None)":
             "run the fault schedule PATH (relative to the test file, then the working directory) on a "
             "fresh cluster before the test body; the test fails if a check fails. The RunResult is the "
             "chaos_result fixture.",
    "integration": "starts real processes on 127.0.0.1",
    "slow": "takes more than a minute",
    "property": "a hypothesis property test (the 'ci' profile by default, --hypothesis-profile nightly for more)",
    "compose": "needs the docker compose backend",
    "swarm": "needs the swarm backend: a Docker engine that is a swarm manager",
}

HEALTH_CHECKS = ("too_slow", "function_scoped_fixture", "data_too_large", "filter_too_much")
PROFILES = {"ci": 3, "nightly": 200}
# Examples of a live-cluster property under 'ci': each is a cluster run of 30-60 s, and CI
# (the main suite and the compose suite) must stay within 30 minutes on two cores. One:
# the simulator runs the same properties on the real syncer a thousand times each
# (tests/sim), so a live example is the cross-check that simulation and reality agree;
# the nightly profile draws 200.
LIVE_CI_EXAMPLES = 1
SHRINKING_PROFILES = ("nightly",)

# --chaos-streaming: P fragments, 4-bit pseudo-gradients, and tau steps of overlap.
STREAMING_FRAGMENTS = 4
STREAMING_OVERLAP = 1
STREAMING_ENCODING = "int4"
STREAMING_FLAGS = ("--fragments", "--encoding", "--overlap")
_SYNC_EVERY_FLAGS = ("--sync-every", "-H")
_DEFAULT_SYNC_EVERY = 20  # trainer.config.TrainConfig.sync_every (not imported: it pulls in torch)


# --------------------------------------------------------------------------- options


@dataclass(frozen=True)
class ChaosOptions:
    backend: str = "local"
    seed: int | None = None
    learners: int = 3
    artifacts: Path = Path("chaos-artifacts")
    streaming: bool = False
    warm_spares: int = 0  # local backend: warm spare processes restarts take (chaos/spares.py)
    reference: str = "auto"  # final_loss against a fault-free run of the same config (chaos/reference.py)
    task: str = "gpt"        # --chaos-task: what every cluster of the session trains, unless a test says

    def spec(self, learners: int | None = None, task: str | None = None, trainer_args=(), **settings) -> RunSpec:
        """The RunSpec of one of this session's clusters: its backend, spares and task, the
        streaming flags when on, and whatever the test sets (`settings`: mode=, data=, ...)."""
        from trainer.task import resolve_spec

        return RunSpec(backend=self.backend, learners=learners or self.learners,
                       task=resolve_spec(task or self.task), trainer_args=self.trainer_args(trainer_args),
                       warm_spares=self.spares_for(self.backend), **settings)

    def spares_for(self, backend: str) -> int:
        """Warm spares for a cluster of `backend`: only the local backend keeps them."""
        return self.warm_spares if backend == "local" else 0

    def trainer_args(self, args: list[str] | tuple[str, ...] = ()) -> list[str]:
        """`args` as the clusters of this session get them (with the streaming flags if on)."""
        return streaming_trainer_args(args) if self.streaming else list(args)


def _flag_value(args: list[str], names: tuple[str, ...]) -> tuple[list[str], str | None]:
    """`args` without any `NAME VALUE` / `NAME=VALUE` of `names`, and the last value given."""
    kept: list[str] = []
    value = None
    i = 0
    while i < len(args):
        arg = args[i]
        name, eq, inline = arg.partition("=")
        if name in names and (eq or i + 1 < len(args)):
            value = inline if eq else args[i + 1]
            i += 1 if eq else 2
            continue
        kept.append(arg)
        i += 1
    return kept, value


def streaming_trainer_args(args: list[str] | tuple[str, ...] = ()) -> list[str]:
    """`args` with streaming DiLoCo on: ``--fragments 4 --encoding int4 --overlap 1`` (replacing
    any of those already given), and ``--sync-every`` rounded up to a multiple of P large
    enough that tau < H/P (H=10 becomes 12). Without ``--sync-every`` the trainer's default
    H=20 already fits and nothing is added."""
    out = list(args)
    for flag in STREAMING_FLAGS:
        out, _ = _flag_value(out, (flag, "-P") if flag == "--fragments" else (flag,))
    out, given = _flag_value(out, _SYNC_EVERY_FLAGS)
    p, tau = STREAMING_FRAGMENTS, STREAMING_OVERLAP
    h = int(given) if given is not None else _DEFAULT_SYNC_EVERY
    fitted = max(-(-h // p) * p, (tau + 1) * p)  # a multiple of P, with H/P > tau
    if given is not None or fitted != h:
        out += ["--sync-every", str(fitted)]
    return out + ["--fragments", str(p), "--encoding", STREAMING_ENCODING, "--overlap", str(tau)]


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("islands chaos", "islands chaos: fault-injection tests on a real cluster")
    group.addoption("--chaos-backend", choices=("local", "compose", "swarm"), default="local",
                    help="cluster backend for the chaos fixtures and the chaos marker (default: local)")
    group.addoption("--chaos-seed", type=int, default=None, metavar="INT",
                    help="override the seed of every schedule run (default: each schedule keeps its own)")
    group.addoption("--chaos-learners", type=positive_int, default=3, metavar="N",
                    help="learners per cluster, unless a chaos marker says otherwise (default: 3)")
    group.addoption("--chaos-artifacts", default="chaos-artifacts", metavar="DIR",
                    help="where a failing chaos test leaves its schedule, history, events and a replay "
                         "command (default: chaos-artifacts)")
    group.addoption("--chaos-streaming", action="store_true", default=False,
                    help=f"run the chaos clusters with streaming DiLoCo: P={STREAMING_FRAGMENTS} fragments, "
                         f"{STREAMING_ENCODING} pseudo-gradients, overlap tau={STREAMING_OVERLAP} (--sync-every "
                         f"is rounded up to a multiple of P; applies to the cluster fixture, the chaos marker "
                         f"and the property suites)")
    group.addoption("--chaos-load", type=non_negative_int, default=0, metavar="N",
                    help="run the session beside N busy processes pinned round-robin to the CPUs (chaos/load.py), "
                         "to prove that no verdict depends on the machine's speed; the terminal summary gives "
                         "the load average it ran at (default 0: no artificial load)")
    group.addoption("--chaos-warm-spares", type=non_negative_int, default=0, metavar="N",
                    help="local backend: keep N warm spare processes (torch already imported) that restarts "
                         "take instead of a cold Python; applies to the cluster fixture and the chaos marker "
                         "(default 0: cold restarts)")
    group.addoption("--chaos-task", default="gpt", metavar="FILE.py:NAME",
                    help="what every chaos cluster trains: FILE.py:NAME or MODULE:NAME (README, 'Your own model'), "
                         "unless a test's cluster_settings or chaos marker names its own (default: gpt, the "
                         "built-in byte-level GPT)")
    group.addoption("--chaos-reference", choices=("auto", "off"), default="auto",
                    help="auto: judge final_loss and no_divergence against a fault-free run of the same "
                         "configuration at the same merged tokens, cached under the islands home (run once when "
                         "missing); off: the unigram-entropy rule only (default: auto)")


def chaos_options_from(config: pytest.Config) -> ChaosOptions:
    artifacts = Path(config.getoption("chaos_artifacts"))
    return ChaosOptions(backend=config.getoption("chaos_backend"), seed=config.getoption("chaos_seed"),
                        learners=config.getoption("chaos_learners"), artifacts=artifacts,
                        streaming=config.getoption("chaos_streaming"),
                        warm_spares=config.getoption("chaos_warm_spares"),
                        reference=config.getoption("chaos_reference"), task=config.getoption("chaos_task"))


def _artifacts_root(config: pytest.Config) -> Path:
    """The artifacts dir to write to: a relative one is taken from where pytest was invoked."""
    artifacts = chaos_options_from(config).artifacts
    return artifacts if artifacts.is_absolute() else Path(config.invocation_params.dir) / artifacts


# --------------------------------------------------------------------------- configure


_previous_profile = pytest.StashKey[str | None]()
_summary = pytest.StashKey["ReplaySummary"]()


def register_hypothesis_profiles() -> bool:
    """Register 'ci' (3 examples) and 'nightly' (200); False when hypothesis is not installed."""
    try:
        from hypothesis import HealthCheck, settings
    except ImportError:
        return False
    for name, examples in PROFILES.items():
        settings.register_profile(
            name, max_examples=examples, deadline=None, print_blob=True, derandomize=False,
            suppress_health_check=[getattr(HealthCheck, h) for h in HEALTH_CHECKS])
    return True


def live_settings():
    """Settings for a property test whose every example is a live cluster run (20-40 s).

    Shrinking such a failure costs minutes: Hypothesis shrinks for up to 300 s before it
    reports. Under the 'ci' profile a live test draws LIVE_CI_EXAMPLES schedules and does
    not shrink: the first failing schedule is the report (its verdicts, artifacts and
    replay command), after one confirming rerun.
    Under 'nightly' it shrinks, within Hypothesis' own 300 s bound. Call it at import, after
    the profile is loaded: `@live_settings()` above `@given`."""
    from hypothesis import Phase, settings

    if settings.get_current_profile_name() in SHRINKING_PROFILES:
        return settings()
    if settings.get_current_profile_name() == "ci":
        return settings(phases=[Phase.explicit, Phase.reuse, Phase.generate], max_examples=LIVE_CI_EXAMPLES)
    return settings(phases=[Phase.explicit, Phase.reuse, Phase.generate])


@pytest.hookimpl(tryfirst=True)  # before hypothesis' own plugin applies --hypothesis-profile
def pytest_configure(config: pytest.Config) -> None:
    for name, description in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {description}")
    config.stash[_summary] = summary = ReplaySummary()
    config.pluginmanager.register(summary, "islands-chaos-replay-summary")
    load = config.getoption("chaos_load", 0)
    if load and not config.pluginmanager.has_plugin("islands-chaos-load"):
        config.pluginmanager.register(LoadSession(load), "islands-chaos-load")
    config.stash[_previous_profile] = None
    if not register_hypothesis_profiles():
        return
    from hypothesis import settings

    # Restored at unconfigure, so an in-process session (pytester) leaves the profile as it was.
    config.stash[_previous_profile] = settings.get_current_profile_name()
    # Load 'ci' unless a profile was chosen: by --hypothesis-profile, or by a conftest that
    # loaded one at import (conftests load before this hook runs).
    if config.getoption("hypothesis_profile", None) is None and settings.get_current_profile_name() == "default":
        settings.load_profile("ci")


def pytest_unconfigure(config: pytest.Config) -> None:
    summary = config.stash.get(_summary, None)
    if summary is not None and config.pluginmanager.is_registered(summary):
        config.pluginmanager.unregister(summary)
    load = config.pluginmanager.get_plugin("islands-chaos-load")
    if load is not None:
        if load.report is None:  # the session never finished: never leave the load running
            load.report = load.load.stop()
        config.pluginmanager.unregister(load)
    previous = config.stash.get(_previous_profile, None)
    if previous is not None:  # leave the process as we found it (pytester runs in-process)
        from hypothesis import settings

        settings.load_profile(previous)


# --------------------------------------------------------------------------- what a test ran


@dataclass
class RunRecord:
    """What a chaos test ran (its RunSpec, schedule and run dir): enough to copy its traces
    and to replay it."""

    run_dir: Path
    spec: RunSpec = field(default_factory=RunSpec)
    schedule: Schedule | None = None
    artifacts: Path | None = None  # set once written

    @property
    def learners(self) -> int:
        return self.spec.learners

    def recorded_spec(self) -> RunSpec:
        """The spec with the schedule's seed and the duration it ran (or will run) for."""
        from .runner import default_duration

        spec = self.spec
        if spec.duration is None and self.schedule is not None:
            spec = spec.replace(duration=default_duration(self.schedule))
        return spec.replace(seed=self.schedule.seed if self.schedule is not None else spec.seed)

    def run_json(self) -> dict:
        """run.json, as `chaos.runner.run_schedule` writes it and `chaos replay` reads it."""
        return self.recorded_spec().to_json()


_record = pytest.StashKey[RunRecord]()


def _remember(node: pytest.Item, record: RunRecord) -> RunRecord:
    node.stash[_record] = record
    return record


def replay_command(schedule_path: Path | str, record: RunRecord) -> str:
    """The one command line that reruns `record` from a schedule file."""
    spec = record.spec.replace(seed=None)  # the schedule file holds its seed
    env = [f"{k}={shlex.quote(v)}" for k, v in sorted(spec.env.items())]
    return " ".join([*env, shlex.join(spec.to_argv(str(schedule_path)))])


def _with_seed(schedule: Schedule, seed: int | None) -> Schedule:
    return schedule if seed is None or seed == schedule.seed else dataclasses.replace(schedule, seed=seed)


# --------------------------------------------------------------------------- artifacts


def sanitize_nodeid(nodeid: str, limit: int = 120) -> str:
    """A directory name for a test id: `tests/x.py::test_y[a-1]` -> `tests_x.py__test_y_a-1`."""
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", nodeid).strip("._") or "test"
    if len(name) > limit:
        digest = hashlib.sha1(nodeid.encode()).hexdigest()[:8]
        name = f"{name[:limit - 9]}-{digest}"
    return name


def _copy_file(src: Path, dst: Path, skipped: list[str]) -> None:
    try:
        size = src.stat().st_size
    except OSError:
        return
    if size > MAX_COPY_BYTES:
        skipped.append(f"{src} ({size} bytes > {MAX_COPY_BYTES})")
        return
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, dst)


def _copy_traces(record: RunRecord, dest: Path, skipped: list[str]) -> None:
    """history.jsonl, verdict.json, events/ and the processes' logs/ as they are now (a running
    cluster keeps writing; the teardown report copies them again once it has stopped)."""
    run_dir = record.run_dir
    _copy_file(run_dir / "history.jsonl", dest / "history.jsonl", skipped)
    _copy_file(run_dir / "verdict.json", dest / "verdict.json", skipped)
    for name in ("events", "logs"):
        src = run_dir / name
        if not src.is_dir():
            continue
        shutil.rmtree(dest / name, ignore_errors=True)
        (dest / name).mkdir(parents=True, exist_ok=True)
        for path in sorted(src.rglob("*")):
            if path.is_file():
                _copy_file(path, dest / name / path.relative_to(src), skipped)


def _display_path(config: pytest.Config, path: Path) -> Path:
    """`path` as the user named the artifacts dir: relative to the invocation dir if they gave it so."""
    given = chaos_options_from(config).artifacts
    if given.is_absolute():
        return path
    try:
        return path.relative_to(Path(config.invocation_params.dir))
    except ValueError:
        return path


def write_artifacts(config: pytest.Config, nodeid: str, record: RunRecord, why: str = "") -> str | None:
    """Copy a failed test's traces into ARTIFACTS/<test id>/; returns the replay command (None
    when the test ran no schedule, so there is nothing to replay)."""
    dest = _artifacts_root(config) / sanitize_nodeid(nodeid)
    if dest.exists():
        shutil.rmtree(dest)  # a previous session's copy of the same test
    dest.mkdir(parents=True)
    record.artifacts = dest
    skipped: list[str] = []
    if record.schedule is not None:
        record.schedule.dump(dest / "schedule.yaml")
        settings = record.run_json()
        settings.update({k: v for k, v in _run_json(record.run_dir).items() if k not in settings})
        (dest / "run.json").write_text(json.dumps(settings, indent=2) + "\n")
    _copy_traces(record, dest, skipped)
    shown = _display_path(config, dest)
    command = replay_command(shown / "schedule.yaml", record) if record.schedule is not None else None
    lines = [f"test: {nodeid}", f"run dir: {record.run_dir}"]
    if why:
        lines.append(f"failed in {why}")
    if command:
        lines += ["", "replay on a fresh cluster:", f"  {command}",
                  "or, with the recorded settings (run.json):", f"  python -m chaos replay {shlex.quote(str(shown))}"]
    else:
        lines += ["", "the test ran no schedule through the chaos fixtures: there is nothing to replay;",
                  "the history and event logs of its cluster are here."]
    if skipped:
        lines += ["", "not copied (too large):", *(f"  {s}" for s in skipped)]
    (dest / "REPLAY.txt").write_text("\n".join(lines) + "\n")
    return command


def _run_json(run_dir: Path) -> dict:
    try:
        found = json.loads((run_dir / "run.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def record_failure_artifacts(request: pytest.FixtureRequest, run_dir: str | Path, schedule: Schedule,
                             learners: int, trainer_args: list[str] | None = None, *, backend: str | None = None,
                             mode: str | None = None, data: str | None = None, duration: float | None = None,
                             env: dict[str, str] | None = None) -> Path:
    """For tests that do their own runs (e.g. a hypothesis test calling `run_schedule` per
    example): remember the latest run so that, if the test fails, its schedule and traces are
    copied into the artifacts dir with a replay command. Call it after every run; the last
    call wins, which for hypothesis is the shrunk example, replayed last. Settings not given
    are read from RUN_DIR/run.json (written by `run_schedule`). `env` (e.g. a defect switch)
    prefixes the replay command. Returns the directory the artifacts will go to."""
    node = request.node
    run_dir = Path(run_dir)
    found = _run_json(run_dir)
    try:
        spec = RunSpec.from_json(found, str(run_dir / "run.json"))
    except ValueError:
        spec = RunSpec(backend=chaos_options_from(request.config).backend)
    if backend is None and not found.get("backend"):  # no run.json, or one without: the session's backend
        backend = chaos_options_from(request.config).backend
    given = {"backend": backend, "mode": mode, "data": data, "duration": duration,
             "trainer_args": trainer_args, "env": env}
    spec = spec.replace(learners=learners, **{k: v for k, v in given.items() if v is not None})
    record = RunRecord(run_dir, spec, schedule)
    _remember(node, record)
    return _artifacts_root(request.config) / sanitize_nodeid(node.nodeid)


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="session")
def chaos_options(pytestconfig: pytest.Config) -> ChaosOptions:
    return chaos_options_from(pytestconfig)


@dataclass(frozen=True)
class ClusterSettings:
    """How the `cluster` fixture builds its cluster; override the `cluster_settings` fixture
    in a module or conftest to change it."""

    learners: int
    mode: str = DEFAULT_MODE
    data: str = DEFAULT_DATA
    trainer_args: tuple[str, ...] = ()
    task: str | None = None   # None: the session's --chaos-task
    disk_layer: bool = False  # the disk-fault layer under the syncer's state dir: disk and power_loss faults


@pytest.fixture
def cluster_settings(chaos_options: ChaosOptions) -> ClusterSettings:
    return ClusterSettings(learners=chaos_options.learners)


def _record_cluster_start(run_dir: Path, backend: str, learners: int) -> None:
    """The history's `cluster_start`, as chaos.runner records it: the checks measure this
    machine's cold start-up from it (chaos/pace.py)."""
    from .controller import HISTORY_FILE, History

    history = History(run_dir / HISTORY_FILE)
    try:
        history.record(event="cluster_start", backend=backend, learners=learners)
    finally:
        history.close()


@pytest.fixture
def cluster(request: pytest.FixtureRequest, tmp_path: Path, chaos_options: ChaosOptions,
            cluster_settings: ClusterSettings):
    """A started cluster in tmp_path/"run" whose learners all train. Teardown heals, then stops."""
    from . import runner

    s = cluster_settings
    run_dir = tmp_path / "run"
    task = getattr(request, "param", None) or s.task  # indirect parametrization: cluster(task=...)
    spec = chaos_options.spec(learners=s.learners, mode=s.mode, data=s.data, trainer_args=s.trainer_args,
                              task=task, disk_layer=s.disk_layer)
    _remember(request.node, RunRecord(run_dir, spec))
    c = runner.make_cluster(spec, run_dir)
    if getattr(c, "run_dir", None) is None:
        c.run_dir = run_dir
    started = False
    try:
        _record_cluster_start(run_dir, chaos_options.backend, s.learners)
        c.start()
        runner.wait_until_training(run_dir, s.learners)
        started = True
        yield c  # a failing test resumes here too: pytest does not throw into fixtures
    finally:
        try:
            c.heal_all()
        except Exception:
            if started:  # a heal that fails after a good start is an error of its own
                raise
        finally:
            c.stop()


@pytest.fixture
def toxiproxy(cluster):
    """The cluster's Toxiproxy client: add toxics by hand, `heal_all` removes them at teardown."""
    return cluster.toxiproxy


class ChaosSession:
    """Runs schedules on one running cluster and checks what happened, without stopping it."""

    def __init__(self, cluster: Any, record: RunRecord, seed: int | None = None) -> None:
        from .controller import HISTORY_FILE, History

        self.cluster = cluster
        self.record = record
        self.seed = seed
        self.run_dir = Path(record.run_dir)
        self.history_path = self.run_dir / HISTORY_FILE
        self.history = History(self.history_path)
        self.last_schedule: Schedule | None = None
        self.runs = 0

    def run(self, schedule: Schedule, duration: float | None = None) -> list[dict]:
        """Apply `schedule` (healing first and at the end); returns its history entries.
        Duration defaults to the schedule's horizon + 10 s. Histories append across calls."""
        from .controller import Controller

        schedule = _with_seed(schedule, self.seed).validate(self.record.learners)
        if duration is None:
            duration = schedule.horizon + SESSION_TAIL_SECONDS
        self.last_schedule = schedule
        self.record.schedule = schedule
        self.record.spec = self.record.spec.replace(duration=duration)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        schedule.dump(self.run_dir / "schedule.yaml")
        (self.run_dir / "run.json").write_text(json.dumps(self.record.run_json(), indent=2) + "\n")
        self.runs += 1
        return Controller(self.cluster, schedule, self.history).run(duration)

    def verdicts(self, checker_options: dict | None = None, all_runs: bool = False) -> list[Verdict]:
        """The checks over the events so far and the history of the last `run` (of every run
        with `all_runs=True`). The cluster keeps running; writes verdict.json."""

        from .checkers import RunView, run_checkers, verdict_document
        from .controller import read_history
        from .backends.collect import incomplete_nodes
        from .timeline import run_events

        history = read_history(self.history_path)
        if not all_runs:
            begins = [i for i, h in enumerate(history) if h.get("event") == "begin"]
            if begins:  # the last run's history, with the cluster's start (the checks' start-up)
                starts = [h for h in history[:begins[-1]] if h.get("event") == "cluster_start"]
                history = starts[-1:] + history[begins[-1]:]
        # A live syncer's state dir is read pending-first (chaos/durable.py): no push is caught in neither.
        events, placement = run_events(self.run_dir)
        verdicts = run_checkers(RunView(events, history, state_dir=self.run_dir / "state", placement=placement,
                                        incomplete=incomplete_nodes(self.run_dir)), checker_options)
        document = verdict_document(verdicts)
        (self.run_dir / "verdict.json").write_text(json.dumps(document, indent=2))
        return verdicts

    def assert_ok(self, checker_options: dict | None = None, all_runs: bool = False) -> list[Verdict]:
        """Fail (AssertionError, so hypothesis shrinks) with a table of the failed checks."""
        from .checkers import failing

        verdicts = self.verdicts(checker_options, all_runs)
        failed = failing(verdicts)  # a required safety check left unknown fails too
        if failed:
            raise AssertionError(format_failed(failed, self.run_dir, self.replay_command()))
        return verdicts

    def replay_command(self) -> str | None:
        """The command that reruns the last schedule on a fresh cluster (None before any run)."""
        if self.last_schedule is None:
            return None
        return replay_command(self.run_dir / "schedule.yaml", self.record)

    def close(self) -> None:
        self.history.close()


@pytest.fixture
def chaos(request: pytest.FixtureRequest, cluster, chaos_options: ChaosOptions):
    """A ChaosSession on the `cluster` fixture's cluster."""
    record = request.node.stash.get(_record, None)
    if record is None:  # a `cluster` fixture overridden by the test's own
        record = _remember(request.node, RunRecord(Path(cluster.run_dir), getattr(cluster, "spec", None) or
                                                   chaos_options.spec(learners=cluster.learners)))
    session = ChaosSession(cluster, record, seed=chaos_options.seed)
    yield session
    session.close()


def format_failed(failed: list[Verdict], run_dir: Path, command: str | None = None) -> str:
    width = max(len(v.name) for v in failed)
    lines = [f"{len(failed)} chaos check(s) failed (run dir {run_dir}):"]
    lines += [f"  {v.status.upper():<7} {v.name:<{width}}  {v.detail}"
              + (" (a required safety check: unknown fails the run)" if v.status != "fail" else "") for v in failed]
    if command:
        lines.append(f"replay: {command}")
    return "\n".join(lines)


def _marker_settings(marker: pytest.Mark) -> dict:
    kwargs = dict(marker.kwargs)
    if marker.args:
        if len(marker.args) > 1 or "schedule" in kwargs:
            raise pytest.UsageError(f"@pytest.mark.chaos takes one schedule, got {marker.args} {kwargs}")
        kwargs["schedule"] = marker.args[0]
    known = {"schedule", "learners", "duration", "mode", "trainer_args", "task"}
    unknown = sorted(set(kwargs) - known)
    if unknown or "schedule" not in kwargs:
        raise pytest.UsageError(f"@pytest.mark.chaos(schedule=PATH, learners=None, duration=None, "
                                f"mode='decoupled', trainer_args=None, task=None): got {kwargs}")
    return kwargs


def _resolve_schedule(spec: Any, test_path: Path, learners: int) -> Schedule:
    from faults import Schedule, ScheduleError

    if isinstance(spec, Schedule):
        return spec.validate(learners)
    tried = [test_path.parent / spec, Path.cwd() / spec] if not Path(spec).is_absolute() else [Path(spec)]
    for path in tried:
        if path.is_file():
            try:
                return Schedule.load(path, learners=learners)
            except ScheduleError as exc:
                pytest.fail(f"@pytest.mark.chaos: {exc}", pytrace=False)
    pytest.fail(f"@pytest.mark.chaos: no schedule file {spec!r} (looked for {', '.join(map(str, tried))})",
                pytrace=False)


_result = pytest.StashKey["RunResult"]()


@pytest.fixture
def chaos_result(request: pytest.FixtureRequest, tmp_path: Path, chaos_options: ChaosOptions) -> RunResult:
    """The RunResult of the test's `@pytest.mark.chaos` schedule, run on a fresh cluster."""
    from . import runner

    marker = request.node.get_closest_marker("chaos")
    if marker is None:
        pytest.fail("the chaos_result fixture needs @pytest.mark.chaos(schedule=PATH)", pytrace=False)
    kw = _marker_settings(marker)
    learners = kw.get("learners") or chaos_options.learners
    schedule = _with_seed(_resolve_schedule(kw["schedule"], Path(request.node.path), learners), chaos_options.seed)
    spec = chaos_options.spec(learners=learners, mode=kw.get("mode") or DEFAULT_MODE,
                              trainer_args=kw.get("trainer_args") or [], task=kw.get("task"),
                              duration=kw.get("duration"))
    run_dir = tmp_path / "run"
    _remember(request.node, RunRecord(run_dir, spec, schedule))
    result = runner.run_schedule(schedule, run_dir, spec, reference=chaos_options.reference)
    request.node.stash[_result] = result
    return result


# --------------------------------------------------------------------------- hooks


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    backend = config.getoption("chaos_backend")
    for item in items:
        for needed in ("compose", "swarm"):  # a suite of containers runs only on its own backend
            if item.get_closest_marker(needed) is not None and backend != needed:
                item.add_marker(pytest.mark.skip(reason=f"needs the {needed} backend: --chaos-backend {needed} and "
                                                        f"a Docker engine (docs/{needed}.md)"))
        if item.get_closest_marker("chaos") is not None:
            names = getattr(item, "fixturenames", None)
            if names is not None and "chaos_result" not in names:
                names.append("chaos_result")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    outcome = yield
    result = item.stash.get(_result, None)
    if result is not None and not result.passed:
        from .checkers import failing
        failed = failing(result.verdicts)
        pytest.fail(format_failed(failed, result.run_dir) if failed else
                    f"the chaos run failed (see {result.run_dir / 'verdict.json'})", pytrace=False)
    return outcome


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    report = yield
    record = item.stash.get(_record, None)
    if record is None:
        return report
    try:
        if report.failed and report.when in ("setup", "call") and record.artifacts is None:
            crash = getattr(report.longrepr, "reprcrash", None)
            why = f"{report.when}: {crash.message.splitlines()[0]}" if crash and crash.message else report.when
            command = write_artifacts(item.config, item.nodeid, record, why=why)
            if command:
                shown = _display_path(item.config, record.artifacts)
                report.sections.append((SECTION, f"python -m chaos replay {shlex.quote(str(shown))}\n"
                                                 f"  (or on a fresh cluster, the same flags: {command})"))
            else:
                shown = _display_path(item.config, record.artifacts)
                report.sections.append((SECTION, f"nothing to replay (no schedule ran); traces in {shown}"))
        elif report.when == "teardown" and record.artifacts is not None:
            _copy_traces(record, record.artifacts, [])  # the cluster has stopped: final events too
    except OSError as exc:  # never turn a test result into an internal error
        report.sections.append((SECTION, f"could not write chaos artifacts: {exc}"))
    return report


class LoadSession:
    """--chaos-load N: busy processes for the whole session, and the load average they made."""

    def __init__(self, processes: int) -> None:
        from .load import CpuLoad
        self.load = CpuLoad(processes)
        self.report = None

    def pytest_sessionstart(self, session: pytest.Session) -> None:
        self.load.start()

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.report is None:
            self.report = self.load.stop()

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if self.report is not None:
            terminalreporter.section("islands chaos load")
            terminalreporter.write_line(self.report.line())


class ReplaySummary:
    """Collects the replay commands from the reports (not the items, so it also works when
    xdist workers run the tests) and prints them at the end of the session."""

    def __init__(self) -> None:
        self.replays: list[tuple[str, str]] = []

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        for name, content in report.sections:
            if name == SECTION:
                self.replays.append((report.nodeid, content))

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if not self.replays:
            return
        terminalreporter.section(SECTION)
        for nodeid, content in self.replays:
            terminalreporter.write_line(nodeid)
            for line in content.splitlines():
                terminalreporter.write_line(f"  {line}")
