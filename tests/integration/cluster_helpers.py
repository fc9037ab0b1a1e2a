"""Helpers for integration tests that run a real local cluster of processes."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

from trainer.events import read_events
from trainer.launch import ClusterSpec, LocalCluster
from trainer.runspec import RunSpec


def make_cluster(run_dir: Path, learners: int = 3, mode: str = "decoupled", extra: list[str] | None = None,
                 start_learners: int | None = None) -> LocalCluster:
    flags = ["--mode", mode, "--sync-every", "10", "--grace", "0.5", *(extra or [])]
    cluster = LocalCluster(ClusterSpec(run_dir, RunSpec(learners=learners, mode=mode, trainer_args=flags[2:])))
    cluster.start_syncer()
    for i in range(1, (start_learners if start_learners is not None else learners) + 1):
        cluster.start_learner(i)
    return cluster


def wait_for(run_dir: Path, what: str, predicate: Callable[[list[dict]], bool], timeout: float,
             cluster: LocalCluster | None = None) -> list[dict]:
    """Poll the run's events until `predicate` holds; fail naming what did not happen."""
    deadline = time.monotonic() + timeout
    while True:
        events = read_events(run_dir)
        if predicate(events):
            return events
        if cluster is not None and cluster.syncer.popen is not None and cluster.syncer.popen.poll() is not None:
            if cluster.syncer.popen.returncode not in (-9, 0):
                raise AssertionError(f"syncer died (exit {cluster.syncer.popen.returncode}) while waiting for {what}")
        if time.monotonic() > deadline:
            kinds = {}
            for e in events:
                kinds[e["kind"]] = kinds.get(e["kind"], 0) + 1
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}; events so far: {kinds}")
        time.sleep(0.25)


def merges(events: list[dict]) -> list[dict]:
    return [e for e in events if e["kind"] == "merge"]


def contributed(events: list[dict], learner: int, incarnation: int, after: float = 0.0) -> bool:
    return any(c["learner"] == learner and c["incarnation"] == incarnation
               for e in merges(events) if e["t"] > after for c in e["contributors"])
