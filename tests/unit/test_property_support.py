"""tests/properties/support.py without a cluster: the suites' trainer args (with and without
--chaos-streaming) and the fragment-aware rejoin condition of the state machine's teardown."""
from __future__ import annotations

from pathlib import Path

import pytest

from faults import Schedule
from tests.properties import support, test_defects

from .test_chaos_plugin import STREAMING, _train_config, run_inner

pytest_plugins = ["pytester"]


def test_suite_args_without_streaming_are_the_fast_args(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(support, "_streaming", False)
    assert support.suite_trainer_args() == support.FAST_TRAINER_ARGS
    assert support.suite_trainer_args("--max-staleness", "1000") == [*support.FAST_TRAINER_ARGS,
                                                                      "--max-staleness", "1000"]
    assert _train_config(support.suite_trainer_args()).fragments == 1


def test_suite_args_with_streaming(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(support, "_streaming", False)
    streamed = support.suite_trainer_args(streaming=True)
    assert streamed[:-8] == support.FAST_TRAINER_ARGS[:-2]  # the same model, batch and so on
    assert streamed[-8:] == ["--sync-every", "12", *STREAMING]
    config = _train_config(streamed)
    assert (config.fragments, config.encoding, config.overlap, config.sync_every) == (4, "int4", 1, 12)

    support.use_streaming(True)  # what tests/properties/conftest.py does under --chaos-streaming
    try:
        assert support.suite_trainer_args() == streamed
        assert support.suite_trainer_args(streaming=False) == support.FAST_TRAINER_ARGS
        for defect, (_, extra, _) in test_defects.CASES.items():  # each case's own args keep theirs
            args = support.suite_trainer_args(*extra)
            assert args[-6:] == STREAMING and all(a in args for a in extra), defect
            assert _train_config(args).sync_every == 12, defect
        trial = support.Trial(Schedule(seed=1, faults=()), result=None, learners=2,
                              trainer_args=support.suite_trainer_args("--max-staleness", "1000"))
        assert trial.replay_command(Path("s.yaml")).endswith(
            "--max-staleness 1000 --sync-every 12 --fragments 4 --encoding int4 --overlap 1")
    finally:
        support.use_streaming(False)


def test_property_conftest_follows_the_option(pytester: pytest.Pytester) -> None:
    pytester.makeconftest("from tests.properties.conftest import _streaming  # noqa: F401\n")
    pytester.makepyfile(test_args="""
        from tests.properties import support

        def test_args(pytestconfig):
            on = pytestconfig.getoption("chaos_streaming")
            assert ("--fragments" in support.suite_trainer_args()) is on
    """)
    run_inner(pytester).assert_outcomes(passed=1)
    run_inner(pytester, "--chaos-streaming").assert_outcomes(passed=1)
    assert support._streaming is False, "the session resets it"


# --------------------------------------------------------------------------- rejoin after healing


def _syncer_start(fragments: int | None) -> dict:
    config = {"sync_every": 12} if fragments is None else {"sync_every": 12, "fragments": fragments}
    return {"t": 0.0, "kind": "process_start", "process": "syncer", "role": "syncer", "config": config}


def _merge(t: float, fragment: int, *learners: int) -> dict:
    return {"t": t, "kind": "merge", "process": "syncer", "fragment": fragment, "version": 1,
            "contributors": [{"id": f"{i}:1:{t}", "learner": i} for i in learners]}


def _apply(t: float, learner: int, fragment: int) -> dict:
    return {"t": t, "kind": "apply", "process": f"learner-{learner}", "learner": learner, "fragment": fragment,
            "version": 1}


def test_fragment_count_comes_from_the_syncer_config() -> None:
    assert support.fragment_count([_syncer_start(4)]) == 4
    assert support.fragment_count([_syncer_start(None)]) == 1
    assert support.fragment_count([]) == 1


def test_rejoined_with_one_fragment_is_a_merged_push_then_an_apply() -> None:
    events = [_syncer_start(1), _merge(1.0, 0, 1, 2), _apply(1.1, 1, 0), _apply(1.1, 2, 0)]
    assert support.not_rejoined(events, since=2.0, learners=2) == [
        "learner-1: no push merged into fragment(s) [0]", "learner-1: adopted no new version of fragment(s) [0]",
        "learner-2: no push merged into fragment(s) [0]", "learner-2: adopted no new version of fragment(s) [0]"]
    events += [_merge(3.0, 0, 1, 2), _apply(3.1, 1, 0)]
    assert support.not_rejoined(events, since=2.0, learners=2) == [
        "learner-2: adopted no new version of fragment(s) [0]"]
    events.append(_apply(3.2, 2, 0))
    assert support.not_rejoined(events, since=2.0, learners=2) == []


def test_rejoined_with_fragments_needs_every_fragment() -> None:
    """The streaming failure the old teardown let through: each learner was in some merge after
    the heal, so it stopped the cluster, though some fragments had not been adopted since a
    26 s outage (the converged check then failed on them)."""
    events = [_syncer_start(4), _merge(5.0, 1, 1, 2), _merge(5.1, 3, 1, 2), _apply(5.2, 1, 3), _apply(5.2, 2, 1)]
    gaps = support.not_rejoined(events, since=4.0, learners=2)
    assert gaps == ["learner-1: no push merged into fragment(s) [0, 2]",
                    "learner-1: adopted no new version of fragment(s) [0, 1, 2]",
                    "learner-2: no push merged into fragment(s) [0, 2]",
                    "learner-2: adopted no new version of fragment(s) [0, 2, 3]"]
    events += [_merge(6.0, f, 1, 2) for f in (0, 2)]
    events += [_apply(6.1, learner, f) for learner in (1, 2) for f in range(4)]
    assert support.not_rejoined(events, since=4.0, learners=2) == []
