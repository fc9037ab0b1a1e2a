"""Fault schedules: a seed plus a list of timed faults, read from and written to YAML/JSON.

A schedule file is the contract between whoever designs a chaos run and the
controller that executes it, so loading is strict (unknown fields, wrong types
and clashing faults are errors) and reports every problem at once, each named
by its place in the file, e.g. ``faults[3].duration: must be > 0``.

File format::

    name: kill-partition-latency   # optional
    seed: 7
    learners: 3                    # optional; bounds learner-N targets
    faults:
    - {kind: kill, at: 8, duration: 4, target: learner-1}
    - {kind: partition, at: 16, duration: 6, targets: [learner-2]}
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Iterable, Literal, Mapping, NamedTuple, Sequence

import yaml

from faults.kinds import (
    KINDS,
    BaseFault,
    Fault,
    Kill,
    NODE_OF,
    LinkFault,
    Node,
    Partition,
    PowerLoss,
    ProcessFault,
    describe,
    fmt_seconds,
    target_sort_key,
    targets_clash,
)
from faults.sizing import rank_problems

FORMATS: dict[str, str] = {".yaml": "yaml", ".yml": "yaml", ".json": "json"}
TOP_LEVEL_FIELDS: tuple[str, ...] = ("name", "seed", "learners", "faults")


class ScheduleError(ValueError):
    """A schedule that can't be used; ``errors`` holds one message per problem.

    ``str()`` gives one problem per line, prefixed with the file name when the
    schedule came from a file.
    """

    def __init__(self, errors: Sequence[str] | str, source: str | None = None) -> None:
        self.errors: list[str] = [errors] if isinstance(errors, str) else list(errors)
        self.source = source
        super().__init__(str(self))

    def __str__(self) -> str:
        prefix = f"{self.source}: " if self.source else ""
        return "\n".join(prefix + e for e in self.errors)


class Event(NamedTuple):
    """One action for the controller: start or stop fault ``index`` at ``time`` s."""

    time: float
    action: Literal["start", "stop"]
    index: int
    fault: Fault


# --------------------------------------------------------------------------- checks


def _check_int(name: str, value: object, minimum: int) -> list[str]:
    if isinstance(value, bool) or not isinstance(value, int):
        return [f"{name}: expected an integer, got {describe(value)}"]
    if value < minimum:
        return [f"{name}: must be >= {minimum}"]
    return []


def _check_header(seed: object, learners: object, name: object) -> list[str]:
    errors = _check_int("seed", seed, 0)
    if learners is not None:
        errors += _check_int("learners", learners, 1)
    if name is not None and not isinstance(name, str):
        errors.append(f"name: expected a string, got {describe(name)}")
    return errors


def _prefixed(index: int, problems: Iterable[tuple[str, str]]) -> list[str]:
    out = []
    for path, msg in problems:
        sep = "." if path and not path.startswith("[") else ""
        out.append(f"faults[{index}]{sep}{path}: {msg}")
    return out


def _overlap(a_start: float, a_end: float, b_start: float, b_end: float) -> bool:
    return a_start < b_end and b_start < a_end


def stays_down(fault: BaseFault) -> bool:
    """A kill or power_loss with ``restart: false``: its target stays down until the final heal, so it has no stop."""
    return isinstance(fault, (Kill, PowerLoss)) and not fault.restart


def _down_until(fault: BaseFault) -> float:
    """When a process fault releases its target; one that ``stays_down`` never does."""
    return math.inf if stays_down(fault) else fault.end


def _parts_overlap(a: BaseFault, b: BaseFault) -> bool:
    """Two faults on different parts of one process (``resource``: its life, its disk, its
    clock) planned to overlap, which they may: a disk stays faulty while its process is down."""
    return (
        isinstance(a, ProcessFault)
        and isinstance(b, ProcessFault)
        and a.resource != b.resource
        and _overlap(a.at, a.end, b.at, b.end)
    )


def contend(a: BaseFault, b: BaseFault) -> bool:
    """Whether two faults act on the same thing: one process (or a unit and one of its
    ranks), the same toxic of one link, or one link's partition. Such faults may not
    overlap in time, and the controller starts the later only once the earlier is over;
    the exception is faults on different parts of one process (its life, its disk, its
    clock: ``ProcessFault.resource``), which may overlap and then are not ordered."""
    if isinstance(a, ProcessFault) and isinstance(b, ProcessFault):
        return targets_clash(a.target, b.target)
    if isinstance(a, LinkFault) and type(a) is type(b):
        assert isinstance(b, LinkFault)
        return a.target == b.target and any(s in b.streams for s in a.streams)
    if isinstance(a, Partition) and isinstance(b, Partition):
        return any(t in b.targets for t in a.targets)
    if isinstance(a, Node) and isinstance(b, Node):
        return a.target == b.target
    return False


def _clash(i: int, a: BaseFault, j: int, b: BaseFault) -> str | None:
    """Why faults i < j can't both be scheduled, or None if they can."""
    head = f"faults[{j}]: overlaps faults[{i}]"
    if not contend(a, b):
        return None
    if isinstance(a, ProcessFault) and isinstance(b, ProcessFault):
        if not _overlap(a.at, _down_until(a), b.at, _down_until(b)):
            return None
        where = a.target if a.target == b.target else f"{a.target} and {b.target}"
        for k, f in sorted(((i, a), (j, b)), key=lambda kf: kf[1].at):
            if stays_down(f):
                does = "kills" if isinstance(f, Kill) else "cuts the power of"
                return (
                    f"{head} on {where}: faults[{k}] {does} {f.target} at {fmt_seconds(f.at)} s with restart: false,"
                    " so it stays down until the final heal"
                )
        if a.resource != b.resource:
            return None  # different parts of one process: a disk stays faulty while the process is down
        if a.resource == "disk":
            return f"{head} on {a.target}'s disk ({a.span} and {b.span}); a disk has only one fault mode at a time"
        if a.resource == "clock":
            return f"{head} on {a.target}'s clock ({a.span} and {b.span}); a clock can have only one fault at a time"
        return f"{head} on {where} ({a.span} and {b.span}); a process can have only one fault at a time"
    if isinstance(a, LinkFault) and type(a) is type(b):
        assert isinstance(b, LinkFault)
        streams = [s for s in a.streams if s in b.streams]
        if not _overlap(a.at, a.end, b.at, b.end):
            return None
        which = f"{streams[0]} stream" if len(streams) == 1 else "upstream and downstream streams"
        return (
            f"{head}: both put a {a.kind} toxic on the {which} of {a.target}'s link"
            f" ({a.span} and {b.span}); their Toxiproxy toxic names would collide"
        )
    if isinstance(a, Partition) and isinstance(b, Partition):
        common = [t for t in a.targets if t in b.targets]
        if not _overlap(a.at, a.end, b.at, b.end):
            return None
        return f"{head}: both partition {', '.join(common)} ({a.span} and {b.span}); a link can be partitioned only once at a time"
    if isinstance(a, Node) and isinstance(b, Node):
        if not _overlap(a.at, a.end, b.at, b.end):
            return None
        return f"{head} on node {a.target} ({a.span} and {b.span}); a node can have only one fault at a time"
    return None


