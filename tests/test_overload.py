"""Overload, live: who decodes when more slots generate than pay for themselves, and a request that
is cancelled stops at once (the real server and the in-process Engine on stories260K)."""
from __future__ import annotations

import json
import socket
import threading
import time
from pathlib import Path

from helpers import ON_THE_CPU, WORDS, long_prompt, wait_until
from llama_preempt.engine import Engine


def test_an_engine_request_cancelled_is_off_its_slot_at_the_next_step(stories_model: Path) -> None:
    with Engine(stories_model, n_ctx=1024, n_parallel=2, kv_unified=True, n_batch=64) as eng:
        req = eng.submit(long_prompt(20), n_predict=900, temperature=0, ignore_eos=True, cache_prompt=False)
        other = eng.submit(long_prompt(24, shift=3), n_predict=40, temperature=0, ignore_eos=True, cache_prompt=False)
        n_generated = 0
        while n_generated < 10:  # stepping by hand: the request is generating
            n_generated += eng.step().n_generated
        # its handler is woken at once and lets go within the wait (a handler that checked only at
        # its 1 s poll would mostly still hold it), with no step run meanwhile
        req.cancel(wait=0.5)
        assert req.done() and req.cancelled()
        rep = eng.step()
        # the very next step ends it, and decodes nothing more for it
        assert len(rep.cancelled) == 1
        busy = [s for s in eng.stats().slots if s.is_processing]
        assert len(busy) == 1, busy  # only the other request still holds a slot
        assert other.completion(timeout=60).n_generated == 40


def test_a_client_that_closes_its_connection_frees_its_slot_within_a_step_or_two(start_server, stories_model: Path) -> None:
    """A non-streamed request tells the server nothing until it answers: the server finds the
    closed connection when the request's handler checks it, which it now does every step (it was
    once a second, during which the slot went on decoding). On the CPU on every build: the bound
    counts steps, and the handlers are woken at most every 10 ms, so it holds where a step takes over
    0.2 ms, as stories260K's do on a CPU; on a GPU one takes a fraction of a millisecond (and 500
    tokens well under a second, so not even a handler that looked once a second would be caught)."""
    srv = start_server(stories_model, n_ctx=1024, n_parallel=1, kv_unified=True, n_batch=64, extra_args=ON_THE_CPU)
    body = json.dumps({"prompt": long_prompt(8), "n_predict": 500, "temperature": 0, "ignore_eos": True,
                       "cache_prompt": False}).encode()
    sock = socket.create_connection((srv.host, srv.port), timeout=60)
    sock.sendall(b"POST /completion HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                 b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    wait_until(lambda: any(s["is_processing"] for s in srv.slots()), 60, "the request in its slot")
    sock.close()
    decodes_at_close = srv.metrics()["n_decode_total"]  # read after the close: the count then, or later
    m = wait_until(lambda: (lambda m: m if m["requests_processing"] == 0 else None)(srv.metrics()), 30,
                   "the slot freed")
    # 500 tokens at a step each: a handler that looked only once a second would let it run to the end.
    # The handlers are woken at most every 10 ms: within two wakes (the close can land just after one)
    # at stories260K's steps of 0.2 ms or more, that is at most 100 steps (a CI run saw 54)
    assert m["n_decode_total"] - decodes_at_close <= 100
    assert m["tokens_predicted_total"] < 400


def test_under_overload_the_first_to_arrive_finishes_before_later_requests_of_the_same_length(
        start_server, stories_model: Path) -> None:
    # one slot decodes at a time (width=1): the rest keep their cells, paused, and /slots says so
    srv = start_server(stories_model, n_ctx=2048, n_parallel=4, kv_unified=True, n_batch=64,
                       extra_args=["--preempt-sched", "width=1"])
    done: dict[int, float] = {}

    def one(i: int) -> None:
        r = srv.post("/completion", {"prompt": " ".join(WORDS[(i * 7 + k) % len(WORDS)] for k in range(24)),
                                     "n_predict": 150, "temperature": 0, "ignore_eos": True, "cache_prompt": False})
        assert r.status_code == 200 and r.json()["tokens_predicted"] == 150
        done[i] = time.monotonic()

    threads = []
    for i in range(4):
        threads.append(threading.Thread(target=one, args=(i,)))
        threads[-1].start()
        # the next one arrives once this one holds its slot
        wait_until(lambda: sum(s["is_processing"] for s in srv.slots()) > i, 30, f"request {i} in a slot")
    wait_until(lambda: any(s.get("is_paused") for s in srv.slots()), 30, "a paused slot")
    for t in threads:
        t.join()
    assert sorted(done, key=done.get) == [0, 1, 2, 3]
    m = srv.metrics()
    assert m["preempt_decode_width"] <= 1 and m["n_preempt_total"] == 0
