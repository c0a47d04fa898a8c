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


class ContextSizeError(RequestError, ValueError):
    """A prompt as long as the context or longer, in llama-cpp-python's calls: the ValueError
    llama_cpp.Llama raises ("Requested tokens (401) exceed context window of 256"), and the
    RequestError the server answered (400, exceed_context_size_error), so `except ValueError` and
    `except RequestError` both catch it. `n_prompt_tokens` and `n_ctx` are the server's counts."""

    def __init__(self, error: RequestError) -> None:
        err = error.body.get("error", {}) if isinstance(error.body, dict) else {}
        err = err if isinstance(err, dict) else {}
        super().__init__(error.status, error.type, error.message, error.body)
        self.n_prompt_tokens: int | None = err.get("n_prompt_tokens")
        self.n_ctx: int | None = err.get("n_ctx")
        counts = "Requested tokens exceed context window"
        if self.n_prompt_tokens is not None and self.n_ctx is not None:
            counts = f"Requested tokens ({self.n_prompt_tokens}) exceed context window of {self.n_ctx}"
        self.args = (f"{counts}: shorten the prompt, or start the model with a larger context (n_ctx=; each "
                     f"request may use all of it) (the server: {error.status} {error.type}: {error.message})",)
