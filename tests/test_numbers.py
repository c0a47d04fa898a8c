"""Every number a client or an operator sends is checked where it is parsed: a request field out of
its type's range, with a fraction where a whole number is meant, or not a number at all is a 400
quoting the value received (never a value wrapped into another: 1e30 as -2147483648), a flag's bad
number is a start-up error naming the flag and the value, and the server keeps serving."""
from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any, Iterator

import pytest

from helpers import new_server
from llama_preempt.engine import Engine, EngineArgumentError, RequestError
from llama_preempt.server import LlamaServer, ServerStartError

I32 = (-(2**31), 2**31 - 1)
I64 = (-(2**63), 2**63 - 1)
U32 = (0, 2**32 - 1)  # and -1: "random"
F32_MAX = 3.4028234663852886e38
N_PARALLEL = 3


# name: (type, lo, hi, hard); hard: a value of the type outside [lo, hi] is a 400, else it is
# clamped into it; (lo, hi) None: the type's own range. `echo`: the key of generation_settings
# that shows the value taken (None: not shown there).
FIELDS: dict[str, tuple[str, tuple[float, float] | None, bool, str | None]] = {
    "priority":           ("i32", None, True, None),
    "n_predict":          ("i32", (-1, I32[1]), True, "n_predict"),
    "max_tokens":         ("i32", (-1, I32[1]), True, "n_predict"),
    "n_keep":             ("i32", (-1, I32[1]), True, "n_keep"),
    "n_discard":          ("i32", (0, I32[1]), True, "n_discard"),
    "n_indent":           ("i32", (0, I32[1]), True, None),
    "n_cmpl":             ("i32", (1, N_PARALLEL), True, None),
    "n":                  ("i32", (1, N_PARALLEL), True, None),
    "n_cache_reuse":      ("i32", (0, I32[1]), True, None),
    "sse_ping_interval":  ("i32", (-1, I32[1]), True, None),
    "t_max_predict_ms":   ("i64", (-1, I64[1]), True, None),
    "top_k":              ("i32", (0, I32[1]), False, "top_k"),
    "seed":               ("u32", None, True, "seed"),
    "n_probs":            ("i32", (0, 20), True, "n_probs"),  # --max-logprobs (default 20): beyond it a 400
    "min_keep":           ("i32", (0, I32[1]), True, "min_keep"),
    "repeat_last_n":      ("i32", (0, I32[1]), True, "repeat_last_n"),
    "dry_allowed_length": ("i32", (0, I32[1]), True, "dry_allowed_length"),
    "dry_penalty_last_n": ("i32", (0, I32[1]), True, "dry_penalty_last_n"),
    "mirostat":           ("i32", (0, 2), False, "mirostat"),
    "id_slot":            ("i32", None, True, None),  # upstream wraps an id beyond the slots around
    "temperature":        ("f32", (0, math.inf), False, None),
    "top_p":              ("f32", (0, 1), False, None),
    "min_p":              ("f32", (0, 1), False, None),
}
TYPE_RANGE = {"i32": I32, "i64": I64, "u32": U32}


def expected(name: str, v: Any) -> tuple[bool, Any]:
    """(accepted, the value the server takes) for `v` sent as field `name`."""
    kind, lim, hard, _ = FIELDS[name]
    if v is None:
        return True, None  # null: the server's default
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return False, None
    if kind == "f32":
        if not math.isfinite(v) or abs(v) > F32_MAX:
            return False, None
        return True, None  # floats are compared loosely: not echoed here
    if isinstance(v, float):
        if not math.isfinite(v) or v != math.floor(v):
            return False, None
        v = int(v)
    if kind == "u32" and v == -1:
        v = U32[1]
    t_lo, t_hi = TYPE_RANGE[kind]
    if not t_lo <= v <= t_hi:
        return False, None
    lo, hi = lim if lim is not None else (t_lo, t_hi)
    if lo <= v <= hi:
        return True, v
    return (False, None) if hard else (True, max(lo, min(hi, v)))


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, stories_model: Path) -> Iterator[LlamaServer]:
    srv = new_server(stories_model, tmp_path_factory.mktemp("numbers"), n_ctx=384, n_parallel=N_PARALLEL).start()
    yield srv
    srv.stop()


