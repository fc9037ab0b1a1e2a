"""Each node's evidence copied into the run directory (chaos/backends/collect.py): files kept
apart per node, nothing written outside events/ and units/, a node that stops answering
recorded, and the checks unknown for what it never handed over. Fake nodes: no Docker."""
from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

from chaos.backends.collect import COLLECTION_FILE, Collector, incomplete_nodes, split_members
from chaos.checkers import FAIL, PASS, UNKNOWN, run_checkers

from .test_chaos_checkers import healthy_chaos_run


def archive(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def test_event_files_are_kept_apart_per_node_and_nothing_lands_outside_the_run_dir():
    files = split_members(archive({"events/learner-2.jsonl": b"a\n", "units/learner-2.json": b"{}",
                                   "events/../../etc/passwd": b"x", "/abs.jsonl": b"x", "events/.hidden.tmp": b"x",
                                   "logs/learner-2.log": b"x", "events/deep/er.jsonl": b"x"}), "islands-node-3")
    assert files == {"events/learner-2@islands-node-3.jsonl": b"a\n", "units/learner-2.json": b"{}"}


class Nodes:
    """Fake nodes whose volumes hold files; a node may stop answering."""

    def __init__(self) -> None:
        self.files = {"n1": {"events/syncer.jsonl": b'{"t": 1}\n'}, "n2": {"events/learner-1.jsonl": b'{"t": 2}\n'}}
        self.down: set[str] = set()
        self.gone: set[str] = set()

    def sources(self) -> dict:
        def fetch(node: str):
            if node in self.down:
                raise ConnectionError(f"{node} does not answer")
            return [archive(self.files[node])]
        return {node: (lambda node=node: fetch(node)) for node in self.files if node not in self.gone}


def test_the_collector_copies_each_node_and_records_one_that_stopped_answering(tmp_path: Path):
    nodes = Nodes()
    collector = Collector(tmp_path, nodes.sources, clock=iter(range(100)).__next__)
    collector.collect()
    assert sorted(p.name for p in (tmp_path / "events").iterdir()) == ["learner-1@n2.jsonl", "syncer@n1.jsonl"]
    nodes.files["n2"]["events/learner-1.jsonl"] += b'{"t": 3}\n'
    nodes.down.add("n1")
    collector.collect()
    assert (tmp_path / "events" / "learner-1@n2.jsonl").read_bytes() == b'{"t": 2}\n{"t": 3}\n'
    nodes.gone.add("n1")  # powered off for good: no longer a node the swarm lists
    records = collector.stop()
    assert records["n2"].final and not records["n1"].final and records["n1"].failures == 1
    written = json.loads((tmp_path / COLLECTION_FILE).read_text())
    assert written["n1"]["error"] and written["n2"]["copies"] == 3
    assert list(incomplete_nodes(tmp_path)) == ["n1"]
    assert (tmp_path / "events" / "syncer@n1.jsonl").exists()  # what it handed over before stays


def test_a_pass_on_incomplete_evidence_is_unknown_naming_the_node_and_a_failure_stands():
    healthy = healthy_chaos_run()
    missing = {"islands-node-3": {"error": "ConnectionError: islands-node-3 does not answer", "final": False}}
    incomplete = type(healthy)(healthy.events, healthy.history, incomplete=missing)
    verdicts = {v.name: v for v in run_checkers(incomplete)}
    assert verdicts["no_lost_acks"].status == UNKNOWN and "islands-node-3" in verdicts["no_lost_acks"].detail
    assert verdicts["faults_applied"].status == PASS  # the controller's own record: nothing missing
    failing = {v.name: v.status for v in run_checkers(incomplete, {"progress": {"max_gap": 0.1}})}
    assert failing["progress"] == FAIL


def test_a_run_directory_without_a_collection_is_complete(tmp_path: Path):
    assert incomplete_nodes(tmp_path) == {}
