"""The error of a request the server (or the library's check of it, before it is sent) refused."""
from __future__ import annotations

from typing import Any

from . import _core


class RequestError(_core.EngineError):
    """The server answered the request with an error (the same status, type and message as HTTP)."""

    def __init__(self, status: int, type: str, message: str, body: Any = None) -> None:
        super().__init__(f"{status} {type}: {message}")
        self.status = status
        self.type = type
        self.message = message
        self.body = body

    @classmethod
    def from_body(cls, status: int, body: Any) -> "RequestError":
        err = body.get("error", {}) if isinstance(body, dict) else {}
        if not isinstance(err, dict):
            err = {"message": str(err)}
        return cls(int(err.get("code", status) or status), str(err.get("type", "error")),
                   str(err.get("message", body)), body)
