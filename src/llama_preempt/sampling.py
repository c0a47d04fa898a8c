"""Per-request sampling parameters as vLLM spells them (`SamplingParams`), for
`Engine.generate(prompts, params)`: one for every prompt, or a list with one per prompt; and vLLM's
`BeamSearchParams` (LLM.beam_search says what to use instead)."""
from __future__ import annotations

import functools
from dataclasses import dataclass, fields, replace
from typing import Any, Sequence

from .checks import FieldTypeError, FieldValueError, check_value, closest, default_rules
from .outputs import RequestOutputKind

# SamplingParams field -> the server's request field
_SERVER_NAMES = {"max_tokens": "n_predict", "repetition_penalty": "repeat_penalty", "logprobs": "n_probs",
                 "n": "n_cmpl"}
# vLLM's fields that no one request field carries: done around the server's requests (vllm_run.py)
_VLLM_ONLY = {"stop_token_ids": None, "min_tokens": 0, "include_stop_str_in_output": False, "skip_special_tokens": True,
              "detokenize": True, "bad_words": None, "allowed_token_ids": None, "prompt_logprobs": None,
              "truncate_prompt_tokens": None}
# fields of SamplingParams that are not request fields
_LOCAL = {"output_kind", *_VLLM_ONLY}


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
    # vLLM's fields that one server request does not carry, done around the server's requests (vllm_run.py)
    stop_token_ids: Sequence[int] | None = None  # ends a sequence at any of these ids (kept in token_ids, not in text)
    min_tokens: int = 0                    # tokens before the end token or a stop_token_id may come
    include_stop_str_in_output: bool = False  # the stop string (or stop token's text) ends the text
    skip_special_tokens: bool = True       # False: special tokens' text (<s>, <|im_end|>, ...) is in the text
    detokenize: bool = True                # False: token ids only, text ""
    bad_words: Sequence[str] | None = None  # words never generated (each must be one token: logit_bias)
    allowed_token_ids: Sequence[int] | None = None  # only these ids are sampled (every other one banned)
    prompt_logprobs: int | None = None     # per prompt token: its log-probability and the top N (first: None)
    truncate_prompt_tokens: int | None = None  # keep only the last N prompt tokens (-1: the context's size)

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
        self._check_vllm_only(where)

    def _check_vllm_only(self, where: str) -> None:
        """vLLM's rules for its own fields (SamplingParams._verify_args), with its messages' sense."""
        for name in ("include_stop_str_in_output", "skip_special_tokens", "detokenize"):
            if not isinstance(getattr(self, name), bool):
                raise FieldTypeError(f"{where}: {name} must be True or False, got {getattr(self, name)!r}")
        for name in ("stop_token_ids", "allowed_token_ids"):
            ids = getattr(self, name)
            if ids is not None and (isinstance(ids, (str, bytes)) or not isinstance(ids, Sequence)
                                    or not all(_is_int(t) for t in ids)):
                raise FieldTypeError(f"{where}: {name} must be a list of token ids (int), got {ids!r}")
            if ids is not None and any(t < 0 for t in ids):
                raise FieldValueError(f"{where}: {name} must hold token ids (>= 0), got {list(ids)}")
        if self.allowed_token_ids is not None and not self.allowed_token_ids:
            raise FieldValueError(f"{where}: allowed_token_ids is empty: give at least one id, or None for every one")
        if self.bad_words is not None:
            if isinstance(self.bad_words, (str, bytes)) or not isinstance(self.bad_words, Sequence) \
                    or not all(isinstance(w, str) for w in self.bad_words):
                raise FieldTypeError(f"{where}: bad_words must be a list of strings, got {self.bad_words!r}")
            if any(not w for w in self.bad_words):
                raise FieldValueError(f"{where}: bad_words cannot contain an empty string, got {list(self.bad_words)}")
        if not _is_int(self.min_tokens):
            raise FieldTypeError(f"{where}: min_tokens must be an int, got {self.min_tokens!r}")
        if self.min_tokens < 0:
            raise FieldValueError(f"{where}: min_tokens must be >= 0, got {self.min_tokens}")
        if self.max_tokens is not None and self.max_tokens != -1 and self.min_tokens > self.max_tokens:
            raise FieldValueError(f"{where}: min_tokens must be at most max_tokens={self.max_tokens}, got {self.min_tokens}")
        if self.prompt_logprobs is not None:
            if self.prompt_logprobs is True:  # vLLM reads True as 1
                object.__setattr__(self, "prompt_logprobs", 1)
            if not _is_int(self.prompt_logprobs) or isinstance(self.prompt_logprobs, bool):
                raise FieldTypeError(f"{where}: prompt_logprobs must be an int, got {self.prompt_logprobs!r}")
            if self.prompt_logprobs == -1:
                raise FieldValueError(f"{where}: prompt_logprobs=-1 (every token of the vocabulary): the server gives "
                                      "at most --max-logprobs alternatives a token; give a number up to it")
            if self.prompt_logprobs < 0:
                raise FieldValueError(f"{where}: prompt_logprobs must be >= 0, got {self.prompt_logprobs}")
        t = self.truncate_prompt_tokens
        if t is not None and (not _is_int(t) or isinstance(t, bool)):
            raise FieldTypeError(f"{where}: truncate_prompt_tokens must be an int, got {t!r}")
        if t is not None and t < 1 and t != -1:
            raise FieldValueError(f"{where}: truncate_prompt_tokens must be >= 1 (keep the last N prompt tokens) or -1 "
                                  f"(the context's size), got {t}")
        if self.stop and not self.detokenize:
            raise FieldValueError(f"{where}: stop strings need detokenize=True (they are found in the text); "
                                  "with detokenize=False use stop_token_ids")

    def clone(self) -> "SamplingParams":
        """A copy, as vLLM's clone() (its lists copied too)."""
        return replace(self, **{f.name: list(v) for f in fields(self)
                                if isinstance(v := getattr(self, f.name), list)})

    @property
    def plain(self) -> bool:
        """Whether one server request does all it asks (none of vLLM's own fields is set)."""
        return not self.vllm_only()

    def vllm_only(self) -> list[str]:
        """The names of vLLM's own fields this one sets (an empty list of ids or words is not set)."""
        out = []
        for name, default in _VLLM_ONLY.items():
            v = getattr(self, name)
            if name in ("stop_token_ids", "bad_words", "allowed_token_ids") and v is not None and len(v) == 0:
                continue
            if v != default or (default is None and v is not None):
                out.append(name)
        return out

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


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


