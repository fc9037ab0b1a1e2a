"""Fault kinds: what goes wrong, where, and for how long.

Every fault is a frozen dataclass with ``at`` (seconds from the schedule's
start), ``duration`` (seconds) and a target. They are plain data, so a
schedule can be written, read and checked without the trainer or the chaos
harness. Constructors deliberately do not validate: ``problems()`` returns
every bad field at once, so a schedule file shows all of its errors together.

Targets:

- process faults (kill, pause): ``syncer``, ``learner-N`` (N >= 1) or
  ``learner-N/rank-R`` (R >= 0, one rank of a multi-rank learner);
- link faults and partitions: ``learner-N``, meaning the link between that
  learner and the syncer. ``upstream`` is learner -> syncer, ``downstream``
  is syncer -> learner (Toxiproxy's streams, with the learner as the client);
- disk and power_loss: ``syncer`` only, the one process with durable state
  (learners keep none: a learner's power loss is a kill);
- clock: ``syncer`` or ``learner-N``, a whole unit: a clock belongs to a host
  (a container), not to one rank.
"""

from __future__ import annotations

import math
import re
from dataclasses import MISSING, Field, dataclass, field, fields
from typing import Any, ClassVar, Literal, Mapping, NamedTuple, Union

SYNCER = "syncer"
DIRECTIONS: tuple[str, ...] = ("both", "upstream", "downstream")
STREAMS: tuple[str, ...] = ("upstream", "downstream")
PARTITION_MODES: tuple[str, ...] = ("blackhole", "refuse", "network")
WHOLE_LINK_MODES: tuple[str, ...] = ("refuse", "network")  # no per-direction cut
DISK_MODES: tuple[str, ...] = ("full", "eio", "slow")
CLOCK_MODES: tuple[str, ...] = ("skew", "jump", "drift")
TEN_YEARS = 315_360_000  # seconds (3650 days): the largest clock offset a schedule may ask for

Direction = Literal["both", "upstream", "downstream"]
Stream = Literal["upstream", "downstream"]
PartitionMode = Literal["blackhole", "refuse"]

TARGET_FORMS = "syncer, learner-N or learner-N/rank-R"
LINK_FORM = "learner-N, the link between learner N and the syncer"
NODE_OF = "node-of:"
NODE_FORMS = "a node's hostname, e.g. islands-node-3, or node-of:UNIT, e.g. node-of:learner-2"
NODE_OF_WHY = "node-of: names a unit (syncer or learner-N), not one of its ranks: name node-of:{unit} instead"
NODE_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$")
NODE_MODES = ("kill", "partition")
_TARGET_RE = re.compile(r"syncer|learner-([1-9][0-9]*)(?:/rank-(0|[1-9][0-9]*))?")


# --------------------------------------------------------------------------- targets


class Target(NamedTuple):
    """A parsed target name; ``learner`` is None for the syncer, ``rank`` None for a whole unit."""

    learner: int | None
    rank: int | None = None

    @property
    def unit(self) -> str:
        """The process unit the target belongs to (``syncer`` or ``learner-N``)."""
        return SYNCER if self.learner is None else f"learner-{self.learner}"

    def __str__(self) -> str:
        return self.unit if self.rank is None else f"{self.unit}/rank-{self.rank}"


def parse_target(text: str) -> Target:
    """Parse a target name; raises ValueError naming the accepted forms."""
    match = _TARGET_RE.fullmatch(text) if isinstance(text, str) else None
    if match is None:
        raise ValueError(f"invalid target {text!r} (expected {TARGET_FORMS})")
    if match.group(1) is None:
        return Target(None)
    rank = match.group(2)
    return Target(int(match.group(1)), None if rank is None else int(rank))


def is_link_target(text: object) -> bool:
    """True for ``learner-N``: the only form that names a learner<->syncer link."""
    try:
        target = parse_target(text)  # type: ignore[arg-type]
    except ValueError:
        return False
    return target.learner is not None and target.rank is None


