"""One host budget for all KV that leaves the device (--host-kv-ram): parked slots and upstream's
prompt cache together, parked slots first.

Under a unified pool upstream's prompt cache receives every idle slot's cells as soon as another
slot starts work; parked slots' states are requests in flight. With one budget the cache gets what
the parked slots leave, and its least recently used prompts give way when a park needs the room;
a park never gives way to the cache.
"""
from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from helpers import complete, logged, long_prompt, wait_for_slot, wait_until

BUDGET = 1 << 20  # --host-kv-ram 1: about 1600 tokens of stories260K's KV


def held(m: Any) -> int:
    """Host bytes of KV off the device now: parked slots' states and cached prompts."""
    return m["preempt_ram_bytes"] + m["prompt_cache_bytes"]


def fill_the_prompt_cache(srv: Any) -> Any:
    # each new request saves the idle slots' cells into the cache: 8 prompts of ~150 tokens each
    # are more than the budget holds, so the cache fills it and drops its oldest
    for i in range(8):
        assert complete(srv, long_prompt(120, shift=7 * i), 4).status_code == 200
    m = srv.metrics()
    assert m["prompt_cache_bytes"] > BUDGET // 2, m["prompt_cache_bytes"]
    assert held(m) <= BUDGET
    return m


def test_the_defaults_make_one_budget_of_the_larger_cap_and_props_says_it(start_server, stories_model: Path) -> None:
    srv = start_server(stories_model, n_ctx=256, n_parallel=2)
    assert srv.metrics()["preempt_host_budget_bytes"] == 8192 << 20  # --preempt-ram 8192, --cache-ram 8192: 8 GiB, not 16
    assert srv.get("/props").json()["llama_preempt"]["host_kv_ram_mib"] == 8192
    logged(srv, "one host budget for KV off the device (--host-kv-ram): 8192 MiB")
    unlimited = start_server(stories_model, n_ctx=256, n_parallel=2, extra_args=["--preempt-ram", "-1"])
    assert unlimited.metrics()["preempt_host_budget_bytes"] == 0  # 0: no limit
    assert unlimited.get("/props").json()["llama_preempt"]["host_kv_ram_mib"] == -1


def test_a_park_displaces_cached_prompts_and_a_cached_prompt_never_displaces_a_park(start_server, stories_model: Path) -> None:
    srv = start_server(stories_model, n_ctx=2048, n_parallel=3, extra_args=["--host-kv-ram", "1", "--preempt-mode", "swap"])
    before = fill_the_prompt_cache(srv)

    # a long request, parked through the API while it generates: its state needs room the cache holds
    out: list[Any] = []
    body = {"prompt": long_prompt(300), "n_predict": 1000, "temperature": 0, "ignore_eos": True}
    t = threading.Thread(target=lambda: out.append(srv.post("/completion", body, timeout=120)))
    t.start()
    sid = wait_for_slot(srv, "is_processing", 60)["id"]
    parked = srv.post(f"/slots/{sid}?action=park", {}).json()
    assert parked["is_preempted"] and parked["preempt_mode"] == "swap"  # the cache gave way, not the park
    slot = next(s for s in srv.slots() if s["id"] == sid)
    assert slot["preempt_tier"] == "ram" and slot["preempt_ram_bytes"] > 0
    m = srv.metrics()
    assert m["n_prompt_cache_evicted_total"] >= 1
    assert m["preempt_ram_bytes"] > 0 and m["prompt_cache_bytes"] < before["prompt_cache_bytes"]
    assert held(m) <= BUDGET

    # while it is parked, more chat turns want the cache: it takes only what the park leaves
    for i in range(3):
        assert complete(srv, long_prompt(120, shift=100 + i), 4).status_code == 200
        m = srv.metrics()
        assert m["preempt_ram_bytes"] == slot["preempt_ram_bytes"]  # the park kept all of its state
        assert held(m) <= BUDGET
    assert srv.post(f"/slots/{sid}?action=unpark", {}).status_code == 200
    t.join(120)
    assert out and out[0].status_code == 200 and out[0].json()["tokens_predicted"] == 1000
    m = srv.metrics()
    assert m["n_preempt_swap_total"] == m["n_preempt_total"] == 1 and m["n_resume_total"] == 1


@pytest.mark.parametrize("cache_mib", ["8192", "0"], ids=["with-cache", "no-cache"])
def test_the_budget_holds_under_a_mixed_load_of_parks_and_chat_turns(start_server, stories_model: Path, cache_mib: str) -> None:
    srv = start_server(stories_model, n_ctx=2048, n_parallel=4, env={"LLAMA_SERVER_PREEMPT_EVERY": "8"},
                       extra_args=["--host-kv-ram", "1", "--preempt-mode", "swap", "--cache-ram", cache_mib])
    seen: list[int] = []
    cached: list[int] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            m = srv.metrics()
            seen.append(held(m))
            cached.append(m["prompt_cache_bytes"])

    w = threading.Thread(target=watch)
    w.start()
    try:
        def turns(i: int) -> None:
            for j in range(3):  # a chat: each turn resends the conversation
                assert complete(srv, long_prompt(150 + 100 * j, shift=i), 24).status_code == 200

        threads = [threading.Thread(target=turns, args=(i,)) for i in range(4)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(300)
    finally:
        stop.set()
        w.join()
    m = srv.metrics()
    assert m["n_preempt_total"] >= 8 and m["n_resume_total"] == m["n_preempt_total"]
    assert len(seen) > 10 and max(seen) <= BUDGET, max(seen)
    if cache_mib == "0":
        assert m["prompt_cache_bytes"] == 0
    else:
        # the cache took part: prompts were cached beside the parks (how much the sampler catches at
        # its peak depends on timing, so the test does not ask for a fraction of the budget)
        assert max(cached) > 0 or m["prompt_cache_bytes"] > 0
    logged(srv, "one host budget")


@pytest.mark.parametrize("value", ["-2", "x", "1.5"])
def test_a_bad_host_kv_ram_is_refused_naming_the_flag(stories_model: Path, value: str) -> None:
    import subprocess

    from llama_preempt.binary import server_binary

    p = subprocess.run([str(server_binary()), "-m", str(stories_model), "--host-kv-ram", value], capture_output=True,
                       text=True, timeout=60)
    assert p.returncode != 0 and "--host-kv-ram expects -1 (no limit) or a size in MiB >= 0" in p.stderr
