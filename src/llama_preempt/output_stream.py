"""A streamed /completion request read as vLLM's AsyncLLM yields it: after each chunk, a
RequestOutput (Completion) of its n sequences so far (cumulative, only what is new, or once at the
end: RequestOutputKind), the last one `finished`; an aborted request's last output has
finish_reason "abort"."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .outputs import CompletionOutput, RequestOutputKind, finish_of, sequence_output
from .reports import Completion


@dataclass
class OutputStream:
    """The sequences of one streamed request, as its chunks arrive; `add(chunk)` gives the output to
    yield (None where FINAL_ONLY holds it back), `aborted()` the last one of an aborted request."""

    n: int
    kind: RequestOutputKind
    request_id: str
    prompt_fields: dict[str, Any]  # prompt and prompt_token_ids, carried by every output
    texts: list[str] = field(init=False)
    ids: list[list[int]] = field(init=False)
    probs: list[list[dict[str, Any]]] = field(init=False)
    reasons: list[str | None] = field(init=False)
    stops: list[str | None] = field(init=False)

    def __post_init__(self) -> None:
        self.texts = [""] * self.n
        self.ids = [[] for _ in range(self.n)]
        self.probs = [[] for _ in range(self.n)]
        self.reasons = [None] * self.n
        self.stops = [None] * self.n

    @property
    def done(self) -> bool:
        """Every sequence has ended."""
        return all(r is not None for r in self.reasons)

    def add(self, chunk: dict[str, Any]) -> Completion | None:
        """Take one streamed chunk (the server's /completion `data:` payload, `index` naming its sequence)."""
        i = int(chunk.get("index", 0) or 0) % self.n
        new_text, new_ids = chunk.get("content", "") or "", [int(t) for t in chunk.get("tokens") or []]
        new_probs = chunk.get("completion_probabilities") or []
        self.texts[i] += new_text
        self.ids[i] += new_ids
        self.probs[i] += new_probs
        if chunk.get("stop"):
            reason, self.stops[i] = finish_of(chunk)
            self.reasons[i] = reason or "stop"
        done = self.done
        if self.kind == RequestOutputKind.FINAL_ONLY and not done:
            return None
        if self.kind == RequestOutputKind.DELTA:
            outs = [sequence_output(i, new_text, new_ids, new_probs, self.reasons[i], self.stops[i])]
        else:
            outs = self._outputs()
        return Completion(self.texts[0], int(chunk.get("tokens_evaluated", 0) or 0), len(self.ids[0]),
                          str(chunk.get("stop_type", "")), chunk.get("timings") or {}, chunk, outs,
                          request_id=self.request_id, finished=done, **self.prompt_fields)

    def aborted(self) -> Completion:
        """The last output of a request aborted before it ended: what each sequence had, the
        unfinished ones with finish_reason "abort"."""
        outs = self._outputs(unfinished="abort")
        return Completion(self.texts[0], 0, len(self.ids[0]), "abort", {}, {}, outs, request_id=self.request_id,
                          finished=True, **self.prompt_fields)

    def _outputs(self, unfinished: str | None = None) -> list[CompletionOutput]:
        return [sequence_output(j, self.texts[j], list(self.ids[j]), self.probs[j], self.reasons[j] or unfinished,
                                self.stops[j]) for j in range(self.n)]
