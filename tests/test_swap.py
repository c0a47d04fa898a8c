"""SWAP under a host-RAM budget, RECOMPUTE above it (stories260K)."""
from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from helpers import (complete, complete_all, logged, long_prompt, n_tokens, open_raw_stream, sse_events,
                     wait_for_parked, wait_until, wait_until_nothing_held)
from llama_preempt import Completion

FORCED = {"LLAMA_SERVER_PREEMPT_EVERY": "8"}


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("endpoint", ["/completion", "/v1/chat/completions"])
def test_forced_parks_under_the_default_budget_are_swaps_and_byte_identical(
        start_server, stories_model: Path, endpoint: str, stream: bool) -> None:
    if endpoint == "/completion":
        body: dict[str, Any] = {"prompt": "Once upon a time", "n_predict": 64, "temperature": 0,
                                "ignore_eos": True}
    else:
        body = {"messages": [{"role": "user", "content": "Tell me a story about a red ball"}],
                "max_tokens": 64, "temperature": 0}
    ref_srv = start_server(stories_model, n_ctx=512, n_parallel=2, preempt=False)
    ref = Completion.from_response(ref_srv.post(endpoint, body).json()).text
    assert ref

    srv = start_server(stories_model, n_ctx=512, n_parallel=2, env=FORCED)
    if stream:
        events = sse_events(list(srv.stream(endpoint, body)))
        got = Completion.from_stream([e for e in events if isinstance(e, dict)]).text
    else:
        r = srv.post(endpoint, body)
        assert r.status_code == 200, r.text
        got = Completion.from_response(r.json()).text
    assert got == ref
    m = srv.metrics()
    assert m["n_preempt_total"] >= 6
    assert m["n_preempt_swap_total"] == m["n_preempt_total"]
    assert m["n_preempt_recompute_total"] == 0
    assert m["n_recompute_tokens_total"] == 0
    assert m["n_resume_total"] == m["n_preempt_total"]
    assert m["preempt_ram_bytes"] == 0
    logged(srv, "parked by swap")
    logged(srv, "restored by swap")


def test_preempt_ram_zero_always_recomputes_and_overflowing_requests_finish(
        start_server, stories_model: Path) -> None:
    srv = start_server(stories_model, n_ctx=256, n_parallel=2, n_batch=64, extra_args=["--preempt-ram", "0"])
    logged(srv, "RECOMPUTE only (--preempt-ram 0)")
    complete_all(srv, [long_prompt(12), "Once upon a time there was a dog"], 200)
    m = srv.metrics()
    assert m["n_preempt_total"] >= 1
    assert m["n_preempt_recompute_total"] == m["n_preempt_total"]
    assert m["n_preempt_swap_total"] == 0


def test_a_budget_that_holds_one_sequence_but_not_two_parks_both_ways(
        start_server, stories_model: Path) -> None:
    # f32 cells: 5 layers x 2 x 4 heads x 8 dims x 4 bytes = 1280 bytes per token, so one
    # sequence of a few hundred tokens fits a 1 MiB budget and two do not
    budget = 1 << 20
    srv = start_server(stories_model, n_ctx=1024, n_parallel=3, n_batch=128,
                       extra_args=["--preempt-ram", "1", "-ctk", "f32", "-ctv", "f32"])
    prompts = [long_prompt(250, shift=k) for k in (0, 5, 11)]
    for p in prompts:
        assert 300 < n_tokens(srv, p) < 450
    ram_seen: list[float] = []
    with ThreadPoolExecutor(max_workers=3) as ex:
        futures = [ex.submit(complete, srv, p, 300) for p in prompts]

        def done_or_sample() -> bool:
            if all(f.done() for f in futures):
                return True
            ram_seen.append(srv.metrics()["preempt_ram_bytes"])
            return False

        wait_until(done_or_sample, 300, "the three requests to finish", interval_s=0)
        results = [f.result() for f in futures]
    for r in results:
        assert r.status_code == 200, r.text
        assert r.json()["tokens_predicted"] == 300
    m = srv.metrics()
    assert m["n_preempt_swap_total"] >= 1
    assert m["n_preempt_recompute_total"] >= 1
    assert max(ram_seen) <= budget
    assert m["preempt_ram_bytes"] == 0


@pytest.mark.parametrize("route", ["bulk", "graph", "slice"])
def test_a_failed_restore_falls_back_to_recompute_and_the_request_finishes(
        start_server, stories_model: Path, route: str) -> None:
    # every copy route: the bulk copy (memcpy of host tensors, device graphs on a GPU), the device
    # path's gather graphs, upstream's per-slice copy
    ref_srv = start_server(stories_model, n_ctx=512, n_parallel=2, preempt=False)
    ref = complete(ref_srv, "Once upon a time", 64).json()
    srv = start_server(stories_model, n_ctx=512, n_parallel=2,
                       env={**FORCED, "LLAMA_SERVER_PREEMPT_FAIL_RESTORE": "1", "LLAMA_SERVER_PREEMPT_COPY": route})
    r = complete(srv, "Once upon a time", 64)
    assert r.status_code == 200, r.text
    assert r.json()["tokens_predicted"] == 64
    m = srv.metrics()
    assert m["n_preempt_swap_total"] >= 1
    assert m["n_swap_restore_fail_total"] == m["n_preempt_swap_total"]
    assert m["n_recompute_tokens_total"] > 0
    assert m["preempt_ram_bytes"] == 0
    logged(srv, "falling back to recompute")
    print(f"fallback output identical to the unforced one: {r.json()['content'] == ref['content']}")


