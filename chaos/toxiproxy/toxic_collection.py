"""The toxics of one proxy, and how changes reach its live links.

Every change bumps a version and notifies the links of that direction; the
API call then waits (briefly, bounded) until those links have applied it, so
data a client sends after the HTTP response already meets the new chain, as
with Toxiproxy's synchronous interrupt of its toxic goroutines.
"""

from __future__ import annotations

import itertools
import threading
from typing import TYPE_CHECKING, Any

from . import jsonio
from .errors import (
    ERR_BAD_REQUEST_BODY,
    ERR_INVALID_STREAM,
    ERR_INVALID_TOXIC_TYPE,
    ERR_TOXIC_ALREADY_EXISTS,
    ERR_TOXIC_NOT_FOUND,
    ApiError,
)
from .toxics import Toxic, new_toxic

if TYPE_CHECKING:
    from .link import Link

UPSTREAM = "upstream"
DOWNSTREAM = "downstream"
DIRECTIONS = (UPSTREAM, DOWNSTREAM)

_WRAPPER_FIELDS = {"name": "string", "type": "string", "stream": "string", "toxicity": "float32"}
_UPDATE_FIELDS = {"toxicity": "float32"}
_APPLY_WAIT_S = 1.0
_uids = itertools.count(1)


class ToxicWrapper:
    """One configured toxic: name, type, stream, toxicity and its attributes."""

    def __init__(self, name: str, type_name: str, stream: str, direction: str,
                 toxicity: float, toxic: Toxic) -> None:
        self.uid = next(_uids)
        self.name = name
        self.type = type_name
        self.stream = stream  # as the client spelled it; Go keeps the original case
        self.direction = direction
        self.toxicity = toxicity
        self.toxic = toxic
        self.revision = 0  # bumped by every update; links restart the toxic when it moves

    def to_json(self) -> dict[str, Any]:
        return {
            "attributes": self.toxic.attributes(),
            "name": self.name,
            "type": self.type,
            "stream": self.stream,
            "toxicity": jsonio.Float32(self.toxicity),
        }


def _bad_body(exc: jsonio.DecodeError) -> ApiError:
    return ERR_BAD_REQUEST_BODY.joined(str(exc))


