"""When a fragment merges: quorum, the grace window, late pushes and the final round.

Pure decisions, no I/O: the live syncer (syncer/core.py) and the goodput simulator
(chaos/simulate/scheduled.py) both ask `MergeRule.decide` with what is pending, who is
alive and the time, so there is one model of the merge rule, not a copy per caller. The
answer carries `recheck_at`, the time at which it changes with no new input (a window
closing), so an event-driven caller sets a timer instead of polling.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field, replace
from typing import Callable, Collection, Iterable, Sequence

LATE_GRACES = 5          # a lone late push waits max(LATE_GRACES · grace, LATE_ROUNDS · round period) ...
LATE_ROUNDS = 1.5        # ... before it merges alone
MERGE_TIMES_KEPT = 9     # merge times kept per fragment for the round period


@dataclass(frozen=True)
class Waiting:
    """A pending push as the rule sees it: who, on which version, since when."""

    learner: int
    base_version: int
    accepted_at: float
    final: bool = False  # its learner's last push of the fragment: it waits for the final round


@dataclass(frozen=True)
class Decision:
    reason: str | None     # quorum | grace | late | final-round | final-timeout, or None: not yet
    info: dict = field(default_factory=dict)   # what the grace window did (the merge event's `grace`)
    recheck_at: float | None = None            # when the answer changes with no new input (None: never)
    # Which pending pushes the merge takes: None every one; "regular" only those that are not
    # a learner's last (they wait for the final round); "final" only the last ones.
    only: str | None = None


def earliest(a: float | None, b: float | None) -> float | None:
    """The sooner of two optional instants (None: never)."""
    return b if a is None else a if b is None else min(a, b)


def predict_arrival(times: Iterable[float]) -> float | None:
    """When a learner's next push of a fragment should arrive, from its recent push times.

    last + median(I) + MAD(I), where I are the intervals between the given times and MAD
    is their median absolute deviation from the median (the slack for jitter). None with
    fewer than two times: no interval, no estimate.
    """
    times = list(times)
    if len(times) < 2:
        return None
    gaps = sorted(b - a for a, b in zip(times, times[1:]))
    med = _median(gaps)
    mad = _median(sorted(abs(g - med) for g in gaps))
    return times[-1] + med + mad


def _median(sorted_values: list[float]) -> float:
    n = len(sorted_values)
    mid = n // 2
    return sorted_values[mid] if n % 2 else (sorted_values[mid - 1] + sorted_values[mid]) / 2


def round_period(merge_times: Sequence[float]) -> float | None:
    """Median time between a fragment's recent merges (None before its second merge)."""
    gaps = sorted(b - a for a, b in zip(merge_times, merge_times[1:]))
    return gaps[len(gaps) // 2] if gaps else None


def grace_window(opened: float, cap: float, predicted: dict[int, float | None]) -> tuple[float, str]:
    """The adaptive grace window: when it closes, and why (a line for the merge event).

    `opened` is when quorum was met, `predicted` maps each live learner still missing from
    this round to its predicted arrival (None: no estimate). The window closes at the
    latest predicted arrival, never later than opened + cap and never before opened: a
    learner already overdue, or one without an estimate, adds no wait.
    """
    if not predicted:
        return opened, "all live learners reported"
    unknown = sorted(j for j, t in predicted.items() if t is None)
    known = {j: t for j, t in predicted.items() if t is not None}
    if not known:
        return opened, f"no estimate for learner {', '.join(map(str, unknown))}: no wait"
    last = max(known, key=lambda j: (known[j], j))
    at = known[last] - opened
    if at > cap:
        return opened + cap, f"cap {cap:.2f} s (predicted learner {last} at {at:+.2f} s)"
    if at <= 0:
        return opened, f"learner {last} overdue (predicted at {at:+.2f} s): no wait"
    return known[last], f"predicted learner {last} at {at:+.2f} s"


def is_stale(version: int, base_version: int, max_staleness: int) -> bool:
    """A push computed on a version more than max_staleness merges old is dropped."""
    return version - base_version > max_staleness


class Arrivals:
    """Recent push times per learner of one fragment, for the adaptive grace window's
    predictions (a new incarnation starts a new history)."""

    def __init__(self, kept: int = 6) -> None:
        self.kept = kept  # five intervals for the estimator
        self._times: dict[int, tuple[int, deque]] = {}

    def note(self, learner: int, incarnation: int, now: float) -> None:
        inc, times = self._times.get(learner, (None, None))
        if inc != incarnation or times is None:
            times = deque(maxlen=self.kept)
            self._times[learner] = (incarnation, times)
        times.append(now)

    def predicted(self, learner: int) -> float | None:
        entry = self._times.get(learner)
        return predict_arrival(entry[1]) if entry else None


@dataclass(frozen=True)
class MergeRule:
    """The syncer's merge settings (SyncerConfig's --quorum, --grace, --grace-policy, --final-wait)."""

    quorum: int = 0          # K; 0 means every live learner
    grace: float = 0.5
    grace_policy: str = "fixed"
    final_wait: float = 10.0

    def effective_quorum(self, alive: int) -> int:
        k = self.quorum if self.quorum > 0 else alive
        return max(1, min(k, alive) if alive else 1)

    def decide(self, pending: Sequence[Waiting], version: int, alive: Collection[int], now: float,
               predicted: Callable[[int], float | None] = lambda _: None,
               period: float | None = None) -> Decision:
        """Why a fragment at `version` should merge now (or not yet), and what the grace window did.

        Quorum: pushes from K distinct learners are pending. Grace: the first push based
        on the current version has waited `grace` seconds. A push that is late for its
        round (based on an older version) does not open a grace window of its own: it
        waits to be merged with the next round's pushes, so a late learner falls back
        into step with the others instead of settling into a merge of its own every
        round. Only if no fresh push comes (its peers are gone) does it merge alone,
        after max(5·grace, 1.5 rounds) (`period`: the fragment's round period).

        With the adaptive policy, reaching quorum merges at once only if no live learner
        that is still missing is predicted (`predicted`) to arrive soon: otherwise the
        merge waits until the latest predicted arrival, at most `grace` after quorum was
        met (grace_window). Below quorum nothing changes: `grace` after the first fresh push.
        """
        if not pending:
            return Decision(None)
        if any(p.final for p in pending):
            stopping = {p.learner for p in pending if p.final}
            training = [learner for learner in alive if learner not in stopping]
            regular = [p for p in pending if not p.final and p.learner not in stopping]
            if not {p.learner for p in regular} & set(training):
                return self._decide_final(pending, alive, now)
            return self._decide_beside_final(pending, regular, version, training, now, predicted, period)
        policy = self.grace_policy
        reporters = {p.learner for p in pending}
        k = self.effective_quorum(len(alive))
        if len(reporters) >= k:
            if policy != "adaptive":
                return Decision("quorum", {"policy": policy, "waited": 0.0,
                                           "why": f"{len(reporters)} of quorum {k} reported"})
            opened = _quorum_since(pending, k)
            missing = sorted(set(alive) - reporters)
            closes, why = grace_window(opened, self.grace, {j: predicted(j) for j in missing})
            if now < closes:
                return Decision(None, recheck_at=closes)
            return Decision("grace" if closes > opened else "quorum", {
                "policy": policy, "waited": round(max(0.0, now - opened), 4), "window": round(closes - opened, 4),
                "missing": missing, "why": why})
        fresh = min((p.accepted_at for p in pending if p.base_version >= version), default=None)
        if fresh is not None:
            if now >= fresh + self.grace:  # the form recheck_at takes: its instant decides
                return Decision("grace", {"policy": policy, "waited": round(now - fresh, 4),
                                          "why": f"below quorum {k}: {self.grace:.2f} s after the first fresh push"})
            return Decision(None, recheck_at=fresh + self.grace)
        oldest = min(p.accepted_at for p in pending)
        late_after = max(LATE_GRACES * self.grace, LATE_ROUNDS * (period or 0.0))
        if now >= oldest + late_after:
            return Decision("late", {"policy": policy, "waited": round(now - oldest, 4),
                                     "why": f"only late pushes, no fresh one for {late_after:.2f} s"})
        return Decision(None, recheck_at=oldest + late_after)

    def _decide_beside_final(self, pending: Sequence[Waiting], regular: Sequence[Waiting], version: int,
                             training: Collection[int], now: float, predicted: Callable[[int], float | None],
                             period: float | None) -> Decision:
        """A learner's last push is pending while live learners train on (`training`: live,
        no last push in; their regular pushes are pending): a learner left mid-run (a
        scale-down, learners moved back onto a node that returned), or the first of a run's
        end. The regular pushes of those training merge by the usual rule among them, and
        the last pushes wait for the final round (every live learner's last push); after
        final_wait they merge as regular pushes. Holding the regular pushes too stalled
        every merge for final_wait (10 s) each time one learner left cleanly mid-run."""
        opened = min(p.accepted_at for p in pending if p.final)
        if now >= opened + self.final_wait:
            # No final round is coming: learners train on. The last pushes merge as regular
            # ones, with the regular pushes and by their rule. A merge of the last pushes
            # alone (at the final round's weight 1) moved Θ_f to the leaver's model mid-run,
            # and left the regular pushes pending past the version their ACKs promised:
            # their learners adopted it and pushed again with those pushes unmerged.
            decision = self.decide([replace(p, final=False) for p in pending], version, training, now, predicted,
                                   period)
            if decision.reason:
                why = (f"{decision.info.get('why', decision.reason)}; the last push(es) of "
                       f"{sorted({p.learner for p in pending if p.final})} waited {self.final_wait:g} s while "
                       f"{sorted(training)} train on: merged as regular pushes")
                return Decision(decision.reason, {**decision.info, "why": why})
            return decision
        decision = self.decide(regular, version, training, now, predicted, period)
        if decision.reason:
            return Decision(decision.reason, decision.info, only="regular")
        return Decision(None, recheck_at=earliest(decision.recheck_at, opened + self.final_wait))

    def _decide_final(self, pending: Sequence[Waiting], alive: Collection[int], now: float) -> Decision:
        """A learner's last push of this fragment is pending: the final round.

        It merges once every live learner's last push is in (a learner that has said BYE is
        no longer live), or `final_wait` seconds after the first one came, so a learner that
        died or lags far behind never holds the others' end back. Until then nothing of the
        fragment merges: a regular push that arrives meanwhile joins its learner's share of
        the round."""
        finals = [p for p in pending if p.final]
        done = {p.learner for p in finals}
        missing = sorted(set(alive) - done)
        opened = min(p.accepted_at for p in finals)
        info = {"policy": "final", "waited": round(now - opened, 4), "missing": missing}
        if not missing:
            return Decision("final-round", {**info, "why": f"the last push of every live learner ({len(done)})"})
        if now >= opened + self.final_wait:
            return Decision("final-timeout", {**info, "why": f"{self.final_wait:g} s after the first last push"})
        return Decision(None, recheck_at=opened + self.final_wait)


def _quorum_since(pending: Sequence[Waiting], k: int) -> float:
    """When pushes from k distinct learners had first become pending (they have)."""
    seen: set[int] = set()
    for p in sorted(pending, key=lambda p: p.accepted_at):
        seen.add(p.learner)
        if len(seen) >= k:
            return p.accepted_at
    raise ValueError(f"fewer than {k} learners pending")