def targets_clash(a: str, b: str) -> bool:
    """True if two process targets share a process: equal, or a learner and one of its ranks."""
    if a == b:
        return True
    try:
        ta, tb = parse_target(a), parse_target(b)
    except ValueError:
        return False
    return ta.unit == tb.unit and (ta.rank is None or tb.rank is None)


def target_sort_key(name: str) -> tuple:
    """Natural order for target names: syncer, learner-1, learner-1/rank-0, ..., learner-10."""
    try:
        t = parse_target(name)
    except ValueError:
        return (2, 0, 0, str(name))
    if t.learner is None:
        return (0, 0, 0, "")
    return (1, t.learner, -1 if t.rank is None else t.rank, "")


# --------------------------------------------------------------------------- field rules


@dataclass(frozen=True)
class Rule:
    """How one field is checked: its type and the allowed range, kept next to the field."""

    type: Literal["number", "integer", "bool", "process_target", "link_target", "link_targets", "choice",
                  "node_target"]
    gt: float | None = None
    ge: float | None = None
    le: float | None = None
    whole: bool = False
    choices: tuple[str, ...] = ()
    noun: str = ""
    only: tuple[str, ...] = ()  # process targets: the only names allowed (empty: any)
    units: bool = False  # process targets: a whole unit only (syncer or learner-N), no rank
    why: str = ""  # process targets: the message for a valid name refused by only/units ({unit}: its unit)


