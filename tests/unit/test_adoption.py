"""The learner's versions protocol (trainer/adoption.py), driven with no thread or socket."""
from __future__ import annotations

from trainer.adoption import Adoption, Rollback, VersionBook


def test_only_the_version_that_holds_the_last_push_or_a_newer_one_is_adopted() -> None:
    book = VersionBook.starting_at([4])
    book.sent(0, seq=1)
    book.answered(0, seq=1, version=6)  # accepted: version 6 will hold it
    book.note_versions([5])
    assert book.pulls_wanted() == [], "version 5 does not hold the push: nothing to pull yet"
    book.put_pulled(0, 5, "v5")
    assert book.take(0) is None and book.pulled_version(0) == 5
    book.note_versions([6])
    assert book.pulls_wanted() == [0]
    book.put_pulled(0, 6, "v6")
    assert book.take(0) == Adoption(6, "v6", None)
    book.adopt(0, 6)
    assert book.adopted == [6] and book.take(0) is None


def test_a_push_waits_while_the_window_is_full_and_goes_once_its_merge_is_adopted() -> None:
    book = VersionBook.starting_at([0, 0])
    assert book.may_push(0, window=1)
    book.sent(0, seq=1)
    assert not book.may_push(0, window=1), "one push of fragment 0 is out"
    assert book.may_push(1, window=1), "fragment 1 has none out"
    assert book.may_push(0, window=2)
    book.answered(0, seq=1, version=1)
    assert not book.may_push(0, window=1), "answered but not adopted yet"
    book.adopt(0, 1)
    assert book.may_push(0, window=1)


def test_an_answer_older_than_the_adopted_version_releases_the_push_at_once() -> None:
    book = VersionBook.starting_at([3])
    book.sent(0, seq=7)
    book.answered(0, seq=7, version=2)  # a duplicate answered with an older version
    assert book.may_push(0, window=1)


def test_a_refused_push_is_released_by_the_syncers_version() -> None:
    book = VersionBook.starting_at([0])
    book.note_versions([2])
    book.sent(0, seq=1)
    book.refused(0, seq=1)
    assert book.targets == [2] and book.awaiting == [{1: 2}]


def test_the_long_poll_waits_only_while_an_awaited_merge_is_not_out() -> None:
    book = VersionBook.starting_at([0])
    assert book.awaited() is None
    book.answered(0, seq=1, version=1)
    assert book.awaited() == [0]
    book.note_versions([1])
    assert book.awaited() is None


def test_a_syncer_that_went_back_is_followed_once_to_its_own_version() -> None:
    book = VersionBook.starting_at([0])
    book.adopt(0, 10)
    book.sent(0, seq=4)
    book.answered(0, seq=4, version=11)
    book.put_pulled(0, 11, "v11")  # pulled, not adopted yet, when the syncer came back older
    assert book.note_versions([3]) == [Rollback(0, 11, 3)]
    assert book.note_versions([3]) == [], "a rollback is reported once"
    assert book.pulled_version(0) == -1, "what was pulled from the lost versions is dropped"
    assert book.awaiting[0] == {}, "the push awaiting a lost version no longer holds the window"
    assert not book.may_push(0, window=1), "a push made now would be made on version 10, which the syncer lost"
    assert book.pulls_wanted() == [0]
    book.put_pulled(0, 3, "v3")
    assert book.pulls_wanted() == []
    assert book.take(0) == Adoption(3, "v3", 11)
    book.adopt(0, 3)
    assert book.adopted == [3] and not book.rollbacks
    assert book.may_push(0, window=1), "once version 3 is adopted, the learner pushes on it"
    book.note_versions([4])
    assert book.note_versions([4]) == [] and book.pulls_wanted() == [], "back to the ordinary rule"


def test_without_following_a_rollback_the_learner_never_adopts_again() -> None:
    """The planted defect the rollback handling exists for: a book that only notes the
    syncer's versions (the learner before this fix) awaits a version that never comes."""
    book = VersionBook.starting_at([0])
    book.adopt(0, 10)
    book.answered(0, seq=4, version=11)
    book.syncer = [3]  # noted without the rollback rule
    for version in range(3, 11):  # the syncer merges again, up to the version held
        book.syncer = [version]
        assert book.pulls_wanted() == [] and book.take(0) is None


def test_a_syncer_that_goes_back_again_before_the_first_is_adopted_is_followed_further() -> None:
    book = VersionBook.starting_at([0])
    book.adopt(0, 10)
    assert book.note_versions([6]) == [Rollback(0, 10, 6)]
    book.put_pulled(0, 6, "v6")
    assert book.note_versions([4]) == [Rollback(0, 10, 4)], "the second loss was not followed"
    assert book.pulled_version(0) == -1 and book.pulls_wanted() == [0], "it would await version 6, now gone"
    book.put_pulled(0, 4, "v4")
    assert book.take(0) == Adoption(4, "v4", 10)


def test_a_push_made_while_a_rollback_is_unadopted_is_made_on_the_syncers_version() -> None:
    """Only a stop's residual push is made then: on the lost version it was refused as ahead."""
    book = VersionBook.starting_at([0])
    book.adopt(0, 10)
    assert book.push_base(0) == 10
    book.note_versions([7])
    assert book.push_base(0) == 7
    book.put_pulled(0, 7, "v7")
    assert book.take(0) is not None
    book.adopt(0, 7)
    assert book.push_base(0) == 7 and not book.rollbacks
