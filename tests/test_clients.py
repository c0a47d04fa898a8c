"""What clients and operators see and steer: stream notices with keepalive, request priority,
park/unpark slot actions, the request_preemptions histogram and the timings fields."""
from __future__ import annotations

import json
import re
import threading
from pathlib import Path
from typing import Any

import pytest
import requests

from helpers import (ALL_DECODE, complete, long_prompt, open_raw_stream, run_concurrently, stats_text, wait_for_parked, wait_for_slot,
                     wait_until)
from llama_preempt.engine import Engine, RequestError

FORCED = {"LLAMA_SERVER_PREEMPT_EVERY": "8"}
BODIES: dict[str, dict[str, Any]] = {
    "/completion": {"prompt": "Once upon a time", "n_predict": 48, "temperature": 0, "ignore_eos": True},
    "/v1/completions": {"prompt": "Once upon a time", "max_tokens": 48, "temperature": 0},
    "/v1/chat/completions": {"messages": [{"role": "user", "content": "Tell me a story"}], "max_tokens": 48,
                             "temperature": 0},
}


def comments(lines: list[str]) -> list[str]:
    return [line[2:] for line in lines if line.startswith(": ")]


def data_payloads(path: str, lines: list[str]) -> list[Any]:
    """The data lines, without what legitimately differs between two runs (ids, clocks)."""
    out = []
    for line in lines:
        if not line.startswith("data: "):
            continue
        d = line[6:]
        if d == "[DONE]":
            out.append(d)
            continue
        obj = json.loads(d)
        for k in ("id", "created", "timings", "id_slot", "system_fingerprint"):
            obj.pop(k, None)
        out.append(obj)
    return out


def alternate(notices: list[str]) -> list[str]:
    """preempted/resumed with the keepalives dropped; asserts every keepalive falls inside a park."""
    seq, parked = [], False
    for n in notices:
        if n == "preempt-keepalive":
            assert parked, notices
            continue
        assert n in ("preempted", "resumed"), n
        assert parked == (n == "resumed"), notices  # strictly alternating
        parked = n == "preempted"
        seq.append(n)
    assert not parked, notices
    return seq


# --- streams ---

@pytest.mark.parametrize("path", list(BODIES))
def test_a_streamed_request_hears_of_each_park_and_resume_and_its_data_is_unchanged(
        start_server, stories_model: Path, path: str) -> None:
    ref = start_server(stories_model, n_ctx=512, n_parallel=2)
    srv = start_server(stories_model, n_ctx=512, n_parallel=2, env=FORCED)
    want = list(ref.stream(path, BODIES[path]))
    got = list(srv.stream(path, BODIES[path]))
    assert comments(want) == [] or set(comments(want)) <= {""}
    seq = alternate(comments(got))
    assert len(seq) // 2 == srv.metrics()["n_preempt_total"] >= 48 // 8 - 1
    # SWAP is exact: the data lines are those of the stream that was never parked
    assert data_payloads(path, got) == data_payloads(path, want)


def test_a_long_park_sends_keepalives_while_other_requests_produce_results(start_server, stories_model: Path) -> None:
    srv = start_server(stories_model, n_ctx=512, n_parallel=2, extra_args=["--preempt-keepalive", "1"])
    seen: list[str] = []
    parked = threading.Event()
    keepalive = threading.Event()

    def reader() -> None:
        for line in srv.stream("/completion", {"prompt": "Once upon a time", "n_predict": 120, "temperature": 0,
                                               "ignore_eos": True}):
            seen.append(line)
            if line == ": preempted":
                parked.set()
            if line == ": preempt-keepalive":
                keepalive.set()

    t = threading.Thread(target=reader)
    t.start()
    sid = wait_for_slot(srv, "is_processing", 30)["id"]
    assert srv.post(f"/slots/{sid}?action=park", {}).json()["is_preempted"]
    assert parked.wait(30)

    def keepalive_seen_or_serve() -> bool:
        if keepalive.is_set():
            return True
        assert complete(srv, "There was a dog", 24).status_code == 200
        return False

    # the other slot keeps producing results the whole time the first is parked
    wait_until(keepalive_seen_or_serve, 30, "a keepalive comment while the other slot served requests")
    assert srv.post(f"/slots/{sid}?action=unpark", {}).status_code == 200
    t.join(60)
    assert alternate(comments(seen)) == ["preempted", "resumed"]
    assert "preempt-keepalive" in comments(seen)
    final = json.loads([line for line in seen if line.startswith("data: ")][-1][6:])
    assert final["stop"] and final["tokens_predicted"] == 120


