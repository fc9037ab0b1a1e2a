"""What the syncer holds per fragment, and per push waiting for a merge: plain data, no I/O."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..fragments import Fragment
from ..merge_rule import Arrivals, Waiting
from ..outer import Contribution


@dataclass
class PendingPush:
    contribution: Contribution
    steps: int
    encoding: str
    path: Path
    accepted_at: float
    final: bool = False  # its learner's last push of the fragment: it waits for the final round


@dataclass
class FragmentState:
    spec: Fragment
    params: dict[str, torch.Tensor]
    momentum: dict[str, torch.Tensor]
    version: int = 0
    applied: list[str] = field(default_factory=list)
    applied_set: set[str] = field(default_factory=set)
    pending: list[PendingPush] = field(default_factory=list)
    merging: set[str] = field(default_factory=set)  # ids taken by a merge being planned or written
    # Ids whose file is being written and is not durable yet: not known (a retry is told it is
    # in flight, never that it is a duplicate, since the write may still fail).
    reserved: set[str] = field(default_factory=set)
    merge_times: list[float] = field(default_factory=list)
    accum: dict[str, torch.Tensor] = field(default_factory=dict)  # delayed Nesterov: Σ Δ since the last momentum step
    accum_count: int = 0                                          # ... and how many Δs that is
    tokens: int = 0                                               # raw tokens merged so far (durable)
    rounds: float = 0.0                                           # outer rounds merged so far (durable)
    arrivals: Arrivals = field(default_factory=Arrivals)  # recent push times: the adaptive grace's estimates
    writing: bool = False  # a merge is being written: its version will not hold pushes accepted meanwhile
    # A merge whose write failed: its push ids and whether it was a final one. The next merge
    # of the fragment takes those pushes alone.
    retry: tuple[set[str], bool] | None = None

    def waiting(self) -> list[Waiting]:
        """The pending pushes as the merge rule sees them."""
        return [Waiting(p.contribution.learner, p.contribution.base_version, p.accepted_at, p.final)
                for p in self.pending]

    def known(self, ident: str) -> bool:
        return ident in self.applied_set or ident in self.merging or self.is_pending(ident)

    def is_pending(self, ident: str) -> bool:
        return any(p.contribution.ident == ident for p in self.pending)

    def holding_version(self, ident: str) -> int:
        """The version that holds known push `ident`: what a learner told "duplicate" awaits
        before it pushes this fragment again. A push taken by the merge being planned or
        written is in the next version; one still pending, in the merge after any being
        written; one already merged, in the current version or an older one."""
        if ident in self.merging:
            return self.version + 1
        if self.is_pending(ident):
            return self.version + (2 if self.writing else 1)
        return self.version
