"""llama-cpp-python's calls over an Engine: `create_completion` (also `llm(prompt)`),
`create_chat_completion`, the embeddings, the model's accessors and `set_seed`, with
`llama_cpp.Llama`'s parameter names and defaults and OpenAI-shaped results (a dict, or an iterator
of chunk dicts with `stream=True`). `Llama` (llama.py) is these calls with llama_cpp's constructor;
the Engine's own `create_completion`, `create_chat_completion` and `engine(prompt)` answer through
them too, so code written for `llama_cpp.Llama` runs by changing the import:

    llm = Llama(model_path="model.gguf", n_ctx=2048)     # from llama_preempt import Llama
    out = llm.create_chat_completion(messages=[{"role": "user", "content": "Hi"}], max_tokens=32)
    print(out["choices"][0]["message"]["content"])

They go through the server's own OpenAI routes (/v1/completions, /v1/chat/completions)."""
from __future__ import annotations

import contextlib
import inspect
import random
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterator, Sequence

from . import chat_formats, llama_state
from .checks import FieldValueError
from .errors import RequestError
from .facade import EngineFacade
from .grammar import grammar_fields
from .llama_state import LlamaState
from .llamacpp_answers import EndTokens, context_errors, without_end_token

if TYPE_CHECKING:
    from .checks import RequestRules
    from .engine import Engine

_MAX_SEED = 0xFFFFFFFE  # the largest seed a request samples with as given (0xFFFFFFFF: a random one)

# llama_cpp's stateful context (eval, sample, generate, reset) is the Llama's own (llama_context.py)
_ONE_CONTEXT = ("{call}: llama-cpp-python's one stateful context is llama_preempt.Llama's (Llama(model_path=...)."
                "eval/sample/generate/reset); here each request gets a slot: submit a prompt (create_completion, "
                "submit) instead")

# Python callables llama.cpp's server cannot run in its C++ sampler
_CALLABLES = ("stopping_criteria", "logits_processor")

# chat_format names llama-cpp-python does not have, kept as llama.cpp's built-in template of that name
LLAMACPP_TEMPLATES = {"phi-3": "phi3", "deepseek": "deepseek", "command-r": "command-r"}


def chat_format_flags(chat_format: str | None) -> list[str]:
    """llama-server's flags for a llama-cpp-python chat_format (none: the model's own template).
    Each of llama-cpp-python's formats is a Jinja template rendering the prompt its formatter
    renders (chat_formats.py); a final assistant message is a whole turn, followed by the
    generation prompt, as llama-cpp-python renders it (--no-prefill-assistant). phi-3, deepseek and
    command-r, which llama-cpp-python does not name, are llama.cpp's built-in templates."""
    if chat_format is None:
        return []
    if isinstance(chat_format, str) and chat_format in LLAMACPP_TEMPLATES:
        return ["--no-jinja", "--chat-template", LLAMACPP_TEMPLATES[chat_format]]
    fmt = chat_formats.chat_format(chat_format)
    return ["--jinja", "--chat-template", fmt.template, "--no-prefill-assistant"]


def refuse_callables(where: str, instead: dict[str, str] | None = None, **given: Any) -> None:
    """llama_cpp's Python callbacks (`given` by keyword, checked in that order), refused saying what
    to use instead: `instead` by name where a call has better advice than the default."""
    for name, value in given.items():
        if name in _CALLABLES and value is not None:
            advice = (instead or {}).get(name, "use stop=, grammar=, logit_bias= or response_format= instead")
            raise NotImplementedError(f"{where}: {name} cannot run here: llama.cpp's server samples in C++, without "
                                      f"Python callbacks; {advice}")


def _completion_logprobs(lp: Any, text_start: int) -> Any:
    """OpenAI's text-completion logprobs (tokens, text_offset, token_logprobs, top_logprobs), as
    llama_cpp.Llama returns them, from the server's chat-style `{"content": [...]}`."""
    if not isinstance(lp, dict) or "content" not in lp:
        return lp
    tokens, offsets, token_lps, tops = [], [], [], []
    at = text_start
    for p in lp["content"]:
        tokens.append(p.get("token", ""))
        offsets.append(at)
        at += len(p.get("token", ""))
        token_lps.append(p.get("logprob"))
        tops.append({t.get("token", ""): t.get("logprob") for t in p.get("top_logprobs") or []})
    return {"tokens": tokens, "text_offset": offsets, "token_logprobs": token_lps, "top_logprobs": tops}