def test_keepalives_can_be_turned_off(start_server, stories_model: Path) -> None:
    srv = start_server(stories_model, n_ctx=512, n_parallel=2, extra_args=["--preempt-keepalive", "0"],
                       env={**FORCED, "LLAMA_SERVER_PREEMPT_HOLD_MS": "1500"})
    lines = list(srv.stream("/completion", BODIES["/completion"]))
    assert "preempt-keepalive" not in comments(lines)
    assert alternate(comments(lines))


def test_a_prompt_that_can_never_fit_gets_an_error_response_not_a_stream(start_server, stories_model: Path) -> None:
    srv = start_server(stories_model, n_ctx=128, n_parallel=2)
    r = requests.post(srv.url + "/completion", json={"prompt": long_prompt(300), "n_predict": 8, "stream": True},
                      timeout=60)
    assert r.status_code == 400 and r.json()["error"]["type"] == "exceed_context_size_error"


def test_a_non_streamed_request_sees_only_the_timings_fields(start_server, stories_model: Path) -> None:
    ref = start_server(stories_model, n_ctx=512, n_parallel=2)
    srv = start_server(stories_model, n_ctx=512, n_parallel=2, env=FORCED)
    want = complete(ref, "Once upon a time", 48).json()
    got = complete(srv, "Once upon a time", 48).json()
    assert got.keys() == want.keys() and got["content"] == want["content"]
    assert got["timings"].keys() == want["timings"].keys()
    assert want["timings"]["n_preempt"] == 0 and want["timings"]["preempted_ms"] == 0
    assert got["timings"]["n_preempt"] >= 48 // 8 - 1 and got["timings"]["preempted_ms"] >= 0


def test_time_parked_is_not_generation_time(start_server, stories_model: Path) -> None:
    srv = start_server(stories_model, n_ctx=512, n_parallel=2, extra_args=["--preempt-keepalive", "1"])
    # t_max_predict_ms below the time parked (over 1 s), yet well above what 200 tokens of this
    # model take to generate on a loaded 2-core machine
    body = {"prompt": "Once upon a time", "n_predict": 200, "temperature": 0, "ignore_eos": True,
            "t_max_predict_ms": 900}
    seen: list[str] = []
    keepalives = threading.Event()

    def reader() -> None:
        for line in srv.stream("/completion", body):
            seen.append(line)
            if comments(seen).count("preempt-keepalive") >= 2:
                keepalives.set()

    t = threading.Thread(target=reader)
    t.start()
    sid = wait_for_slot(srv, "is_processing", 30)["id"]
    assert srv.post(f"/slots/{sid}?action=park", {}).status_code == 200
    assert keepalives.wait(30)  # parked for two keepalive intervals: over 1 s, more than t_max_predict_ms
    assert srv.post(f"/slots/{sid}?action=unpark", {}).status_code == 200
    t.join(60)
    final = json.loads([line for line in seen if line.startswith("data: ")][-1][6:])
    timings = final["timings"]
    assert timings["preempted_ms"] >= 1000
    assert timings["predicted_ms"] < timings["preempted_ms"]
    # t_max_predict_ms (900 ms) did not cut the answer short because it waited parked for over a second
    assert final["tokens_predicted"] == 200 and final["stop_type"] == "limit"


# --- priority ---

def test_a_high_priority_request_is_never_parked_while_a_lower_one_can_be(
        stories_model: Path) -> None:
    with Engine(stories_model, ALL_DECODE, n_ctx=256, n_parallel=4, n_batch=32, kv_unified=True, seed=1,
                n_threads=2) as eng:
        prompts = [long_prompt(6, shift=3 * i) for i in range(4)]
        reqs = [eng.submit(p, n_predict=100, temperature=0, ignore_eos=True, priority=(7 if i == 1 else 0))
                for i, p in enumerate(prompts)]
        reports = eng.run(reqs)
        assert all(r.completion().n_generated == 100 for r in reqs)
        parks = [p for rep in reports for p in rep.parked]
        assert parks, "the load should have overflowed the pool"
        assert all(p.priority == 0 for p in parks)