def describe(value: object) -> str:
    """Show a bad value the way the user wrote it in YAML/JSON."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, str):
        return repr(value)
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "a list"
    if isinstance(value, Mapping):
        return "a mapping"
    return f"a {type(value).__name__}"


def _looks_numeric(value: object) -> bool:
    if not isinstance(value, str):
        return False
    try:
        float(value)
    except ValueError:
        return False
    return True


def _got(value: object) -> str:
    # '1e3' is a string to YAML 1.1 (it wants 1.0e+3); say so instead of a puzzling repr.
    return describe(value) + (" (a string)" if _looks_numeric(value) else "")


def _fmt_bound(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else repr(x)


def _range_problem(rule: Rule, value: float) -> str | None:
    ok = (
        (rule.gt is None or value > rule.gt)
        and (rule.ge is None or value >= rule.ge)
        and (rule.le is None or value <= rule.le)
    )
    if ok:
        return None
    parts = []
    if rule.gt is not None:
        parts.append(f"> {_fmt_bound(rule.gt)}")
    if rule.ge is not None:
        parts.append(f">= {_fmt_bound(rule.ge)}")
    if rule.le is not None:
        parts.append(f"<= {_fmt_bound(rule.le)}")
    return "must be " + " and ".join(parts)


def _learner_bound(name: str, learners: int | None) -> str | None:
    if learners is None:
        return None
    learner = parse_target(name).learner
    if learner is not None and learner > learners:
        known = "1" if learners == 1 else f"1..{learners}"
        return f"no such target {name!r} (learners: {known})"
    return None


def check_value(rule: Rule, value: object, learners: int | None = None) -> list[tuple[str, str]]:
    """Problems with one field value, as (sub-path, message); sub-path is '' or '[k]'."""
    t = rule.type
    if t == "number":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return [("", f"expected a number, got {_got(value)}")]
        if isinstance(value, float) and not math.isfinite(value):
            return [("", f"must be a finite number, got {describe(value)}")]
        problem = _range_problem(rule, value)
        if problem is None and rule.whole and not float(value).is_integer():
            problem = "must be a whole number"
        return [] if problem is None else [("", problem)]
    if t == "integer":
        if isinstance(value, bool) or not isinstance(value, int):
            return [("", f"expected an integer, got {_got(value)}")]
        problem = _range_problem(rule, value)
        return [] if problem is None else [("", problem)]
    if t == "bool":
        if not isinstance(value, bool):
            return [("", f"expected true or false, got {describe(value)}")]
        return []
    if t == "choice":
        if not isinstance(value, str):
            return [("", f"expected a string, got {describe(value)}")]
        if value not in rule.choices:
            expected = ", ".join(rule.choices[:-1]) + " or " + rule.choices[-1]
            return [("", f"unknown {rule.noun} {value!r} (expected {expected})")]
        return []
    if t == "process_target":
        if not isinstance(value, str):
            return [("", f"expected a string, got {describe(value)}")]
        try:
            parsed = parse_target(value)
        except ValueError as exc:
            return [("", str(exc))]
        if (rule.only and value not in rule.only) or (rule.units and parsed.rank is not None):
            return [("", rule.why.format(unit=parsed.unit, target=value))]
        problem = _learner_bound(value, learners)
        return [] if problem is None else [("", problem)]
    if t == "link_target":
        if not isinstance(value, str):
            return [("", f"expected a string, got {describe(value)}")]
        if not is_link_target(value):
            return [("", f"invalid link target {value!r} (expected {LINK_FORM})")]
        problem = _learner_bound(value, learners)
        return [] if problem is None else [("", problem)]
    if t == "link_targets":
        if not isinstance(value, (list, tuple)):
            return [("", f"expected a list of learner names, got {describe(value)}")]
        if not value:
            return [("", "must name at least one learner")]
        out: list[tuple[str, str]] = []
        seen: set[str] = set()
        for k, item in enumerate(value):
            out += [(f"[{k}]", msg) for _, msg in check_value(Rule("link_target"), item, learners)]
            if isinstance(item, str):
                if item in seen:
                    out.append(("", f"duplicate target {item!r}"))
                seen.add(item)
        return out
    if t == "node_target":
        if not isinstance(value, str):
            return [("", f"expected a string, got {describe(value)}")]
        if value.startswith(NODE_OF):
            unit = value[len(NODE_OF):]
            problems = check_value(Rule("process_target", units=True, why=NODE_OF_WHY), unit, learners)
            return [("", f"{NODE_OF}{unit}: {msg}") for _, msg in problems]
        if not NODE_NAME_RE.match(value):
            return [("", f"invalid node {value!r} (expected {NODE_FORMS})")]
        return []
    raise AssertionError(f"unknown rule type {t!r}")  # pragma: no cover


def _field(rule: Rule, default: Any = MISSING) -> Any:
    return field(default=default, metadata={"rule": rule})


AT = Rule("number", ge=0)
DURATION = Rule("number", gt=0)
PROCESS_TARGET = Rule("process_target")
LINK_TARGET = Rule("link_target")
LINK_TARGETS = Rule("link_targets")
DIRECTION = Rule("choice", choices=DIRECTIONS, noun="direction")
MODE = Rule("choice", choices=PARTITION_MODES, noun="mode")
TOXICITY = Rule("number", gt=0, le=1)
MILLIS = Rule("number", ge=0, whole=True)  # Toxiproxy takes whole milliseconds
RATE = Rule("number", gt=0, whole=True)  # Toxiproxy takes whole KB/s
FLAG = Rule("bool")
COUNT = Rule("integer", ge=0)
POSITIVE_COUNT = Rule("integer", ge=1)
DISK_TARGET = Rule(
    "process_target",
    only=(SYNCER,),
    why="disk faults act on a process's durable state, and only the syncer keeps any (its --state-dir)",
)
DISK_MODE = Rule("choice", choices=DISK_MODES, noun="mode")
DISK_LATENCY = Rule("number", gt=0, le=10_000, whole=True)  # whole milliseconds per operation
POWER_TARGET = Rule(
    "process_target",
    only=(SYNCER,),
    why="power_loss acts on a process's durable state, and only the syncer keeps any"
    " (a learner's power loss is a kill)",
)
CLOCK_TARGET = Rule(
    "process_target",
    units=True,
    why="a clock belongs to a host (a unit's container), not to one of its ranks:"
    " name {unit!r} instead of {target!r}",
)
CLOCK_MODE = Rule("choice", choices=CLOCK_MODES, noun="mode")
NODE_TARGET = Rule("node_target")
NODE_MODE = Rule("choice", choices=NODE_MODES, noun="mode")
CLOCK_OFFSET = Rule("number", ge=-TEN_YEARS, le=TEN_YEARS)
CLOCK_RATE = Rule("number", gt=0, le=1000)


# --------------------------------------------------------------------------- base classes


def _is_default(value: object, default: object) -> bool:
    if isinstance(value, bool) != isinstance(default, bool):
        return False
    return value == default


def _plain(value: object) -> object:
    """A file-friendly value: tuples become lists, whole floats are written as ints."""
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return int(value)
    return value


def fmt_seconds(x: float) -> str:
    """Seconds for messages: 8, 12.5."""
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e15 else repr(round(x, 6))


class BaseFault:
    """Behaviour shared by all fault dataclasses (they carry the fields)."""

    kind: ClassVar[str]

    @property
    def end(self) -> float:
        """``at + duration``, rounded to 1 ns so 0.1 + 0.2 ends exactly where 0.3 starts."""
        return round(self.at + self.duration, 9)  # type: ignore[attr-defined]

    @property
    def span(self) -> str:
        """Human-readable interval, e.g. ``8-12 s``."""
        return f"{fmt_seconds(self.at)}-{fmt_seconds(self.end)} s"  # type: ignore[attr-defined]

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        """File field names in file order (``kind`` excluded)."""
        return tuple(f.name for f in fields(cls))  # type: ignore[arg-type]

    @classmethod
    def required_fields(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls) if _required(f))  # type: ignore[arg-type]

    @classmethod
    def coerce(cls, name: str, value: object) -> object:
        """Normalise a value read from a file: numbers become floats, lists tuples."""
        rule = _rule(cls, name)
        if rule.type == "number" and isinstance(value, int) and not isinstance(value, bool):
            try:
                return float(value)
            except OverflowError:
                return value
        if rule.type == "link_targets" and isinstance(value, list):
            return tuple(value)
        return value

    @classmethod
    def check_fields(cls, values: Mapping[str, object], learners: int | None = None) -> list[tuple[str, str]]:
        """Problems with a (possibly partial) set of field values, in field order.

        Returns (path, message) pairs; path is a field name such as ``duration``
        or ``targets[1]``. Missing required fields are reported here too.
        """
        out: list[tuple[str, str]] = []
        for f in fields(cls):  # type: ignore[arg-type]
            if f.name not in values:
                if _required(f):
                    out.append((f.name, "missing required field"))
                continue
            out += [(f.name + sub, msg) for sub, msg in check_value(f.metadata["rule"], values[f.name], learners)]
        if not out:
            out += cls._cross_problems(values)
        return out

    @classmethod
    def _cross_problems(cls, values: Mapping[str, object]) -> list[tuple[str, str]]:
        """Checks that involve more than one field; run only once every field is fine."""
        return []

    def problems(self, learners: int | None = None) -> list[tuple[str, str]]:
        """Everything wrong with this fault; ``learners`` bounds ``learner-N`` targets."""
        return self.check_fields({f.name: getattr(self, f.name) for f in fields(self)}, learners)  # type: ignore[arg-type]

    def to_dict(self) -> dict[str, object]:
        """File form: kind first, then fields in order; fields at their default are left out."""
        out: dict[str, object] = {"kind": self.kind}
        for f in fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            if not _required(f) and _is_default(value, f.default):
                continue
            out[f.name] = _plain(value)
        return out


def _required(f: Field) -> bool:
    return f.default is MISSING and f.default_factory is MISSING


def _rule(cls: type, name: str) -> Rule:
    return next(f.metadata["rule"] for f in fields(cls) if f.name == name)


class ProcessFault(BaseFault):
    """A fault on a process (``target``: syncer, learner-N or learner-N/rank-R).

    ``resource`` is the part of the process the fault holds: ``process`` (its life: kill,
    pause, power_loss), its ``disk`` or its ``clock``. Two faults on one process may overlap
    only when they hold different parts (and the process is not down for good).
    """

    target: str
    resource: ClassVar[str] = "process"


class LinkFault(BaseFault):
    """A Toxiproxy toxic on the link between ``target`` (learner-N) and the syncer."""

    target: str
    direction: str
    toxicity: float
    toxic_type: ClassVar[str]

    @property
    def streams(self) -> tuple[str, ...]:
        """Toxiproxy streams this fault touches: "both" means upstream and downstream."""
        return STREAMS if self.direction == "both" else (self.direction,)

    def toxic_attributes(self) -> dict[str, int]:
        raise NotImplementedError

    def toxics(self) -> list[dict[str, Any]]:
        """Toxiproxy toxic specs (one per stream), ready for ``POST /proxies/<link>/toxics``.

        Names are ``<kind>_<stream>``, so the controller can remove them by name;
        this is why two overlapping faults of one kind on one stream are rejected.
        """
        return [
            {
                "name": f"{self.kind}_{stream}",
                "type": self.toxic_type,
                "stream": stream,
                "toxicity": float(self.toxicity),
                "attributes": self.toxic_attributes(),
            }
            for stream in self.streams
        ]


# --------------------------------------------------------------------------- process faults


@dataclass(frozen=True)
class Kill(ProcessFault):
    """SIGKILL ``target``; restart it ``duration`` s later, or (restart=False) leave it down until the final heal."""

    kind: ClassVar[str] = "kill"
    at: float = _field(AT)
    duration: float = _field(DURATION)
    target: str = _field(PROCESS_TARGET)
    restart: bool = _field(FLAG, True)


@dataclass(frozen=True)
class Pause(ProcessFault):
    """SIGSTOP ``target``, SIGCONT it ``duration`` s later: a hung process with its sockets still open."""

    kind: ClassVar[str] = "pause"
    at: float = _field(AT)
    duration: float = _field(DURATION)
    target: str = _field(PROCESS_TARGET)


# --------------------------------------------------------------------------- partition


@dataclass(frozen=True)
class Partition(BaseFault):
    """Cut the links of ``targets`` (learner names) off from the syncer.

    ``blackhole`` adds a Toxiproxy ``timeout`` toxic with timeout 0 (data vanishes,
    connections hang); ``refuse`` disables the proxy (connections are refused);
    ``network`` disconnects the learner's container from its Docker networks (compose
    backend only; its aliases come back on heal). ``refuse`` and ``network`` cut both
    directions at once.
    """

    kind: ClassVar[str] = "partition"
    at: float = _field(AT)
    duration: float = _field(DURATION)
    targets: tuple[str, ...] = _field(LINK_TARGETS)
    direction: str = _field(DIRECTION, "both")
    mode: str = _field(MODE, "blackhole")

    def __post_init__(self) -> None:
        if isinstance(self.targets, list):
            object.__setattr__(self, "targets", tuple(self.targets))

    @classmethod
    def _cross_problems(cls, values: Mapping[str, object]) -> list[tuple[str, str]]:
        direction = values.get("direction", "both")
        mode = values.get("mode", "blackhole")
        if mode in WHOLE_LINK_MODES and direction != "both":
            return [("direction", f"mode {mode!r} cuts the whole link, so direction must be 'both', got {direction!r}")]
        return []

    @property
    def streams(self) -> tuple[str, ...]:
        return STREAMS if self.direction == "both" else (self.direction,)

    def toxics(self) -> list[dict[str, Any]]:
        """Toxic specs to add to EACH target's link; empty for ``refuse`` and ``network``, which add no toxic."""
        if self.mode in WHOLE_LINK_MODES:
            return []
        return [
            {"name": f"partition_{s}", "type": "timeout", "stream": s, "toxicity": 1.0, "attributes": {"timeout": 0}}
            for s in self.streams
        ]


