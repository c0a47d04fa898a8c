"""Per-request sampling parameters as vLLM spells them (`SamplingParams`), for
`Engine.generate(prompts, params)`: one for every prompt, or a list with one per prompt."""
from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any, Sequence

# SamplingParams field -> the server's request field
_SERVER_NAMES = {"max_tokens": "n_predict", "repetition_penalty": "repeat_penalty", "logprobs": "n_probs"}


@dataclass(frozen=True)
class SamplingParams:
    """How one request samples; None leaves the server's default.

        SamplingParams(max_tokens=64, temperature=0)          # greedy
        SamplingParams(temperature=0.8, top_p=0.95, seed=7)   # sampled, reproducible
    """

    max_tokens: int | None = 16           # tokens to generate at most (-1: until the context ends)
    temperature: float | None = None      # 0: greedy
    top_p: float | None = None
    top_k: int | None = None              # 0: off
    min_p: float | None = None
    seed: int | None = None               # -1: random
    stop: str | Sequence[str] | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    ignore_eos: bool = False
    logprobs: int | None = None           # the top N probabilities of each token
    priority: int | None = None           # llama-preempt: lower priorities are parked first

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if v is None or f.name == "stop":
                continue
            if f.name == "ignore_eos":
                if not isinstance(v, bool):
                    raise TypeError(f"SamplingParams.ignore_eos must be a bool, got {v!r}")
            elif f.type in ("int | None",):
                if isinstance(v, bool) or not isinstance(v, int):
                    raise TypeError(f"SamplingParams.{f.name} must be an int, got {v!r}")
            elif isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise TypeError(f"SamplingParams.{f.name} must be a finite number, got {v!r}")
        if self.max_tokens is not None and self.max_tokens < -1:
            raise ValueError(f"SamplingParams.max_tokens must be -1 (no limit) or more, got {self.max_tokens}")
        if self.temperature is not None and self.temperature < 0:
            raise ValueError(f"SamplingParams.temperature must be >= 0, got {self.temperature}")
        if self.top_p is not None and not 0 <= self.top_p <= 1:
            raise ValueError(f"SamplingParams.top_p must be within [0, 1], got {self.top_p}")
        if self.stop is not None and not isinstance(self.stop, str) and \
                not all(isinstance(s, str) for s in self.stop):
            raise TypeError(f"SamplingParams.stop must be a string or a list of strings, got {self.stop!r}")

    def to_fields(self) -> dict[str, Any]:
        """The request fields (the server's names) of the parameters that are set."""
        out: dict[str, Any] = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if v is None or (f.name == "ignore_eos" and not v):
                continue
            out[_SERVER_NAMES.get(f.name, f.name)] = [v] if f.name == "stop" and isinstance(v, str) else \
                list(v) if f.name == "stop" else v
        return out


def per_prompt(params: SamplingParams | Sequence[SamplingParams] | None, n: int) -> list[dict[str, Any]]:
    """The request fields of each of n prompts: one SamplingParams for all, or one per prompt."""
    if params is None:
        return [{} for _ in range(n)]
    if isinstance(params, SamplingParams):
        return [params.to_fields() for _ in range(n)]
    if isinstance(params, (str, bytes, dict)) or not isinstance(params, Sequence):
        raise TypeError(f"params must be a SamplingParams or a list of them, got {type(params).__name__}")
    if len(params) != n:
        raise ValueError(f"params: {len(params)} SamplingParams for {n} prompts (give one, or one per prompt)")
    for i, p in enumerate(params):
        if not isinstance(p, SamplingParams):
            raise TypeError(f"params[{i}] must be a SamplingParams, got {type(p).__name__}")
    return [p.to_fields() for p in params]