def send(srv: LlamaServer, name: str, v: Any) -> Any:
    body: dict[str, Any] = {"prompt": "Once", "n_predict": 2, "temperature": 0, name: v}
    if name in ("n_predict", "max_tokens"):
        body.pop("n_predict") if name == "max_tokens" else None
        body["n_keep"] = 0  # a huge n_predict runs to the end of the slot's context, and stops there
    return srv.post("/completion", body, timeout=120)


def check(srv: LlamaServer, name: str, v: Any) -> None:
    ok, taken = expected(name, v)
    r = send(srv, name, v)
    assert r.status_code < 500, (name, v, r.status_code, r.text[:300])
    assert srv.proc is not None and srv.proc.poll() is None
    if not ok:
        assert r.status_code == 400, (name, v, r.status_code, r.text[:300])
        msg = r.json()["error"]["message"]
        assert f"'{name}'" in msg and "got " in msg, msg
        if isinstance(v, int) and not isinstance(v, bool):
            # the value received, not a wrapped one (beyond 64 bits JSON parsers keep a double)
            shown = v if -(2**63) <= v < 2**64 else repr(float(v))
            assert f"got {shown}" in msg, msg
        return
    assert r.status_code == 200, (name, v, r.status_code, r.text[:300])
    echo = FIELDS[name][3]
    if taken is not None and echo is not None:
        results = r.json() if isinstance(r.json(), list) else [r.json()]
        for res in results:
            assert res["generation_settings"][echo] == taken, (name, v, res["generation_settings"][echo])


EDGES: list[Any] = [2**31, -(2**31) - 1, 2**32, 2**63, -(2**63) - 1, 2**64, 1e30, -1e30, 2.7, True, False, "5", [1],
                    {"v": 1}, 99999999999]


@pytest.mark.parametrize("name", sorted(FIELDS))
def test_each_numeric_field_refuses_values_across_the_32_and_64_bit_edges(server: LlamaServer, name: str) -> None:
    for v in EDGES:
        check(server, name, v)


def test_priority_1e30_is_a_400_that_quotes_it_and_never_a_wrapped_priority(server: LlamaServer) -> None:
    r = send(server, "priority", 1e30)
    assert r.status_code == 400
    assert "Field 'priority': must be a whole number from -2147483648 to 2147483647, got 1e+30" in r.json()["error"]["message"]
    for v, shown in ((2.7, "2.7"), (True, "true")):
        r = send(server, "priority", v)
        assert r.status_code == 400 and f"got {shown}" in r.json()["error"]["message"]
    assert send(server, "priority", 2.0).status_code == 200  # a whole number written as a float


def test_n_predict_beyond_int32_is_a_400_quoting_it(server: LlamaServer) -> None:
    for v in (2147483648, 99999999999):
        r = send(server, "n_predict", v)
        assert r.status_code == 400 and f"got {v}" in r.json()["error"]["message"], r.text
    r = server.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2**40})
    assert r.status_code == 400 and f"got {2**40}" in r.json()["error"]["message"], r.text


def test_openai_chat_numbers_are_checked_and_logprobs_false_still_works(server: LlamaServer) -> None:
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "temperature": 0}
    assert server.post("/v1/chat/completions", {**chat, "logprobs": False}).status_code == 200
    r = server.post("/v1/chat/completions", {**chat, "logprobs": True, "top_logprobs": 3})
    assert r.status_code == 200 and r.json()["choices"][0]["logprobs"] is not None
    for body, needle in (({"logprobs": True, "top_logprobs": 2**32}, f"got {2**32}"),
                         ({"seed": 2**32}, f"got {2**32}"), ({"n": 1.5}, "got 1.5"), ({"seed": "42"}, 'got "42"')):
        r = server.post("/v1/chat/completions", {**chat, **body})
        assert r.status_code == 400 and needle in r.json()["error"]["message"], (body, r.text)
    assert server.post("/v1/chat/completions", {**chat, "seed": -1}).status_code == 200  # -1: random


