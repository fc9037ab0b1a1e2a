"""What the syncer does when its disk fails, and when the wall clock steps (issue 27's findings).

Each test reproduces one finding on the simulated disk (trainer/simdisk.py) or with a
stepped wall clock, and checks the rule the syncer now keeps (docs/durability.md)."""
from __future__ import annotations

import errno
import threading
import time

import pytest

from tests.unit.syncer_rig import H, Rig, merged_ids, poll_until, push_frame, wait_until
from trainer import wire
from trainer.simdisk import SimDisk

WAIT = 10.0  # every wait on a test thread is bounded by this


def disk_for(r: Rig) -> SimDisk:
    return SimDisk(roots=(str(r.state_dir.parent),))


def test_a_full_disk_answers_the_push_with_a_storage_error_and_keeps_the_connection(rig: Rig) -> None:
    """Finding: ENOSPC closed the learner's connection with no ERROR and no event."""
    disk = disk_for(rig)
    s = rig.start(storage=disk)
    c = rig.client(s)
    c.hello(1, "n")
    disk.fail("create", errno.ENOSPC)
    reply = c.send(push_frame(1, 1, 1, rig.delta(s, 1)))
    assert reply.type == wire.ERROR and reply.header["reason"] == "storage_full", reply.header
    assert "ENOSPC" in reply.header["detail"]
    assert c.request(wire.HEARTBEAT).type == wire.BEAT, "the connection stays open after a storage refusal"
    assert s.counters["rejected_storage_full"] == 1 and s.counters["storage_full"] == 1
    rejected = [e for e in rig.events("frame_rejected") if e.get("reason") == "storage_full"]
    assert rejected, "the refusal is an event"
    assert not s.disk_failed.is_set(), "a full disk wrote nothing: nothing is in doubt"
    disk.heal()
    assert c.send(push_frame(1, 1, 1, rig.delta(s, 1))).header["status"] == "accepted", \
        "the same push is accepted once there is space"


def test_a_full_disk_leaves_no_temporary_behind(rig: Rig) -> None:
    """Finding: partly written `.L-I-S.safetensors.<pid>.<tid>.tmp` files stayed in pending/."""
    disk = disk_for(rig)
    s = rig.start(storage=disk)
    c = rig.client(s)
    c.hello(1, "n")
    disk.fail("sync_files", errno.ENOSPC)  # the file was written, then its group failed
    for seq in (1, 2, 3):
        c.send(push_frame(1, 1, seq, rig.delta(s, seq)))
    leftovers = [n for d in (s.store.pending_dir(0),) for n in disk.listdir(d) if n.endswith(".tmp")]
    assert leftovers == []


def test_a_failed_sync_refuses_the_group_marks_the_disk_failed_and_applies_nothing(rig: Rig) -> None:
    """Findings: a failed syncfs fell back to fsync and acknowledged (12 of 12); pushes that
    only ever got a closed connection were applied after the restart."""
    disk = disk_for(rig)
    s = rig.start(storage=disk)
    c = rig.client(s)
    c.hello(1, "n")
    disk.fail("sync_files", errno.EIO)
    reply = c.send(push_frame(1, 1, 1, rig.delta(s, 1)))
    assert reply.type == wire.ERROR and reply.header["reason"] == "storage_io", reply.header
    assert s.disk_failed.is_set() and s.counters["disk_failed"] == 1
    assert rig.events("disk_failed"), "the failed disk is an event"
    disk.heal()
    again = c.send(push_frame(1, 1, 2, rig.delta(s, 2)))
    assert again.header["reason"] == "storage_io" and "restarts" in again.header["detail"], \
        "after a failed sync nothing more is stored, even once the disk answers again"
    # The restart (serve() exits 75 and a supervisor starts it) reads the disk back: neither
    # push is there, and the retry of the first is a new, accepted push, applied once.
    rig.crash(s)
    s2 = rig.start(storage=disk.crash())
    assert not s2.frags[0].pending and not s2.frags[0].applied
    c2 = rig.client(s2)
    c2.hello(1, "n")
    assert c2.send(push_frame(1, 1, 1, rig.delta(s2, 1))).header["status"] == "accepted"
    wait_until(s2, lambda: s2.frags[0].version >= 1, "the retried push to be merged")
    assert s2.frags[0].applied.count("1:1:1") == 1


def test_a_new_incarnation_that_cannot_be_stored_is_refused_and_written_at_its_reconnect(rig: Rig) -> None:
    """An incarnation number is durable before it is welcomed, even through a reconnect."""
    disk = disk_for(rig)
    s = rig.start(storage=disk)
    disk.fail("create", errno.ENOSPC)
    refused = rig.client(s).hello(1, "n")
    assert refused.type == wire.ERROR and refused.header["reason"] == "storage_full"
    disk.heal()
    welcome = rig.client(s).hello(1, "n")  # the same process again: a reconnect
    assert welcome.type == wire.WELCOME and welcome.header["incarnation"] == 1
    meta = disk.crash().read_json(s.store.meta_path)
    assert meta["members"]["1"]["incarnation"] == 1, "welcomed before its incarnation was durable"


def _push_rounds(r: Rig, s, learner: int, rounds: int, seq0: int = 1) -> list[str]:
    c = r.client(s)
    incarnation = int(c.hello(learner, f"nonce-{learner}").header["incarnation"])
    statuses = []
    for k in range(rounds):
        version = s.frags[0].version
        reply = c.send(push_frame(learner, incarnation, seq0 + k, r.delta(s, seq0 + k), base_version=version,
                                  position=(seq0 + k) * H))
        statuses.append(str(reply.header.get("status") or reply.header.get("reason")))
    c.close()
    return statuses


