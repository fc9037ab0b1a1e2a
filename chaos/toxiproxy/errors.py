"""API errors with Toxiproxy's exact messages and status codes.

Clients match on these strings and codes, so they live in one place and are
never spelled inline elsewhere. The ERR_* objects are templates: raise
``ERR_X.new()`` or ``ERR_X.joined(detail)``, never ``ERR_X`` itself.
"""

from __future__ import annotations

from typing import Any


class ApiError(Exception):
    """An error the HTTP layer turns into ``{"error": msg, "status": code}``."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.message = message
        self.status = status

    def new(self) -> "ApiError":
        """A fresh instance to raise. Raising the shared ERR_* object itself would chain
        every raise's traceback onto it, keeping each request's frames (and its
        handler's buffers) alive for the life of the server."""
        return ApiError(self.message, self.status)

    def joined(self, detail: str) -> "ApiError":
        """Go's ``joinError``: prefix this error's message to a detail."""
        return ApiError(f"{self.message}: {detail}", self.status)

    def to_json(self) -> dict[str, Any]:
        return {"error": self.message, "status": self.status}


class ListenError(Exception):
    """A proxy could not bind its listen address (Toxiproxy answers 500)."""


class AlreadyStarted(Exception):
    """Start was called on a proxy that is already listening."""


ERR_BAD_REQUEST_BODY = ApiError("bad request body", 400)
ERR_MISSING_FIELD = ApiError("missing required field", 400)
ERR_PROXY_NOT_FOUND = ApiError("proxy not found", 404)
ERR_PROXY_ALREADY_EXISTS = ApiError("proxy already exists", 409)
ERR_INVALID_STREAM = ApiError("stream was invalid, can be either upstream or downstream", 400)
ERR_INVALID_TOXIC_TYPE = ApiError("invalid toxic type", 400)
ERR_TOXIC_ALREADY_EXISTS = ApiError("toxic already exists", 409)
ERR_TOXIC_NOT_FOUND = ApiError("toxic not found", 404)


def internal(message: str) -> ApiError:
    """An error without its own status: Toxiproxy reports those as 500."""
    return ApiError(message, 500)