def conflicts(indexed: Sequence[tuple[int, BaseFault]]) -> list[str]:
    """Pairs of (individually valid) faults that can't coexist, one message per pair."""
    out = []
    for x, (i, a) in enumerate(indexed):
        for j, b in indexed[x + 1 :]:
            message = _clash(i, a, j, b)
            if message:
                out.append(message)
    return out


def _parse_fault(index: int, entry: object, learners: int | None) -> tuple[BaseFault | None, list[str]]:
    """Build one fault from its file form, or return every problem with it."""
    where = f"faults[{index}]"
    if not isinstance(entry, Mapping):
        return None, [f"{where}: expected a mapping with a kind, got {describe(entry)}"]
    if "kind" not in entry:
        return None, [f"{where}.kind: missing required field"]
    kind = entry["kind"]
    if not isinstance(kind, str):
        return None, [f"{where}.kind: expected a string, got {describe(kind)}"]
    cls = KINDS.get(kind)
    if cls is None:
        return None, [f"{where}.kind: unknown fault kind {kind!r} (known: {', '.join(KINDS)})"]
    names = cls.field_names()
    errors = [f"{where}: unknown field {key!r}" for key in entry if key != "kind" and key not in names]
    values = {name: cls.coerce(name, entry[name]) for name in names if name in entry}
    errors += _prefixed(index, cls.check_fields(values, learners))
    if errors:
        return None, errors
    return cls(**values), []