# --------------------------------------------------------------------------- link faults


@dataclass(frozen=True)
class Latency(LinkFault):
    """Delay data by ``latency_ms`` +/- ``jitter_ms``."""

    kind: ClassVar[str] = "latency"
    toxic_type: ClassVar[str] = "latency"
    at: float = _field(AT)
    duration: float = _field(DURATION)
    target: str = _field(LINK_TARGET)
    latency_ms: float = _field(MILLIS)
    jitter_ms: float = _field(MILLIS, 0.0)
    direction: str = _field(DIRECTION, "both")
    toxicity: float = _field(TOXICITY, 1.0)

    def toxic_attributes(self) -> dict[str, int]:
        return {"latency": int(self.latency_ms), "jitter": int(self.jitter_ms)}


@dataclass(frozen=True)
class Bandwidth(LinkFault):
    """Limit the link to ``rate_kbps`` KB/s."""

    kind: ClassVar[str] = "bandwidth"
    toxic_type: ClassVar[str] = "bandwidth"
    at: float = _field(AT)
    duration: float = _field(DURATION)
    target: str = _field(LINK_TARGET)
    rate_kbps: float = _field(RATE)
    direction: str = _field(DIRECTION, "both")
    toxicity: float = _field(TOXICITY, 1.0)

    def toxic_attributes(self) -> dict[str, int]:
        return {"rate": int(self.rate_kbps)}


