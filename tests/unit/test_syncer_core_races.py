"""What the syncer's core keeps when its threads race (a review of the group commit and the
merge path): a push entered once however many of its attempts land, one merge of a
fragment at a time, and no push stranded when a quarantine cannot be written."""
from __future__ import annotations

import pytest

from tests.unit.syncer_rig import Rig
from trainer.syncer import Syncer


def _joined(rig: Rig) -> Syncer:
    s = rig.start()
    rig.client(s).hello(1, "n")
    return s


def test_a_push_whose_two_attempts_both_land_is_entered_once(rig: Rig) -> None:
    s = _joined(rig)
    ticket = rig.admitted(s, 3)
    with s.cond:
        s.core.push_durable(ticket)
        s.core.push_durable(ticket)  # a second attempt's file, at the same path, made durable too
    assert [p.contribution.ident for p in s.frags[0].pending] == ["1:1:3"]
    assert s.core.counters["durable_again"] == 1 and s.core.counters["accepted"] == 1


def test_no_merge_of_a_fragment_is_planned_while_one_is_being_written(rig: Rig) -> None:
    """stop() gave up on a merge thread after 5 s and merged the same fragment again: two
    merges of one version, each ledger without the other's pushes."""
    s = _joined(rig)
    with s.cond:
        s.core.push_durable(rig.admitted(s, 1))
        frag = s.frags[0]
        frag.writing = True  # a merge thread is writing this fragment, off the lock
        try:
            assert s.core.final_merges() == []
            assert s.core.due(frag, s.core.monotonic() + 3600) is None
        finally:
            frag.writing = False
        assert s.core.final_merges() == [frag]


def test_a_quarantine_that_cannot_be_written_leaves_the_pushes_pending(rig: Rig, monkeypatch) -> None:
    s = _joined(rig)
    with s.cond:
        s.core.push_durable(rig.admitted(s, 1))
        s.core.push_durable(rig.admitted(s, 2))
    frag = s.frags[0]

    def unmergeable(*args, **kwargs):
        raise RuntimeError("planted: this merge raises")

    def disk_full(*args, **kwargs):
        raise OSError(28, "planted: no space for the quarantine")
    monkeypatch.setattr(s.core, "_step", unmergeable)
    monkeypatch.setattr(s.core.quarantine, "put", disk_full)
    with s.cond:
        with pytest.raises(OSError, match="no space"):
            s.core.begin_merge(frag, "test")
        assert sorted(p.contribution.ident for p in frag.pending) == ["1:1:1", "1:1:2"]
        assert frag.merging == set() and not frag.writing