def _effective_learners(declared: object, override: int | None) -> int | None:
    if override is not None:
        if isinstance(override, bool) or not isinstance(override, int) or override < 1:
            raise ValueError(f"learners must be an integer >= 1, got {override!r}")
        return override
    if isinstance(declared, int) and not isinstance(declared, bool) and declared >= 1:
        return declared
    return None


# --------------------------------------------------------------------------- text formats


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that rejects duplicate keys instead of silently keeping the last one."""


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> Any:
    seen: set[object] = set()
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue
        key = loader.construct_object(key_node, deep=deep)
        try:
            duplicate = key in seen
            seen.add(key)
        except TypeError:  # unhashable key; construct_mapping reports it
            continue
        if duplicate:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark
            )
    return loader.construct_mapping(node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def _parse_yaml(text: str, source: str | None) -> object:
    try:
        return yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        problem = exc.problem or exc.context or "syntax error"
        if problem.startswith("duplicate key") and mark is not None:
            raise ScheduleError(f"{problem} at line {mark.line + 1}, column {mark.column + 1}", source) from None
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise ScheduleError(f"invalid YAML{at}: {problem}", source) from None
    except yaml.YAMLError as exc:
        raise ScheduleError(f"invalid YAML: {exc}", source) from None


def _json_pairs(pairs: list[tuple[str, object]]) -> dict[str, object]:
    out: dict[str, object] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key!r}")
        out[key] = value
    return out


def _parse_json(text: str, source: str | None) -> object:
    try:
        return json.loads(text, object_pairs_hook=_json_pairs)
    except json.JSONDecodeError as exc:
        raise ScheduleError(f"invalid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}", source) from None
    except ValueError as exc:
        raise ScheduleError(f"invalid JSON: {exc}", source) from None


def format_for(path: str | Path) -> str:
    """``yaml`` or ``json`` from a file's extension; ScheduleError for anything else."""
    suffix = Path(path).suffix.lower()
    if suffix not in FORMATS:
        raise ScheduleError(
            f"unsupported file extension {suffix or '(none)'!r} (use .yaml, .yml or .json)", str(path)
        )
    return FORMATS[suffix]


def _norm_format(fmt: str) -> str:
    fmt = fmt.lower().lstrip(".")
    if fmt == "yml":
        fmt = "yaml"
    if fmt not in ("yaml", "json"):
        raise ValueError(f"unknown schedule format {fmt!r} (expected 'yaml' or 'json')")
    return fmt


def _yaml_flow(value: object) -> str:
    text = yaml.safe_dump(value, default_flow_style=True, sort_keys=False, allow_unicode=True, width=math.inf)
    return text.removesuffix("\n...\n").rstrip("\n")


def declared_learners(path: str | Path) -> int | None:
    """The file's ``learners:`` if it is a valid count, else None (``Schedule.load`` reports why).

    Read before the full load, so the run's learner count can be settled first and every
    target checked against it in the one pass that reports every problem.
    """
    try:
        fmt = format_for(path)
        text = Path(path).read_text(encoding="utf-8")
        data = _parse_json(text, None) if fmt == "json" else _parse_yaml(text, None)
    except (OSError, UnicodeDecodeError, ScheduleError):
        return None
    value = data.get("learners") if isinstance(data, Mapping) else None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        return None
    return value


# --------------------------------------------------------------------------- the schedule