@dataclass(frozen=True)
class ResetPeer(LinkFault):
    """Reset connections (TCP RST) after ``timeout_ms``; 0 resets at once."""

    kind: ClassVar[str] = "reset_peer"
    toxic_type: ClassVar[str] = "reset_peer"
    at: float = _field(AT)
    duration: float = _field(DURATION)
    target: str = _field(LINK_TARGET)
    timeout_ms: float = _field(MILLIS, 0.0)
    direction: str = _field(DIRECTION, "both")
    toxicity: float = _field(TOXICITY, 1.0)

    def toxic_attributes(self) -> dict[str, int]:
        return {"timeout": int(self.timeout_ms)}


@dataclass(frozen=True)
class SlowClose(LinkFault):
    """Delay closing connections by ``delay_ms``."""

    kind: ClassVar[str] = "slow_close"
    toxic_type: ClassVar[str] = "slow_close"
    at: float = _field(AT)
    duration: float = _field(DURATION)
    target: str = _field(LINK_TARGET)
    delay_ms: float = _field(MILLIS)
    direction: str = _field(DIRECTION, "both")
    toxicity: float = _field(TOXICITY, 1.0)

    def toxic_attributes(self) -> dict[str, int]:
        return {"delay": int(self.delay_ms)}


@dataclass(frozen=True)
class Slicer(LinkFault):
    """Split data into ~``average_size``-byte packets (+/- ``size_variation``), ``delay_us`` apart."""

    kind: ClassVar[str] = "slicer"
    toxic_type: ClassVar[str] = "slicer"
    at: float = _field(AT)
    duration: float = _field(DURATION)
    target: str = _field(LINK_TARGET)
    average_size: int = _field(POSITIVE_COUNT)
    size_variation: int = _field(COUNT, 0)
    delay_us: int = _field(COUNT, 0)
    direction: str = _field(DIRECTION, "both")
    toxicity: float = _field(TOXICITY, 1.0)

    @classmethod
    def _cross_problems(cls, values: Mapping[str, object]) -> list[tuple[str, str]]:
        # Toxiproxy's slicer can pick a split point outside the chunk when variation >= size.
        average, variation = values["average_size"], values.get("size_variation", 0)
        if variation >= average:  # type: ignore[operator]
            return [("size_variation", f"must be < average_size ({average})")]
        return []

    def toxic_attributes(self) -> dict[str, int]:
        return {"average_size": self.average_size, "size_variation": self.size_variation, "delay": self.delay_us}


