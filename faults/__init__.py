"""The fault vocabulary and schedules: pure data, no trainer or chaos imports.

``faults.kinds`` defines one frozen dataclass per fault kind, ``faults.schedule``
reads, checks and writes schedule files, ``faults.cli`` validates one from the
command line and ``faults.strategies`` (needs hypothesis) generates valid ones.
"""

from faults.kinds import (
    OUTAGE_KINDS,
    KINDS,
    LINK_KINDS,
    PROCESS_KINDS,
    Bandwidth,
    BaseFault,
    Clock,
    Disk,
    Fault,
    Kill,
    Latency,
    LimitData,
    LinkFault,
    Node,
    Partition,
    Pause,
    PowerLoss,
    ProcessFault,
    ResetPeer,
    Slicer,
    SlowClose,
    Target,
    Timeout,
    parse_target,
)
from faults.schedule import Event, Schedule, ScheduleError

__all__ = [
    "KINDS",
    "LINK_KINDS",
    "OUTAGE_KINDS",
    "PROCESS_KINDS",
    "Bandwidth",
    "BaseFault",
    "Clock",
    "Disk",
    "Event",
    "Fault",
    "Kill",
    "Latency",
    "LimitData",
    "LinkFault",
    "Node",
    "Partition",
    "Pause",
    "PowerLoss",
    "ProcessFault",
    "ResetPeer",
    "Schedule",
    "ScheduleError",
    "Slicer",
    "SlowClose",
    "Target",
    "Timeout",
    "parse_target",
]
