"""What the Engine hands back: what one step of the server loop did (StepReport and its typed
events) and what a request answered (Completion). `llama_preempt.engine` re-exports them."""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from . import _core
from .outputs import CompletionOutput, Logprob, RequestStateStats, output_of, outputs_of_choices

# --- what a step did ---

# The events are the C++ types the server's mechanics record (csrc/server/preempt-events.h), bound as they
# are: read-only attributes, `_fields` and `_asdict()` as a namedtuple has, equality by fields.
ParkEvent = _core.ParkEvent      # slot, task, mode, tier, n_tokens, bytes, reason, ms, priority, choice, *_ms_predicted
ResumeEvent = _core.ResumeEvent  # slot, task, mode, tier, fallback, parked_ms, restore_ms, n_replay
EndEvent = _core.EndEvent        # slot, task, n_generated, stop

# Their enums, the policy's own (csrc/python/py-enums.h): str enums whose members equal the names
# the server writes in /slots, /metrics and its logs (ParkTier.DISK == "disk").
ParkTier = _core.ParkTier        # where a parked state waits: RAM, DISK, RECOMPUTE
ParkReason = _core.ParkReason    # who parked it: POOL_FULL ("planner"), FORCED, LAST_RESORT, API
ParkChoice = _core.ParkChoice    # why that tier (preempt_parks_by_choice_total's label)
PreemptMode = _core.PreemptMode  # AUTO, SWAP, RECOMPUTE (an event's mode is SWAP or RECOMPUTE)
StopType = _core.StopType        # why a request ended: EOS, WORD, LIMIT (NONE: cancelled)
FailEvent = _core.FailEvent      # slot (-1: the task never had a slot), task, message


@dataclass(frozen=True)
class StepReport:
    """What one iteration of the server loop did."""

    n_decoded: int            # tokens decoded (prompt, replay and generated)
    n_prompt: int             # of those, prompt tokens
    n_replay: int             # of those, tokens re-prefilled after a park (recompute)
    n_generated: int          # tokens sampled for requests
    n_busy: int               # slots with a request after the step
    elapsed_ms: float
    parked: tuple[ParkEvent, ...] = ()
    resumed: tuple[ResumeEvent, ...] = ()
    finished: tuple[EndEvent, ...] = ()
    failed: tuple[FailEvent, ...] = ()
    cancelled: tuple[int, ...] = ()  # tasks cancelled (slot released without an answer)

    @property
    def idle(self) -> bool:
        return self.n_busy == 0 and self.n_decoded == 0

    @classmethod
    def from_core(cls, r: Any) -> "StepReport":
        """From the C++ report of one step (_core.StepReportCore)."""
        return cls(
            n_decoded=r.n_decoded, n_prompt=r.n_prompt, n_replay=r.n_replay, n_generated=r.n_generated,
            n_busy=r.busy, elapsed_ms=r.t_us / 1000.0, parked=tuple(r.parked), resumed=tuple(r.resumed),
            finished=tuple(r.finished), failed=tuple(r.failed), cancelled=tuple(e.task for e in r.cancelled),
        )


# --- answers ---

