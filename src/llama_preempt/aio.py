"""asyncio for the in-process Engine. `AsyncEngine` runs the Engine's loop on its own thread; the
event loop is woken only when one of its requests has news (the core's notify pipe, watched with
`loop.add_reader`), never by polling, so thousands of idle streams cost nothing.

    async with await AsyncEngine.create("model.gguf", n_ctx=2048, n_parallel=8) as eng:
        done = await eng.complete("Once upon a time", n_predict=32)
        reply = await eng.chat([{"role": "user", "content": "Hi"}], max_tokens=32)
        async for chunk in eng.stream(messages=[{"role": "user", "content": "Hi"}], max_tokens=64):
            print(stream_text(chunk), end="")

Cancelling the task that awaits a request (a client that disconnected) cancels the request: its
slot, and any parked state, is freed. With `notices=True` a stream also yields a `StreamNotice`
where the request was parked, resumed, or kept alive while parked.
"""
from __future__ import annotations

import asyncio
import contextlib
import os
import struct
import warnings
from dataclasses import dataclass, replace
from typing import Any, AsyncGenerator, AsyncIterator, Callable, Sequence

from .engine import Engine, EngineError, GenerateError, RequestError
from .request import Request, RequestCancelled, _decode, _sse_data
from .checks import FieldTypeError, FieldValueError
from .outputs import RequestOutputKind
from .prompts import is_one_prompt, is_prompt, vllm_prompt
from .reports import Completion
from .sampling import SamplingParams, each_params, per_prompt
from .vllm_run import VllmRun
from .stats import PreemptStats

_NOTICES = {": preempted": "preempted", ": resumed": "resumed", ": preempt-keepalive": "keepalive"}


@dataclass(frozen=True)
class StreamNotice:
    """A park notice in a stream (stream(..., notices=True)): `kind` is "preempted" (the request
    was parked to make room), "resumed" (it is back) or "keepalive" (still parked)."""

    kind: str