def test_the_highest_priority_parked_request_is_restored_first(stories_model: Path) -> None:
    with Engine(stories_model, n_ctx=512, n_parallel=3, kv_unified=True, seed=1, n_threads=2) as eng:
        reqs = [eng.submit(f"Once upon a time {i}", n_predict=300, temperature=0, ignore_eos=True, priority=p)
                for i, p in enumerate((0, 3, 1))]
        eng.run(lambda: all(s.n_decoded > 0 for s in eng.stats().slots))
        by_prio = {s.id: s.priority for s in eng.stats().slots}
        assert sorted(by_prio.values()) == [0, 1, 3]
        for sid in sorted(by_prio, key=lambda i: by_prio[i]):
            eng.park(sid)
        # unparked together, lowest priority first: the one step that takes the three actions
        # resumes them in priority order
        for sid in sorted(by_prio, key=lambda i: by_prio[i]):
            eng.submit(path=f"/slots/{sid}?action=unpark", body={})  # returns once queued; nothing steps
        rep = eng.step()
        assert [by_prio[r.slot] for r in rep.resumed] == [3, 1, 0]
        eng.run(reqs)
        assert all(r.completion().n_generated == 300 for r in reqs)


# --- park / unpark ---

def test_park_and_unpark_round_trip_and_the_answer_is_still_complete_and_exact(start_server, stories_model: Path) -> None:
    # the reference on a server of its own, the request alone on each: the same batches and the same
    # cells, on any device (asked twice of one server, the second could take other cells, which a
    # GPU's kernels may sum in other groups)
    want = complete(start_server(stories_model, n_ctx=512, n_parallel=2), "Once upon a time", 150).json()["content"]
    srv = start_server(stories_model, n_ctx=512, n_parallel=2)
    got: dict[str, Any] = {}

    def client() -> None:
        got.update(complete(srv, "Once upon a time", 150, cache_prompt=False).json())

    t = threading.Thread(target=client)
    t.start()
    sid = wait_for_slot(srv, "is_processing", 30)["id"]
    parked = srv.post(f"/slots/{sid}?action=park", {})
    assert parked.status_code == 200, parked.text
    assert parked.json()["preempt_mode"] == "swap"
    slot = next(s for s in srv.slots() if s["id"] == sid)
    assert slot["is_preempted"] and slot["parked_by"] == "api" and slot["state"] == "preempted"
    # the planner leaves it parked: nothing else runs, yet it stays put
    assert srv.metrics()["n_resume_total"] == 0
    assert srv.post(f"/slots/{sid}?action=unpark", {}).status_code == 200
    t.join(60)
    assert got["tokens_predicted"] == 150 and got["content"] == want
    assert got["timings"]["n_preempt"] == 1


def test_a_slot_parked_through_the_api_never_holds_back_new_requests(start_server, stories_model: Path) -> None:
    # issue 64: with one request parked by the API (it waits for its unpark) and another running,
    # three new short requests start and finish while the running one still runs; before, they
    # were held until nothing ran, as if the API-parked slot waited for room
    srv = start_server(stories_model, n_ctx=4096, n_parallel=6)
    parked_done: dict[str, Any] = {}
    held = threading.Thread(target=lambda: parked_done.update(complete(srv, "Once upon a time", 200).json()))
    held.start()
    parked_id = wait_for_slot(srv, "is_processing", 30)["id"]
    assert srv.post(f"/slots/{parked_id}?action=park", {}).status_code == 200
    running = threading.Thread(target=lambda: complete(srv, "There was a dog", 3000))
    running.start()
    running_id = wait_until(lambda: next((s["id"] for s in srv.slots() if s["is_processing"] and not s["is_preempted"]), None),
                            30, "the second request running")
    shorts = run_concurrently([lambda p=p: complete(srv, p, 8) for p in ("The cat", "A bird", "Tom had")])
    assert [r.json()["tokens_predicted"] for r in shorts] == [8, 8, 8]
    # the running one has not finished: the three did not wait for it
    slot = next(s for s in srv.slots() if s["id"] == running_id)
    assert slot["is_processing"], "the three short requests waited until the running one had finished"
    assert next(s for s in srv.slots() if s["id"] == parked_id)["is_preempted"]
    assert srv.metrics()["n_resume_total"] == 0
    assert srv.post(f"/slots/{parked_id}?action=unpark", {}).status_code == 200
    held.join(120)
    running.join(120)
    assert parked_done["tokens_predicted"] == 200


