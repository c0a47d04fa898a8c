"""The one check every call of the library runs on what it is given, before anything is submitted:
unknown keywords are a TypeError naming the closest valid one, a field of the wrong type a TypeError
naming it, a value out of range or malformed chat messages a ValueError, the same rule for `submit`,
`complete`, `create_*`, `generate`, `SamplingParams` and the async calls.

The fields, their types and their hard limits are upstream's request schema
(tools/server/server-schema.cpp, read through the compiled core), so a call is refused here exactly
where the server would answer the same request over HTTP with a 400; a value the server clamps (a
soft limit: top_p 1.5 is read as 1) passes here too. The fields the routes read beside the schema,
and the shapes of the schema's JSON fields (its handlers read them), are listed below.
"""
from __future__ import annotations

import difflib
import functools
import json
import math
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from .errors import RequestError


class FieldTypeError(RequestError, TypeError):
    """A call's keyword unknown or of the wrong type: a TypeError, and the RequestError (400) the
    server would answer."""

    def __init__(self, message: str) -> None:
        super().__init__(400, "invalid_request_error", message, _error_body(message))
        self.args = (message,)


class FieldValueError(RequestError, ValueError):
    """A call's value out of range, or chat messages that cannot be rendered: a ValueError, and the
    RequestError (400) the server would answer."""

    def __init__(self, message: str) -> None:
        super().__init__(400, "invalid_request_error", message, _error_body(message))
        self.args = (message,)


def _error_body(message: str) -> dict[str, Any]:
    """The error body the server would answer the same request with."""
    return {"error": {"code": 400, "message": message, "type": "invalid_request_error"}}


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else repr(x)

# the fields the completion and chat routes read besides upstream's schema
# (server-context.cpp, server-common.cpp's oaicompat_*_params_parse), each with its shape
ROUTE_FIELDS: dict[str, str] = {
    "prompt": "prompt", "messages": "messages", "tools": "list[dict]", "tool_choice": "str|dict",
    "parallel_tool_calls": "bool", "response_format": "dict", "top_logprobs": "int", "model": "str", "user": "str",
    "id_slot": "int", "chat_template_kwargs": "dict", "add_generation_prompt": "bool", "reasoning_effort": "str",
    "input_extra": "list", "input_prefix": "str", "input_suffix": "str", "multimodal_data": "list",
    "metadata": "dict", "n_cmpl": "int", "thinking_budget_tokens": "int",
}

# the shapes of the schema's JSON fields (a handler reads each; it skips what it cannot read)
JSON_SHAPES: dict[str, str] = {
    "stop": "str|list[str]", "samplers": "str|list[str]", "grammar": "str", "json_schema": "dict",
    "logit_bias": "logit_bias", "response_fields": "list[str]", "dry_sequence_breakers": "list[str]",
    "lora": "list[dict]", "preserved_tokens": "list[str]", "grammar_triggers": "list",
}

@dataclass(frozen=True)
class FieldRule:
    """How one request field must be given: `kind` (int, float, bool, str, object, or a shape of
    ROUTE_FIELDS/JSON_SHAPES), and for numbers the limits the server refuses beyond (`hard`)."""

    kind: str
    lo: float | None = None
    hi: float | None = None
    hard: bool = False
    bool_ok: bool = False          # "logprobs": true is 1 (OpenAI's chat API sends a bool)
    repr_min: float | None = None  # what the server's field type holds (beyond it: always refused)
    repr_max: float | None = None
    fields: "Mapping[str, FieldRule] | None" = None  # an object's own fields