@dataclass(frozen=True)
class Schedule:
    """A seed and the faults to inject, each timed from the start of the run.

    ``learners`` (optional) is the run's learner count; when set, targets
    naming a higher learner are errors. Construction does not validate;
    ``load``/``loads``/``from_dict`` do, and ``validate()`` checks a schedule
    built in code.
    """

    seed: int
    faults: tuple[Fault, ...]
    learners: int | None = None
    name: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.faults, list):
            object.__setattr__(self, "faults", tuple(self.faults))

    # ---- checking

    def problems(self, learners: int | None = None, ranks: int | None = None) -> list[str]:
        """Every problem, one message per line-to-be; ``learners`` overrides ``self.learners``,
        ``ranks`` (ranks per learner unit), when given, bounds ``learner-N/rank-R`` targets."""
        errors = _check_header(self.seed, self.learners, self.name)
        effective = _effective_learners(self.learners, learners)
        if not isinstance(self.faults, (tuple, list)):
            return errors + [f"faults: expected a list, got {describe(self.faults)}"]
        good: list[tuple[int, BaseFault]] = []
        for i, fault in enumerate(self.faults):
            if not isinstance(fault, BaseFault):
                errors.append(f"faults[{i}]: expected a fault, got {describe(fault)}")
                continue
            found = _prefixed(i, fault.problems(effective))
            errors += found
            if not found:
                good.append((i, fault))
        if ranks is not None:
            errors += rank_problems(good, ranks)
        return errors + conflicts(good)

    def validate(self, learners: int | None = None, ranks: int | None = None) -> Schedule:
        """Raise ScheduleError listing every problem; returns self so calls chain."""
        errors = self.problems(learners, ranks)
        if errors:
            raise ScheduleError(errors)
        return self

    # ---- dict form

    @classmethod
    def from_dict(
        cls, data: object, *, learners: int | None = None, source: str | None = None, ranks: int | None = None
    ) -> Schedule:
        """Build and validate a schedule from its file form, reporting all problems at once.

        ``learners`` overrides the file's ``learners`` when checking targets
        (e.g. the learner count of the run about to start); ``ranks``, when given,
        is the ranks per learner unit that ``learner-N/rank-R`` targets must exist in.
        """
        if data is None:
            raise ScheduleError("empty schedule (expected a mapping with seed and faults)", source)
        if not isinstance(data, Mapping):
            raise ScheduleError(
                f"expected a mapping with seed and faults at the top level, got {describe(data)}", source
            )
        errors = [
            f"unknown top-level field {key!r} (known: {', '.join(TOP_LEVEL_FIELDS)})"
            for key in data
            if key not in TOP_LEVEL_FIELDS
        ]
        if "seed" not in data:
            errors.append("seed: missing required field")
        seed, declared, name = data.get("seed", 0), data.get("learners"), data.get("name")
        errors += _check_header(seed, declared, name)
        effective = _effective_learners(declared, learners)
        parsed: list[BaseFault | None] = []
        if "faults" not in data:
            errors.append("faults: missing required field")
        elif not isinstance(data["faults"], list):
            errors.append(f"faults: expected a list, got {describe(data['faults'])}")
        else:
            for i, entry in enumerate(data["faults"]):
                fault, problems = _parse_fault(i, entry, effective)
                errors += problems
                parsed.append(fault)
        good = [(i, f) for i, f in enumerate(parsed) if f is not None]
        if ranks is not None:
            errors += rank_problems(good, ranks)
        errors += conflicts(good)
        if errors:
            raise ScheduleError(errors, source)
        return cls(seed=seed, faults=tuple(parsed), learners=declared, name=name)  # type: ignore[arg-type]

    def to_dict(self) -> dict[str, Any]:
        """File form: name, seed, learners (the optional ones only when set), faults."""
        out: dict[str, Any] = {}
        if self.name is not None:
            out["name"] = self.name
        out["seed"] = self.seed
        if self.learners is not None:
            out["learners"] = self.learners
        out["faults"] = [f.to_dict() for f in self.faults]
        return out

    # ---- text and files

    @classmethod
    def loads(
        cls,
        text: str,
        fmt: str = "yaml",
        *,
        learners: int | None = None,
        source: str | None = None,
        ranks: int | None = None,
    ) -> Schedule:
        """Parse and validate YAML or JSON text; ``source`` names it in errors."""
        fmt = _norm_format(fmt)
        data = _parse_json(text, source) if fmt == "json" else _parse_yaml(text, source)
        return cls.from_dict(data, learners=learners, source=source, ranks=ranks)

    @classmethod
    def load(cls, path: str | Path, *, learners: int | None = None, ranks: int | None = None) -> Schedule:
        """Read a ``.yaml``/``.yml``/``.json`` schedule; OSError if it can't be read."""
        fmt = format_for(path)
        try:
            text = Path(path).read_text(encoding="utf-8")
        except UnicodeDecodeError as exc:
            raise ScheduleError(f"not UTF-8 text ({exc.reason} at byte {exc.start})", str(path)) from None
        return cls.loads(text, fmt, learners=learners, source=str(path), ranks=ranks)

    def dumps(self, fmt: str = "yaml") -> str:
        """Readable text, one fault per line; ``loads(dumps(s), fmt) == s``."""
        fmt = _norm_format(fmt)
        data = self.to_dict()
        faults = data.pop("faults")
        if fmt == "json":
            lines = ["{"] + [f"  {json.dumps(k)}: {json.dumps(v, ensure_ascii=False)}," for k, v in data.items()]
            if not faults:
                return "\n".join(lines + ['  "faults": []', "}"]) + "\n"
            items = [f"    {json.dumps(f, ensure_ascii=False)}" for f in faults]
            return "\n".join(lines + ['  "faults": [', ",\n".join(items), "  ]", "}"]) + "\n"
        head = yaml.safe_dump(data, default_flow_style=False, sort_keys=False, allow_unicode=True, width=math.inf)
        if not faults:
            return head + "faults: []\n"
        return head + "faults:\n" + "".join(f"- {_yaml_flow(f)}\n" for f in faults)

    def dump(self, path: str | Path) -> None:
        """Write to ``path`` in the format its extension names."""
        fmt = format_for(path)
        Path(path).write_text(self.dumps(fmt), encoding="utf-8")

    # ---- what the controller needs

    def targets(self) -> tuple[str, ...]:
        """Every target named by any fault (process targets and links), in natural order; a
        node fault names the unit of its node-of:UNIT (a hostname names no process)."""
        names: set[str] = set()
        for fault in self.faults:
            if isinstance(fault, Partition):
                names.update(fault.targets)
            elif isinstance(fault, Node):
                if fault.target.startswith(NODE_OF):
                    names.add(fault.target[len(NODE_OF):])
            else:
                names.add(fault.target)  # type: ignore[union-attr]
        return tuple(sorted(names, key=target_sort_key))

    @property
    def horizon(self) -> float:
        """When the last fault ends (0.0 with no faults); a run should last at least this long."""
        return max((f.end for f in self.faults), default=0.0)

    def sorted(self) -> Schedule:
        """The same schedule with faults ordered by ``at`` (stable for ties)."""
        return replace(self, faults=tuple(sorted(self.faults, key=lambda f: f.at)))

    def predecessors(self) -> dict[int, list[int]]:
        """Fault index -> every earlier fault on the same thing (``contend``), in start order:
        the controller starts a fault only once those are over, and any other fault at once.
        Every one, not only the latest: contention is not transitive (a partition of
        learner-1 and learner-2 after one of each, a unit after one of its ranks). Faults on
        different parts of one process planned to overlap (a power_loss during a disk fault)
        are not ordered: waiting would move the later past the earlier's end."""
        order = sorted(range(len(self.faults)), key=lambda i: (self.faults[i].at, i))
        out: dict[int, list[int]] = {}
        for x, j in enumerate(order):
            b = self.faults[j]
            earlier = [i for i in order[:x] if contend(self.faults[i], b) and not _parts_overlap(self.faults[i], b)]
            if earlier:
                out[j] = earlier
        return out

    def events(self) -> list[Event]:
        """Start/stop actions in time order; indices refer to ``self.faults``.

        At equal times stops come before starts, so back-to-back faults on one
        target heal before the next one begins. A kill or power_loss with
        ``restart: false`` has no stop (``stays_down``): the target stays down until
        the final heal. A clock jump or drift has a stop like any fault, though the
        clock keeps its offset until the final heal.
        """
        events = []
        for i, fault in enumerate(self.faults):
            events.append(Event(fault.at, "start", i, fault))
            if not stays_down(fault):
                events.append(Event(fault.end, "stop", i, fault))
        return sorted(events, key=lambda e: (e.time, e.action == "start", e.index))
