"""The learner's versions protocol, with no thread, socket, clock or tensor math.

Which global versions a learner pulls, which it adopts, when a due push may go, and what
it does when the syncer goes back: decisions the learner's two threads used to make on
shared lists under one lock. Here they are one object the learner holds under that lock
(its network thread reports what the syncer said, its inner loop asks what to adopt), and
that a simulator can drive alone (issue 28). Pulled fragments are opaque payloads: the
book only orders them by version.

The rule it keeps (learner.py's docstring says why): a learner adopts the version that
holds its last push of a fragment, or a newer one, and pushes a fragment again only once
its pushes in flight (at most --push-window) were answered and adopted. The exception: a
syncer that reports a version below the one the learner holds has lost merges, and the
learner follows it back.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple


class Rollback(NamedTuple):
    """The syncer reported `theirs` for a fragment of which this learner held `held`."""
    fragment: int
    held: int
    theirs: int


class Adoption(NamedTuple):
    """A pulled version to adopt now; `rollback_from` is the newer version held before it
    when the syncer went back."""
    version: int
    payload: Any
    rollback_from: int | None


@dataclass
class VersionBook:
    """Per fragment: the syncer's version as last reported, the version adopted, the version
    awaited (the one that will hold this learner's last push), the pushes out and what
    releases each, and the newest pulled version not yet adopted."""

    syncer: list[int]
    adopted: list[int]
    targets: list[int | None] = field(default_factory=list)
    awaiting: list[dict[int, int | None]] = field(default_factory=list)  # seq -> the releasing version
    pulled: dict[int, tuple[int, Any]] = field(default_factory=dict)
    rollbacks: dict[int, tuple[int, int]] = field(default_factory=dict)

    @classmethod
    def starting_at(cls, versions: list[int]) -> "VersionBook":
        """A learner that just joined: it holds the versions the syncer welcomed it with."""
        return cls(syncer=list(versions), adopted=list(versions), targets=[None] * len(versions),
                   awaiting=[{} for _ in versions])

    # ------------------------------------------------- what the syncer said
    def note_versions(self, versions: list[int] | None) -> list[Rollback]:
        """The versions a reply carried. Returns the fragments the syncer went back on (each
        once): the pushes from the lost versions will be refused and the awaited versions
        never come, so the book awaits the syncer's own version, to adopt whatever it is."""
        if not versions:
            return []
        self.syncer = list(versions)
        found = []
        for f, (theirs, ours) in enumerate(zip(versions, self.adopted)):
            held = max(ours, self.pulled_version(f))
            if f in self.rollbacks:
                # Followed back already, not yet adopted: a syncer that went back again, below
                # the version followed, is followed there (else the learner awaited a version
                # that was gone, and pulled nothing).
                first_held, target = self.rollbacks[f]
                if theirs < target:
                    self.rollbacks[f] = (first_held, theirs)
                    self.pulled.pop(f, None)
                    self.targets[f] = theirs
                    found.append(Rollback(f, first_held, theirs))
            elif theirs < held:
                self.rollbacks[f] = (held, theirs)
                self.pulled.pop(f, None)
                self.targets[f] = theirs
                self.awaiting[f] = {}
                found.append(Rollback(f, held, theirs))
        return found

    def note_waiting(self, waiting: list[int] | None) -> None:
        """How many of this learner's pushes of each fragment the syncer holds unmerged, from
        the reply whose versions were just noted. None of f: every push of f it answered is in
        the syncer's version (or was quarantined), whatever version its ACK promised, so the
        book awaits that version instead. A syncer that restarted after a merge's write failed
        merges the pushes accepted during that write a version early, and the promised one
        came only with another push of f: never, for a learner whose window was full and
        that pushed f alone."""
        if not isinstance(waiting, list) or len(waiting) != len(self.syncer):
            return  # a syncer that does not say (sync mode, an older one): the promises stand
        for f, count in enumerate(waiting):
            target = self.targets[f]
            if count != 0 or target is None or f in self.rollbacks or target <= self.syncer[f]:
                continue
            held = self.syncer[f]
            self.targets[f] = held if held > self.adopted[f] else None
            self.awaiting[f] = {seq: v if v is None else min(v, held) for seq, v in self.awaiting[f].items()}

    def answered(self, f: int, seq: int, version: int) -> None:
        """Push `seq` of f was answered: the version that holds it (accepted) or the one that
        releases it (a duplicate, a stale drop, a refusal)."""
        current = self.targets[f]
        self.targets[f] = version if current is None else max(current, version)
        self.awaiting[f][seq] = version

    def refused(self, f: int, seq: int) -> None:
        """Push `seq` of f was refused and dropped: the syncer's version releases it."""
        self.answered(f, seq, self.syncer[f])

    # ----------------------------------------------------------- pulling
    def awaited(self) -> list[int] | None:
        """The syncer's versions, when a push's merge is awaited and not known to be out
        (the learner long-polls with them); else None."""
        waiting = any(t is not None and v < t for t, v in zip(self.targets, self.syncer))
        return list(self.syncer) if waiting else None

    def pulls_wanted(self) -> list[int]:
        """Fragments whose awaited version is out and newer than anything held (or, after a
        rollback, whatever the syncer has)."""
        return [f for f, v in enumerate(self.syncer)
                if self.targets[f] is not None and v >= self.targets[f]
                and (v > max(self.adopted[f], self.pulled_version(f))
                     or (f in self.rollbacks and f not in self.pulled))]

    def put_pulled(self, f: int, version: int, payload: Any) -> None:
        current = self.pulled.get(f)
        if current is None or current[0] < version:
            self.pulled[f] = (version, payload)

    def pulled_version(self, f: int) -> int:
        item = self.pulled.get(f)
        return item[0] if item else -1

    # ---------------------------------------------------------- adopting
    def take(self, f: int) -> Adoption | None:
        """The pulled version of f to adopt at this step boundary, if the awaited one came."""
        target = self.targets[f]
        if target is None or self.pulled_version(f) < target:
            return None
        version, payload = self.pulled.pop(f)
        self.targets[f] = None
        rollback = self.rollbacks.pop(f, None)
        if version <= self.adopted[f] and rollback is None:
            return None
        return Adoption(version, payload, rollback[0] if rollback else None)

    def adopt(self, f: int, version: int) -> None:
        """The learner's model now holds `version` of f."""
        self.adopted[f] = version
        self._release_answered(f)

    # ----------------------------------------------------------- pushing
    def may_push(self, f: int, window: int) -> bool:
        """A push of f falls due: may it go, with fewer than `window` pushes of f still out?
        Not while a rollback of f is unadopted: it would be made on a version the syncer lost,
        refused as ahead of it and dropped; its progress waits in the model for the first
        push after the adoption."""
        if f in self.rollbacks:
            return False
        self._release_answered(f)
        return len(self.awaiting[f]) < window

    def push_base(self, f: int) -> int:
        """The version a push of f made now is made on: the one adopted, or, while a rollback
        of f is not yet adopted (only a stop's residual push is made then), the syncer's: the
        adopted one was lost, and a push on it would be refused as ahead of the syncer."""
        rollback = self.rollbacks.get(f)
        return self.adopted[f] if rollback is None else min(self.adopted[f], rollback[1])

    def sent(self, f: int, seq: int) -> None:
        """Push `seq` of f is on its way: the next push of f waits for its adoption."""
        self.awaiting[f].setdefault(seq, None)

    def _release_answered(self, f: int) -> None:
        """Forget the pushes of f whose version was adopted (or was older than what is
        adopted: a duplicate, a stale or refused push)."""
        adopted = self.adopted[f]
        self.awaiting[f] = {seq: v for seq, v in self.awaiting[f].items() if v is None or v > adopted}
