"""llama-cpp-python's calls on the Engine: `create_completion` (also `engine(prompt)`) and
`create_chat_completion`, with `llama_cpp.Llama`'s parameter names and defaults and OpenAI-shaped
results (a dict, or an iterator of chunk dicts with `stream=True`), so code written for
`llama_cpp.Llama` runs against the Engine by changing the constructor:

    llm = Engine("model.gguf", n_ctx=2048)     # was: Llama(model_path="model.gguf", n_ctx=2048)
    out = llm.create_chat_completion(messages=[{"role": "user", "content": "Hi"}], max_tokens=32)
    print(out["choices"][0]["message"]["content"])

They go through the server's own OpenAI routes (/v1/completions, /v1/chat/completions)."""
from __future__ import annotations

from typing import Any, Iterator, Sequence

# Python callables llama.cpp's server cannot run in its C++ sampler
_CALLABLES = ("stopping_criteria", "logits_processor")


def _refuse_callables(where: str, **given: Any) -> None:
    for name in _CALLABLES:
        if given.get(name) is not None:
            raise TypeError(f"{where}: {name} is not supported by the Engine (llama.cpp's server samples in C++, "
                            f"without Python callbacks); use stop=, grammar= or logit_bias= instead")


def _common(max_tokens: int | None, temperature: float, top_p: float, top_k: int, min_p: float, typical_p: float,
            stop: str | Sequence[str] | None, seed: int | None, frequency_penalty: float, presence_penalty: float,
            repeat_penalty: float, tfs_z: float, mirostat_mode: int, mirostat_tau: float, mirostat_eta: float,
            grammar: Any, logit_bias: dict[int, float] | None) -> dict[str, Any]:
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
    if grammar is not None:  # a GBNF string, or llama_cpp.LlamaGrammar (its _grammar text)
        body["grammar"] = grammar if isinstance(grammar, str) else str(getattr(grammar, "_grammar", grammar))
    if logit_bias:
        body["logit_bias"] = [[int(k), float(v)] for k, v in logit_bias.items()]
    return body


def _without_null_deltas(chunk: dict[str, Any]) -> dict[str, Any]:
    """A chat chunk as llama-cpp-python streams it: a delta holds only what it carries (llama-server
    sends "content": null beside the role), so `delta.get("content", "")` is always a string."""
    for choice in chunk.get("choices") or []:
        delta = choice.get("delta")
        if isinstance(delta, dict):
            choice["delta"] = {k: v for k, v in delta.items() if v is not None}
    return chunk


class LlamaCppCalls:
    """The mixin that gives the Engine llama-cpp-python's calls; see the module's docstring."""

    def _answer(self, path: str, body: dict[str, Any], stream: bool) -> dict[str, Any] | Iterator[dict[str, Any]]:
        req = self.submit(path=path, body=body, stream=stream)  # type: ignore[attr-defined]
        if stream:
            return (_without_null_deltas(c) for c in req.stream())
        return dict(req.result())

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
        OpenAI's text_completion, or with stream=True an iterator of its chunks. Extra keywords are
        request fields of llama-server (`priority`, `n_keep`, ...)."""
        _refuse_callables("create_completion()", stopping_criteria=stopping_criteria, logits_processor=logits_processor)
        if suffix is not None:
            raise ValueError("create_completion(suffix=...): fill-in-the-middle goes through the server's /infill "
                             "route: submit(path='/infill', body={'input_prefix': ..., 'input_suffix': ...})")
        if not isinstance(prompt, (str, list)):
            raise TypeError(f"create_completion(): prompt must be a string or a list of token ids, got "
                            f"{type(prompt).__name__}")
        body = {"prompt": prompt, **_common(max_tokens, temperature, top_p, top_k, min_p, typical_p, stop, seed,
                                            frequency_penalty, presence_penalty, repeat_penalty, tfs_z, mirostat_mode,
                                            mirostat_tau, mirostat_eta, grammar, logit_bias), **extra}
        if logprobs is not None:
            body["logprobs"] = logprobs
        if echo:
            body["echo"] = True
        if model is not None:
            body["model"] = model
        return self._answer("/v1/completions", body, stream)

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
        chat template): a chat.completion dict, or with stream=True an iterator of its chunks."""
        _refuse_callables("create_chat_completion()", logits_processor=logits_processor)
        if isinstance(messages, (str, bytes)) or not all(isinstance(m, dict) for m in messages):
            raise TypeError("create_chat_completion(): messages must be a list of {'role': ..., 'content': ...} dicts")
        if functions is not None or function_call is not None:
            raise ValueError("create_chat_completion(): functions/function_call are OpenAI's deprecated form; "
                             "pass tools= and tool_choice=")
        body = {"messages": list(messages), **_common(max_tokens, temperature, top_p, top_k, min_p, typical_p, stop,
                                                      seed, frequency_penalty, presence_penalty, repeat_penalty, tfs_z,
                                                      mirostat_mode, mirostat_tau, mirostat_eta, grammar, logit_bias),
                **extra}
        for key, value in (("tools", tools), ("tool_choice", tool_choice), ("response_format", response_format),
                           ("model", model), ("logprobs", logprobs), ("top_logprobs", top_logprobs)):
            if value is not None:
                body[key] = value
        return self._answer("/v1/chat/completions", body, stream)