hypothesis = pytest.importorskip("hypothesis")
st = hypothesis.strategies
EDGE_INTS = [b + d for b in (2**31, 2**32, 2**63, 2**64) for d in (-1, 0, 1)]
NUMBERS = (st.sampled_from(EDGE_INTS + [-v for v in EDGE_INTS] + [-1, 0, 1, 2])
           | st.integers(min_value=-(2**70), max_value=2**70)
           | st.floats(allow_nan=False, allow_infinity=False)
           | st.sampled_from([0.5, 2.0, 2.5, -1.0, 1e30, 3.5e38, 1e300]))
VALUES = NUMBERS | st.booleans() | st.none() | st.text(max_size=8) | st.lists(st.integers(), max_size=2)


@hypothesis.settings(max_examples=300, deadline=None, derandomize=True)
@hypothesis.given(name=st.sampled_from(sorted(FIELDS)), v=VALUES)
def test_any_value_of_any_numeric_field_is_taken_exactly_or_refused_with_a_400(server: LlamaServer, name: str,
                                                                               v: Any) -> None:
    check(server, name, v)


# --- the Engine ---

def test_the_engine_refuses_a_wrapped_n_predict_quoting_it(stories_model: Path) -> None:
    with Engine(stories_model, n_ctx=256, n_parallel=2) as eng:
        with pytest.raises(RequestError, match=r"got 1000000000000\b") as e:
            eng.submit("Once", n_predict=10**12).result()
        assert e.value.status == 400
        assert eng.submit("Once", n_predict=4, temperature=0).completion().n_generated == 4


# --- flags ---

@pytest.mark.parametrize("args,needle", [
    (["-c", "abc"], """error while handling argument "-c": expected a whole number, got 'abc'"""),
    (["-c", "2.7"], """error while handling argument "-c": expected a whole number, got '2.7'"""),
    (["-c", "99999999999"], """error while handling argument "-c": '99999999999' is out of range"""),
    (["--drain-timeout", "abc"], """error while handling argument "--drain-timeout": expected a whole number, got 'abc'"""),
    (["-np", "12abc"], """error while handling argument "-np": expected a whole number, got '12abc'"""),
    (["--temp", "warm"], """error while handling argument "--temp": expected a number, got 'warm'"""),
    (["-ngl", "99999999999"], """error while handling argument "-ngl": '99999999999' is out of range"""),
    (["--temp", "1e99"], """error while handling argument "--temp": '1e99' is out of range"""),
], ids=["ctx-word", "ctx-fraction", "ctx-beyond-int", "drain-word", "np-trailing", "temp-word", "ngl-huge", "temp-huge"])
def test_a_bad_number_in_a_flag_is_a_startup_error_naming_flag_and_value(start_server, stories_model: Path,
                                                                          args: list[str], needle: str) -> None:
    with pytest.raises(ServerStartError, match=re.escape(needle)):
        start_server(stories_model, n_ctx=256, n_parallel=2, extra_args=args)


def test_an_integer_flag_with_surrounding_blanks_is_taken(start_server, stories_model: Path) -> None:
    # an env file written on Windows ends its lines in \r
    srv = start_server(stories_model, n_ctx=256, n_parallel=2, env={"LLAMA_ARG_PREEMPT_KEEPALIVE": " 7\r"})
    assert srv.get("/health").status_code == 200


def test_a_bad_number_in_a_flags_environment_variable_names_it(start_server, stories_model: Path) -> None:
    with pytest.raises(ServerStartError, match="\"LLAMA_ARG_CTX_SIZE\": expected a whole number, got 'lots'"):
        start_server(stories_model, n_ctx=256, n_parallel=2, env={"LLAMA_ARG_CTX_SIZE": "lots"})


def test_the_engine_raises_a_bad_flag_once_without_printing_it(stories_model: Path, capfd: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(EngineArgumentError) as e:
        Engine(stories_model, args="-c abc")
    assert str(e.value) == """error while handling argument "-c": expected a whole number, got 'abc'"""
    with pytest.raises(EngineArgumentError) as e:
        Engine(stories_model, n_ctx=-5)
    assert "-c/--ctx-size must be 0 (the model's own context length) or at least 2 cells, got -5" in str(e.value)
    assert "ctx-size" not in capfd.readouterr().err  # raised, not also printed