@dataclass(frozen=True)
class LimitData(LinkFault):
    """Close connections once ``bytes`` bytes have passed."""

    kind: ClassVar[str] = "limit_data"
    toxic_type: ClassVar[str] = "limit_data"
    at: float = _field(AT)
    duration: float = _field(DURATION)
    target: str = _field(LINK_TARGET)
    bytes: int = _field(COUNT)
    direction: str = _field(DIRECTION, "both")
    toxicity: float = _field(TOXICITY, 1.0)

    def toxic_attributes(self) -> dict[str, int]:
        return {"bytes": self.bytes}


@dataclass(frozen=True)
class Timeout(LinkFault):
    """Stop all data and close the connection after ``timeout_ms``; 0 holds it open, silent, until removed."""

    kind: ClassVar[str] = "timeout"
    toxic_type: ClassVar[str] = "timeout"
    at: float = _field(AT)
    duration: float = _field(DURATION)
    target: str = _field(LINK_TARGET)
    timeout_ms: float = _field(MILLIS, 0.0)
    direction: str = _field(DIRECTION, "both")
    toxicity: float = _field(TOXICITY, 1.0)

    def toxic_attributes(self) -> dict[str, int]:
        return {"timeout": int(self.timeout_ms)}


# --------------------------------------------------------------------------- a process's disk, power and clock


