"""Nemeses: one object per fault kind that starts and stops it on a Cluster.

The controller asks the registry for the nemesis of a fault's kind and records what its
start/stop return as the history's ``did``. The harness's facts about a kind live on its
nemesis too: whether it impairs its target learner (the checkers judge recovery after
those) and its colour in the report. Modelled on Jepsen's nemesis packages and
Toxiproxy's one file per toxic behind one interface.

Adding a fault kind
-------------------

1. The data: a frozen dataclass in ``faults/kinds.py`` (``at``, ``duration``, a target,
   its parameters, each field with its ``Rule``), added to ``KINDS``. Subclass
   ``LinkFault`` for a Toxiproxy toxic (give ``toxic_type`` and ``toxic_attributes()``),
   ``ProcessFault`` for a fault on a process. ``faults`` stays pure data: it imports
   nothing from chaos or trainer.
2. The nemesis:

   - a toxic that is just its ``toxics()`` on the learner's link: one line in
     ``toxic.COLORS`` (its report colour); the generic ToxicNemesis does the rest;
   - anything else: one module here with a ``Nemesis`` subclass (``kind``, ``color``,
     ``impairs_learner``, ``start`` and ``stop`` returning the text for the history),
     listed in NEMESES below.

3. Schedules drawn by Hypothesis (``faults/strategies.py``) derive a kind's parameters
   from its fields' rules; only a kind whose fields constrain one another (or a rule
   with no draw yet) needs a few lines there.

``tests/unit/test_chaos_nemesis.py`` fails for a kind in ``KINDS`` without a nemesis.

What a backend (``chaos/backends/base.py``'s ``Cluster``) must implement for the
nemeses here: the process primitives ``kill``, ``pause``, ``resume``, ``restart`` (which
may return a note for the history), ``is_running`` and ``is_paused``; for partition mode
``network``, ``disconnect`` and ``connect`` (and ``supports_network_partitions = True``).
For ``node`` faults (a whole host): ``resolve_node``, ``units_on``, ``node_off``/``node_on``
and ``node_cut``/``node_join``; a backend on one machine refuses the kind by name
(``node_fault_problems``).
``hold_down`` (a no-op by default) matters only to an engine that restarts what dies by
itself (Swarm): it keeps a ``restart: false`` kill down.
Links need a ``toxiproxy`` client and ``link_proxy``, which the base class provides.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from . import toxic
from .base import Nemesis, Registry, UnknownKind
from .clock import ClockNemesis
from .disk import DiskNemesis
from .kill import KillNemesis
from .node import NodeNemesis
from .partition import PartitionNemesis
from .pause import PauseNemesis
from .power import PowerLossNemesis

if TYPE_CHECKING:
    from ..backends.base import Cluster

NEMESES = Registry(KillNemesis(), PauseNemesis(), PartitionNemesis(), *toxic.NEMESES, DiskNemesis(),
                   PowerLossNemesis(), ClockNemesis(), NodeNemesis())


def nemesis_for(fault: Any) -> Nemesis:
    """The nemesis of `fault`'s kind; raises UnknownKind naming the kind when there is none."""
    return NEMESES.for_fault(fault)


def start(cluster: Cluster, fault: Any) -> str:
    return nemesis_for(fault).start(cluster, fault)


def stop(cluster: Cluster, fault: Any) -> str:
    return nemesis_for(fault).stop(cluster, fault)


__all__ = ["NEMESES", "Nemesis", "Registry", "UnknownKind", "nemesis_for", "start", "stop"]