class RequestRules:
    """The request fields of one server: upstream's schema (as `_core` describes it) and the routes'."""

    def __init__(self, schema: Iterable[Mapping[str, Any]]) -> None:
        self.fields: dict[str, FieldRule] = {}
        for entry in schema:
            for name, rule in _rules_of(entry).items():
                self.fields.setdefault(name, rule)
        for name, shape in ROUTE_FIELDS.items():
            self.fields.setdefault(name, FieldRule(shape))

    def names(self) -> set[str]:
        return set(self.fields)

    def check_keywords(self, where: str, given: Iterable[str], own: Iterable[str] = ()) -> None:
        """A TypeError for the first keyword that is neither a request field nor one of `own` (the
        call's own parameters), naming the closest valid keyword."""
        own = set(own)
        for name in given:
            if name not in self.fields and name not in own:
                raise FieldTypeError(f"{where} got an unexpected keyword argument {name!r}{closest(name, own | self.names())}")

    def check(self, where: str, fields: Mapping[str, Any], shown: Mapping[str, str] | None = None) -> None:
        """Each known field's type and hard limits. `shown` maps a field's server name to the name
        the caller wrote (SamplingParams' max_tokens for n_predict), for the message."""
        for name, value in fields.items():
            rule = self.fields.get(name)
            if rule is not None and value is not None:
                check_value(where, (shown or {}).get(name, name), rule, value)


def _rules_of(entry: Mapping[str, Any], prefix: str = "") -> dict[str, FieldRule]:
    kind = str(entry["kind"])
    names = [prefix + str(n) for n in entry["names"]]
    if kind == "object":
        sub: dict[str, FieldRule] = {}
        for s in entry.get("fields") or []:
            sub.update(_rules_of(s))
        rule = FieldRule("object", fields=sub)
        return {n: rule for n in names}
    out: dict[str, FieldRule] = {}
    for n in names:
        if kind in ("int", "float"):
            out[n] = FieldRule(kind, entry.get("min"), entry.get("max"), bool(entry.get("hard")),
                               bool_ok=entry.get("bool_alias") == n, repr_min=entry.get("repr_min"),
                               repr_max=entry.get("repr_max"))
        elif kind == "json":
            out[n] = FieldRule(JSON_SHAPES.get(n, "json"))
        else:
            out[n] = FieldRule(kind)
    return out


def closest(name: str, candidates: Iterable[str]) -> str:
    """"; did you mean 'x'?" for the closest candidate, or "" when none is close."""
    near = difflib.get_close_matches(name, sorted(candidates), n=1, cutoff=0.6)
    return f"; did you mean {near[0]!r}?" if near else ""


def _kind_error(where: str, name: str, expected: str, value: Any) -> FieldTypeError:
    return FieldTypeError(f"{where}: {name} must be {expected}, got {value!r} ({type(value).__name__})")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _is_str_list(v: Any) -> bool:
    return isinstance(v, (list, tuple)) and all(isinstance(s, str) for s in v)


def check_value(where: str, name: str, rule: FieldRule, value: Any) -> None:
    """One field's value against its rule: TypeError for the wrong type, ValueError out of range."""
    kind = rule.kind
    if kind in ("int", "float"):
        if rule.bool_ok and isinstance(value, bool):
            return
        # the server takes a whole number written as a float (2.0), and refuses 2.5 (checked_number)
        if kind == "int" and not (_is_int(value) or (isinstance(value, float) and value.is_integer())):
            raise _kind_error(where, name, "an int (a whole number)", value)
        if kind == "float" and not _is_number(value):
            raise _kind_error(where, name, "a number", value)
        if kind == "float" and not math.isfinite(value):
            raise FieldValueError(f"{where}: {name} must be a finite number, got {value!r}")
        if rule.repr_min is not None and rule.repr_max is not None and not rule.repr_min <= value <= rule.repr_max:
            raise FieldValueError(f"{where}: {name} must be from {_num(rule.repr_min)} to {_num(rule.repr_max)}, got {value!r}")
        if rule.hard and ((rule.lo is not None and value < rule.lo) or (rule.hi is not None and value > rule.hi)):
            lo = "-inf" if rule.lo is None else _num(rule.lo)
            hi = "inf" if rule.hi is None else _num(rule.hi)
            raise FieldValueError(f"{where}: {name} must be between {lo} and {hi}, got {value!r}")
        return
    if kind == "bool":
        if not isinstance(value, bool):
            raise _kind_error(where, name, "True or False", value)
    elif kind == "str":
        if not isinstance(value, str):
            raise _kind_error(where, name, "a string", value)
    elif kind in ("object", "dict"):
        if not isinstance(value, dict):
            raise _kind_error(where, name, "a dict", value)
        for k, v in value.items():
            sub = (rule.fields or {}).get(k)
            if sub is not None and v is not None:
                check_value(where, f"{name}.{k}", sub, v)
    elif kind == "str|list[str]":
        if not isinstance(value, str) and not _is_str_list(value):
            raise _kind_error(where, name, "a string or a list of strings", value)
    elif kind == "list[str]":
        if not _is_str_list(value):
            raise _kind_error(where, name, "a list of strings", value)
    elif kind == "list[dict]":
        if not isinstance(value, (list, tuple)) or not all(isinstance(x, dict) for x in value):
            raise _kind_error(where, name, "a list of dicts", value)
    elif kind == "list":
        if not isinstance(value, (list, tuple)):
            raise _kind_error(where, name, "a list", value)
    elif kind == "str|dict":
        if not isinstance(value, (str, dict)):
            raise _kind_error(where, name, "a string or a dict", value)
    elif kind == "logit_bias":
        _check_logit_bias(where, name, value)
    elif kind == "prompt":
        _check_prompt(where, name, value)
    elif kind == "messages":
        check_messages(where, value)


