"""Crash consistency, state by state, as ALICE and CrashMonkey test file systems' users.

A real syncer (in this process, on 127.0.0.1) takes pushes from three learners while its
state directory lives on a simulated disk (trainer/simdisk.py) that records what is
durable after every call: power-loss semantics, where nothing survives that was not
synced (a write without fsync, a name whose directory was not fsynced). Then, for every
point of the run at which the durable state changed, a fresh syncer recovers from exactly
what a power loss there would have left, and the ledger is checked against the
acknowledgements the learners had received by then: each acknowledged push is merged or
pending exactly once, none is lost and none is applied twice.

SIGKILL cannot find what this finds: a killed process's unsynced writes survive in the
page cache. The planted defect `ack_before_sync` (acknowledges once a push's file is in
place by name, before its contents are synced) passes every SIGKILL test and fails here.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

from tests.unit.syncer_rig import H, SECRET, Client, push_frame, train_config
from trainer.config import SyncerConfig
from trainer.simdisk import Image, SimDisk
from trainer.syncer import Syncer

LEARNERS = 3
PUSHES = 24          # per learner
FRAGMENTS = 2
MIN_STATES = 200     # the floor of crash states per CI run
TIMEOUT = 30.0


@dataclass
class Acks:
    """(push id, fragment, the disk's op count when the learner had the ack in hand)."""

    got: list[tuple[str, int, int]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


def syncer_config(state_dir: Path) -> SyncerConfig:
    # quorum 1 and no grace: a merge (a fragment file written, pending files removed) after
    # nearly every push, so merges interleave with the pushes' group commits.
    return SyncerConfig(host="127.0.0.1", port=0, state_dir=str(state_dir), quorum=1, grace=0.0,
                        max_staleness=1000, momentum_warmup=0.0)


def learner(address: tuple[str, int], n: int, disk: SimDisk, acks: Acks, shapes: dict[str, list[torch.Size]],
            errors: list[BaseException]) -> None:
    try:
        client = Client(address, n)
        incarnation = int(client.hello(n, f"nonce-{n}").header["incarnation"])
        g = torch.Generator().manual_seed(n)
        for seq in range(1, PUSHES + 1):
            fragment = seq % FRAGMENTS
            delta = {name: torch.randn(shape, generator=g) * 0.01 for name, shape in shapes[fragment]}
            reply = client.send(push_frame(n, incarnation, seq, delta, fragment=fragment, base_version=0,
                                           position=seq * H))
            with disk.lock:
                op = disk.ops  # every call the commit made is counted by now
            assert reply.header["status"] in ("accepted", "duplicate"), reply.header
            with acks.lock:
                acks.got.append((f"{n}:{incarnation}:{seq}", fragment, op))
        client.close()
    except BaseException as exc:  # noqa: BLE001 - reported by the test
        errors.append(exc)


def run_workload(tmp_path: Path) -> tuple[SimDisk, Acks, Path]:
    state_dir = tmp_path / "state"
    disk = SimDisk(roots=(str(tmp_path),))
    s = Syncer(syncer_config(state_dir), train_config(FRAGMENTS), SECRET, str(tmp_path / "run"), storage=disk)
    s.start()
    acks, errors = Acks(), []
    shapes = {f.index: [(n, s.shapes[n]) for n in f.names] for f in s.specs}
    threads = [threading.Thread(target=learner, args=(s.address, n, disk, acks, shapes, errors))
               for n in range(1, LEARNERS + 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT)
        assert not t.is_alive(), "a learner did not finish its pushes"
    assert not errors, errors
    # Halt as a power loss would: no final merge, no final write (the threads just stop).
    s._running = False
    s._listener.close()
    for t in s._threads:
        t.join(timeout=5)
    s.events.close()
    return disk, acks, state_dir


def recover(image: Image, state_dir: Path, run_dir: Path) -> tuple[dict[int, list[str]], dict[int, list[str]], int]:
    """A fresh syncer on what the power loss left: (ledger, pending, quarantined) per fragment."""
    s = Syncer(syncer_config(state_dir), train_config(FRAGMENTS), SECRET, str(run_dir),
               storage=SimDisk.from_image(image))
    try:
        ledger = {f.spec.index: list(f.applied) for f in s.frags}
        pending = {f.spec.index: [p.contribution.ident for p in f.pending] for f in s.frags}
        return ledger, pending, s.counters["quarantined"]
    finally:
        s.events.close()


def violations(disk: SimDisk, acks: Acks, state_dir: Path, run_dir: Path) -> tuple[list[str], int, int]:
    """Every crash state checked: (what went wrong, states, distinct images)."""
    problems: list[str] = []
    points = [at for at, _ in disk.images] + [disk.ops + 1]
    seen: dict[str, tuple] = {}
    states = 0
    for (at, image), next_at in zip(disk.images, points[1:]):
        # A power loss at any op in [at, next_at) leaves this image; the acks the learners
        # held by the last of those ops must all be in it.
        held = [(ident, f) for ident, f, op in acks.got if op < next_at]
        digest = image.digest()
        if digest not in seen:
            seen[digest] = recover(image, state_dir, run_dir)
        ledger, pending, quarantined = seen[digest]
        states += 1
        for f, ids in ledger.items():
            doubled = sorted({i for i in ids if ids.count(i) > 1} | (set(ids) & set(pending[f])))
            if doubled:
                problems.append(f"crash after op {next_at - 1}: fragment {f} applies {doubled} twice")
        for ident, f in held:
            count = ledger[f].count(ident) + pending[f].count(ident)
            if count != 1:
                problems.append(f"crash after op {next_at - 1}: acknowledged push {ident} of fragment {f} "
                                f"is {'lost' if count == 0 else f'there {count} times'} (quarantined: {quarantined})")
    return problems, states, len(seen)


def test_every_crash_state_of_a_run_keeps_every_acknowledged_push_exactly_once(tmp_path: Path) -> None:
    torch.set_num_threads(1)
    started = time.monotonic()
    disk, acks, state_dir = run_workload(tmp_path)
    assert len(acks.got) == LEARNERS * PUSHES
    problems, states, distinct = violations(disk, acks, state_dir, tmp_path / "recover")
    seconds = time.monotonic() - started
    print(f"crash states: {states} ({distinct} distinct images) over {disk.ops} disk calls, "
          f"{len(acks.got)} acks, {len(problems)} violations, {seconds:.1f} s")
    assert states >= MIN_STATES, f"only {states} crash states were explored (want >= {MIN_STATES})"
    assert not problems, "\n".join(problems[:20])


def test_the_ack_before_sync_defect_loses_acknowledged_pushes_at_a_power_loss(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The planted defect no SIGKILL can catch: the files are in place by name when the push
    is acknowledged, their contents only in the page cache."""
    monkeypatch.setenv("ISLANDS_SYNCER_DEFECT", "ack_before_sync")
    torch.set_num_threads(1)
    disk, acks, state_dir = run_workload(tmp_path)
    problems, states, _ = violations(disk, acks, state_dir, tmp_path / "recover")
    assert any("is lost" in p for p in problems), f"{states} crash states and no acknowledged push lost"
