"""The in-process Engine: the patched llama-server in this process, its loop driven from Python.

    from llama_preempt import Engine

    with Engine("model.gguf", n_ctx=1024, n_parallel=4) as eng:
        outs = eng.generate(["Once upon a time", "The dog"], n_predict=64, temperature=0)
        print(outs[0].text, eng.stats().n_preempt_total)

The model is loaded with llama-server's own argument parser (`args` takes any llama-server flag),
requests go through the server's own route handlers (`/completion`, `/v1/chat/completions`, ...),
and `step()` runs one iteration of the server's loop, returning a StepReport. Either drive the
loop yourself (`step()`, `run()`, `generate()`, or simply `Request.result()`, which steps until
its answer is there), or `start()` a background thread that does, so several Python threads can
submit and stream at once.
"""
from __future__ import annotations

import json
import os
import shlex
import threading
import time
from dataclasses import replace
from typing import Any, Callable, Iterator, Sequence, Union, cast

from . import _core
from .checks import RequestRules, check_messages
from .errors import RequestError
from .flags import server_flags
from .llamacpp_api import LlamaCalls, chat_format_flags
from .metrics import MetricsSnapshot, parse_prometheus
from .reports import (Completion, EndEvent, FailEvent, ParkChoice, ParkEvent, ParkReason, ParkTier,  # noqa: F401
                      PreemptMode, ResumeEvent, StepReport, StopType, stream_text)
from .prompts import Prompt, is_prompt, prompt_fields
from .request import Request, RequestCancelled  # one request's handle (request.py); also this module's API
from .sampling import SamplingParams, each_params, per_prompt
from .stats import PreemptStats

# errors raised by the compiled core (re-exported so callers need only this module)
EngineError = _core.EngineError                   # base of the Engine's errors (a RuntimeError)
EngineClosedError = _core.EngineClosedError       # the Engine was closed
EngineBusyError = _core.EngineBusyError           # step() from two threads at once
ModelLoadError = _core.ModelLoadError             # missing or unloadable model file
EngineArgumentError = _core.EngineArgumentError   # a bad llama-server flag (a ValueError)

# a flag the Engine adds unless the caller sets it: warnings and errors only (the binary logs info)
_QUIET = ["-lv", "1"]  # load errors only; once loaded a quiet Engine logs nothing (_core.set_log_verbosity(0))
_VERBOSITY_FLAGS = {"-lv", "--verbosity", "--log-verbosity", "-v", "--verbose", "--log-verbose"}


class GenerateError(RequestError):
    """generate() with failed requests: the first failure's status, type and message, and every
    result in input order (`results`: a Completion, or the RequestError / RequestCancelled of that
    request), so the answers that succeeded are not lost."""

    def __init__(self, results: list[Any]) -> None:
        failed = [x for x in results if isinstance(x, Exception)]
        first = failed[0]
        status, type_, message = ((first.status, first.type, first.message) if isinstance(first, RequestError)
                                  else (499, "cancelled", str(first)))
        super().__init__(status, type_, f"{len(failed)} of {len(results)} requests failed; the first: {message}")
        self.results = results

    @property
    def completions(self) -> list[Any]:
        """The answers that succeeded (None in the place of each failed request)."""
        return [None if isinstance(x, Exception) else x for x in self.results]


# the routes whose request fields submit() checks by the server's schema (any other takes its body as given)
_CHECKED_PATHS = {"/completion", "/completions", "/v1/completions", "/v1/chat/completions", "/chat/completions",
                  "/infill"}
Until = Union[None, Callable[[], bool], Request, Sequence[Request]]