def test_a_wall_clock_step_back_across_a_restart_does_not_lock_a_learner_out(rig: Rig, monkeypatch) -> None:
    """Finding: a syncer run an hour ahead, restarted with the true clock, refused pushes
    (`would have done 10 steps in -3596.9 s`) and would have for an hour."""
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + 3600)
    s = rig.start()
    assert _push_rounds(rig, s, 1, 2) == ["accepted"] * 2
    rig.crash(s)
    monkeypatch.setattr(time, "time", real)
    s2 = rig.start()
    statuses = _push_rounds(rig, s2, 1, 12, seq0=3)
    assert statuses == ["accepted"] * 12, statuses


def test_a_wall_clock_step_forward_across_a_restart_grants_no_burst(rig: Rig, monkeypatch) -> None:
    """The other direction: an hour forward must not allow 2000 steps/s × 3600 s at once."""
    s = rig.start()
    _push_rounds(rig, s, 1, 1)
    rig.crash(s)
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + 3600)
    s2 = rig.start()
    c = rig.client(s2)
    c.hello(1, "nonce-1")
    greedy = push_frame(1, 1, 9, rig.delta(s2, 9), base_version=s2.frags[0].version, position=9 * H,
                        tokens=100_000 * 8, steps=100_000)
    reply = c.send(greedy)
    assert reply.type == wire.ERROR and reply.header["reason"] == "out_of_bounds", reply.header


def test_the_incarnation_age_is_persisted_and_credited_with_the_downtime(rig: Rig) -> None:
    s = rig.start()
    _push_rounds(rig, s, 1, 1)
    poll_until(lambda: s.members.members[1].elapsed(time.monotonic()) > 0.2, "the incarnation to age")
    rig.crash(s)
    s2 = rig.start()
    assert s2.members.members[1].elapsed(time.monotonic()) > 0.2, "a restart does not reset the age"


@pytest.fixture(autouse=True)
def _tiny_threads():
    import torch
    torch.set_num_threads(1)
    yield


class HeldSyncDisk(SimDisk):
    """A SimDisk whose next group sync waits to be released, then succeeds or fails (a plain
    EIO, which does not mark the disk failed): a slow disk under a learner's deadline."""

    def __init__(self, roots: tuple[str, ...]) -> None:
        super().__init__(roots=roots)
        self.hold, self.entered, self.release = threading.Event(), threading.Event(), threading.Event()
        self.fail_held = False

    def sync_files(self, paths, root) -> None:
        if self.hold.is_set():
            self.hold.clear()
            self.entered.set()
            assert self.release.wait(WAIT), "the test never released the held sync"
            if self.fail_held:
                raise OSError(errno.EIO, "planted: the first attempt's group fails")
        super().sync_files(paths, root)


@pytest.mark.parametrize("first_attempt", ["lands", "fails"])
def test_a_retry_while_the_first_attempt_is_stored_is_in_flight_not_a_duplicate(rig: Rig, first_attempt: str) -> None:
    """Finding (a review of the group commit): a learner whose deadline passed while its
    push's group was still being written sent it again and heard "duplicate", which it
    takes as the acknowledgement; when that group then failed, the push was lost. The
    retry now hears "in flight" until the first attempt's group ends: then it is a
    duplicate of a durable push, or accepted anew, and merged exactly once either way."""
    disk = HeldSyncDisk((str(rig.state_dir.parent),))
    s = rig.start(storage=disk)
    first, retry = rig.client(s), rig.client(s)
    first.hello(1, "n")
    push = push_frame(1, 1, 7, rig.delta(s, 7))
    disk.hold.set()
    answers: list[wire.Frame] = []
    sender = threading.Thread(target=lambda: answers.append(first.send(push)))
    sender.start()
    assert disk.entered.wait(WAIT), "the first attempt never reached its group's sync"
    retry.hello(1, "n")  # the learner reconnected: the same incarnation
    busy = retry.send(push)
    assert busy.type == wire.ERROR and busy.header["reason"] == "in_flight", busy.header
    disk.fail_held = first_attempt == "fails"
    disk.release.set()
    sender.join(WAIT)
    assert not sender.is_alive()
    again = retry.send(push)
    assert again.type == wire.ACK, again.header
    assert again.header["status"] == ("duplicate" if first_attempt == "lands" else "accepted")
    wait_until(s, lambda: s.frags[0].version >= 1, "the push's merge")
    assert merged_ids(rig.events("merge")).count("1:1:7") == 1


def test_a_failed_sync_outside_the_group_commit_stops_it_too(rig: Rig) -> None:
    """Finding (a review): a merge's failed sync marked the syncer's disk failed, but the
    group commit went on making pushes already admitted durable (and meta.json) on a disk
    no longer trusted."""
    from trainer.group_commit import DiskFailed
    from trainer.storage import SyncFailed

    s = rig.start(storage=disk_for(rig))
    rig.client(s).hello(1, "n")
    s._storage_error(SyncFailed(errno.EIO, "planted: the fragment file's sync failed", "fragment-0"), "fragment-0")
    assert s.disk_failed.is_set() and s.durability.failed is not None
    with pytest.raises(DiskFailed, match="a sync failed earlier"):
        s.durability.commit()
