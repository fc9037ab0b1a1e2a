"""A small Toxiproxy HTTP client for the controller.

Why not toxiproxy-python alone: it keeps its host and port in module globals (one server
per process) and sets no timeouts. This client is bound to one URL, puts a deadline on
every call, retries transport failures and 5xx answers with tenacity (exponential
backoff, jitter), never retries a 4xx (those are answers), and maps errors to exceptions.
It speaks the exact API of Toxiproxy 2.12, so it drives the real server and ours alike.
"""
from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from typing import Any, Iterator

import requests
from tenacity import Retrying, retry_if_exception, stop_after_attempt, stop_after_delay, stop_any, wait_exponential_jitter

USER_AGENT = "islands-chaos/0.1"


class ToxiproxyError(Exception):
    def __init__(self, status: int, message: str, method: str, path: str) -> None:
        super().__init__(f"{method} {path}: {status} {message}")
        self.status = status
        self.message = message


class BadRequest(ToxiproxyError):
    pass


class NotFound(ToxiproxyError):
    pass


class Conflict(ToxiproxyError):
    pass


class ServerError(ToxiproxyError):
    pass


class Unreachable(ConnectionError):
    """The Toxiproxy API did not answer within the retry budget."""


_ERRORS = {400: BadRequest, 404: NotFound, 409: Conflict}


def _retryable(exc: BaseException) -> bool:
    return isinstance(exc, (requests.ConnectionError, requests.Timeout, ServerError))


class ToxiproxyClient:
    def __init__(self, url: str, timeout: float = 5.0, attempts: int = 5, retry_budget: float = 15.0) -> None:
        self.url = url.rstrip("/")
        self.timeout = timeout
        self.attempts = attempts
        self.retry_budget = retry_budget
        self._local = threading.local()  # a Session per thread: the controller's fault workers call at once

    @property
    def session(self) -> requests.Session:
        session = getattr(self._local, "session", None)
        if session is None:
            session = self._local.session = requests.Session()
            session.headers["User-Agent"] = USER_AGENT
        return session

    def __repr__(self) -> str:
        return f"ToxiproxyClient({self.url!r})"

    @contextmanager
    def within(self, seconds: float) -> Iterator[None]:
        """Calls made by this thread inside the block retry until `seconds` from now have
        passed, however many attempts that takes (the controller gives a fault's start the
        time until its planned end, and a heal a deadline of its own)."""
        saved = getattr(self._local, "deadline", None)
        self._local.deadline = time.monotonic() + max(0.0, seconds)
        try:
            yield
        finally:
            self._local.deadline = saved

    def _call(self, method: str, path: str, body: Any = None) -> Any:
        deadline = getattr(self._local, "deadline", None)
        if deadline is not None:
            stop = stop_after_delay(max(0.0, deadline - time.monotonic()))
        else:
            stop = stop_any(stop_after_attempt(self.attempts), stop_after_delay(self.retry_budget))
        retrying = Retrying(stop=stop, wait=wait_exponential_jitter(multiplier=0.05, max=1.0, jitter=0.1),
                            retry=retry_if_exception(_retryable), reraise=True)
        self._local.retried = False
        try:
            for attempt in retrying:
                with attempt:
                    self._local.retried = attempt.retry_state.attempt_number > 1
                    return self._once(method, path, body)
        except (requests.ConnectionError, requests.Timeout) as exc:
            raise Unreachable(f"Toxiproxy at {self.url} did not answer {method} {path}: {exc}") from exc
        raise AssertionError("unreachable")  # pragma: no cover

    @property
    def last_call_retried(self) -> bool:
        """Whether this thread's last call needed more than one attempt: a 409 or 404 it got
        may answer an earlier attempt that did reach the server."""
        return bool(getattr(self._local, "retried", False))

    def _once(self, method: str, path: str, body: Any) -> Any:
        resp = self.session.request(method, self.url + path, json=body, timeout=self.timeout)
        if resp.status_code >= 400:
            try:
                message = resp.json().get("error", resp.text)
            except ValueError:
                message = resp.text.strip()
            cls = ServerError if resp.status_code >= 500 else _ERRORS.get(resp.status_code, ToxiproxyError)
            raise cls(resp.status_code, message, method, path)
        if resp.status_code == 204 or not resp.content:
            return None
        return resp.json()

    # --------------------------------------------------------------- server
    def version(self) -> str:
        return self._call("GET", "/version")["version"]

    def reset(self) -> None:
        """Re-enable every proxy and remove every toxic."""
        self._call("POST", "/reset")

    # --------------------------------------------------------------- proxies
    def proxies(self) -> dict[str, dict]:
        return self._call("GET", "/proxies")

    def proxy(self, name: str) -> dict:
        return self._call("GET", f"/proxies/{name}")

    def create_proxy(self, name: str, listen: str, upstream: str, enabled: bool = True) -> dict:
        return self._call("POST", "/proxies", {"name": name, "listen": listen, "upstream": upstream,
                                               "enabled": enabled})

    def populate(self, proxies: list[dict]) -> list[dict]:
        return self._call("POST", "/populate", proxies)["proxies"]

    def update_proxy(self, name: str, **fields: Any) -> dict:
        return self._call("POST", f"/proxies/{name}", fields)

    def enable(self, name: str) -> dict:
        return self.update_proxy(name, enabled=True)

    def disable(self, name: str) -> dict:
        return self.update_proxy(name, enabled=False)

    def delete_proxy(self, name: str) -> None:
        self._call("DELETE", f"/proxies/{name}")

    # --------------------------------------------------------------- toxics
    def toxics(self, proxy: str) -> list[dict]:
        return self._call("GET", f"/proxies/{proxy}/toxics")

    def add_toxic(self, proxy: str, type: str, stream: str = "downstream", toxicity: float = 1.0,
                  attributes: dict | None = None, name: str | None = None) -> dict:
        body = {"type": type, "stream": stream, "toxicity": toxicity, "attributes": attributes or {}}
        if name:
            body["name"] = name
        try:
            return self._call("POST", f"/proxies/{proxy}/toxics", body)
        except Conflict:
            # A retry after a timeout finds the toxic its first attempt added: that is success.
            if name and self.last_call_retried:
                existing = next((t for t in self.toxics(proxy) if t.get("name") == name), None)
                if existing is not None and existing.get("type") == type and existing.get("stream") == stream:
                    return existing
            raise

    def update_toxic(self, proxy: str, name: str, attributes: dict | None = None,
                     toxicity: float | None = None) -> dict:
        body: dict[str, Any] = {"attributes": attributes or {}}
        if toxicity is not None:
            body["toxicity"] = toxicity
        return self._call("POST", f"/proxies/{proxy}/toxics/{name}", body)

    def remove_toxic(self, proxy: str, name: str) -> None:
        self._call("DELETE", f"/proxies/{proxy}/toxics/{name}")

    def clear(self, proxy: str) -> int:
        """Remove every toxic of one proxy and enable it; returns how many toxics went."""
        removed = 0
        for toxic in self.toxics(proxy):
            try:
                self.remove_toxic(proxy, toxic["name"])
                removed += 1
            except NotFound:
                pass
        self.enable(proxy)
        return removed