class AsyncEngine:
    """The Engine for asyncio; see the module's docstring. Always `await aclose()` it, or use
    `async with`. Serves one event loop (the first it is used in)."""

    def __init__(self, model: str | os.PathLike[str], args: Sequence[str] | str = (), **kwargs: Any) -> None:
        """Load the model (this blocks: from a running event loop, `await AsyncEngine.create(...)`);
        the keywords are Engine's (n_ctx, n_parallel, preempt_ram_mib, ...)."""
        self.engine = Engine(model, args, **kwargs)
        self._fd = self.engine._core.notify_fd()
        self.engine.start()
        self._events: dict[int, asyncio.Event] = {}
        self._by_id: dict[str, Request] = {}   # generate()'s requests by request_id, for abort()
        self._aborted: set[int] = set()          # the handles abort() cancelled, while their generate() runs
        self._abort_ids: set[str] = set()        # generate()'s ids abort() named (one may be between two requests)
        self._loop: asyncio.AbstractEventLoop | None = None

    @classmethod
    async def create(cls, model: str | os.PathLike[str], args: Sequence[str] | str = (), **kwargs: Any) -> "AsyncEngine":
        """Load the model on a worker thread, so the event loop keeps serving meanwhile."""
        return await asyncio.to_thread(cls, model, args, **kwargs)

    async def __aenter__(self) -> "AsyncEngine":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self, *, drain: float = 0.0) -> None:
        """Cancel what is pending (after letting it finish for up to `drain` seconds) and free the
        model, on a worker thread; the requests awaited meanwhile end with RequestCancelled."""
        if self.engine.closed:
            return
        self._unlisten()
        try:
            await asyncio.to_thread(self.engine.close, drain=drain)
        finally:
            self._wake_all()

    def close(self) -> None:
        """aclose() without awaiting: blocks while the pending requests are cancelled and the model
        freed (vLLM's AsyncLLM.shutdown() is this)."""
        if self.engine.closed:
            return
        self._unlisten()
        try:
            self.engine.close()
        finally:
            self._wake_all()

    def _unlisten(self) -> None:
        """The pipe leaves the event loop before it is closed (its number may be reused at once)."""
        if self._loop is not None and not self._loop.is_closed():
            self._loop.remove_reader(self._fd)
        self._loop = None

    @property
    def closed(self) -> bool:
        return self.engine.closed

    # --- requests ---

    async def complete(self, prompt: str | None = None, *, messages: Sequence[dict[str, Any]] | None = None,
                       **fields: Any) -> Completion:
        """One answer (a prompt for /completion, messages for /v1/chat/completions); the keywords
        are request fields (n_predict, temperature, priority, ...). RequestError for an error answer."""
        if fields.pop("stream", False):
            raise ValueError("complete() returns a whole answer: for a stream, use stream()")
        self.engine.request_rules().check_keywords("complete()", fields)
        req = self._submit(prompt, messages, fields)
        try:
            await self._until(req, req._is_done)
        finally:
            self._forget(req)
        return req.completion()

    async def chat(self, messages: Sequence[dict[str, Any]], **fields: Any) -> Completion:
        """A chat answer (the model's own chat template): `await eng.chat([{"role": "user", ...}])`."""
        return await self.complete(messages=messages, **fields)

    async def stream(self, prompt: str | None = None, *, messages: Sequence[dict[str, Any]] | None = None,
                     notices: bool = False, **fields: Any) -> AsyncIterator[Any]:
        """The streamed chunks (dicts, as the server's SSE `data:` payloads; `stream_text(chunk)` is
        the text each adds), and with `notices` the StreamNotice of each park notice. Leaving the
        loop early, or cancelling the task, cancels the request."""
        fields["stream"] = True
        self.engine.request_rules().check_keywords("stream()", fields)
        req = self._submit(prompt, messages, fields)
        async for item in self._stream_request(req, notices):
            yield item

    async def _stream_request(self, req: Request, notices: bool) -> AsyncGenerator[Any, None]:
        """The chunks of a submitted streaming request (see stream())."""
        h = req._handle
        try:
            await self._until(req, lambda: h.started)
            if not h.is_stream:  # an error before the first token is an ordinary error answer
                status, body = int(h.status), _decode(bytes(h.data))
                if h.cancelled and not body:
                    raise RequestCancelled(f"{req.path}: cancelled")
                raise RequestError.from_body(status if status != 200 else 500, body)
            ev = self._event(req)
            while True:
                ev.clear()
                done = h.done
                chunks = h.take_chunks()
                for chunk in chunks:
                    for item in _items(bytes(chunk).decode("utf-8"), notices):
                        yield item
                if done:
                    break
                if not chunks:
                    await self._wait(ev, lambda: h.done or h.has_chunks())
            if h.cancelled:
                raise RequestCancelled(f"{req.path}: cancelled")
        finally:
            if not h.done:
                req.cancel(wait=0)  # the consumer left, or its task was cancelled (never block the event loop)
            self._forget(req)

    def generate(self, prompt: Any = None, sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
                 request_id: str | None = None, *, priority: int = 0, **fields: Any) -> Any:
        """vLLM's AsyncLLM.generate: `async for out in eng.generate(prompt, params, request_id)`, a
        RequestOutput (Completion) at each step of one request (text, token ids or
        {"prompt": ...} / {"prompt_token_ids": ...}; chat messages are rendered with the model's
        template first), its text so far (or, with SamplingParams(output_kind=RequestOutputKind.DELTA),
        only what is new), the last one with `finished` True. `abort(request_id)` stops it (its last
        output's finish_reason "abort"). `priority` is vLLM's: lower runs first, and is parked last.

        The batch form of earlier releases, `await eng.generate([p1, p2], params)`, still answers
        (a list of Completions) with a DeprecationWarning: use `await eng.generate_all(...)`."""
        old_form = "prompts" in fields or "params" in fields or "return_exceptions" in fields
        if old_form or (isinstance(prompt, (list, tuple)) and not is_one_prompt(prompt)):
            warnings.warn("AsyncEngine.generate(list) is vLLM's single-prompt stream now; for the whole list at "
                          "once, await generate_all(prompts, params)", DeprecationWarning, stacklevel=2)
            prompts = fields.pop("prompts", prompt)
            return self.generate_all(prompts, fields.pop("params", sampling_params), **fields)
        if sampling_params is not None and not isinstance(sampling_params, SamplingParams):
            raise TypeError(f"generate(): one prompt takes one SamplingParams, got {type(sampling_params).__name__}")
        if isinstance(priority, bool) or not isinstance(priority, int):
            raise TypeError(f"generate(): priority must be an int, got {priority!r}")
        # vLLM runs lower priorities first; the server parks lower priorities first: the opposite sign
        return self._generate(prompt, sampling_params or SamplingParams(), request_id,
                              {**fields, "priority": -priority} if priority else fields)

    async def _generate(self, prompt: Any, params: SamplingParams, request_id: str | None,
                        fields: dict[str, Any]) -> AsyncIterator[Completion]:
        if request_id is not None and request_id in self._by_id:
            raise ValueError(f"generate(): request_id {request_id!r} is already running")
        self.engine.request_rules().check_keywords("generate()", fields)
        prompt = vllm_prompt(prompt, "generate()")
        if not is_prompt(prompt):  # chat messages: rendered, then generated from, as LLM.chat
            prompt = await asyncio.to_thread(self.engine.render_chat, prompt)
        # the server requests this one takes (one, unless vLLM's own fields ask for more: vllm_run.py)
        run = VllmRun(self.engine, prompt, params, fields, request_id or "", measure=True)
        rid = request_id
        req: Request | None = None
        try:
            while (stage := run.next_stage()) is not None:
                if rid is not None and rid in self._abort_ids:  # aborted after one request, before the next
                    yield run.aborted()
                    return
                req = self._submit(stage.prompt, None, stage.fields)
                if rid is None:
                    rid = run.request_id = req.request_id
                self._by_id[rid] = req
                try:
                    async with contextlib.aclosing(self._stream_request(req, False)) as chunks:
                        async for chunk in chunks:
                            out = run.feed(chunk)
                            if out is not None:
                                yield out
                            if run.cancel_wanted:
                                break  # every sequence has ended here: leaving the stream cancels the request
                except RequestCancelled:
                    if req._handle.id not in self._aborted:
                        raise
                    yield run.aborted()
                    return
                finally:
                    self._aborted.discard(req._handle.id)
                out = run.stage_ended()
                if out is not None:
                    yield out
        finally:
            if rid is not None and req is not None and self._by_id.get(rid) is req:
                del self._by_id[rid]
                self._abort_ids.discard(rid)

    async def abort(self, request_id: str | Sequence[str]) -> None:
        """Stop the request(s) started by generate() with these ids, as vLLM's abort; their slots
        (and any parked state) are freed. An id that is not running is ignored."""
        for rid in [request_id] if isinstance(request_id, str) else list(request_id):
            req = self._by_id.get(rid)
            if req is None:
                continue
            self._abort_ids.add(rid)
            if not req.done():
                self._aborted.add(req._handle.id)
                req.cancel(wait=0)

    async def generate_all(self, prompts: Sequence[Any],
                           params: SamplingParams | Sequence[SamplingParams] | None = None,
                           *, return_exceptions: bool = False, **fields: Any) -> list[Any]:
        """Every prompt at once, the answers in input order (as Engine.generate, vLLM-style params).
        A mistake in the call (a field's type, malformed messages) is raised, as by Engine.generate."""
        if isinstance(prompts, (str, bytes)):
            raise TypeError("generate_all(): prompts must be a list; for one prompt, pass [prompt]")
        self.engine.request_rules().check_keywords("generate_all()", fields)
        sps = each_params(params, len(prompts))
        prompts = [vllm_prompt(p, f"generate_all(): prompts[{i}]") for i, p in enumerate(prompts)]
        if any(not sp.plain for sp in sps):  # vLLM's own fields: each prompt's run to its end (vllm_run.py)
            calls = [self._last(self._generate(p, replace(sp, output_kind=RequestOutputKind.FINAL_ONLY), None, fields))
                     for p, sp in zip(prompts, sps)]
        else:
            each = per_prompt(params, len(prompts))
            calls = [self.complete(p, **{**f, **fields}) if is_prompt(p)
                     else self.complete(messages=p, **{**f, **fields}) for p, f in zip(prompts, each)]
        out = list(await asyncio.gather(*calls, return_exceptions=True))
        for x in out:
            if isinstance(x, (FieldTypeError, FieldValueError)) or \
                    (isinstance(x, BaseException) and not isinstance(x, (RequestError, RequestCancelled))):
                raise x
        if not return_exceptions and any(isinstance(x, Exception) for x in out):
            raise GenerateError(out)
        return out

    @staticmethod
    async def _last(outs: AsyncIterator[Completion]) -> Completion:
        last: Completion | None = None
        async with contextlib.aclosing(outs) as it:  # type: ignore[type-var]
            async for out in it:
                last = out
        if last is None:
            raise RequestError(500, "server_error", "generate_all(): a request ended without an answer")
        return last

    def stats(self) -> PreemptStats:
        """The preemption stats; never waits for the loop (see Engine.stats, `age_ms`)."""
        return self.engine.stats()

    def slots(self) -> list[dict[str, Any]]:
        """The slots as /slots shows them (Engine.slots; never waits for the loop)."""
        return self.engine.slots()

    def metrics(self) -> Any:
        """/metrics as of the last step boundary (Engine.metrics; never waits for the loop)."""
        return self.engine.metrics()

    def tokenize(self, text: bytes | str, add_bos: bool = True, special: bool = False) -> list[int]:
        return self.engine.tokenize(text, add_bos, special)

    def detokenize(self, tokens: Sequence[int], prev_tokens: Sequence[int] | None = None, special: bool = False) -> bytes:
        return self.engine.detokenize(tokens, prev_tokens, special)

    def model_info(self) -> dict[str, Any]:
        return self.engine.model_info()

    async def request(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        """Any route (Engine.request), awaited on a worker thread."""
        return await asyncio.to_thread(self.engine.request, method, path, body)

    async def park(self, slot: int) -> dict[str, Any]:
        return await asyncio.to_thread(self.engine.park, slot)

    async def unpark(self, slot: int) -> dict[str, Any]:
        return await asyncio.to_thread(self.engine.unpark, slot)

    # --- waking on news ---

    def _submit(self, prompt: str | None, messages: Sequence[dict[str, Any]] | None, fields: dict[str, Any]) -> Request:
        self.engine._check_open()
        self._listen()
        req = self.engine.submit(prompt, messages=messages, **fields)
        self._events[req._handle.id] = asyncio.Event()
        return req

    def _listen(self) -> None:
        loop = asyncio.get_running_loop()
        if self._loop is loop:
            return
        if self._loop is not None and not self._loop.is_closed():
            raise RuntimeError("this AsyncEngine serves another event loop: use one AsyncEngine per loop")
        loop.add_reader(self._fd, self._on_news)
        self._loop = loop
        self.engine._on_loop_error = lambda: loop.call_soon_threadsafe(self._wake_all)

    def _on_news(self) -> None:
        """The pipe is readable: wake the requests whose ids it carries."""
        ids: set[int] = set()
        while True:
            try:
                data = os.read(self._fd, 8 * 4096)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:  # closed with the Engine
                break
            n = len(data) // 8
            ids.update(struct.unpack(f"={n}Q", data[:8 * n]))
            if len(data) < 8 * 4096:
                break
        if self.engine._core.take_missed():
            ids = set(self._events)
        for i in ids:
            ev = self._events.get(i)
            if ev is not None:
                ev.set()

    def _wake_all(self) -> None:
        for ev in self._events.values():
            ev.set()

    def _event(self, req: Request) -> asyncio.Event:
        return self._events.setdefault(req._handle.id, asyncio.Event())

    def _forget(self, req: Request) -> None:
        self._events.pop(req._handle.id, None)

    async def _wait(self, ev: asyncio.Event, pred: Callable[[], bool]) -> None:
        """Until woken; then, unless pred() holds already, the loop's error or the close."""
        await ev.wait()
        if pred():
            return
        err = self.engine._loop_error
        if err is not None:
            raise EngineError(f"the Engine's loop ended with an error: {err!r}") from err
        if self.engine.closed:
            raise RequestCancelled("the AsyncEngine was closed")

    async def _until(self, req: Request, pred: Callable[[], bool]) -> None:
        """Until pred() holds, woken by the request's news; a cancelled task cancels the request."""
        ev = self._event(req)
        try:
            while True:
                ev.clear()
                if pred():
                    return
                await self._wait(ev, pred)
        except asyncio.CancelledError:
            req.cancel(wait=0)
            raise


def _items(chunk: str, notices: bool) -> list[Any]:
    """The data payloads of one SSE chunk, and its park notices when asked for."""
    out: list[Any] = []
    for line in chunk.splitlines():
        if line.startswith("data: "):
            out.extend(_sse_data(line))
        elif notices and line in _NOTICES:
            out.append(StreamNotice(_NOTICES[line]))
    return out