DISK_LATENCY_MS = 50.0  # Disk.latency_ms's default


@dataclass(frozen=True)
class Disk(ProcessFault):
    """A faulty disk under ``target``'s durable state for ``duration`` s; only the syncer keeps any (its --state-dir).

    ``full``: writes fail with ENOSPC; ``eio``: syncs fail with EIO (writes are taken, as a
    page cache takes them); ``slow``: every operation takes ``latency_ms`` (whole
    milliseconds) longer. The disk is sound again when the fault ends.
    """

    kind: ClassVar[str] = "disk"
    resource: ClassVar[str] = "disk"
    at: float = _field(AT)
    duration: float = _field(DURATION)
    target: str = _field(DISK_TARGET)
    mode: str = _field(DISK_MODE)
    latency_ms: float = _field(DISK_LATENCY, DISK_LATENCY_MS)

    @classmethod
    def _cross_problems(cls, values: Mapping[str, object]) -> list[tuple[str, str]]:
        mode = values["mode"]
        if mode != "slow" and values.get("latency_ms", DISK_LATENCY_MS) != DISK_LATENCY_MS:
            return [("latency_ms", f"latency_ms is for mode 'slow'; mode {mode!r} adds no latency, so leave it out")]
        return []


@dataclass(frozen=True)
class PowerLoss(ProcessFault):
    """Cut ``target``'s power: it dies and every write it had not made durable (fsynced) is lost.

    It restarts ``duration`` s later, or (restart=False) stays down until the final heal, as a
    kill does. Only the syncer keeps durable state, so only it can lose power; a learner's power
    loss is a kill.
    """

    kind: ClassVar[str] = "power_loss"
    at: float = _field(AT)
    duration: float = _field(DURATION)
    target: str = _field(POWER_TARGET)
    restart: bool = _field(FLAG, True)