def test_the_slot_actions_errors(start_server, stories_model: Path) -> None:
    srv = start_server(stories_model, n_ctx=512, n_parallel=2)

    def act(slot: Any, action: str) -> requests.Response:
        return srv.post(f"/slots/{slot}?action={action}", {})

    def error(r: requests.Response, code: int, text: str) -> None:
        assert r.status_code == code, r.text
        assert text in r.json()["error"]["message"]

    error(act(0, "park"), 400, "is idle")
    error(act(0, "unpark"), 400, "is not parked")
    error(act(7, "park"), 400, "no slot 7")
    error(act("x", "park"), 400, "Invalid slot ID")
    # a slot of an n_cmpl family is parked like any other once its prompt is in every choice's
    # cells (before that, while a choice waits for the prompt, it is a 400 naming n_cmpl)
    out: dict[str, requests.Response] = {}
    t = threading.Thread(target=lambda: out.setdefault("r", complete(srv, "Once upon a time", 300, n_cmpl=2)))
    t.start()
    sid = wait_for_slot(srv, "is_processing", 30)["id"]
    wait_until(lambda: act(sid, "park").status_code == 200 or None, 30, "a choice of the family to be parked")
    wait_for_parked(srv, 30)
    assert act(sid, "unpark").status_code == 200
    t.join(60)
    choices = out["r"].json()
    assert out["r"].status_code == 200 and [c["tokens_predicted"] for c in choices] == [300, 300]
    # a slot the planner parked is not the API's to unpark
    held = start_server(stories_model, n_ctx=512, n_parallel=2,
                        env={**FORCED, "LLAMA_SERVER_PREEMPT_HOLD_MS": "600000"})
    with requests.post(held.url + "/completion", json={**BODIES["/completion"], "stream": True}, stream=True, timeout=60):
        sid = wait_for_parked(held, 30)["id"]
        assert next(s for s in held.slots() if s["id"] == sid)["parked_by"] == "forced"
        error(held.post(f"/slots/{sid}?action=unpark", {}), 400, "parked by the forced")
        error(held.post(f"/slots/{sid}?action=park", {}), 400, "already parked")
    # preemption off
    off = start_server(stories_model, n_ctx=512, n_parallel=2, preempt=False)
    error(off.post("/slots/0?action=park", {}), 400, "preemption is off")


def test_engine_park_unpark_and_priority(stories_model: Path) -> None:
    with Engine(stories_model, n_ctx=512, n_parallel=2, kv_unified=True, n_threads=2) as eng:
        req = eng.submit("Once upon a time", n_predict=100, temperature=0, ignore_eos=True, priority=2)
        eng.run(lambda: any(s.n_decoded > 0 for s in eng.stats().slots))
        sid = next(s.id for s in eng.stats().slots if s.is_processing)
        assert eng.park(sid)["is_preempted"]
        assert eng.stats().parked()[0].id == sid
        for _ in range(20):  # the planner leaves it parked
            assert not eng.step().resumed
        with pytest.raises(RequestError, match="already parked"):
            eng.park(sid)
        eng.unpark(sid)
        assert req.completion().n_generated == 100


# --- the histogram ---