@dataclass(frozen=True)
class Completion:
    """One finished answer, from any completion endpoint. It is also vLLM's RequestOutput:
    `prompt`, `prompt_token_ids`, `outputs` (one CompletionOutput per sequence: `text`,
    `token_ids`, `finish_reason`, ...), `finished`, `request_id`, `num_cached_tokens` (the prompt
    tokens the server found in its cache: `timings.cache_n`), `prompt_logprobs` (with
    SamplingParams(prompt_logprobs=N), else None) and `metrics` (a RequestStateStats on
    AsyncLLM's outputs; None from LLM.generate, as vLLM's LLM gives)."""

    text: str
    n_prompt: int
    n_generated: int
    stop: str                 # stop_type (/completion) or finish_reason (OpenAI endpoints)
    timings: dict[str, Any] = field(default_factory=dict, repr=False)
    response: dict[str, Any] = field(default_factory=dict, repr=False)  # the server's whole response
    outputs: list[CompletionOutput] = field(default_factory=list, repr=False)
    prompt: str | None = field(default=None, repr=False)           # as given (None for chat messages)
    prompt_token_ids: list[int] | None = field(default=None, repr=False)
    request_id: str = field(default="", repr=False)
    finished: bool = field(default=True, repr=False)
    num_cached_tokens: int | None = field(default=None, repr=False)
    prompt_logprobs: list[dict[int, Logprob] | None] | None = field(default=None, repr=False)
    metrics: RequestStateStats | None = field(default=None, repr=False)

    @property
    def finish_reason(self) -> str | None:
        """vLLM's finish_reason of the first sequence: "stop", "length" (or "tool_calls")."""
        return self.outputs[0].finish_reason if self.outputs else None

    @classmethod
    def from_response(cls, body: dict[str, Any] | list[dict[str, Any]]) -> "Completion":
        if isinstance(body, list):  # /completion with n > 1: one answer per sequence
            first = cls.from_response(body[0])
            outs = [output_of(b, i) for i, b in enumerate(body)]
            return replace(first, outputs=outs, n_generated=sum(int(b.get("tokens_predicted", 0)) for b in body))
        timings = body.get("timings") or {}
        if "choices" in body:  # /v1/chat/completions, /v1/completions
            choice = body["choices"][0]
            text = choice["message"].get("content") or "" if "message" in choice else choice.get("text", "")
            usage = body.get("usage") or {}
            return cls(text, int(usage.get("prompt_tokens", 0)), int(usage.get("completion_tokens", 0)),
                       str(choice.get("finish_reason")), timings, body, outputs_of_choices(body),
                       num_cached_tokens=cached_tokens(timings, usage))
        return cls(body.get("content", ""), int(body.get("tokens_evaluated", 0)),
                   int(body.get("tokens_predicted", 0)), str(body.get("stop_type", "")), timings, body, [output_of(body)],
                   num_cached_tokens=cached_tokens(timings))

    @classmethod
    def from_stream(cls, chunks: list[dict[str, Any]]) -> "Completion":
        """From a streamed answer's chunks: the text joined, the counts and stop of its last chunk
        (`response` is that last chunk)."""
        last = chunks[-1] if chunks else {}
        text = "".join(stream_text(c) for c in chunks)
        timings = last.get("timings") or {}
        if "choices" in last:  # the OpenAI endpoints: usage and finish_reason on the last chunks
            usage = next((c["usage"] for c in reversed(chunks) if c.get("usage")), {})
            reason = next((ch.get("finish_reason") for c in reversed(chunks) for ch in c.get("choices", [])
                           if ch.get("finish_reason")), None)
            # usage only with stream_options.include_usage; llama-server's timings always
            timings = next((c["timings"] for c in reversed(chunks) if c.get("timings")), timings)
            return cls(text, int(usage.get("prompt_tokens", timings.get("prompt_n", 0))),
                       int(usage.get("completion_tokens", timings.get("predicted_n", 0))), str(reason), timings, last,
                       [CompletionOutput(0, text, [], None, None, reason)], num_cached_tokens=cached_tokens(timings, usage))
        ids = [int(t) for c in chunks for t in c.get("tokens") or []]
        out = replace(output_of(last, 0, text), token_ids=ids)
        return cls(text, int(last.get("tokens_evaluated", 0)), int(last.get("tokens_predicted", 0)),
                   str(last.get("stop_type", "")), timings, last, [out], num_cached_tokens=cached_tokens(timings))


RequestOutput = Completion  # vLLM's name: a Completion has RequestOutput's fields


def cached_tokens(timings: dict[str, Any], usage: dict[str, Any] | None = None) -> int | None:
    """vLLM's num_cached_tokens: the prompt tokens the server took from its cache (`timings.cache_n`,
    or OpenAI's usage.prompt_tokens_details.cached_tokens); None where the answer does not say."""
    if "cache_n" in timings:
        return int(timings["cache_n"])
    details = (usage or {}).get("prompt_tokens_details") or {}
    return int(details["cached_tokens"]) if "cached_tokens" in details else None


def stream_text(chunk: dict[str, Any]) -> str:
    """The text a streamed chunk adds, for /completion and the OpenAI endpoints alike."""
    if "choices" in chunk:
        if not chunk["choices"]:
            return ""
        choice = chunk["choices"][0]
        if "delta" in choice:
            return choice["delta"].get("content") or ""
        return choice.get("text") or ""
    return chunk.get("content", "") or ""
