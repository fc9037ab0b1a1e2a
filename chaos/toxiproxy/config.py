"""--config FILE: a JSON array of proxies applied at start, exactly like POST /populate."""

from __future__ import annotations

import logging
from pathlib import Path

from .collection import PopulateError, ProxyCollection
from .proxy import Proxy

log = logging.getLogger(__name__)


class ConfigError(Exception):
    """The config file could not be read or applied; the message says why."""


def populate_from_file(proxies: ProxyCollection, path: str | Path) -> list[Proxy]:
    """Apply the file's proxies; raise ConfigError with Toxiproxy's message on failure."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"error reading config file {path}: {exc.strerror or exc}") from None
    try:
        applied = proxies.populate_json(data)
    except PopulateError as exc:
        raise ConfigError(f"failed to populate proxies from file {path}: {exc.message}") from None
    log.info("populated %d proxies from %s", len(applied), path)
    return applied
