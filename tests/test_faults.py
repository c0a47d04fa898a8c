"""Faults and hostile input: a request cancelled while parked or while resuming, signals with slots
parked, a draft model under forced parks, bad requests and fuzzed fields. Nothing else is lost
and the server keeps serving."""
from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest
import requests

from helpers import complete, logged, long_prompt, new_server, streams_held_parked
from llama_preempt.engine import Engine, RequestCancelled

FORCED = {"LLAMA_SERVER_PREEMPT_EVERY": "8"}


# --- cancelled while parked or resuming ---

def test_a_request_cancelled_while_parked_before_its_first_token_frees_everything(stories_model: Path) -> None:
    with Engine(stories_model, n_ctx=512, n_parallel=2, kv_unified=True, n_threads=2) as eng:
        req = eng.submit("Once upon a time", n_predict=40, temperature=0, ignore_eos=True, stream=True)
        parks = [eng.submit(path=f"/slots/{i}?action=park", body={}) for i in range(2)]
        eng.step()  # the request takes a slot and is parked there before its prompt
        assert len(eng.stats().parked()) == 1
        assert next(req.sse()) == ": preempted\n\n"
        req.cancel()  # the client goes away while it waits
        eng.run(lambda: req.done() and not any(s.is_processing for s in eng.stats().slots), timeout=30)
        st = eng.stats()
        assert st.requests_preempted == 0 and st.preempt_ram_bytes == 0
        for p in parks:
            p.wait(10)
        # and the engine serves the next request
        assert eng.submit("Once upon a time", n_predict=8).completion().n_generated == 8


def test_a_request_cancelled_while_it_replays_frees_everything(stories_model: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLAMA_SERVER_PREEMPT_EVERY", "16")
    with Engine(stories_model, ["--preempt-ram", "0"], n_ctx=512, n_parallel=2, kv_unified=True, n_batch=8,
                n_threads=2) as eng:
        req = eng.submit(long_prompt(150), n_predict=200, temperature=0, ignore_eos=True)
        # step until a RECOMPUTE resume has begun replaying its ~170 tokens, 8 a step
        eng.run(lambda: any(s.state == "processing_prompt" and s.n_preempt > 0 for s in eng.stats().slots),
                timeout=60)
        replaying = eng.stats()
        assert any(s.n_recompute > 0 or s.n_preempt > 0 for s in replaying.slots)
        req.cancel()
        # nothing steps until the handler has noticed (it polls every second) and posted its cancel,
        # so the cancel lands while the slot is still mid-replay
        assert req._handle.wait_done(10)
        assert any(s.state == "processing_prompt" for s in eng.stats().slots)
        eng.run(lambda: not any(s.is_processing for s in eng.stats().slots), timeout=30)
        with pytest.raises(RequestCancelled):
            req.result()
        st = eng.stats()
        assert st.requests_preempted == 0 and st.preempt_ram_bytes == 0
        assert eng.submit("Once upon a time", n_predict=8).completion().n_generated == 8


# --- signals with slots parked ---

@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_with_slots_parked_ends_the_server_cleanly(start_server, stories_model: Path,
                                                            sig: signal.Signals) -> None:
    # parked for good: the drain runs out after a second and ends them with an error (test_drain.py)
    srv = start_server(stories_model, n_ctx=512, n_parallel=2, extra_args=["--drain-timeout", "1"],
                       env={**FORCED, "LLAMA_SERVER_PREEMPT_HOLD_MS": "600000"})
    streams = streams_held_parked(srv)
    assert srv.proc is not None
    srv.proc.send_signal(sig)
    rc = srv.proc.wait(timeout=30)  # no hang
    assert rc == 0, srv.log_tail()
    logged(srv, "cleaning up before exit")
    for s in streams:
        s.close()


# --- speculative decoding with a draft model ---

def test_a_draft_model_under_forced_swap_parks_gives_the_unparked_output(start_server, stories_model: Path) -> None:
    spec = ["--spec-draft-model", str(stories_model), "--spec-type", "draft-simple", "--spec-draft-n-max", "4"]
    ref = start_server(stories_model, n_ctx=512, n_parallel=2, extra_args=spec)
    want = complete(ref, "Once upon a time", 120).json()
    srv = start_server(stories_model, n_ctx=512, n_parallel=2, extra_args=spec + ["--preempt-ram", "-1"], env=FORCED)
    got = complete(srv, "Once upon a time", 120).json()
    assert got["tokens_predicted"] == 120 and got["content"] == want["content"]
    m = srv.metrics()
    # drafts accept several tokens a step, so a park comes at most every 8 + 4 tokens
    assert m["n_preempt_swap_total"] >= 120 // 12 - 1 and m["n_preempt_swap_total"] == m["n_preempt_total"]
    assert m["spec_decode_num_drafts_total"] > 0  # the draft model drafted across the parks


# --- bad input ---

def test_a_prompt_larger_than_the_pool_is_a_4xx_and_others_carry_on(start_server, stories_model: Path) -> None:
    from concurrent.futures import ThreadPoolExecutor

    srv = start_server(stories_model, n_ctx=256, n_parallel=2)
    with ThreadPoolExecutor(2) as ex:
        ok = ex.submit(complete, srv, "Once upon a time", 100)
        bad = complete(srv, long_prompt(400), 8)
        assert bad.status_code == 400 and bad.json()["error"]["type"] == "exceed_context_size_error"
        assert ok.result().json()["tokens_predicted"] == 100


# 2**40 was taken modulo 2**32 (as if n_predict were 0); every number is now checked where it is
# read (tests/test_numbers.py has them all)
@pytest.mark.parametrize("n_predict, status", [(-5, 400), ("many", 400), (2**31 - 1, 200), (2**40, 400)])
def test_absurd_n_predict_is_refused_or_bounded(start_server, stories_model: Path, n_predict: Any,
                                                status: int) -> None:
    srv = start_server(stories_model, n_ctx=256, n_parallel=2)
    r = srv.post("/completion", {"prompt": "Once upon a time", "n_predict": n_predict, "ignore_eos": True}, timeout=120)
    assert r.status_code == status, r.text
    if status == 200:
        # bounded by the slot's context, not by the number asked for
        assert r.json()["tokens_predicted"] < 256 and r.json()["truncated"] in (True, False)
    assert complete(srv, "Once", 4).json()["tokens_predicted"] == 4


# --- fuzzing the fields and actions we add ---

hypothesis = pytest.importorskip("hypothesis")
st = hypothesis.strategies

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3),
    max_leaves=6)