@dataclass(frozen=True)
class BeamSearchParams:
    """vLLM's BeamSearchParams, so a program that builds them imports; LLM.beam_search raises a
    NotImplementedError (the server samples one sequence per slot: use SamplingParams(n=...))."""

    beam_width: int
    max_tokens: int
    ignore_eos: bool = False
    temperature: float = 0.0
    length_penalty: float = 1.0
    include_stop_str_in_output: bool = False

    def __post_init__(self) -> None:
        if not _is_int(self.beam_width) or self.beam_width < 1:
            raise FieldValueError(f"BeamSearchParams(): beam_width must be at least 1, got {self.beam_width!r}")
        if not _is_int(self.max_tokens) or self.max_tokens < 1:
            raise FieldValueError(f"BeamSearchParams(): max_tokens must be at least 1, got {self.max_tokens!r}")


def each_params(params: SamplingParams | Sequence[SamplingParams] | None, n: int) -> list[SamplingParams]:
    """The SamplingParams of each of n prompts: one for all, or one per prompt (None: the defaults)."""
    if params is None:
        return [SamplingParams() for _ in range(n)]
    if isinstance(params, SamplingParams):
        return [params] * n
    if isinstance(params, (str, bytes, dict)) or not isinstance(params, Sequence):
        raise TypeError(f"params must be a SamplingParams or a list of them, got {type(params).__name__}")
    if len(params) != n:
        raise ValueError(f"params: {len(params)} SamplingParams for {n} prompts (give one, or one per prompt)")
    for i, p in enumerate(params):
        if not isinstance(p, SamplingParams):
            raise TypeError(f"params[{i}] must be a SamplingParams, got {type(p).__name__}")
    return list(params)


def per_prompt(params: SamplingParams | Sequence[SamplingParams] | None, n: int) -> list[dict[str, Any]]:
    """The request fields of each of n prompts: one SamplingParams for all, or one per prompt."""
    if params is None:
        return [{} for _ in range(n)]
    each = each_params(params, n)
    for p in each:
        _refuse_vllm_only(p)
    return [p.to_fields() for p in each]


def _refuse_vllm_only(p: SamplingParams) -> None:
    """A request's fields alone would drop vLLM's own fields: say where they work instead."""
    if not p.plain:
        raise NotImplementedError(f"SamplingParams({', '.join(p.vllm_only())}=...) need more than one server request "
                                  "each; they work through generate() (Engine, LLM, AsyncLLM), not as request fields")
