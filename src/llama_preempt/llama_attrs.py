"""The rest of llama_cpp.Llama's public attributes on `Llama`: each works, or raises an error that
says what to use instead (docs/python.md's compatibility table lists them all).

Working: `tokenizer()` and `tokenizer_` (a LlamaTokenizer: tokenize, detokenize, encode, decode),
`pooling_type()`, `create_chat_completion_openai_v1()` (with the `openai` package),
`logits_to_logprobs()`, `longest_token_prefix()`, `cache` (None: the server keeps its own prompt
cache) and `set_cache(None)`, pickling (a new Llama of the same keywords, as llama_cpp's
`__getstate__`), and the constructor's keywords as attributes (set by llama.py). Refused: `ctx`,
`model`, `context_params`, `model_params` (llama.cpp's C pointers and structs: the model runs
inside the server here), `set_cache(cache)` with a cache object.
"""
from __future__ import annotations

from typing import Any, Iterator, Sequence

import numpy as np

from .llama_context import ContextCalls, longest_token_prefix

_NO_POINTER = "{name}: llama.cpp's C {what} is inside the server here, shared by every slot, and not handed out; {instead}"


class LlamaTokenizer:
    """llama_cpp.LlamaTokenizer over a Llama: tokenize/detokenize in bytes, encode/decode in str."""

    def __init__(self, llama: Any) -> None:
        self._llama = llama

    def tokenize(self, text: bytes, add_bos: bool = True, special: bool = True) -> list[int]:
        return list(self._llama.tokenize(text, add_bos=add_bos, special=special))

    def detokenize(self, tokens: Sequence[int], prev_tokens: Sequence[int] | None = None,
                   special: bool = False) -> bytes:
        return bytes(self._llama.detokenize(tokens, special=special))

    def encode(self, text: str, add_bos: bool = True, special: bool = True) -> list[int]:
        return self.tokenize(text.encode("utf-8", errors="ignore"), add_bos=add_bos, special=special)

    def decode(self, tokens: Sequence[int]) -> str:
        return self.detokenize(tokens).decode("utf-8", errors="ignore")

    @classmethod
    def from_ggml_file(cls, path: str) -> "LlamaTokenizer":
        raise NotImplementedError("LlamaTokenizer.from_ggml_file(): the tokenizer is the model's, inside the server; "
                                  "load the model (llm = Llama(model_path=path)) and use llm.tokenizer()")


class LlamaAttributes(ContextCalls):
    """llama_cpp.Llama's remaining public attributes; see the module's docstring."""

    cache: Any = None  # llama_cpp's Python prompt cache: none here (the server keeps its own)

    def tokenizer(self) -> LlamaTokenizer:
        """llama_cpp.Llama.tokenizer(): the model's tokenizer (a LlamaTokenizer)."""
        return LlamaTokenizer(self)

    @property
    def tokenizer_(self) -> LlamaTokenizer:
        return LlamaTokenizer(self)

    def pooling_type(self) -> int:
        """llama_cpp.Llama.pooling_type(): llama.cpp's pooling type of the context (0: none, 1:
        mean, 2: cls, 3: last, 4: rank)."""
        return int(self.engine.model_info()["pooling"])

    def set_cache(self, cache: Any) -> None:
        """llama_cpp.Llama.set_cache: None is taken (no Python cache, as before); a cache object is
        refused: the server keeps its own prompt cache."""
        if cache is not None:
            super().set_cache(cache)

    def create_chat_completion_openai_v1(self, *args: Any, **kwargs: Any) -> Any:
        """llama_cpp.Llama.create_chat_completion_openai_v1: create_chat_completion's answer as the
        openai package's ChatCompletion (or a stream of ChatCompletionChunk)."""
        try:
            from openai.types.chat import ChatCompletion, ChatCompletionChunk
        except ImportError:
            raise ImportError("To use create_chat_completion_openai_v1, you must install the openai package: "
                              "pip install openai") from None
        stream = kwargs.get("stream", False)
        if not isinstance(stream, bool):
            raise TypeError(f"create_chat_completion_openai_v1(): stream must be True or False, got {stream!r}")
        answer = self.create_chat_completion(*args, **kwargs)
        if stream:
            return _chunks(ChatCompletionChunk, answer)
        return ChatCompletion(**answer)

    @staticmethod
    def logits_to_logprobs(logits: Any, axis: int = -1) -> np.ndarray:
        """llama_cpp.Llama.logits_to_logprobs: log-softmax of `logits` along `axis`."""
        maxs: np.ndarray = np.amax(logits, axis=axis, keepdims=True)
        if maxs.ndim > 0:
            maxs[~np.isfinite(maxs)] = 0
        elif not np.isfinite(maxs):
            maxs = np.zeros_like(maxs)
        shifted = np.subtract(logits, maxs, dtype=np.single)
        with np.errstate(divide="ignore"):
            total = np.log(np.sum(np.exp(shifted), axis=axis, keepdims=True))
        return np.asarray(shifted - total)

    @staticmethod
    def longest_token_prefix(a: Sequence[int], b: Sequence[int]) -> int:
        """llama_cpp.Llama.longest_token_prefix: how many tokens a and b share from the start."""
        return longest_token_prefix(a, b)

    # --- llama.cpp's pointers and structs: not handed out ---

    @property
    def ctx(self) -> Any:
        raise NotImplementedError(_NO_POINTER.format(name="ctx", what="llama_context", instead=(
            "use the context's calls (eval, sample, generate, save_state) or the Engine's (llm.engine)")))

    @property
    def model(self) -> Any:
        raise NotImplementedError(_NO_POINTER.format(name="model", what="llama_model", instead=(
            "use llm.metadata, n_vocab(), n_ctx(), n_embd() and llm.engine.model_info() for its facts")))

    @property
    def context_params(self) -> Any:
        raise NotImplementedError(_NO_POINTER.format(name="context_params", what="llama_context_params", instead=(
            "use llm.args (the server's flags, which Llama's keywords become) and n_ctx() (the pool's size)")))

    @property
    def model_params(self) -> Any:
        raise NotImplementedError(_NO_POINTER.format(name="model_params", what="llama_model_params", instead=(
            "use llm.args (the server's flags, which n_gpu_layers=, use_mmap=, ... become)")))


def _chunks(kind: Any, answer: Iterator[dict[str, Any]]) -> Iterator[Any]:
    for chunk in answer:
        yield kind(**chunk)