@pytest.mark.parametrize("in_flight", [False, True], ids=["copied", "copy-in-flight"])
def test_cancelling_a_parked_streaming_request_frees_its_host_ram(start_server, stories_model: Path,
                                                                  in_flight: bool) -> None:
    # copy-in-flight: the swap copy of each park counts as still running for a minute (on a device
    # the transfer to host RAM runs on while the next decode computes), and the request is cancelled
    # then: the server waits for the copy and frees everything
    env = {**FORCED, "LLAMA_SERVER_PREEMPT_HOLD_MS": "60000"}
    if in_flight:
        env["LLAMA_SERVER_PREEMPT_COPY_HOLD_MS"] = "60000"
    srv = start_server(stories_model, n_ctx=512, n_parallel=2, env=env, extra_args=["--preempt-mode", "swap"])
    sock = open_raw_stream(srv, "Once upon a time", 400)
    parked = wait_for_parked(srv, timeout=30)
    assert parked["preempt_mode"] == "swap"
    assert parked["preempt_ram_bytes"] > 0
    assert parked["preempt_copy_in_flight"] is in_flight
    m = srv.metrics()
    assert m["preempt_ram_bytes"] == parked["preempt_ram_bytes"]
    assert m["preempt_copies_in_flight"] == (1 if in_flight else 0)

    sock.close()  # the client goes away while its slot is parked

    m = wait_until_nothing_held(srv)
    assert m["preempt_ram_bytes"] == 0
    assert m["preempt_copies_in_flight"] == 0
    assert m["requests_preempted"] == 0
    assert not any(s["is_processing"] for s in srv.slots())
    # the server is still serving
    assert complete(srv, "Once", 8).json()["tokens_predicted"] == 8


@pytest.mark.parametrize("value", ["-2", "abc", "lots", "1.5", "12MiB", "99999999999", ""])
def test_an_invalid_preempt_ram_is_a_startup_error_naming_the_flag(
        start_server, stories_model: Path, value: str) -> None:
    from llama_preempt.server import ServerStartError

    with pytest.raises(ServerStartError, match="--preempt-ram") as e:
        start_server(stories_model, n_ctx=256, n_parallel=2, extra_args=["--preempt-ram", value])
    # the binary exited (not "not ready after ...") with a failure status
    assert re.match(r"llama-server exited with -?[1-9]", str(e.value)), e.value


def test_preempt_ram_comes_from_the_environment(start_server, stories_model: Path) -> None:
    srv = start_server(stories_model, n_ctx=256, n_parallel=2, env={"LLAMA_ARG_PREEMPT_RAM": "-1"})
    logged(srv, "SWAP or RECOMPUTE by measured cost, host RAM with no limit")


YES_NO = 'root ::= ("yes" | "no") (", " ("yes" | "no"))*'


@pytest.mark.parametrize("sampling", [
    {"temperature": 1.0, "seed": 7},                                    # the RNG carries on
    {"temperature": 0, "repeat_penalty": 1.5, "repeat_last_n": 64},     # the penalty history carries on
    {"temperature": 0.8, "seed": 3, "grammar": YES_NO},                 # the grammar state carries on
], ids=["rng", "penalties", "grammar"])
def test_the_sampler_state_carries_across_swap_parks(start_server, stories_model: Path,
                                                      sampling: dict[str, Any]) -> None:
    body = {"prompt": "Once upon a time", "n_predict": 64, "ignore_eos": True, **sampling}
    ref_srv = start_server(stories_model, n_ctx=512, n_parallel=2, preempt=False)
    ref = ref_srv.post("/completion", body).json()
    srv = start_server(stories_model, n_ctx=512, n_parallel=2, env=FORCED)
    got = srv.post("/completion", body).json()
    assert srv.metrics()["n_preempt_swap_total"] >= 6
    assert got["content"] == ref["content"]


def test_a_grammar_stays_satisfied_across_recompute_parks(start_server, stories_model: Path) -> None:
    import re

    srv = start_server(stories_model, n_ctx=512, n_parallel=2, extra_args=["--preempt-ram", "0"], env=FORCED)
    r = srv.post("/completion", {"prompt": "Answer:", "n_predict": 48, "temperature": 0.8, "seed": 5,
                                 "grammar": YES_NO, "ignore_eos": True})
    assert r.status_code == 200, r.text
    text = r.json()["content"]
    assert srv.metrics()["n_preempt_recompute_total"] >= 4
    # every prefix the grammar allows: whole answers, then possibly a cut-off separator or word
    assert re.fullmatch(r"(yes|no)(, (yes|no))*(,? ?|, (y|ye|n))?", text), text