class Engine:
    """The patched llama-server in process. Always close() it, or use it as a context manager.

        with Engine("model.gguf", n_ctx=1024, n_parallel=4) as eng:
            print(eng.submit("Once upon a time", n_predict=32).completion().text)
            out = eng.create_chat_completion(messages=[{"role": "user", "content": "Hi"}])  # llama-cpp-python's call

    llama-cpp-python's `Llama` and vLLM's `LLM` are facades that hold an Engine (llama.py,
    vllm_api.py); the Engine's own `create_completion`, `create_chat_completion` and
    `engine(prompt)` answer through the same llama-cpp-python calls (llamacpp_api.py).
    """

    def __init__(self, model: str | os.PathLike[str] | None = None, args: Sequence[str] | str = (), *,
                 model_path: str | os.PathLike[str] | None = None, n_ctx: int | None = None, n_parallel: int | None = None, kv_unified: bool | None = None,
                 preempt: bool | None = None, preempt_ram_mib: int | None = None,
                 preempt_mode: str | None = None, preempt_disk: str | os.PathLike[str] | None = None,
                 preempt_disk_mib: int | None = None, n_threads: int | None = None, n_gpu_layers: int | None = None,
                 seed: int | None = None, n_batch: int | None = None, metrics: bool = True, slots: bool = True,
                 deterministic: bool = False, verbose: bool = False, chat_format: str | None = None,
                 embedding: bool = False) -> None:
        if model is None:
            model, model_path = model_path, None
        if model is None or model_path is not None:
            raise TypeError("Engine(): give the model file once, as Engine(path) or Engine(model_path=path) "
                            "(llama_cpp.Llama's name)")
        if not isinstance(args, (str, bytes)) and not isinstance(args, Sequence):
            raise TypeError(f"Engine(): args must be llama-server flags, a list or one string, got {type(args).__name__}")
        argv = server_flags(model, n_ctx=n_ctx, n_parallel=n_parallel, preempt_ram_mib=preempt_ram_mib,
                            preempt_mode=preempt_mode, threads=n_threads, n_gpu_layers=n_gpu_layers, seed=seed,
                            preempt_disk=preempt_disk, preempt_disk_mib=preempt_disk_mib, n_batch=n_batch,
                            kv_unified=kv_unified, preempt=preempt, metrics=metrics, slots=slots,
                            deterministic=deterministic, embedding=embedding or None)
        argv += chat_format_flags(chat_format)
        if isinstance(args, (str, bytes)):  # "-c 256 -fa on": split as a shell would
            args = shlex.split(args.decode() if isinstance(args, bytes) else args)
        argv += [str(a) for a in args]
        quiet = not verbose and not _VERBOSITY_FLAGS.intersection(argv)
        if quiet:
            argv = _QUIET + argv
        self.args = argv
        self.chat_format: str | None = chat_format  # llama-cpp-python's name (its stop strings join each chat request)
        self._core = _core.EngineCore(argv)
        if quiet:  # a failed request is the RequestError raised here, not lines on stderr too
            _core.set_log_verbosity(0)
        self._drive_lock = threading.Lock()  # one thread steps at a time
        self._requests: list[Request] = []
        self._requests_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._loop_error: BaseException | None = None
        self._on_loop_error: Callable[[], object] | None = None  # AsyncEngine: wake the event loop's waiters
        self._closed = False
        self._draining = False
        self._rules: RequestRules | None = None
        self._info: dict[str, Any] | None = None

    # --- lifetime ---

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self, *, drain: float = 0.0) -> None:
        """Stop the background loop, cancel what is pending, free the model and context. With
        `drain` (seconds), the pending requests may finish first, as llama-server's --drain-timeout
        lets them on SIGTERM: no new request is taken meanwhile. A second close does nothing."""
        if self._closed:
            return
        try:
            if self._thread is not None:
                self.stop(drain=drain)
            elif drain > 0:
                self._drain(drain)
        finally:
            self._closed = True
            self._draining = False
            self._core.close()

    def _pending(self) -> list[Request]:
        with self._requests_lock:
            return [r for r in self._requests if not r._is_done()]

    def _drain(self, seconds: float) -> None:
        """Let the pending requests finish for up to `seconds` (stepping the loop when no background
        thread does), taking no new ones; what is left is cancelled by the caller."""
        self._draining = True  # reset by the caller, once what is left has been cancelled
        deadline = time.monotonic() + seconds
        pending = self._pending()
        try:
            if self._thread is None:
                self.run(pending, timeout=seconds)
            else:
                for r in pending:
                    r.wait(max(0.0, deadline - time.monotonic()))
        except (TimeoutError, EngineError):
            pass  # out of time, or the loop failed: the caller cancels what is left either way

    def _check_open(self) -> None:
        if self._closed:
            raise EngineClosedError("the Engine is closed: create a new one")

    # --- requests ---

    def submit(self, prompt: str | Sequence[int] | None = None, *, messages: Sequence[dict[str, Any]] | None = None,
               path: str | None = None, body: dict[str, Any] | None = None, stream: bool = False,
               **params: Any) -> Request:
        """Start a request. `prompt` goes to /completion, `messages` to /v1/chat/completions;
        `path` and `body` send anything else. Extra keywords are request fields
        (n_predict, temperature, priority, ...): `priority` (default 0) orders who is parked
        first (lowest) and resumed first (highest) when the pool is full."""
        self._check_open()
        if prompt is not None and messages is not None:
            raise TypeError("submit(): give either prompt (for /completion) or messages (for /v1/chat/completions), "
                            "not both")
        if path is None or path.split("?")[0] in _CHECKED_PATHS:  # the completion routes' fields, checked here
            rules = self.request_rules()
            rules.check_keywords("submit()", params)
            rules.check("submit()", {"prompt": prompt, **params})
        if messages is not None:
            check_messages("submit()", messages)
        if not isinstance(stream, bool):
            raise TypeError(f"submit(): stream must be True or False, got {stream!r}")
        if body is not None and not isinstance(body, dict):
            raise TypeError(f"submit(): body must be a dict, got {type(body).__name__}")
        if self._draining:
            raise EngineError("the Engine is draining (stop(drain=...) or close(drain=...)): it takes no new requests")
        payload: dict[str, Any] = dict(body or {})
        if messages is not None:
            payload["messages"] = list(messages)
            path = path or "/v1/chat/completions"
        elif prompt is not None:
            payload["prompt"] = prompt
            path = path or "/completion"
        if path is None:
            raise ValueError("submit() needs a prompt, messages, or a path and body")
        payload.update(params)
        if stream:
            payload["stream"] = True
        # stepping by hand, submit() returns once the request's task is queued, so requests submitted
        # one after another run together in the next step; a background loop takes them as they come
        req = Request(self, self._core.submit("POST", path, json.dumps(payload), self._thread is None), path,
                      bool(payload.get("stream")))
        with self._requests_lock:
            self._requests = [r for r in self._requests if not r._is_done()]
            self._requests.append(req)
        return req

    def request(self, method: str, path: str, body: dict[str, Any] | None = None,
                timeout: float | None = None) -> Any:
        """Any route, answered synchronously: `request("GET", "/slots")`,
        `request("POST", "/tokenize", {"content": "hi"})`. Returns the decoded body."""
        self._check_open()
        req = Request(self, self._core.submit(method.upper(), path, json.dumps(body) if body is not None else "",
                                              self._thread is None), path, False)
        return req.result(timeout)

    def render_chat(self, messages: Sequence[dict[str, Any]], add_generation_prompt: bool = True,
                    **template_fields: Any) -> str:
        """Chat messages as the prompt text the model's chat template (or chat_format) makes of them
        (/apply-template), for generating from it as vLLM's chat does; `template_fields` (tools,
        chat_template_kwargs, ...) go to the template."""
        body = {"messages": list(messages), "add_generation_prompt": add_generation_prompt,
                **{k: v for k, v in template_fields.items() if v is not None}}
        self.request_rules().check("render_chat()", body)
        return str(self.request("POST", "/apply-template", body)["prompt"])

    def request_rules(self) -> RequestRules:
        """The request fields this server takes, with their types and limits (upstream's schema and
        the routes' own): what every call checks its keywords by before it submits."""
        if self._rules is None:
            self._check_open()
            self._rules = RequestRules(self._core.request_fields())
        return self._rules

    def model_info(self) -> dict[str, Any]:
        """The loaded model's facts: n_ctx (the KV pool), n_ctx_train, n_embd, n_vocab, token_bos,
        token_eos, token_nl, add_bos, chat_template and its GGUF metadata."""
        if self._info is None:
            self._check_open()
            self._info = dict(self._core.model_info())
        return self._info

    def tokenize(self, text: bytes | str, add_bos: bool = True, special: bool = False, *,
                 add_special: bool | None = None) -> list[int]:
        """The model's tokens of `text` (bytes as llama_cpp.Llama takes it, or a str). `add_bos`
        adds the model's start token where it uses one (`add_special` is llama-server's name for
        it); `special` parses special-token text such as "<s>" as those tokens."""
        if isinstance(text, str):
            text = text.encode("utf-8")
        if not isinstance(text, (bytes, bytearray)):
            raise TypeError(f"tokenize(): text must be bytes or a str, got {type(text).__name__}")
        for name, v in (("add_bos", add_bos), ("special", special), ("add_special", add_special)):
            if v is not None and not isinstance(v, bool):
                raise TypeError(f"tokenize(): {name} must be True or False, got {v!r}")
        return list(self._core.tokenize(bytes(text), add_bos if add_special is None else add_special, special))

    def detokenize(self, tokens: Sequence[int], prev_tokens: Sequence[int] | None = None,
                   special: bool = False) -> bytes:
        """The bytes of `tokens` (llama_cpp.Llama's: decode them with .decode("utf-8", errors="ignore")
        where a piece may split a character). With `prev_tokens`, only what `tokens` add after them;
        `special` renders special tokens ("<s>") instead of dropping them."""
        if isinstance(tokens, (str, bytes)) or not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
            raise TypeError("detokenize(): tokens must be a list of token ids (int)")
        if not isinstance(special, bool):
            raise TypeError(f"detokenize(): special must be True or False, got {special!r}")
        try:
            if prev_tokens is not None:
                before = self._pieces(list(prev_tokens), special)
                return self._pieces(list(prev_tokens) + list(tokens), special)[len(before):]
            return self._pieces(list(tokens), special)
        except ValueError as e:
            raise ValueError(f"detokenize(): {e}") from None

    def _pieces(self, tokens: list[int], special: bool) -> bytes:
        """The tokens' bytes, without the space a sentencepiece model puts after its start token
        (llama_cpp.Llama drops it the same way, so detokenize(tokenize(b"x")) == b"x")."""
        out = bytes(self._core.detokenize(tokens, special))
        return out[1:] if tokens and tokens[0] == int(self.model_info()["token_bos"]) and out[:1] == b" " else out

    # --- llama-cpp-python's completion calls (llamacpp_api.LlamaCalls answers them) ---

    def create_completion(self, prompt: str | list[int], *args: Any,
                          **kwargs: Any) -> dict[str, Any] | Iterator[dict[str, Any]]:
        """llama_cpp.Llama.create_completion, with its parameters and defaults (max_tokens=16,
        temperature=0.8, stop, echo, logprobs, grammar, stream, ...): see LlamaCalls.create_completion."""
        return LlamaCalls(self).create_completion(prompt, *args, **kwargs)

    def __call__(self, prompt: str | list[int], *args: Any, **kwargs: Any) -> dict[str, Any] | Iterator[dict[str, Any]]:
        """`engine(prompt, ...)` is create_completion(prompt, ...), as with llama_cpp.Llama."""
        return LlamaCalls(self).create_completion(prompt, *args, **kwargs)

    def create_chat_completion(self, messages: Sequence[dict[str, Any]], *args: Any,
                               **kwargs: Any) -> dict[str, Any] | Iterator[dict[str, Any]]:
        """llama_cpp.Llama.create_chat_completion, with its parameters and defaults (the model's
        own chat template, or chat_format): see LlamaCalls.create_chat_completion."""
        return LlamaCalls(self).create_chat_completion(messages, *args, **kwargs)

    def slots(self) -> list[dict[str, Any]]:
        """The slots as /slots shows them, as of the last step boundary: never waits for the loop
        (`request("GET", "/slots")` asks the loop itself)."""
        self._check_open()
        return list(self._core.views()["slots"])

    def metrics(self) -> MetricsSnapshot:
        """/metrics as the server's route renders it, as of the last step boundary: never waits
        for the loop (`request("GET", "/metrics")` asks the loop itself, and needs metrics=True)."""
        self._check_open()
        views = self._core.views()
        snap = parse_prometheus(str(views["metrics_text"]))
        snap.age_ms = float(views["age_ms"])
        return snap

    def park(self, slot: int) -> dict[str, Any]:
        """Park the request in `slot` now (POST /slots/{slot}?action=park). It stays parked until
        unpark(slot) or until it is cancelled; RequestError says why a slot cannot be parked."""
        return dict(self.request("POST", f"/slots/{int(slot)}?action=park"))

    def unpark(self, slot: int) -> dict[str, Any]:
        """Let a slot parked through park() resume; the planner resumes it as soon as it fits."""
        return dict(self.request("POST", f"/slots/{int(slot)}?action=unpark"))

    def stats(self) -> PreemptStats:
        """Preemption counters, gauges and the slots, read directly from the server's slots. Never
        waits for the loop: while a step runs (a long prefill can take seconds) they are those of
        the step boundary before it; `age_ms` says how old they are."""
        self._check_open()
        return PreemptStats.from_core(self._core.stats())

    # --- the loop ---

    def step(self) -> StepReport:
        """One iteration of the server loop (takes queued tasks, runs update_slots() once, never
        waits for work). Raises EngineBusyError if another thread is stepping."""
        self._check_open()
        if self._thread is not None:
            raise EngineBusyError("the background loop is running (start()): stop() it before stepping by hand")
        return self._step_once()

    def _step_once(self) -> StepReport:
        return StepReport.from_core(self._core.step())

    def tick(self, idle_wait: float = 0.05) -> StepReport:
        """One step; when it did nothing, wait up to `idle_wait` s for work (a queued task or a
        finished request) instead of spinning. The loop every driver of the Engine runs."""
        self._check_open()
        if self._thread is not None:
            raise EngineBusyError("the background loop is running (start()): stop() it before stepping by hand")
        return self._tick(idle_wait)

    def _tick(self, idle_wait: float, done: Callable[[], bool] | None = None, *, locked: bool = False) -> StepReport:
        """One step (under the drive lock, unless the caller holds it: `locked`), then, when it did
        nothing and `done()` does not hold yet, wait up to `idle_wait` s for work."""
        if locked:
            rep = self._step_once()
        else:
            with self._drive_lock:
                rep = self._step_once()
        if rep.idle and idle_wait > 0 and (done is None or not done()):
            self._core.wait(idle_wait)
        return rep

    def run(self, until: Until = None, *, timeout: float | None = None,
            on_step: Callable[[StepReport], None] | None = None) -> list[StepReport]:
        """Step until `until` holds: a callable, a Request or a list of them (all done), or, when
        None, until nothing is pending and no slot is busy. Returns the steps' reports."""
        self._check_open()
        if self._thread is not None:
            raise EngineBusyError("the background loop is running (start()): wait on the requests instead")
        pred = self._until(until)
        deadline = None if timeout is None else time.monotonic() + timeout
        reports: list[StepReport] = []
        while not pred():
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"run(): not done within {timeout} s")
            rep = self._tick(0.05, pred)
            reports.append(rep)
            if on_step is not None:
                on_step(rep)
        return reports

    def generate(self, prompts: Sequence[Prompt], params: SamplingParams | Sequence[SamplingParams] | None = None, *,
                 progress: Callable[[int, int, StepReport | None], None] | None = None,
                 timeout: float | None = None, return_exceptions: bool = False,
                 **fields: Any) -> list[Any]:
        """Submit every prompt (a string for /completion, a list of chat messages for
        /v1/chat/completions), run until all finish, and return the answers (Completion) in input
        order. `params`: a SamplingParams for all prompts or one per prompt, as vLLM's generate()
        takes them; keywords are request fields for all (n_predict, temperature, ...), over those.

            eng.generate(["Once", "The dog"], SamplingParams(max_tokens=32, temperature=0))
            eng.generate(["Once", "The dog"], [SamplingParams(seed=1), SamplingParams(seed=2)])

        `progress(n_done, n_total, report)` is called after each step (report is None in
        background mode). If any request failed: with return_exceptions, its RequestError (or
        RequestCancelled) stands in its place in the list; else GenerateError is raised once all
        are done, carrying every result in `.results` (answers and errors in input order). Past
        `timeout` seconds every request not done is cancelled and TimeoutError says how many."""
        if isinstance(prompts, (str, bytes)):
            raise TypeError("generate(): prompts must be a list (of strings, or of chat message lists); "
                            "for one prompt, pass [prompt]")
        if fields.get("stream"):
            raise ValueError("generate() returns whole answers: for a stream, submit(..., stream=True).stream()")
        if params is not None and not all(p.plain for p in each_params(params, len(prompts))):
            from .vllm_run import generate_sync  # vLLM's fields that take more than one request each
            return generate_sync(self, prompts, each_params(params, len(prompts)), progress=progress, timeout=timeout,
                                 return_exceptions=return_exceptions, **fields)
        rules = self.request_rules()
        rules.check_keywords("generate()", fields)
        rules.check("generate()", fields)
        each = per_prompt(params, len(prompts))
        # a text prompt goes to /completion, which returns the generated token ids (vLLM's token_ids)
        reqs: list[Request] = []
        try:
            for p, f in zip(prompts, each):
                reqs.append(self.submit(cast("str | list[int]", p), **{"return_tokens": True, **f, **fields})
                            if is_prompt(p) else self.submit(messages=cast("list[dict[str, Any]]", p), **{**f, **fields}))
        except Exception:  # a later prompt refused at the call: the ones already started do not run on
            for r in reqs:
                r.cancel(wait=0)
            raise
        total = len(reqs)
        try:
            if self._thread is None:
                on_step = None
                if progress is not None:
                    on_step = lambda rep: progress(sum(r._is_done() for r in reqs), total, rep)  # noqa: E731
                self.run(reqs, timeout=timeout, on_step=on_step)
            else:
                deadline = None if timeout is None else time.monotonic() + timeout
                for r in reqs:
                    left = None if deadline is None else max(0.0, deadline - time.monotonic())
                    if not r.wait(left):
                        raise TimeoutError
                    if progress is not None:
                        progress(sum(q._is_done() for q in reqs), total, None)
        except TimeoutError:
            left_over = [r for r in reqs if not r._is_done()]
            for r in left_over:
                r.cancel(wait=0)  # all at once, then each one's handler lets go
            for r in left_over:
                r.cancel()
            raise TimeoutError(f"generate(): not done within {timeout} s; cancelled the {len(left_over)} of its "
                               f"{total} requests still running") from None
        out: list[Any] = []
        for r, p in zip(reqs, prompts):
            try:
                out.append(self._request_output(r.completion(), p, r.request_id))
            except (RequestError, RequestCancelled) as e:
                out.append(e)
        if not return_exceptions and any(isinstance(x, Exception) for x in out):
            raise GenerateError(out)
        return out

    def _request_output(self, c: Completion, prompt: Any, request_id: str) -> Completion:
        """The answer with vLLM's RequestOutput fields: the request's id, `prompt` and `prompt_token_ids`."""
        return replace(c, request_id=request_id, **prompt_fields(prompt, self))

    # --- background mode ---

    def start(self) -> "Engine":
        """Run the loop on a background thread, so any thread may submit, wait and stream."""
        self._check_open()
        if self._thread is not None:
            return self
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="llama-preempt-engine", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 30.0, *, drain: float = 0.0) -> None:
        """Cancel the pending requests (parked ones too), let the loop free their slots, and end the
        background thread. With `drain` (seconds), the pending requests may finish first and only
        those still running then are cancelled; no new request is taken meanwhile. The engine
        stays open for stepping by hand."""
        if self._thread is None:
            return
        if drain > 0:
            self._drain(drain)
        try:
            pending = self._pending()
            for r in pending:
                r.cancel(wait=0)
            for r in pending:
                r.cancel()
            self._stop.set()
            self._thread.join(timeout)
            if self._thread.is_alive():
                raise EngineError(f"the background loop did not stop within {timeout} s")
        finally:
            self._draining = False
        self._thread = None
        if self._loop_error is not None:
            err, self._loop_error = self._loop_error, None
            raise EngineError(f"the background loop ended with an error: {err!r}") from err

    @property
    def running(self) -> bool:
        return self._thread is not None

    def _loop(self) -> None:
        try:
            while True:
                rep = self._tick(0.05, lambda: self._stop.is_set() and self._core.n_pending() == 0)
                if self._stop.is_set() and self._core.n_pending() == 0 and rep.n_busy == 0:
                    return
        except BaseException as e:  # surfaced to the threads that wait on the loop
            self._loop_error = e
            if self._on_loop_error is not None:
                self._on_loop_error()

    # --- helpers ---

    def _until(self, until: Until) -> Callable[[], bool]:
        if until is None:
            def idle() -> bool:
                if self._core.n_pending() > 0:
                    return False
                return not any(s.is_processing for s in self._core.stats().slots)
            return idle
        if isinstance(until, Request):
            return until._is_done
        if callable(until):
            return until
        reqs = list(until)
        return lambda: all(r._is_done() for r in reqs)

    def _drive(self, pred: Callable[[], bool], wait: Callable[[float], bool], timeout: float | None) -> bool:
        """Until pred() holds: step the loop if nobody else does, else wait for the other driver."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not pred():
            if self._closed:
                return pred()
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return False
            if self._loop_error is not None:
                raise EngineError(f"the background loop ended with an error: {self._loop_error!r}") from self._loop_error
            if self._thread is None and self._drive_lock.acquire(blocking=False):
                try:  # nobody else drives: step here
                    rep = self._tick(0.0, locked=True)
                finally:
                    self._drive_lock.release()
                if rep.idle and not pred():
                    self._core.wait(0.02 if left is None else max(0.0, min(0.02, left)))
            else:
                wait(0.05 if left is None else max(0.0, min(0.05, left)))
        return True

