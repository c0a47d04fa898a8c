"""One request submitted to the in-process Engine, and its Python handle: `result()`,
`completion()`, `stream()`, `sse()`, `poll()`, `cancel()`, `done()`, `cancelled()`. The compiled core
holds the request (its status, body and streamed chunks); this reads it, stepping the Engine's loop
through `Engine._drive` while nobody else does."""
from __future__ import annotations

import json
import time
import warnings
from typing import TYPE_CHECKING, Any, Iterator

from . import _core
from .errors import RequestError
from .reports import Completion

if TYPE_CHECKING:
    from .engine import Engine


class RequestCancelled(_core.EngineError):
    """The request was cancelled before it finished."""


class _Flag:
    """`req.done()` / `req.cancelled()`, called as on concurrent.futures.Future, and usable as a
    predicate (`eng.run(req.done)`): it reads the request each time. Read as a bool or a number
    without the call (`if req.done:`, the form before 0.2) it still answers, with a
    DeprecationWarning, for one release."""

    __slots__ = ("_handle", "_name")

    def __init__(self, handle: Any, name: str) -> None:
        self._handle = handle
        self._name = name

    def __call__(self) -> bool:
        return bool(getattr(self._handle, self._name))

    def _deprecated(self) -> bool:
        warnings.warn(f"Request.{self._name} is a method, as on concurrent.futures.Future: call req.{self._name}() "
                      f"(reading it as a bool goes away in the next release)", DeprecationWarning, stacklevel=3)
        return self()

    def __bool__(self) -> bool:
        return self._deprecated()

    def __int__(self) -> int:
        return int(self._deprecated())

    __index__ = __int__

    def __eq__(self, other: object) -> bool:
        return self._deprecated() == other

    def __hash__(self) -> int:
        return id(self)

    def __add__(self, other: Any) -> Any:  # sum(r.done for r in reqs)
        return int(self._deprecated()) + other

    __radd__ = __add__

    def __repr__(self) -> str:
        return f"<bound method Request.{self._name} of a request: {self()}>"


class Request:
    """A submitted request. `result()` / `stream()` step the engine themselves unless a background
    loop runs, so a single thread can simply submit and read. `done()` and `cancelled()` are
    methods, as on concurrent.futures.Future."""

    def __init__(self, engine: "Engine", handle: Any, path: str, stream: bool, request_id: str | None = None) -> None:
        self._engine = engine
        self._handle = handle
        self.path = path
        self.is_stream = stream
        self.request_id = request_id if request_id is not None else f"req-{handle.id}"

    @property
    def done(self) -> _Flag:
        """`req.done()`: whether the request has finished (answered, failed or cancelled)."""
        return _Flag(self._handle, "done")

    @property
    def cancelled(self) -> _Flag:
        """`req.cancelled()`: whether the request was cancelled."""
        return _Flag(self._handle, "cancelled")

    def _is_done(self) -> bool:
        return bool(self._handle.done)

    def cancel(self, wait: float = 1.0) -> None:
        """Stop the request as a client disconnect would: its handler stops at once and the loop's
        next step frees its slot (and any parked state). Returns once the handler has let go of the
        request, waiting up to `wait` seconds for that (0: return at once; the slot is then freed
        at the step after the handler lets go)."""
        self._handle.cancel()
        if wait > 0:
            self._handle.wait_done(wait)

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until the request has finished; False if the timeout passed first."""
        return self._engine._drive(self._is_done, self._handle.wait_done, timeout)

    def result(self, timeout: float | None = None) -> Any:
        """The response body (a dict for completions). Raises RequestError for an error answer,
        RequestCancelled if it was cancelled, TimeoutError if the timeout passed."""
        if self.is_stream:
            return list(self.stream(timeout=timeout))
        if not self.wait(timeout):
            raise TimeoutError(f"{self.path}: no answer within {timeout} s")
        status = int(self._handle.status)
        raw = bytes(self._handle.data)
        if self._handle.cancelled and not raw:
            raise RequestCancelled(f"{self.path}: cancelled")
        body = _decode(raw)
        if status != 200:
            raise RequestError.from_body(status, body)
        return body

    def completion(self, timeout: float | None = None) -> Completion:
        """The answer as a Completion; a streamed request's chunks are read to its end and joined."""
        if self.is_stream:
            return Completion.from_stream(list(self.stream(timeout=timeout)))
        return Completion.from_response(self.result(timeout))

    def sse(self, timeout: float | None = None) -> Iterator[str]:
        """The raw SSE chunks as the HTTP stream carries them (data lines, comments, [DONE])."""
        h = self._handle
        deadline = None if timeout is None else time.monotonic() + timeout
        if not self._engine._drive(lambda: h.started, h.wait_started, timeout):
            raise TimeoutError(f"{self.path}: no answer within {timeout} s")
        if not h.is_stream:
            self._raise_unstreamed()
        while True:
            for chunk in h.take_chunks():
                yield bytes(chunk).decode("utf-8")
            if h.done:
                for chunk in h.take_chunks():
                    yield bytes(chunk).decode("utf-8")
                break
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise TimeoutError(f"{self.path}: stream stalled past {timeout} s")
            self._engine._drive(lambda: h.done or h.has_chunks(), h.wait_chunk, left)
        if h.cancelled:
            raise RequestCancelled(f"{self.path}: cancelled")

    def stream(self, timeout: float | None = None) -> Iterator[dict[str, Any]]:
        """The streamed chunks, JSON-decoded: the same `data:` payloads as the SSE stream. A request
        submitted without stream=True yields its whole answer as one chunk."""
        if not self.is_stream:
            yield self.result(timeout)
            return
        for chunk in self.sse(timeout):
            yield from _sse_data(chunk)

    def poll(self) -> list[dict[str, Any]]:
        """The streamed chunks that arrived since the last call, without waiting or stepping.
        Raises RequestError for an error answer (before or during the stream)."""
        h = self._handle
        if not h.started:
            return []
        if not h.is_stream:
            self._raise_unstreamed()
        out: list[dict[str, Any]] = []
        for chunk in h.take_chunks():
            out.extend(_sse_data(bytes(chunk).decode("utf-8")))
        return out

    def _raise_unstreamed(self) -> None:
        """A stream that ended before its first chunk: an ordinary error response, as over HTTP."""
        h = self._handle
        status, body = int(h.status), _decode(bytes(h.data))
        if h.cancelled and not body:
            raise RequestCancelled(f"{self.path}: cancelled")
        raise RequestError.from_body(status if status != 200 else 500, body)


def _sse_data(chunk: str) -> Iterator[dict[str, Any]]:
    """The decoded `data:` payloads of one SSE chunk; an error payload raises RequestError."""
    for line in chunk.splitlines():
        if not line.startswith("data: "):
            continue
        payload = line[len("data: "):]
        if payload == "[DONE]":
            continue
        data = json.loads(payload)
        if isinstance(data, dict) and "error" in data:
            raise RequestError.from_body(int(data["error"].get("code", 500)), data)
        yield data


def _decode(raw: bytes) -> Any:
    text = raw.decode("utf-8", errors="replace")
    if not text:
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text
