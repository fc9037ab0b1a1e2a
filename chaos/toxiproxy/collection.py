"""All proxies by name: create, replace, remove, populate.

Populate follows Toxiproxy: validate every item before touching anything,
then create each proxy, replace one whose listen or upstream differs, and
leave an identical one alone.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

from . import jsonio
from .errors import (
    ERR_BAD_REQUEST_BODY,
    ERR_MISSING_FIELD,
    ERR_PROXY_ALREADY_EXISTS,
    ERR_PROXY_NOT_FOUND,
    ApiError,
    ListenError,
    internal,
)
from .proxy import Proxy

PROXY_FIELDS = {"name": "string", "listen": "string", "upstream": "string", "enabled": "bool"}

ProxyFactory = Callable[[str, str, str], Proxy]


class PopulateError(ApiError):
    """A populate failure, carrying the proxies applied before it (Go returns them too)."""

    def __init__(self, error: ApiError, applied: list[Proxy]) -> None:
        super().__init__(error.message, error.status)
        self.applied = applied


class ProxyCollection:
    """Thread-safe registry of proxies."""

    def __init__(self, proxy_factory: ProxyFactory = Proxy) -> None:
        """``proxy_factory(name, listen, upstream)`` makes every proxy; a fuzz harness
        passes one that binds nothing, since its inputs choose the listen addresses."""
        self._lock = threading.RLock()
        self._proxies: dict[str, Proxy] = {}
        self.new_proxy = proxy_factory

    def proxies(self) -> dict[str, Proxy]:
        with self._lock:
            return dict(self._proxies)

    def get(self, name: str) -> Proxy:
        with self._lock:
            proxy = self._proxies.get(name)
        if proxy is None:
            raise ERR_PROXY_NOT_FOUND.new()
        return proxy

    def add(self, proxy: Proxy, start: bool) -> None:
        """Create; 409 if the name is taken, 500 if the listener cannot bind."""
        with self._lock:
            if proxy.name in self._proxies:
                raise ERR_PROXY_ALREADY_EXISTS.new()
            if start:
                try:
                    proxy.start()
                except ListenError as exc:
                    raise internal(str(exc)) from None
            self._proxies[proxy.name] = proxy

    def add_or_replace(self, proxy: Proxy, start: bool) -> Proxy:
        """Populate's step: keep an identical proxy, otherwise (re)create it."""
        with self._lock:
            existing = self._proxies.get(proxy.name)
            if existing is not None:
                if existing.listen == proxy.listen and existing.upstream == proxy.upstream:
                    return existing
                existing.stop()
            if start:
                try:
                    proxy.start()
                except ListenError as exc:
                    raise internal(str(exc)) from None
            self._proxies[proxy.name] = proxy
            return proxy

    def remove(self, name: str) -> None:
        with self._lock:
            proxy = self._proxies.pop(name, None)
        if proxy is None:
            raise ERR_PROXY_NOT_FOUND.new()
        proxy.stop()

    def clear(self, timeout: float = 1.0) -> None:
        """Stop every proxy and wait (bounded) for their connections to close."""
        with self._lock:
            proxies = list(self._proxies.values())
            self._proxies.clear()
        for proxy in proxies:
            proxy.stop()
        deadline = time.monotonic() + timeout
        for proxy in proxies:
            proxy.wait_closed(deadline)

    def populate_json(self, body: bytes) -> list[Proxy]:
        """POST /populate and --config: decode an array of proxies and apply it.

        Raises PopulateError (with the proxies applied so far) on any failure.
        """
        try:
            value = jsonio.decode_first(body)
            if value is not None and (not isinstance(value, list) or isinstance(value, jsonio.Obj)):
                raise jsonio.value_error(value, "[]toxiproxy.Proxy")
            items = [
                jsonio.decode_struct(item, PROXY_FIELDS, "", "toxiproxy.Proxy")
                for item in (value or [])
            ]
        except jsonio.DecodeError as exc:
            raise PopulateError(ERR_BAD_REQUEST_BODY.joined(str(exc)), []) from None
        for index, item in enumerate(items, start=1):
            for field in ("name", "upstream"):
                if not item.get(field):
                    raise PopulateError(ERR_MISSING_FIELD.joined(f"{field} at proxy {index}"), [])
        applied: list[Proxy] = []
        for item in items:
            proxy = self.new_proxy(item["name"], item.get("listen", ""), item["upstream"])
            try:
                applied.append(self.add_or_replace(proxy, item.get("enabled", True)))
            except ApiError as exc:
                raise PopulateError(exc, applied) from None
        return applied


def proxy_list_json(proxies: list[Proxy] | None) -> list[dict[str, Any]] | None:
    """Go marshals an empty result slice as null; keep that."""
    if not proxies:
        return None
    return [proxy.to_json() for proxy in proxies]