def _common(rules: RequestRules, where: str, max_tokens: int | None, temperature: float, top_p: float, top_k: int,
            min_p: float, typical_p: float, stop: str | Sequence[str] | None, seed: int | None,
            frequency_penalty: float, presence_penalty: float, repeat_penalty: float, tfs_z: float,
            mirostat_mode: int, mirostat_tau: float, mirostat_eta: float, grammar: Any,
            logit_bias: dict[int, float] | None) -> dict[str, Any]:
    # each by the server's rule, under the name the caller wrote (mirostat_mode is the server's mirostat)
    given = {"max_tokens": max_tokens, "temperature": temperature, "top_p": top_p, "top_k": top_k, "min_p": min_p,
             "typical_p": typical_p, "stop": stop, "seed": seed, "frequency_penalty": frequency_penalty,
             "presence_penalty": presence_penalty, "repeat_penalty": repeat_penalty, "mirostat": mirostat_mode,
             "mirostat_tau": mirostat_tau, "mirostat_eta": mirostat_eta, "logit_bias": logit_bias}
    grammar_given = grammar_fields(where, grammar)  # {"grammar": GBNF} or, for a JSON-schema grammar, {"json_schema": ...}
    given.update(grammar_given)
    if max_tokens is not None and not isinstance(max_tokens, bool) and isinstance(max_tokens, int) and max_tokens <= 0:
        given["max_tokens"] = -1
    rules.check(where, given, shown={"mirostat": "mirostat_mode"})
    if not isinstance(tfs_z, (int, float)) or isinstance(tfs_z, bool):
        raise TypeError(f"{where}: tfs_z must be a number, got {tfs_z!r}")
    if tfs_z != 1.0:
        raise ValueError(f"tfs_z={tfs_z}: tail-free sampling was removed from llama.cpp; leave it at 1.0")
    body: dict[str, Any] = {
        # llama-cpp-python: None or <= 0 generates until the context ends
        "max_tokens": -1 if max_tokens is None or max_tokens <= 0 else max_tokens,
        "temperature": temperature, "top_p": top_p, "top_k": top_k, "min_p": min_p, "typical_p": typical_p,
        "frequency_penalty": frequency_penalty, "presence_penalty": presence_penalty,
        "repeat_penalty": repeat_penalty, "mirostat": mirostat_mode, "mirostat_tau": mirostat_tau,
        "mirostat_eta": mirostat_eta,
    }
    if stop:
        body["stop"] = [stop] if isinstance(stop, str) else list(stop)
    if seed is not None:
        body["seed"] = seed
    body.update(grammar_given)
    if logit_bias:  # {token id: bias} as llama-cpp-python takes it; the server also takes text for a key
        body["logit_bias"] = [[int(k) if isinstance(k, str) and k.lstrip("-").isdigit() else k, v]
                              for k, v in logit_bias.items()]
    return body


def _without_null_deltas(chunk: dict[str, Any]) -> dict[str, Any]:
    """A chat chunk as llama-cpp-python streams it: a delta holds only what it carries (llama-server
    sends "content": null beside the role), so `delta.get("content", "")` is always a string."""
    for choice in chunk.get("choices") or []:
        delta = choice.get("delta")
        if isinstance(delta, dict):
            choice["delta"] = {k: v for k, v in delta.items() if v is not None}
    return chunk


@dataclass
class SeedChain:
    """llama_cpp.Llama's seed as its calls use it: `set_seed(s)`, or a call's own `seed=`, sets it; a
    call without a seed of its own samples with the next seed drawn from it
    (`random.Random(seed)`), which becomes the seed, so the calls after `set_seed(s)` sample the
    same way each time the program runs them. Before either, a call without a seed takes the
    server's (`Llama(seed=)`, `--seed`; random by default)."""

    seed: int | None = None

    def take(self, given: int | None) -> int | None:
        """The seed a call samples with (None: the server's), as llama_cpp chooses it."""
        if given is not None:
            self.seed = given
        elif self.seed is not None:
            self.seed = random.Random(self.seed).randint(0, _MAX_SEED)
        return self.seed


