"""What the syncer's answer to a push tells the learner, and what admission keeps of a push
that was not stored.

A `duplicate` answer stands in for an `accepted` one whose ACK was lost: the learner must
await the version that holds the push, or it pushes the fragment again while that push is
still pending (one more push out than --push-window allows). The steps a push claims are
bounded per incarnation; a push whose write failed is retried, and must not be bounded by
its own steps twice."""
from __future__ import annotations

import torch

from tests.unit.syncer_rig import H, Rig, push_frame, wait_until
from trainer import wire
from trainer.adoption import VersionBook
from trainer.events import EventLog, MemoryEvents
from trainer.push_protocol import PushProtocol
from trainer.pushes import OutgoingPush, PushQueue
from trainer.syncer import Syncer


def _claimed(s: Syncer) -> int:
    return s.core.members.members[1].claimed.get(0, 0)


# ------------------------------------------------------------ the duplicate's version

def test_a_duplicate_of_a_pending_push_names_the_version_that_will_hold_it(rig: Rig) -> None:
    s = rig.start(quorum=2, grace=3600.0)  # learner 2 never pushes: learner 1's push stays pending
    c1, c2 = rig.client(s), rig.client(s)
    c1.hello(1, "n1")
    c2.hello(2, "n2")
    frame = push_frame(1, 1, 1, rig.delta(s, 1))
    first = c1.send(frame)
    again = c1.send(frame)  # the retry of a push whose ACK was lost
    assert first.header["status"] == "accepted" and again.header["status"] == "duplicate"
    assert s.frags[0].version == 0 and len(s.frags[0].pending) == 1
    # `accepted` names the version the next merge builds on (the learner awaits one more);
    # `duplicate` names the version that releases the push: the same one, version 1.
    assert again.header["version"] == first.header["version"] + 1 == 1


def test_a_duplicate_of_a_merged_push_names_the_current_version(rig: Rig) -> None:
    s = rig.start(quorum=1, grace=0.0)
    c = rig.client(s)
    c.hello(1, "n")
    frame = push_frame(1, 1, 1, rig.delta(s, 1))
    assert c.send(frame).header["status"] == "accepted"
    wait_until(s, lambda: s.frags[0].version >= 1, "the push to be merged")
    again = c.send(frame)
    assert again.header["status"] == "duplicate" and again.header["version"] == 1


def test_holding_version_while_a_merge_is_written(rig: Rig) -> None:
    s = rig.start(quorum=1, grace=3600.0)
    rig.client(s).hello(1, "n")
    frag = s.frags[0]
    with s.cond:
        s.core.push_durable(rig.admitted(s, 1))
        s.core.push_durable(rig.admitted(s, 2))
        frag.merging.add("1:1:1")  # push 1 was taken by the merge being written; push 2 arrived after
        frag.writing = True
        try:
            assert frag.holding_version("1:1:1") == 1, "the merge being written holds it"
            assert frag.holding_version("1:1:2") == 2, "the merge after the one being written holds it"
        finally:
            frag.merging.discard("1:1:1")
            frag.writing = False
        assert frag.holding_version("1:1:2") == 1


def test_the_learner_does_not_push_again_before_the_duplicate_push_is_adopted() -> None:
    book = VersionBook.starting_at([0])
    book.sent(0, 1)
    book.answered(0, 1, 1)  # "duplicate", version 1: push 1 is pending on the syncer
    assert not book.may_push(0, window=1), "a second push of fragment 0 went while the first was pending"
    book.adopt(0, 1)
    assert book.may_push(0, window=1)


# ------------------------------------------------------------ claims of unstored pushes

def test_a_push_whose_write_failed_gives_its_claimed_steps_back(rig: Rig) -> None:
    s = rig.start()
    rig.client(s).hello(1, "n")
    norms = s.core.norms[0].recent
    ticket = rig.admitted(s, 1)
    assert _claimed(s) == H, "admission claims the push's steps while its file is written"
    with s.cond:
        s.core.push_failed(ticket)
    assert _claimed(s) == 0 and len(norms) == 0, "a push that was never stored still counts"

    retry = rig.admitted(s, 1)  # the learner sends it again, same id
    with s.cond:
        s.core.push_durable(retry)
    assert _claimed(s) == H, "the retry's steps were claimed twice"
    assert len(norms) == 1, "the stored push's norm was not noted once"



# ------------------------------------------------------------ merges that fail

