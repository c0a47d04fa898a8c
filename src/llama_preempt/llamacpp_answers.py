"""The server's answers as llama_cpp.Llama gives them, for llama-cpp-python's calls (llamacpp_api.py):

- the end-of-generation token that stopped an answer is not one of its tokens. llama_cpp stops
  before it (`llama_vocab_is_eog` ends its loop before the token joins the completion), so its
  logprobs have no entry for it and `completion_tokens` does not count it; llama-server keeps it as
  a last entry with empty text and counts it. Here the entry goes, and the count with it;
- a prompt as long as the context or longer is llama_cpp's ValueError ("Requested tokens (401)
  exceed context window of 256"): a ContextSizeError, which is also the server's RequestError.

Where an answer has no logprobs, the server's OpenAI routes do not say whether a "stop" was the
end-of-generation token or one of the request's stop strings (its `stop_type` is only on
/completion): with no stop strings in the request it can only be the token, and the count is
corrected; with stop strings it is left as the server counts it (one more than llama_cpp's where
the model ended the answer itself).
"""
from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any, Iterator

from .errors import ContextSizeError, RequestError

if TYPE_CHECKING:
    from .engine import Engine

_STOPPED = ("stop", "tool_calls")  # the finish reasons of an answer that ended at a stop string or the model's end


@contextlib.contextmanager
def context_errors() -> Iterator[None]:
    """The server's exceed_context_size_error as llama_cpp's ValueError (a ContextSizeError)."""
    try:
        yield
    except ContextSizeError:
        raise
    except RequestError as e:
        if e.type != "exceed_context_size_error":
            raise
        raise ContextSizeError(e) from None


class EndTokens:
    """Which tokens end generation, as the server's logprobs show them: the model's EOS, or another
    control token (an end of turn such as <|im_end|> or <|eot_id|>) that renders as no text."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._known: dict[int, bool] = {}

    def __contains__(self, token: object) -> bool:
        if isinstance(token, bool) or not isinstance(token, int):
            return False
        if token not in self._known:
            eng = self._engine
            self._known[token] = (token == int(eng.model_info()["token_eos"])
                                  or (eng.detokenize([token]) == b"" and eng.detokenize([token], special=True) != b""))
        return self._known[token]


def _entries(choice: dict[str, Any]) -> list[dict[str, Any]] | None:
    lp = choice.get("logprobs")
    content = lp.get("content") if isinstance(lp, dict) else None
    return content if isinstance(content, list) else None


def _ends_with_end_token(entries: list[dict[str, Any]] | None, ends: EndTokens) -> bool:
    if not entries:
        return False
    last = entries[-1]
    return isinstance(last, dict) and last.get("token") == "" and last.get("id") in ends


def _finished(chunk: dict[str, Any], index: int | None = None) -> bool:
    return any(c.get("finish_reason") in _STOPPED and (index is None or c.get("index", 0) == index)
               for c in chunk.get("choices") or [])


def _uncount(usage: dict[str, Any]) -> None:
    for key in ("completion_tokens", "total_tokens"):
        if isinstance(usage.get(key), int) and usage[key] > 0:
            usage[key] -= 1


def without_end_token(chunks: Iterator[dict[str, Any]], ends: EndTokens, stops: bool,
                      one_choice: bool) -> Iterator[dict[str, Any]]:
    """An answer (one chunk) or a stream's chunks without the end-of-generation token that stopped
    them: its logprobs entry dropped (a streamed chunk that carried only it is not sent), and, for a
    request of one choice (`one_choice`), the usage counting one token fewer. `stops`: whether the
    request had stop strings. The usage of several choices (n > 1) is left as the server gives it."""
    held: dict[str, Any] | None = None  # a streamed chunk with only an end token's entry, until the next says it ended
    held_index = 0
    dropped = False  # the end token's entry has gone
    uncount = False  # the usage still to correct, in the chunk that carries it
    for chunk in chunks:
        choices = chunk.get("choices") or []
        if held is not None:
            if _finished(chunk, held_index):
                dropped = True
            else:  # a control token inside the answer: it stays
                yield held
            held = None
        for choice in choices:
            entries = _entries(choice)
            if not _ends_with_end_token(entries, ends):
                continue
            assert entries is not None
            if choice.get("finish_reason") in _STOPPED:
                del entries[-1]
                dropped = True
            elif len(choices) == 1 and len(entries) == 1 and not choice.get("text") and not choice.get("delta"):
                held, held_index = chunk, int(choice.get("index", 0))
        if held is chunk:
            continue
        if one_choice and _finished(chunk) and (dropped or not stops):
            uncount = True  # without stop strings, only the model's end token stops an answer
        usage = chunk.get("usage")
        if uncount and isinstance(usage, dict):
            _uncount(usage)
            uncount = False
        yield chunk
    if held is not None:
        yield held
