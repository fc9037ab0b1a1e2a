"""Each node's evidence, brought into the run directory: no directory is shared between nodes.

On several hosts there is no shared disk: a task writes its events into its node's own
volume (`run`, mounted at /islands/run), and the controller copies them out while the run
goes on and once more at its end. Copies go through each node's engine (`get_archive` on a
container of that node that mounts the volume: the `clock` service's task, one per node),
so nothing but the Docker API crosses between the controller and the nodes.

A process that ran on two nodes (a learner Swarm moved after its node failed) leaves a
file on each; they are kept apart as `events/<process>@<node>.jsonl` (the checks read
every file of events/). A node that never answers again keeps the evidence it had at its
last copy; `collection.json` says, per node, when that was and whether its last copy
came at the end of the run, and the checks answer unknown for what they could not see.
"""
from __future__ import annotations

import io
import json
import os
import tarfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

COLLECTION_FILE = "collection.json"
COLLECT_EVERY = 2.0
MAX_RUN_SECONDS = 24 * 3600.0
VOLUME_TARGET = "/islands/run"
COLLECTED_DIRS = ("events", "units")
MAX_ARCHIVE_BYTES = 512 << 20  # a node's evidence; a larger archive is refused, not read


@dataclass
class NodeRecord:
    """What was collected from one node: when its last copy was taken (controller monotonic
    time), how many copies failed, and whether it answered once the run had ended."""
    last: float | None = None
    copies: int = 0
    failures: int = 0
    error: str | None = None
    final: bool = False
    files: list[str] = field(default_factory=list)


def split_members(archive: bytes, node: str) -> dict[str, bytes]:
    """The archive's event and unit files, as run-directory paths (events renamed per node)."""
    out: dict[str, bytes] = {}
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        for member in tar.getmembers():
            if not member.isfile():
                continue
            parts = Path(member.name).parts
            if len(parts) != 2 or parts[0] not in COLLECTED_DIRS or parts[1].startswith("."):
                continue  # only a flat events/ or units/ file: nothing may land outside the run dir
            directory, name = parts
            data = tar.extractfile(member).read()  # type: ignore[union-attr]
            if directory == "events" and name.endswith(".jsonl"):
                name = f"{name[:-len('.jsonl')]}@{node}.jsonl"
            out[f"{directory}/{name}"] = data
    return out


def write_atomically(path: Path, data: bytes) -> None:
    """Readers (the progress printer, the checks) never see half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


class Collector:
    """Copies every node's evidence into `run_dir` every COLLECT_EVERY seconds until stopped.

    `sources()` names, per node, a function that returns tar archives of the node's run
    volume's events/ and units/ (raising when the node does not answer)."""

    def __init__(self, run_dir: str | os.PathLike, sources: Callable[[], dict[str, Callable[[], list[bytes]]]],
                 every: float = COLLECT_EVERY, clock: Callable[[], float] = time.monotonic) -> None:
        self.run_dir = Path(run_dir)
        self.sources = sources
        self.every = every
        self.clock = clock
        self.nodes: dict[str, NodeRecord] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="evidence-collector", daemon=True)

    def start(self) -> "Collector":
        self._thread.start()
        return self

    def collect(self, final: bool = False) -> None:
        """One copy from every node that answers (nodes are asked one after another)."""
        with self._lock:
            try:
                sources = self.sources()
            except Exception as exc:  # noqa: BLE001 - an engine too slow to list its nodes: next round
                for record in self.nodes.values():
                    record.error = f"nodes could not be listed: {exc}"
                return
            for node, fetch in sorted(sources.items()):
                record = self.nodes.setdefault(node, NodeRecord())
                try:
                    files: dict[str, bytes] = {}
                    for archive in fetch():
                        if len(archive) > MAX_ARCHIVE_BYTES:
                            raise ValueError(f"its evidence is {len(archive)} bytes, over {MAX_ARCHIVE_BYTES}")
                        files.update(split_members(archive, node))
                except Exception as exc:  # noqa: BLE001 - a node down or slow: recorded, asked again
                    record.failures += 1
                    record.error = f"{type(exc).__name__}: {exc}"
                    continue
                for relative, data in files.items():
                    target = self.run_dir / relative
                    if not target.exists() or target.stat().st_size != len(data) or target.read_bytes() != data:
                        write_atomically(target, data)
                record.last, record.copies, record.error = self.clock(), record.copies + 1, None
                record.files = sorted(files)
                if final:
                    record.final = True
            for node, record in self.nodes.items():
                if node not in sources and final:
                    record.error = record.error or "the node was not in the swarm when the run ended"

    def stop(self) -> dict[str, NodeRecord]:
        """Stop copying, take the final copy, and write collection.json."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self.every + 60)
        self.collect(final=True)
        with self._lock:
            (self.run_dir / COLLECTION_FILE).write_text(json.dumps(
                {node: asdict(r) for node, r in sorted(self.nodes.items())}, indent=2) + "\n")
            return dict(self.nodes)

    def _run(self) -> None:
        deadline = self.clock() + MAX_RUN_SECONDS
        while not self._stop.is_set() and self.clock() < deadline:
            self.collect()
            self._stop.wait(self.every)


def incomplete_nodes(run_dir: str | os.PathLike) -> dict[str, dict]:
    """The nodes whose evidence stops before the run's end (collection.json): node -> its
    record. Empty when every node answered at the end, or when nothing was collected (a
    run directory the processes wrote into directly)."""
    path = Path(run_dir) / COLLECTION_FILE
    if not path.exists():
        return {}
    try:
        nodes = json.loads(path.read_text())
    except ValueError:
        return {"?": {"error": f"{COLLECTION_FILE} is unreadable"}}
    return {node: r for node, r in nodes.items() if not r.get("final")}
