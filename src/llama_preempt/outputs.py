"""vLLM's output shapes, read from the server's answers: a Completion is also a `RequestOutput`
(`prompt`, `prompt_token_ids`, `outputs`, `finished`, `request_id`), each of its `outputs` a
`CompletionOutput` (`index`, `text`, `token_ids`, `cumulative_logprob`, `logprobs`,
`finish_reason`, `stop_reason`), so `o.outputs[0].text` works as in vLLM's quickstart; a
RequestOutput's `metrics` is a `RequestStateStats`. `from llama_preempt.outputs import
RequestOutput, CompletionOutput` works as vLLM's `vllm.outputs` does."""
from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from typing import Any


class RequestOutputKind(enum.IntEnum):
    """What each output of a stream carries, as vLLM's: CUMULATIVE (the text so far, the default),
    DELTA (only what is new), FINAL_ONLY (one output, at the end)."""

    CUMULATIVE = 0
    DELTA = 1
    FINAL_ONLY = 2


@dataclass(frozen=True)
class Logprob:
    """One token's log-probability, as vLLM's: `rank` 1 is the most likely token."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclass
class RequestStateStats:
    """vLLM's per-request stats (`RequestOutput.metrics`), measured as the request's stream arrives:
    `arrival_time` is the wall clock (time.time()) when it was submitted, the `*_ts` are
    time.monotonic() seconds: `queued_ts` at the submit, `scheduled_ts` when the server began its
    prompt (the first token's arrival less the server's own prompt time, `timings.prompt_ms`),
    `first_token_ts` and `last_token_ts` when the first and the latest token arrived;
    `first_token_latency` is first_token_ts - queued_ts."""

    num_generation_tokens: int = 0
    arrival_time: float = 0.0
    queued_ts: float = 0.0
    scheduled_ts: float = 0.0
    first_token_ts: float = 0.0
    last_token_ts: float = 0.0
    first_token_latency: float = 0.0
    is_corrupted: bool = False


@dataclass
class CompletionOutput:
    """One generated sequence of a request (vLLM's CompletionOutput)."""

    index: int
    text: str
    token_ids: list[int] = field(default_factory=list)
    cumulative_logprob: float | None = None
    logprobs: list[dict[int, Logprob]] | None = None
    finish_reason: str | None = None   # "stop" (an end token or a stop string), "length", "tool_calls"; None: running
    stop_reason: str | int | None = None  # the stop string or stop_token_id that ended it (None: the end token, the length)

    def finished(self) -> bool:
        return self.finish_reason is not None


def logprobs_of(probs: list[dict[str, Any]] | None) -> tuple[list[dict[int, Logprob]] | None, float | None]:
    """vLLM's per-token logprob dicts (the sampled token and the top ones) and their sum, from the
    server's `completion_probabilities` or an OpenAI `logprobs.content` list."""
    if not probs:
        return None, None
    out: list[dict[int, Logprob]] = []
    total = 0.0
    for p in probs:
        tops = p.get("top_logprobs") or p.get("top_probs") or []  # top_probs: post_sampling_probs
        entry: dict[int, Logprob] = {}
        for rank, top in enumerate(tops, start=1):
            if "id" in top:
                entry[int(top["id"])] = Logprob(_log_of(top), rank, top.get("token"))
        if "id" in p:
            tid = int(p["id"])
            sampled_rank = next((r for r, t in enumerate(tops, start=1) if t.get("id") == tid), None)
            entry[tid] = Logprob(_log_of(p), sampled_rank, p.get("token"))
        total += _log_of(p)
        out.append(entry)
    return out, total


def _log_of(p: dict[str, Any]) -> float:
    """A token's log-probability: `logprob`, or the log of `prob` (post_sampling_probs)."""
    if "logprob" in p:
        return float(p["logprob"])
    prob = float(p.get("prob", 0.0))
    return math.log(prob) if prob > 0 else -math.inf


def finish_of(body: dict[str, Any]) -> tuple[str | None, str | None]:
    """vLLM's finish_reason and stop_reason from /completion's stop_type (and stopping_word)."""
    stop_type, stopping_word = body.get("stop_type"), body.get("stopping_word")
    if stop_type == "eos":
        return "stop", None
    if stop_type == "word":
        return "stop", stopping_word or None
    if stop_type == "limit":
        return "length", None
    return None, None


def sequence_output(index: int, text: str, token_ids: list[int], probs: list[dict[str, Any]] | None,
                    finish_reason: str | None, stop_reason: str | None) -> CompletionOutput:
    """One sequence's CompletionOutput, its logprobs (and their sum) read from the server's
    per-token probabilities."""
    logprobs, cum = logprobs_of(probs)
    return CompletionOutput(index, text, token_ids, cum, logprobs, finish_reason, stop_reason)


def output_of(body: dict[str, Any], index: int = 0, text: str | None = None) -> CompletionOutput:
    """The CompletionOutput of one /completion answer (or a streamed answer's last chunk, with the
    joined `text`)."""
    return sequence_output(int(body.get("index", index) or index), body.get("content", "") if text is None else text,
                           [int(t) for t in body.get("tokens") or []], body.get("completion_probabilities"),
                           *finish_of(body))


def outputs_of_choices(body: dict[str, Any]) -> list[CompletionOutput]:
    """One CompletionOutput per choice of an OpenAI-shaped answer (/v1/completions, /v1/chat/completions);
    these routes return no token ids."""
    out = []
    for i, choice in enumerate(body.get("choices") or []):
        text = choice["message"].get("content") or "" if "message" in choice else choice.get("text", "")
        lp = choice.get("logprobs")
        out.append(sequence_output(int(choice.get("index", i)), text, [], lp.get("content") if isinstance(lp, dict)
                                   else None, choice.get("finish_reason"), None))
    return out


def __getattr__(name: str) -> Any:
    """`RequestOutput` (reports.Completion) as vLLM's vllm.outputs has it; loaded on first use."""
    if name == "RequestOutput":
        from .reports import RequestOutput
        return RequestOutput
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
