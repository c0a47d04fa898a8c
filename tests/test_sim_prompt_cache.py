"""The simulator's prompt cache: a multi-turn chat workload, upstream's RAM cache and the disk tier
under one host budget (csrc/sim/preempt-sim-cache.cpp, preempt-sim-prompts.cpp). That the live server makes the same
choices is tests/test_trace.py's; here, what a user of `simulate` relies on: the workload, the
figures, the flags."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import run_cli
from llama_preempt.fleet import simulate_fleet
from llama_preempt.simulator import Workload, WorkloadError, simulate

# bench/prompt_cache.py's shape: six users, one client asking for each in turn; each state about
# 17-20 MiB of SmolLM2 cells, so a 64 MiB cache keeps three conversations, not six
CHAT = dict(system=300, first=400, turn=20, gen=24, one_client=True)
SERVER = dict(n_ctx=8192, n_parallel=2)


def test_a_chat_workload_resends_each_conversation_and_follows_its_answers() -> None:
    wl = Workload.chat(3, 2, system=10, first=5, turn=2, gen=4)
    assert wl.n_prompt == (17, 17, 17, 23, 23, 23)  # a later turn: the earlier prompt, its answer, the new tokens
    assert wl.conversation == (0, 1, 2, 0, 1, 2)
    assert wl.after == (-1, -1, -1, 0, 1, 2)  # each user's next turn follows its own answer
    assert Workload.chat(3, 2, one_client=True).after == (-1, 0, 1, 2, 3, 4)
    assert wl.has_chats and not Workload.synthetic(3).has_chats


def test_a_chat_workload_round_trips_through_jsonl(tmp_path: Path) -> None:
    wl = Workload.chat(2, 3, system=50, first=20, turn=5, gen=8, think_s=1.5)
    f = tmp_path / "chat.jsonl"
    wl.to_jsonl(f)
    assert json.loads(f.read_text().splitlines()[2]) == {"t": 1.5, "prompt_tokens": 88, "max_tokens": 8,
                                                         "conversation": 0, "shared_tokens": 50, "after": 0}
    assert Workload.from_jsonl(f) == wl


def test_a_workload_that_follows_a_later_request_is_refused(tmp_path: Path) -> None:
    with pytest.raises(WorkloadError, match="earlier"):
        Workload((0.0, 0.0), (10, 10), (5, 5), (0, 0), (0, 0), (1, -1))
    f = tmp_path / "bad.jsonl"
    f.write_text('{"prompt_tokens": 5, "max_tokens": 5, "after": 0}\n')
    with pytest.raises(WorkloadError, match=r"bad.jsonl:1: .*after"):
        Workload.from_jsonl(f)


def test_returning_turns_reuse_their_conversation_when_the_cache_holds_it() -> None:
    wl = Workload.chat(6, 4, **CHAT)
    none = simulate(wl, **SERVER, cache_ram_mib=0)
    ram = simulate(wl, **SERVER, cache_ram_mib=-1)
    returning = sum(wl.n_prompt[6:])
    # without a cache a returning turn keeps what its slot holds: the system prompt
    assert none.prompt_tokens_computed == sum(wl.n_prompt) - 300 * 23
    assert ram.prompt_cache_ram_hits == 18  # every returning turn
    assert ram.prompt_tokens_computed < none.prompt_tokens_computed - returning // 2
    assert ram.makespan_s < none.makespan_s
    assert {q["cached_from"] for q in ram.per_request[6:]} == {"ram"}


def test_a_small_cache_spills_to_disk_and_the_turns_come_back_from_their_files() -> None:
    wl = Workload.chat(6, 4, **CHAT)
    small = simulate(wl, **SERVER, cache_ram_mib=64, host_kv_ram_mib=64)
    disk = simulate(wl, **SERVER, cache_ram_mib=64, host_kv_ram_mib=64, preempt_disk_mib=-1)
    assert small.prompt_cache_ram_hits == 0 and small.prompt_cache_disk_hits == 0  # three of six fit
    assert disk.prompt_cache_spilled > 0 and disk.prompt_cache_disk_hits == 18
    assert disk.prompt_tokens_computed < small.prompt_tokens_computed
    assert disk.peak_cache_mib <= 64


def test_a_prompt_larger_than_the_whole_cache_is_streamed_to_disk_and_back_into_its_slot() -> None:
    # upstream's RAM cache skips a prompt larger than itself; with a disk tier it is streamed from its
    # slot to a file instead (issue 41), and the user's next turn streams it straight back into a slot
    wl = Workload.chat(6, 4, **CHAT)
    ram_only = simulate(wl, **SERVER, cache_ram_mib=8, host_kv_ram_mib=8)
    big = simulate(wl, **SERVER, cache_ram_mib=8, host_kv_ram_mib=8, preempt_disk_mib=-1)
    assert ram_only.prompt_cache_spilled == ram_only.prompt_cache_disk_hits == ram_only.prompt_cache_ram_hits == 0
    assert big.prompt_cache_streamed == big.prompt_cache_spilled > 0
    # every later turn of the six users (three each after their first) came back from its file
    assert big.prompt_cache_streamed_back == big.prompt_cache_disk_hits == 18
    assert big.peak_cache_mib == 0  # none of it ever sat in the RAM cache
    assert big.prompt_tokens_computed < ram_only.prompt_tokens_computed


def test_a_full_disk_tier_makes_the_oldest_prompt_files_give_way_to_newer_ones() -> None:
    # as the server's (issue 41): within --preempt-disk-mib the newest prompts are kept, none dropped
    wl = Workload.chat(6, 4, **CHAT)
    free = simulate(wl, **SERVER, cache_ram_mib=64, host_kv_ram_mib=64, preempt_disk_mib=-1)
    small = simulate(wl, **SERVER, cache_ram_mib=64, host_kv_ram_mib=64, preempt_disk_mib=40)
    assert free.peak_disk_mib > 40 >= small.peak_disk_mib
    assert small.prompt_cache_disk_skipped == 0 and small.prompt_cache_spilled >= free.prompt_cache_spilled - 1
    # six users in turn: each turn's file gave way to later ones before it returned
    assert small.prompt_cache_disk_hits < free.prompt_cache_disk_hits


def test_a_fleet_keeps_a_cache_per_server() -> None:
    wl = Workload.chat(4, 3, system=300, first=400, turn=20, gen=24)
    rr = simulate_fleet(wl, n_servers=2, route="round-robin", **SERVER)
    alone = simulate(wl, **SERVER)
    assert rr.completed == alone.completed == len(wl)
    # round-robin sends a user's turns to both servers in turn: some come back where their prompt is not
    cached_fleet = sum(q["n_prompt_cached"] for s in rr.servers for q in s.per_request)
    cached_alone = sum(q["n_prompt_cached"] for q in alone.per_request)
    assert cached_fleet < cached_alone


def test_simulate_chat_prints_the_prompt_tokens_computed() -> None:
    r = run_cli("simulate", "--chat", "6", "--turns", "4", "--system-len", "300", "--prompt-len", "400", "--one-client",
                "--ctx", "8192", "--parallel", "2", "--cache-ram", "64", "--host-kv-ram", "64", "--preempt-disk-mib", "-1",
                "--json")
    assert r.returncode == 0, r.stderr
    (res,) = json.loads(r.stdout)["results"]
    assert res["prompt_cache_disk_hits"] == 18 and res["cache_ram_mib"] == 64
    table = run_cli("simulate", "--chat", "3", "--turns", "2", "--ctx", "8192", "--parallel", "2")
    assert table.returncode == 0 and "prompt computed" in table.stdout


@pytest.mark.parametrize("args, needle", [
    (["--chat", "3", "--prompt-len", "100-400"], "--prompt-len"),
    (["--chat", "0"], "--chat"),
    (["--chat", "3", "--cache-ram", "-5"], "--cache-ram"),
])
def test_simulate_chat_flags_are_checked(args: list[str], needle: str) -> None:
    r = run_cli("simulate", *args)
    assert r.returncode != 0 and needle in r.stderr


def test_a_turn_follows_its_leader_even_when_the_leader_fails() -> None:
    # the first turn is larger than the pool (it fails at admission, as upstream's size check does);
    # the user's next turn still comes, one second after that answer
    wl = Workload((0.0, 1.0), (5000, 10), (10, 10), (0, 0), (0, 0), (-1, 0))
    r = simulate(wl, n_ctx=1024, n_parallel=2)
    assert [q["outcome"] for q in r.per_request] == ["failed", "completed"]
    assert r.per_request[1]["t_arrival"] == pytest.approx(r.per_request[0]["t_done"] + 1.0)


def test_a_turn_whose_leader_never_ends_is_reported_pending() -> None:
    wl = Workload((0.0, 0.0), (100, 10), (100_000, 10), (0, 0), (0, 0), (-1, 0))
    r = simulate(wl, n_ctx=200_000, n_parallel=2, max_steps=50)
    assert r.hit_step_limit and [q["outcome"] for q in r.per_request] == ["pending", "pending"]