class ToxicCollection:
    """Ordered toxic chains per direction, plus the live links that follow them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._chains: dict[str, list[ToxicWrapper]] = {d: [] for d in DIRECTIONS}
        self._links: set["Link"] = set()
        self._version = 0
        self._applied = threading.Condition()

    # --- reads -----------------------------------------------------------

    def array(self) -> list[dict[str, Any]]:
        """All toxics as JSON: upstream ones first, each direction in insertion order."""
        with self._lock:
            return [w.to_json() for d in DIRECTIONS for w in self._chains[d]]

    def get(self, name: str) -> dict[str, Any]:
        with self._lock:
            wrapper = self._find(name)
            if wrapper is None:
                raise ERR_TOXIC_NOT_FOUND.new()
            return wrapper.to_json()

    def snapshot(self, direction: str) -> tuple[int, list[ToxicWrapper]]:
        """The chain a link should follow now, with the version it reflects."""
        with self._lock:
            return self._version, list(self._chains[direction])

    def _find(self, name: str) -> ToxicWrapper | None:
        for direction in DIRECTIONS:
            for wrapper in self._chains[direction]:
                if wrapper.name == name:
                    return wrapper
        return None

    # --- changes ------------------------------------------------------------

    def add_json(self, body: bytes) -> dict[str, Any]:
        """POST /proxies/{p}/toxics, with Go's order of checks."""
        try:
            value = jsonio.decode_first(body)
            fields = jsonio.decode_struct(
                value, _WRAPPER_FIELDS, "ToxicWrapper", "toxics.ToxicWrapper"
            )
            found, raw_attrs = (jsonio.lookup(value, "attributes")
                                if isinstance(value, jsonio.Obj) else (False, None))
            if found and raw_attrs is not None and not isinstance(raw_attrs, jsonio.Obj):
                raise jsonio.type_error(raw_attrs, "ToxicWrapper", "attributes", "toxics.Toxic")
        except jsonio.DecodeError as exc:
            raise _bad_body(exc) from None
        stream = fields.get("stream", DOWNSTREAM)
        toxicity = fields.get("toxicity", 1.0)
        type_name = fields.get("type", "")
        direction = stream.lower()
        if direction not in DIRECTIONS:
            raise ERR_INVALID_STREAM.new()
        name = fields.get("name") or f"{type_name}_{stream}"
        toxic = new_toxic(type_name)
        if toxic is None:
            raise ERR_INVALID_TOXIC_TYPE.new()
        with self._lock:
            if self._find(name) is not None:
                raise ERR_TOXIC_ALREADY_EXISTS.new()
            try:
                toxic.apply(toxic.merged(raw_attrs))
            except jsonio.DecodeError as exc:
                raise _bad_body(exc) from None
            wrapper = ToxicWrapper(name, type_name, stream, direction, toxicity, toxic)
            self._chains[direction].append(wrapper)
            result = wrapper.to_json()
            version = self._bump()
        self._propagate(version, {direction})
        return result

    def update_json(self, name: str, body: bytes) -> dict[str, Any]:
        """PATCH /proxies/{p}/toxics/{t}: merge attributes and toxicity; keep the rest."""
        with self._lock:
            wrapper = self._find(name)
            if wrapper is None:
                raise ERR_TOXIC_NOT_FOUND.new()
            try:
                value = jsonio.decode_first(body)
                fields = jsonio.decode_struct(value, _UPDATE_FIELDS, "", "struct")
                raw_attrs = (jsonio.lookup(value, "attributes")[1]
                             if isinstance(value, jsonio.Obj) else None)
                if raw_attrs is not None and not isinstance(raw_attrs, jsonio.Obj):
                    raise jsonio.type_error(raw_attrs, "", "attributes", "toxics.Toxic")
                values = wrapper.toxic.merged(raw_attrs)
            except jsonio.DecodeError as exc:
                raise _bad_body(exc) from None
            wrapper.toxic.apply(values)
            wrapper.toxicity = fields.get("toxicity", wrapper.toxicity)
            wrapper.revision += 1
            result = wrapper.to_json()
            version = self._bump()
        self._propagate(version, {wrapper.direction})
        return result

    def remove(self, name: str) -> None:
        with self._lock:
            wrapper = self._find(name)
            if wrapper is None:
                raise ERR_TOXIC_NOT_FOUND.new()
            self._chains[wrapper.direction].remove(wrapper)
            version = self._bump()
        self._propagate(version, {wrapper.direction})

    def reset(self) -> None:
        """Remove every toxic (POST /reset)."""
        with self._lock:
            touched = {d for d in DIRECTIONS if self._chains[d]}
            for direction in DIRECTIONS:
                self._chains[direction] = []
            version = self._bump()
        if touched:
            self._propagate(version, touched)

    def _bump(self) -> int:
        self._version += 1
        return self._version

    # --- live links ------------------------------------------------------------

    def register(self, link: "Link") -> None:
        with self._lock:
            self._links.add(link)

    def unregister(self, link: "Link") -> None:
        with self._lock:
            self._links.discard(link)
        self.applied()

    def applied(self) -> None:
        """A link synced or went away; wake API calls waiting for it."""
        with self._applied:
            self._applied.notify_all()

    def _propagate(self, version: int, directions: set[str]) -> None:
        with self._lock:
            links = [link for link in self._links if link.direction in directions]
        for link in links:
            link.notify()
        with self._applied:
            self._applied.wait_for(
                lambda: all(link.synced_version >= version or link.dead for link in links),
                timeout=_APPLY_WAIT_S,
            )