def test_a_merge_whose_write_failed_is_retried_with_its_own_pushes_alone(rig: Rig) -> None:
    """A push accepted while a merge is written is promised the version after it; when that
    write fails and the retry took every pending push, the promised version never came and
    a learner that alone pushes the fragment waited for it forever."""
    s = rig.start(quorum=2, grace=3600.0)  # nothing merges on its own: the test drives the merges
    rig.client(s).hello(1, "n1")
    rig.client(s).hello(2, "n2")
    frag = s.frags[0]
    with s.cond:
        s.core.push_durable(rig.admitted(s, 1))
        plan = s.core.begin_merge(frag, "test")
        assert plan is not None and frag.writing
        during = rig.admitted(s, 2)
        s.core.push_durable(during)
        assert during.version == 1, "accepted during the write: its learner awaits version 2"
        s.core.abort_merge(plan)  # the fragment file's write failed (ENOSPC)
        s._merge(frag, "retry")
        assert frag.version == 1 and frag.applied == ["1:1:1"], "the retry took more than the failed merge's pushes"
        assert [p.contribution.ident for p in frag.pending] == ["1:1:2"]
        s._merge(frag, "next")
        assert frag.version == 2 and frag.applied == ["1:1:1", "1:1:2"], "the promised version did not hold the push"


def test_a_lone_learner_whose_push_merged_before_its_promised_version_after_a_restart_pushes_again(
        rig: Rig) -> None:
    """Learner 1's push, accepted while learner 2's merge was written, is promised version 2.
    The write fails, and so does the syncer (a failed sync ends it). Recovery knows no
    promises: it merges both recovered pushes into version 1. Learner 2 has left; learner 1,
    pushing with a window of 1, awaited version 2, which only another push of the fragment
    could make: it never pushed again. A heartbeat's answer says how many of its pushes the
    syncer still holds: none, so it awaits the version it can pull."""
    s = rig.start(quorum=2, grace=3600.0)  # nothing merges on its own: the test drives it
    rig.client(s).hello(1, "n1")
    rig.client(s).hello(2, "n2")
    frag = s.frags[0]
    s._store_push(rig.admitted(s, 1, learner=2))  # its file durable, as the service stores it
    with s.cond:
        plan = s.core.begin_merge(frag, "test")
        assert plan is not None
    during = rig.admitted(s, 1, learner=1)
    s._store_push(during)
    assert during.version == 1, "accepted during the write: its learner awaits version 2"
    with s.cond:
        s.core.disk_failed = True  # the fragment file's sync failed: the syncer merges nothing more, exits
        s.core.abort_merge(plan)
    rig.crash(s)

    book = VersionBook.starting_at([0])
    protocol = PushProtocol(1, 1, book, PushQueue(4), EventLog(None, "learner-1", learner=1), "fp32", lambda: 0.0)
    book.sent(0, 1)
    book.answered(0, 1, during.version + 1)  # the ACK (version 1) promised version 2

    r = rig.start(quorum=1, grace=0.0)  # learner 2 is gone: learner 1 pushes alone
    c = rig.client(r)
    c.hello(1, "n1")
    wait_until(r, lambda: r.frags[0].version >= 1 and not r.frags[0].pending, "the recovered pushes to merge")
    assert r.frags[0].version == 1 and sorted(r.frags[0].applied) == ["1:1:1", "2:1:1"], \
        "the control: recovery merges both pushes into version 1"
    beat = c.request("HEARTBEAT")
    assert beat.header["waiting"] == [0] and beat.header["versions"] == [1], beat.header
    protocol.note_versions(beat.header["versions"])
    assert book.pulls_wanted() == [] and book.awaited() == [1], "the bug: the promise alone awaits version 2"
    protocol.note_versions(beat.header["versions"], beat.header["waiting"])
    assert book.pulls_wanted() == [0], "the learner does not pull version 1, which holds its push"
    book.put_pulled(0, 1, "theta-1")
    adoption = book.take(0)
    assert adoption is not None and adoption.version == 1
    book.adopt(0, 1)
    assert book.may_push(0, window=1), "the learner still awaits version 2 and never pushes fragment 0 again"


