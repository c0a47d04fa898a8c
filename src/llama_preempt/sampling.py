"""Per-request sampling parameters as vLLM spells them (`SamplingParams`), for
`Engine.generate(prompts, params)`: one for every prompt, or a list with one per prompt."""
from __future__ import annotations

import functools
from dataclasses import dataclass, fields, replace
from typing import Any, Sequence

from .checks import FieldTypeError, FieldValueError, check_value, closest, default_rules
from .outputs import RequestOutputKind

# SamplingParams field -> the server's request field
_SERVER_NAMES = {"max_tokens": "n_predict", "repetition_penalty": "repeat_penalty", "logprobs": "n_probs",
                 "n": "n_cmpl"}
# fields of SamplingParams that are not request fields
_LOCAL = {"output_kind"}


@dataclass(frozen=True)
class SamplingParams:
    """How one request samples, as vLLM spells it; None leaves the server's default.

        SamplingParams(max_tokens=64, temperature=0)          # greedy
        SamplingParams(temperature=0.8, top_p=0.95, seed=7)   # sampled, reproducible
        SamplingParams(n=2, temperature=0.8)                  # two answers to one prompt
    """

    n: int = 1                            # sequences per prompt (the server's n_cmpl, up to its slots)
    max_tokens: int | None = 16           # tokens to generate at most (None, or -1 as before: until the context ends)
    temperature: float | None = None      # 0: greedy
    top_p: float | None = None
    top_k: int | None = None              # 0: off
    min_p: float | None = None
    seed: int | None = None
    stop: str | Sequence[str] | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    ignore_eos: bool = False
    logprobs: int | None = None           # the top N probabilities of each token
    logit_bias: dict[int, float] | None = None
    priority: int | None = None           # llama-preempt: lower priorities are parked first
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE  # what AsyncEngine.generate's outputs carry

    def __post_init__(self) -> None:
        rules = default_rules()
        where = "SamplingParams()"
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name in _LOCAL or v is None:
                continue
            rule = rules.fields.get(_SERVER_NAMES.get(f.name, f.name))
            if f.name in ("n", "logprobs"):  # their limits are the Engine's (its slots, --max-logprobs): at submit
                rule = rule and replace(rule, hard=False)
            if rule is not None:
                check_value(where, f.name, rule, v)
        if not isinstance(self.output_kind, RequestOutputKind):
            raise FieldTypeError(f"{where}: output_kind must be a RequestOutputKind, got {self.output_kind!r}")
        # vLLM's own rules (SamplingParams._verify_args)
        if self.n < 1:
            raise FieldValueError(f"{where}: n must be at least 1, got {self.n}")
        if self.max_tokens is not None and self.max_tokens < 1 and self.max_tokens != -1:
            raise FieldValueError(f"{where}: max_tokens must be at least 1, got {self.max_tokens} (None or -1: until "
                                  "the context ends; to only prefill a prompt, submit(prompt, n_predict=0))")
        if self.temperature is not None and self.temperature < 0:
            raise FieldValueError(f"{where}: temperature must be >= 0, got {self.temperature}")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise FieldValueError(f"{where}: top_p must be in (0, 1], got {self.top_p}")

    def to_fields(self) -> dict[str, Any]:
        """The request fields (the server's names) of the parameters that are set."""
        out: dict[str, Any] = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if v is None or f.name in _LOCAL or (f.name == "ignore_eos" and not v) or (f.name == "n" and v == 1):
                continue
            out[_SERVER_NAMES.get(f.name, f.name)] = [v] if f.name == "stop" and isinstance(v, str) else \
                list(v) if f.name == "stop" else v
        if self.max_tokens is None:
            out["n_predict"] = -1
        return out


_dataclass_init = SamplingParams.__init__


@functools.wraps(_dataclass_init)
def _init(self: SamplingParams, *args: Any, **kwargs: Any) -> None:
    names = {f.name for f in fields(SamplingParams)}
    for name in kwargs:
        if name not in names:
            raise FieldTypeError(f"SamplingParams() got an unexpected keyword argument {name!r}{closest(name, names)}")
    _dataclass_init(self, *args, **kwargs)


SamplingParams.__init__ = _init  # type: ignore[method-assign]


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