def test_the_histogram_counts_every_finished_request_by_its_parks(start_server, stories_model: Path) -> None:
    srv = start_server(stories_model, n_ctx=256, n_parallel=4, n_batch=32)
    prompts = [long_prompt(6, shift=3 * i) for i in range(4)] + ["Once upon a time"]
    res = [r.json() for r in run_concurrently([lambda p=p: complete(srv, p, 100) for p in prompts])]
    h = srv.metrics().histograms["request_preemptions"]
    assert h.count == len(prompts)
    per_response = [r["timings"]["n_preempt"] for r in res]
    assert h.sum == sum(per_response)
    bounds = [0, 1, 2, 3, 5, 10, 20]
    expected: dict[str, int] = {}
    for le in bounds:
        expected[str(le)] = sum(1 for n in per_response if n <= le)
    expected["+Inf"] = len(per_response)
    assert h.buckets == expected


def test_a_request_parked_before_it_started_opens_its_stream_with_the_notice(stories_model: Path) -> None:
    with Engine(stories_model, n_ctx=512, n_parallel=2, kv_unified=True, n_threads=2) as eng:
        req = eng.submit("Once upon a time", n_predict=40, temperature=0, ignore_eos=True, stream=True)
        # queued behind it, before any step: the request takes a slot and is parked before its prompt
        parks = [eng.submit(path=f"/slots/{i}?action=park", body={}) for i in range(2)]
        eng.step()
        answers = []
        for p in parks:
            try:
                answers.append(p.result())
            except RequestError as e:
                assert "is idle" in e.message
        assert len(answers) == 1
        sid = answers[0]["id_slot"]
        chunks = req.sse()
        first = next(chunks)
        assert first == ": preempted\n\n"  # the stream is open: headers went out with the notice
        eng.unpark(sid)
        rest = list(chunks)
        lines = [line for c in [first, *rest] for line in c.splitlines() if line]
        assert alternate(comments(lines)) == ["preempted", "resumed"]
        data = [json.loads(line[6:]) for line in lines if line.startswith("data: ")]
        assert data[-1]["stop"] and data[-1]["tokens_predicted"] == 40
        assert "data: null" not in lines and all(isinstance(d, dict) for d in data)


# --- client errors and the time parked, as a client and an operator see them ---

@pytest.mark.parametrize("path", ["/completion", "/v1/chat/completions"])
def test_a_body_that_is_not_json_is_a_400_with_a_short_message(start_server, stories_model: Path, path: str) -> None:
    srv = start_server(stories_model, n_ctx=256, n_parallel=1)
    r = requests.post(srv.url + path, data=b'{"prompt": "Once", n_predict: 4', timeout=30,
                      headers={"Content-Type": "application/json"})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error"
    assert err["message"] == ("the request body is not valid JSON: parse error at line 1, column 21: "
                              "syntax error while parsing object key")
    assert complete(srv, "Once", 4).json()["tokens_predicted"] == 4  # nothing else lost


def test_an_unknown_slot_action_is_a_400_naming_the_valid_ones(start_server, stories_model: Path) -> None:
    srv = start_server(stories_model, n_ctx=256, n_parallel=1)  # no --slot-save-path: still the client's error
    r = srv.post("/slots/0?action=foo", {})
    assert r.status_code == 400, r.text
    msg = r.json()["error"]["message"]
    assert "'foo'" in msg and all(a in msg for a in ("park", "unpark", "save", "restore", "erase"))
    # the save actions still say what they need
    assert srv.post("/slots/0?action=save", {"filename": "x.bin"}).status_code == 501


def test_the_time_parked_grows_while_the_slot_is_parked(start_server, stories_model: Path) -> None:
    srv = start_server(stories_model, n_ctx=512, n_parallel=2,
                       env={"LLAMA_SERVER_PREEMPT_EVERY": "8", "LLAMA_SERVER_PREEMPT_HOLD_MS": "600000"})
    sock = open_raw_stream(srv, "Once upon a time", 400)
    try:
        first = wait_for_parked(srv)
        # the clock runs while it waits
        later = wait_until(lambda: next((s for s in srv.slots() if s["id"] == first["id"] and
                                         s["t_preempted_ms"] > first["t_preempted_ms"] + 50), None), 30,
                           "the time parked to grow by 50 ms")
        assert later["is_preempted"] and later["n_preempt"] == 1  # still the same park
        # the operator's view shows it too
        row = next(line for line in stats_text(srv.url).splitlines() if "parked" in line and "swap" in line)
        assert re.search(r"\d+\.\d s\s*│?\s*$", row.rstrip()), row
    finally:
        sock.close()