def test_a_heartbeat_counts_the_learners_pushes_not_yet_merged(rig: Rig) -> None:
    s = rig.start(quorum=2, grace=3600.0)
    c1, c2 = rig.client(s), rig.client(s)
    c1.hello(1, "n1")
    c2.hello(2, "n2")
    assert c1.send(push_frame(1, 1, 1, rig.delta(s, 1))).header["status"] == "accepted"
    assert c1.request("HEARTBEAT").header["waiting"] == [1]
    assert c2.request("HEARTBEAT").header["waiting"] == [0], "another learner's push counted"
    assert c2.send(push_frame(2, 1, 1, rig.delta(s, 2))).header["status"] == "accepted"
    wait_until(s, lambda: s.frags[0].version == 1, "the quorum's merge")
    assert c1.request("HEARTBEAT").header["waiting"] == [0]


def test_a_learner_keeps_awaiting_its_promised_version_while_its_push_is_held() -> None:
    """The control: while the syncer holds a push, or says nothing (sync mode, an older
    syncer), the promise stands."""
    for waiting in ([1], None, [0, 0]):
        book = VersionBook.starting_at([0])
        book.sent(0, 1)
        book.answered(0, 1, 2)
        book.note_versions([1])
        book.note_waiting(waiting)
        assert book.targets[0] == 2 and not book.pulls_wanted(), waiting


def test_nothing_merges_once_the_disk_failed_a_sync(rig: Rig) -> None:
    s = rig.start(quorum=2, grace=3600.0)
    rig.client(s).hello(1, "n1")
    frag = s.frags[0]
    with s.cond:
        s.core.push_durable(rig.admitted(s, 1))
        s.core.disk_failed = True  # a sync failed: the restart reads the state back and merges
        s.core.begin_pass()
        assert s.core.due(frag, s.core.monotonic() + 1e6) is None, "a merge was due on a disk that failed a sync"
        s.core.disk_failed = False
        assert s.core.due(frag, s.core.monotonic() + 1e6) is not None, "the control: the push is due without the failure"


def test_every_fragments_pending_directory_is_made_at_recovery(rig: Rig) -> None:
    s = rig.make(fragments=2)
    assert all((rig.state_dir / "pending" / str(f)).is_dir() for f in range(2)), \
        "a pending directory left to the first pushes' threads can race (one acknowledges before it is durable)"
    assert s.frags[0].version == 0


# ------------------------------------------------------------ a syncer that went back

def _outgoing(seq: int, base_version: int) -> OutgoingPush:
    return OutgoingPush(0, seq, base_version, 2048, 4, seq * 4, {"w": torch.ones(2)})


def test_pushes_queued_on_lost_versions_are_rebased_on_the_syncers() -> None:
    """The syncer came back at version 9; the learner held 10 and had pushes queued on it,
    which the syncer refuses as ahead of it: they were dropped, their progress with them."""
    book, queue = VersionBook.starting_at([10]), PushQueue(4)
    memory = MemoryEvents()
    events = EventLog(None, "learner-1", learner=1, memory=memory)
    protocol = PushProtocol(1, 1, book, queue, events, "fp32", lambda: 0.0)
    head = _outgoing(1, 10)
    queue.put(head)
    protocol.sent(queue.claim())
    first = protocol.message(head, 512)  # sent, its answer lost as the syncer went down
    queue.put(_outgoing(2, 10))  # made while the syncer was down
    protocol.note_versions([9])
    assert [(item.seq, item.base_version) for item in queue._items] == [(1, 9), (2, 9)]
    again = protocol.message(head, 512)
    assert again is not first and wire.parse_header(again.head)["base_version"] == 9
    assert wire.parse_header(again.head)["seq"] == 1, "a rebased push keeps its id"
    assert not book.may_push(0, window=1), "no push is made on version 10 until 9 is adopted"
    rollback = [e for e in memory.events() if e["kind"] == "syncer_rollback"]
    assert rollback and rollback[0]["rebased"] == [1, 2]


def test_a_stored_push_retried_on_an_older_version_is_a_duplicate_not_ahead(rig: Rig) -> None:
    s = rig.start(quorum=2, grace=3600.0)
    c = rig.client(s)
    c.hello(1, "n1")
    rig.client(s).hello(2, "n2")
    delta = rig.delta(s, 1)
    assert c.send(push_frame(1, 1, 1, delta)).header["status"] == "accepted"
    retried = c.send(push_frame(1, 1, 1, delta, base_version=5))  # rebased after a rollback it misread
    assert retried.type == wire.ACK and retried.header["status"] == "duplicate", retried.header
    fresh = c.send(push_frame(1, 1, 2, delta, base_version=5))
    assert fresh.type == wire.ERROR and fresh.header["reason"] == "out_of_bounds", "a new push ahead is refused"