def _check_logit_bias(where: str, name: str, value: Any) -> None:
    """{token id or text: bias} or [[token id or text, bias], ...]; a bias of False bans the token."""
    if isinstance(value, dict):
        pairs = list(value.items())
    elif isinstance(value, (list, tuple)):
        if not all(isinstance(p, (list, tuple)) and len(p) == 2 for p in value):
            raise _kind_error(where, name, "a dict {token: bias} or a list of [token, bias] pairs", value)
        pairs = [tuple(p) for p in value]
    else:
        raise _kind_error(where, name, "a dict {token: bias} or a list of [token, bias] pairs", value)
    for tok, bias in pairs:
        if not (_is_int(tok) or isinstance(tok, str)):
            raise FieldTypeError(f"{where}: {name} keys must be token ids (int) or text (str), got {tok!r}")
        if not (_is_number(bias) or bias is False):
            raise FieldTypeError(f"{where}: {name}[{tok!r}] must be a number (or False to ban the token), got {bias!r}")
        if _is_number(bias) and not math.isfinite(bias):
            raise FieldValueError(f"{where}: {name}[{tok!r}] must be finite (False bans a token), got {bias!r}")


def _check_prompt(where: str, name: str, value: Any) -> None:
    """What the server tokenizes as a prompt (server-common.cpp, tokenize_input_prompts): a string,
    token ids, a mix of both in one list, a multimodal {"prompt_string": ...}, or a list of these
    (several prompts)."""
    def piece(p: Any) -> bool:
        return isinstance(p, str) or _is_int(p)

    def one(p: Any) -> bool:
        return (isinstance(p, str) or (isinstance(p, list) and all(piece(t) for t in p))
                or (isinstance(p, dict) and isinstance(p.get("prompt_string"), str)))

    if one(value) or (isinstance(value, list) and value and all(one(p) for p in value)):
        return
    raise _kind_error(where, name, "a string or a list of token ids (int)", value)


def check_messages(where: str, messages: Any) -> None:
    """Chat messages as the server's chat routes check them (a 400 over HTTP): TypeError when they
    are not a list of dicts, ValueError when they cannot be rendered (no message, no or an unknown
    role, no content)."""
    if isinstance(messages, (str, bytes, dict)) or not isinstance(messages, (list, tuple)):
        raise FieldTypeError(f"{where}: messages must be a list of {{'role': ..., 'content': ...}} dicts, got "
                        f"{type(messages).__name__}")
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise FieldTypeError(f"{where}: messages[{i}] must be a dict with 'role' and 'content', got {type(m).__name__}")
    try:
        text = json.dumps(list(messages))
    except (TypeError, ValueError) as e:
        raise FieldTypeError(f"{where}: messages must hold only JSON values (strings, lists, dicts): {e}") from None
    from . import _core

    why = _core.chat_messages_error(text)
    if why:
        raise FieldValueError(f"{where}: {why}")


@functools.lru_cache(maxsize=1)
def default_rules() -> RequestRules:
    """The rules under the server's default parameters, for what is checked without an Engine
    (SamplingParams): a field's type and fixed limits; the limits an Engine's flags set (n up to its
    slots, logprobs up to --max-logprobs) are checked when the request is submitted."""
    from . import _core

    return RequestRules(_core.request_fields())