@pytest.fixture(scope="module")
def fuzz_server(tmp_path_factory: pytest.TempPathFactory, stories_model: Path) -> Any:
    srv = new_server(stories_model, tmp_path_factory.mktemp("fuzz"), n_ctx=384, n_parallel=3).start()
    yield srv
    srv.stop()


@hypothesis.settings(max_examples=60, deadline=None, derandomize=True)
@hypothesis.given(priority=JSON_VALUES, keepalive=JSON_VALUES)
def test_fuzzed_priority_is_a_200_or_a_4xx_never_a_crash(fuzz_server: Any, priority: Any, keepalive: Any) -> None:
    for path in ("/completion", "/v1/chat/completions"):
        body: dict[str, Any] = {"n_predict": 2, "max_tokens": 2, "priority": priority, "sse_ping_interval": keepalive}
        if path == "/completion":
            body["prompt"] = "Once"
        else:
            body["messages"] = [{"role": "user", "content": "hi"}]
        r = fuzz_server.post(path, body, timeout=60)
        assert r.status_code == 200 or 400 <= r.status_code < 500, (priority, r.status_code, r.text[:200])
    assert fuzz_server.proc.poll() is None


@hypothesis.settings(max_examples=80, deadline=None, derandomize=True)
@hypothesis.given(slot=st.one_of(st.integers(-5, 10), st.text(max_size=6)),
                  action=st.sampled_from(["park", "unpark", "PARK", "park ", "", "erase", "x" * 50]) | st.text(max_size=8))
def test_fuzzed_slot_actions_are_a_200_or_a_4xx_never_a_crash(fuzz_server: Any, slot: Any, action: str) -> None:
    r = requests.post(f"{fuzz_server.url}/slots/{requests.utils.quote(str(slot), safe='')}",
                      params={"action": action}, json={}, timeout=60)
    assert r.status_code in (200, 400, 404, 501), (slot, action, r.status_code, r.text[:200])
    assert fuzz_server.proc.poll() is None
    # the server still answers
    assert fuzz_server.get("/health").status_code == 200



# --- memory pressure ---

def test_a_budget_beyond_the_machines_memory_degrades_to_recompute_when_allocation_fails(
        start_server, stories_model: Path) -> None:
    """--preempt-ram 10000000 (about 9.5 TiB) is accepted; when a swap buffer cannot be had, the
    park recomputes instead of failing. The failed allocation is forced with a test knob: capping a
    live server's address space (prlimit) also breaks its other allocations and ends it."""
    huge = ["--preempt-ram", "10000000"]
    ok = start_server(stories_model, n_ctx=512, n_parallel=2, extra_args=huge, env=FORCED)
    assert complete(ok, "Once upon a time", 64).json()["tokens_predicted"] == 64
    assert ok.metrics()["n_preempt_swap_total"] >= 64 // 8 - 1  # the memory was there: swapped
    srv = start_server(stories_model, n_ctx=512, n_parallel=2, extra_args=huge,
                       env={**FORCED, "LLAMA_SERVER_PREEMPT_FAIL_ALLOC": "1"})
    r = complete(srv, "Once upon a time", 64)
    assert r.status_code == 200 and r.json()["tokens_predicted"] == 64
    m = srv.metrics()
    assert m["n_preempt_swap_total"] == 0 and m["n_preempt_recompute_total"] >= 64 // 8 - 1
    logged(srv, "cannot allocate", "recomputing instead")
    assert srv.proc is not None and srv.proc.poll() is None