@dataclass(frozen=True)
class Clock(ProcessFault):
    """``target``'s wall clock goes wrong; ``target`` is a unit (syncer or learner-N), a clock being a host's.

    ``skew``: the clock reads ``offset_s`` off (ahead when positive) for the fault's duration,
    then true again. ``jump``: the clock steps by ``offset_s`` at the fault's start and keeps the
    stepped time after the fault ends: a step is not undone; the run's final heal restores true
    time. ``drift``: the clock runs at ``rate`` times true speed during the fault and keeps the
    offset it accumulated, ``(rate - 1) * duration`` s, afterwards, until the final heal.

    Only the wall clock: the monotonic clock is not changed (a monotonic clock never steps, and
    the event timeline is read from it).
    """

    kind: ClassVar[str] = "clock"
    resource: ClassVar[str] = "clock"
    at: float = _field(AT)
    duration: float = _field(DURATION)
    target: str = _field(CLOCK_TARGET)
    mode: str = _field(CLOCK_MODE)
    offset_s: float = _field(CLOCK_OFFSET, 0.0)
    rate: float = _field(CLOCK_RATE, 1.0)

    @classmethod
    def _cross_problems(cls, values: Mapping[str, object]) -> list[tuple[str, str]]:
        mode, offset, rate = values["mode"], values.get("offset_s", 0.0), values.get("rate", 1.0)
        out: list[tuple[str, str]] = []
        if mode == "drift":
            if offset != 0:
                out.append(("offset_s", "mode 'drift' accumulates its offset from rate; leave offset_s out (0)"))
            if rate == 1:
                out.append(("rate", "mode 'drift' needs a rate other than 1 (e.g. 2: twice true speed)"))
        else:
            if offset == 0:
                out.append(("offset_s", f"mode {mode!r} needs a non-zero offset_s"))
            if rate != 1:
                out.append(("rate", f"rate is for mode 'drift'; leave it out (1) for mode {mode!r}"))
        return out


# --------------------------------------------------------------------------- node faults


@dataclass(frozen=True)
class Node(BaseFault):
    """A whole host of a cluster spread over several (the swarm backend), not one process.

    ``kill``: the node's engine stops (its power is cut): every task on it dies at once, the
    manager notices the node down and Swarm runs its tasks on other nodes; at the fault's end
    the node comes back, empty. ``partition``: the node is cut off the cluster's overlay
    networks, its tasks still running; at the end it is joined again.

    ``target`` is a node's name (its hostname), or ``node-of:UNIT`` (syncer or learner-N) for
    whichever node runs that unit when the fault starts, so one schedule fits any placement.
    ``rebalance`` (kill only): once the node is back, the units Swarm moved away from it are
    started again (a clean stop: they push what they have) where Swarm's scheduler now
    spreads them, the returned node among the candidates; without it they stay where Swarm
    moved them, as Swarm leaves them. Backends that run every process on one machine refuse
    the kind by name.
    """

    kind: ClassVar[str] = "node"
    at: float = _field(AT)
    duration: float = _field(DURATION)
    target: str = _field(NODE_TARGET)
    mode: str = _field(NODE_MODE)
    rebalance: bool = _field(FLAG, False)

    @classmethod
    def _cross_problems(cls, values: Mapping[str, object]) -> list[tuple[str, str]]:
        if values.get("rebalance") and values["mode"] != "kill":
            return [("rebalance", "only a node that was killed had its units moved away; leave it out for "
                                  f"mode {values['mode']!r}")]
        return []


Fault = Union[
    Kill, Pause, Partition, Latency, Bandwidth, ResetPeer, SlowClose, Slicer, LimitData, Timeout,
    Disk, PowerLoss, Clock, Node,
]

KINDS: dict[str, type[BaseFault]] = {
    cls.kind: cls
    for cls in (
        Kill, Pause, Partition, Latency, Bandwidth, ResetPeer, SlowClose, Slicer, LimitData, Timeout,
        Disk, PowerLoss, Clock, Node,
    )
}
NODE_KINDS: tuple[str, ...] = ("node",)
PROCESS_KINDS: tuple[str, ...] = tuple(k for k, c in KINDS.items() if issubclass(c, ProcessFault))
LINK_KINDS: tuple[str, ...] = tuple(k for k, c in KINDS.items() if issubclass(c, LinkFault))
# Kinds that take their target down for the fault's duration and start it again at its
# stop (or leave it down with ``restart: false``): its recovery is a cold start.
OUTAGE_KINDS: tuple[str, ...] = ("kill", "power_loss")