class LlamaCalls(EngineFacade):
    """llama_cpp.Llama's calls over the Engine it holds (`.engine`); see the module's docstring.
    The Engine's own calls (`submit`, `generate`, `tokenize`, `stats`, ...) answer on it too."""

    def __init__(self, engine: Engine) -> None:
        super().__init__(engine)
        self._seeds = SeedChain()

    # --- the model (llama_cpp.Llama's accessors) ---

    def token_bos(self) -> int:
        return int(self.engine.model_info()["token_bos"])

    def token_eos(self) -> int:
        return int(self.engine.model_info()["token_eos"])

    def token_nl(self) -> int:
        return int(self.engine.model_info()["token_nl"])

    def n_ctx(self) -> int:
        """The context: here the KV pool every slot shares (each request may grow to all of it)."""
        return int(self.engine.model_info()["n_ctx"])

    def n_vocab(self) -> int:
        return int(self.engine.model_info()["n_vocab"])

    def n_embd(self) -> int:
        return int(self.engine.model_info()["n_embd"])

    @property
    def metadata(self) -> dict[str, str]:
        """The GGUF metadata, as llama_cpp.Llama.metadata (every value a string)."""
        return dict(self.engine.model_info()["metadata"])

    # --- what this design cannot do, said where it is asked for ---

    def save_state(self) -> LlamaState:
        """llama_cpp.Llama.save_state: the state of the slot this program's last call used (its
        tokens and their cells, byte for byte) and the seed its next call draws from, as a
        picklable LlamaState (llama_state.py)."""
        return llama_state.save_state(self.engine, self._seeds.seed)

    def load_state(self, state: LlamaState) -> None:
        """llama_cpp.Llama.load_state: `state`'s cells go back into an idle slot and its seed
        becomes this program's, so the next call that starts with its tokens continues as if
        nothing had been saved (the prompt's shared start is not computed again)."""
        llama_state.load_state(self.engine, state)
        self._seeds.seed = state.seed

    def set_cache(self, cache: Any) -> None:
        raise NotImplementedError("set_cache(): the server keeps its own prompt cache (--cache-ram MiB, and on disk "
                                  "with --preempt-disk DIR); pass those as args")

    def eval(self, tokens: Sequence[int]) -> None:
        raise NotImplementedError(_ONE_CONTEXT.format(call="eval()"))

    def sample(self, *args: Any, **kwargs: Any) -> int:
        raise NotImplementedError(_ONE_CONTEXT.format(call="sample()"))

    def reset(self) -> None:
        raise NotImplementedError(_ONE_CONTEXT.format(call="reset()"))

    # --- completions ---

    def set_seed(self, seed: int) -> None:
        """llama_cpp.Llama.set_seed: the calls after it that give no seed of their own sample with
        seeds drawn from this one, as llama_cpp draws them (see SeedChain), so a program that sets
        it gets the same answers each time it runs."""
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise TypeError(f"set_seed(): seed must be an int, got {seed!r}")
        self.engine.request_rules().check("set_seed()", {"seed": seed})
        self._seeds.seed = seed

    def _answer(self, where: str, path: str, body: dict[str, Any],
                stream: bool) -> dict[str, Any] | Iterator[dict[str, Any]]:
        req = self.engine.submit(path=path, body=body, stream=stream)
        ends, stops, one = EndTokens(self.engine), bool(body.get("stop")), body.get("n", 1) == 1
        if stream:
            return without_end_token(_streamed(where, req.stream(), body), ends, stops, one)
        with _grammar_errors(where, body), context_errors():
            answer = dict(req.result())
        return next(without_end_token(iter([answer]), ends, stops, one))

    def create_completion(self, prompt: str | list[int], suffix: str | None = None, max_tokens: int | None = 16,
                          temperature: float = 0.8, top_p: float = 0.95, min_p: float = 0.05, typical_p: float = 1.0,
                          logprobs: int | None = None, echo: bool = False, stop: str | Sequence[str] | None = None,
                          frequency_penalty: float = 0.0, presence_penalty: float = 0.0, repeat_penalty: float = 1.0,
                          top_k: int = 40, stream: bool = False, seed: int | None = None, tfs_z: float = 1.0,
                          mirostat_mode: int = 0, mirostat_tau: float = 5.0, mirostat_eta: float = 0.1,
                          model: str | None = None, stopping_criteria: Any = None, logits_processor: Any = None,
                          grammar: Any = None, logit_bias: dict[int, float] | None = None,
                          **extra: Any) -> dict[str, Any] | Iterator[dict[str, Any]]:
        """A text completion as llama_cpp.Llama.create_completion answers it: a dict shaped like
        OpenAI's text_completion, or with stream=True an iterator of its chunks. `echo` puts the
        prompt before the text; `logprobs` (an int) gives OpenAI's completion logprobs. Extra
        keywords are request fields of llama-server (`priority`, `n_keep`, `response_format`, ...)."""
        where = "create_completion()"
        rules = self.engine.request_rules()
        rules.check_keywords(where, extra, own=_CREATE_COMPLETION_ARGS)
        refuse_callables(where, stopping_criteria=stopping_criteria, logits_processor=logits_processor)
        if suffix is not None:
            raise ValueError(f"{where}: suffix= (fill-in-the-middle) goes through the server's /infill route: "
                             "submit(path='/infill', body={'input_prefix': ..., 'input_suffix': ...})")
        rules.check(where, {"prompt": prompt, "echo": echo, "stream": stream, "logprobs": logprobs, "model": model,
                            **extra})
        if echo and logprobs is not None:
            raise ValueError(f"{where}: echo with logprobs would need the prompt tokens' logprobs, which the server "
                             "does not compute; ask for one or the other")
        body = {"prompt": prompt, **_common(rules, where, max_tokens, temperature, top_p, top_k, min_p, typical_p,
                                            stop, seed, frequency_penalty, presence_penalty, repeat_penalty, tfs_z,
                                            mirostat_mode, mirostat_tau, mirostat_eta, grammar, logit_bias), **extra}
        if logprobs is not None:
            body["logprobs"] = logprobs
        if model is not None:
            body["model"] = model
        head = ""
        if echo:  # the server's /v1/completions refuses echo: the prompt's text is put before the answer here
            head = prompt if isinstance(prompt, str) else self.engine.detokenize(prompt).decode("utf-8", errors="ignore")
        if "response_format" in body:  # the chat route reads it; /v1/completions takes the schema itself
            schema = _json_schema_of(where, body.pop("response_format"))
            if schema is not None:
                body["json_schema"] = schema
        self._seed_of(body, seed)
        answer = self._answer(where, "/v1/completions", body, stream)
        chunks = _completion_chunks(answer if isinstance(answer, Iterator) else iter([answer]), head,
                                    logprobs is not None)
        return chunks if stream else next(chunks)

    def __call__(self, prompt: str | list[int], **kwargs: Any) -> dict[str, Any] | Iterator[dict[str, Any]]:
        """`engine(prompt, ...)` is create_completion(prompt, ...), as with llama_cpp.Llama."""
        return self.create_completion(prompt, **kwargs)

    def create_chat_completion(self, messages: Sequence[dict[str, Any]], functions: Any = None,
                               function_call: Any = None, tools: Sequence[dict[str, Any]] | None = None,
                               tool_choice: Any = None, temperature: float = 0.2, top_p: float = 0.95, top_k: int = 40,
                               min_p: float = 0.05, typical_p: float = 1.0, stream: bool = False,
                               stop: str | Sequence[str] | None = None, seed: int | None = None,
                               response_format: dict[str, Any] | None = None, max_tokens: int | None = None,
                               presence_penalty: float = 0.0, frequency_penalty: float = 0.0,
                               repeat_penalty: float = 1.0, tfs_z: float = 1.0, mirostat_mode: int = 0,
                               mirostat_tau: float = 5.0, mirostat_eta: float = 0.1, model: str | None = None,
                               logits_processor: Any = None, grammar: Any = None,
                               logit_bias: dict[int, float] | None = None, logprobs: bool | None = None,
                               top_logprobs: int | None = None,
                               **extra: Any) -> dict[str, Any] | Iterator[dict[str, Any]]:
        """A chat completion as llama_cpp.Llama.create_chat_completion answers it (the model's own
        chat template, or the Engine's chat_format): a chat.completion dict, or with stream=True an
        iterator of its chunks. `response_format={"type": "json_object"}` (with a "schema", or
        {"type": "json_schema", ...}) constrains the answer to JSON; `tools` as the server takes them."""
        where = "create_chat_completion()"
        rules = self.engine.request_rules()
        rules.check_keywords(where, extra, own=_CREATE_CHAT_ARGS)
        refuse_callables(where, logits_processor=logits_processor)
        if functions is not None or function_call is not None:
            raise ValueError(f"{where}: functions/function_call are OpenAI's deprecated form; pass tools= and tool_choice=")
        if logprobs is not None and not isinstance(logprobs, bool):
            raise TypeError(f"{where}: logprobs must be True or False (top_logprobs= says how many), got {logprobs!r}")
        rules.check(where, {"messages": messages, "tools": tools, "tool_choice": tool_choice, "stream": stream,
                            "response_format": response_format, "model": model, "top_logprobs": top_logprobs, **extra})
        body = {"messages": list(messages), **_common(rules, where, max_tokens, temperature, top_p, top_k, min_p,
                                                      typical_p, stop, seed, frequency_penalty, presence_penalty,
                                                      repeat_penalty, tfs_z, mirostat_mode, mirostat_tau,
                                                      mirostat_eta, grammar, logit_bias), **extra}
        for key, value in (("tools", tools), ("tool_choice", tool_choice), ("response_format", response_format),
                           ("model", model), ("logprobs", logprobs), ("top_logprobs", top_logprobs)):
            if value is not None:
                body[key] = value
        if not logprobs:  # llama_cpp asks for logprobs only with logprobs=True: top_logprobs alone is taken, unused
            body.pop("top_logprobs", None)
        fmt = chat_formats.CHAT_FORMATS.get(self.engine.chat_format or "")
        if fmt is not None and fmt.stop:  # the format's stop strings after the call's own, as llama_cpp adds them
            body["stop"] = [*body.get("stop", []), *fmt.stop]
        self._seed_of(body, seed)
        return self._answer(where, "/v1/chat/completions", body, stream)

    def _seed_of(self, body: dict[str, Any], seed: int | None) -> None:
        """The seed the request samples with, as llama_cpp chooses it (SeedChain): set in `body`."""
        chosen = self._seeds.take(seed)
        if chosen is not None:
            body["seed"] = chosen

    # --- embeddings (an Engine started with embedding=True) ---

    def embed(self, input: str | Sequence[str], normalize: bool = False, truncate: bool = True,
              return_count: bool = False) -> Any:
        """llama_cpp.Llama.embed: one embedding per input (a list of floats), or for a model
        without pooling (a text-generation model) one per token (a list of lists), as llama_cpp
        returns them; `normalize` scales each to length 1. With return_count, (embeddings, n_tokens)."""
        where = "embed()"
        inputs = [input] if isinstance(input, str) else input
        if isinstance(inputs, bytes) or not isinstance(inputs, Sequence) or not all(isinstance(x, str) for x in inputs):
            raise TypeError(f"{where}: input must be a string or a list of strings")
        for name, v in (("normalize", normalize), ("truncate", truncate), ("return_count", return_count)):
            if not isinstance(v, bool):
                raise TypeError(f"{where}: {name} must be True or False, got {v!r}")
        body = {"content": list(inputs), "embd_normalize": 2 if normalize else -1}
        try:
            answer = self.engine.request("POST", "/embeddings", body)
        except Exception as e:
            if getattr(e, "status", None) == 501 or "embedding" in str(e).lower():
                raise ValueError(f"{where}: this Engine does not compute embeddings: start it with embedding=True "
                                 f"({e})") from None
            raise
        out: list[Any] = []
        n_tokens = 0
        pooled = int(self.engine.model_info()["pooling"]) != 0  # else: one vector per token
        for item in sorted(answer, key=lambda x: x.get("index", 0)):
            emb = item["embedding"]
            n_tokens += len(self.engine.tokenize(inputs[item.get("index", 0)])) if pooled else len(emb)
            out.append(emb[0] if pooled else emb)
        result = out[0] if isinstance(input, str) else out
        return (result, n_tokens) if return_count else result

    def create_embedding(self, input: str | Sequence[str], model: str | None = None) -> dict[str, Any]:
        """llama_cpp.Llama.create_embedding: OpenAI's embedding list ({"object": "list", "data":
        [{"embedding": ..., "index": i}], "usage"}), embeddings not normalized as llama_cpp's."""
        if model is not None and not isinstance(model, str):
            raise TypeError(f"create_embedding(): model must be a string, got {type(model).__name__}")
        inputs = [input] if isinstance(input, str) else input
        embeddings, n_tokens = self.embed(inputs, return_count=True)
        return {"object": "list", "model": model or self.engine.model_info()["metadata"].get("general.name", ""),
                "data": [{"object": "embedding", "embedding": e, "index": i} for i, e in enumerate(embeddings)],
                "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens}}


def _json_schema_of(where: str, response_format: dict[str, Any]) -> dict[str, Any] | None:
    """The JSON schema an OpenAI response_format asks for (None: plain text), read as llama-server's
    chat route reads it (server-common.cpp, oaicompat_chat_params_parse)."""
    kind = response_format.get("type")
    if kind == "json_object":
        return response_format.get("schema") or {"type": "object"}
    if kind == "json_schema":
        return (response_format.get("json_schema") or {}).get("schema") or {"type": "object"}
    if kind in (None, "text"):
        return None
    raise ValueError(f"{where}: response_format type must be 'text', 'json_object' or 'json_schema', got {kind!r}")


def _completion_chunks(chunks: Iterator[dict[str, Any]], head: str, logprobs: bool) -> Iterator[dict[str, Any]]:
    """A completion answer, or its stream's chunks, as llama_cpp gives them: the echoed prompt
    before each choice's first text, and OpenAI's completion logprobs (text_offset counted over the
    whole text)."""
    length: dict[int, int] = {}  # choice index -> the length of its text so far, the echoed prompt included
    for chunk in chunks:
        for choice in chunk.get("choices") or []:
            i = int(choice.get("index", 0))
            text = choice.get("text", "")
            if i not in length:
                length[i] = len(head)
                choice["text"] = head + text
            if logprobs:
                choice["logprobs"] = _completion_logprobs(choice.get("logprobs"), length[i])
            length[i] += len(text)
        yield chunk


_CREATE_COMPLETION_ARGS = frozenset(inspect.signature(LlamaCalls.create_completion).parameters) - {"self", "extra"}
_CREATE_CHAT_ARGS = frozenset(inspect.signature(LlamaCalls.create_chat_completion).parameters) - {"self", "extra"}


@contextlib.contextmanager
def _grammar_errors(where: str, body: dict[str, Any]) -> Iterator[None]:
    """The server's refusal of a call's grammar as a ValueError naming `grammar` (still the
    RequestError, status 400, it was)."""
    try:
        yield
    except RequestError as e:
        if e.status != 400 or not ({"grammar", "json_schema"} & set(body)):
            raise
        if "failed to parse grammar" in e.message:
            raise FieldValueError(f"{where}: grammar= is not a grammar llama.cpp can parse ({e.message}; its parser "
                                  "printed the rule it stopped at on stderr): every rule it uses must be defined, "
                                  "starting with 'root ::= ...' (llama.cpp's grammars/README.md)") from None
        if "json_schema" in body and "json schema" in e.message.lower():
            raise FieldValueError(f"{where}: grammar= (a JSON-schema grammar) could not be converted: {e.message}") \
                from None
        raise


def _streamed(where: str, chunks: Iterator[dict[str, Any]], body: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """A streamed answer's chunks as llama-cpp-python gives them, a refused grammar named."""
    with _grammar_errors(where, body), context_errors():
        for c in chunks:
            yield _without_null_deltas(c)
