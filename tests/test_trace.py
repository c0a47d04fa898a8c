"""The server and the simulator make the same decisions: one policy, one executor interface.

The live server (the in-process Engine, the real llama-server loop) and the simulator both carry a
plan out through `apply_plan()` (csrc/policy/preempt-executor.h), which asks the policy for every
victim's tier and records each decision. Here the server's decision trace (each park's tier and
reason, each resume's tier and order, as its step events report them) is compared with the
simulator's on the same arrivals, with the server's own pool, slots, batch, prompt lengths, bytes
per cell and measured rates. A decision made anywhere but in the policy, or a simulator that
copies the server's control flow and drifts from it, makes the traces differ.

What is compared is the decisions, not the token counts: the simulator's batch model parks a
victim a few steps later than the live loop (about 10 tokens more held, 4 %), so a RAM budget that
a state fits by fewer bytes than that can tip either way, and over a long RECOMPUTE run the replays
drift apart by steps; the workloads here stay off that edge. For that reason the RECOMPUTE workload
runs without the restore headroom (`--preempt-sched restore-headroom=0`, in both): a resume that
waits for headroom turns a drift of a few steps into a different resume step.

The decode width chosen by measured cost depends on how long the live steps took, which the
simulator prices by its own costs, and a paused slot's bound on its wait is a time: the first
cases run every slot at once (`width-loss=0`), as upstream does, and one case fixes the width
(`width=2,max-gap-ms=0`): then who is paused, which paused slot goes first as a victim and when the
parked come back depend on the planner alone, and the traces agree on those too.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from helpers import long_prompt
from llama_preempt import _core
from llama_preempt.engine import Engine
from llama_preempt.simulator import Costs, sim_params

N_BATCH = 32
# (slots, cells, tokens to generate): eight chats that each fit alone overflow a 2048-cell pool
# together, and with f32 cells their states (about 0.3-0.55 MiB) outgrow a 1 MiB RAM budget; four
# small ones for RECOMPUTE, whose replays the simulator's batch model times less closely over a
# long run (see above)
LARGE, SMALL = (8, 2048, 400), (4, 256, 100)


Trace = list[tuple[Any, int, Any, Any]]


def server_trace(reports: list[Any], tasks: list[int]) -> Trace:
    """(kind, request, tier, reason) per park and resume, in the order the server made them;
    requests numbered by submission (their task ids ascend in that order). The events and the
    simulator's decisions report in the same enums (ParkTier, ParkReason)."""
    request_of = {task: i for i, task in enumerate(sorted(tasks))}
    trace: Trace = []
    for rep in reports:
        # within a step the policy parks before it resumes (apply_plan's order), as the events list them
        trace += [(_core.DecisionKind.PARK, request_of[e.task], e.tier, e.reason) for e in rep.parked]
        trace += [(_core.DecisionKind.RESUME, request_of[e.task], e.tier, None) for e in rep.resumed]
    return trace


def sim_trace(decisions: list[Any]) -> Trace:
    return [(d.kind, d.request, d.tier, d.reason if d.kind == _core.DecisionKind.PARK else None)
            for d in decisions if d.kind in (_core.DecisionKind.PARK, _core.DecisionKind.RESUME)]


def server_costs(st: Any, per_cell: float, overhead: float) -> Costs:
    """The simulator's prices as the server measured them: its state sizes, its park and restore
    rates, its disk rates (the default price where it read or wrote no file)."""
    return Costs(bytes_per_cell=per_cell, state_overhead_bytes=overhead,
                 swap_out_gbps=st.preempt_park_bytes_per_second / 1e9 or Costs().swap_out_gbps,
                 swap_in_gbps=st.preempt_restore_bytes_per_second / 1e9 or Costs().swap_in_gbps,
                 disk_write_gbps=st.preempt_disk_write_bytes_per_second / 1e9 or Costs().disk_write_gbps,
                 disk_read_gbps=st.preempt_disk_read_bytes_per_second / 1e9 or Costs().disk_read_gbps)


ALL_DECODE = {"width-loss": 0}
FIXED_WIDTH = {"width": 2, "max-gap-ms": 0}


@pytest.mark.parametrize("mode, ram_mib, disk, load, knobs", [
    ("auto", 1, True, LARGE, ALL_DECODE),        # RAM while it lasts, then disk by price: both tiers, reads ahead
    ("swap", 0, True, LARGE, ALL_DECODE),        # every park to disk, written while the loop waits
    ("swap", -1, False, LARGE, ALL_DECODE),      # RAM only
    ("recompute", 0, False, SMALL, {**ALL_DECODE, "restore-headroom": 0}),  # no copies: the planner's order and the replays alone
    ("swap", -1, False, SMALL, FIXED_WIDTH),     # two decode, the rest paused: paused victims first, parked to admit
])
def test_the_simulator_makes_the_servers_decisions(stories_model: Path, tmp_path: Path, mode: str, ram_mib: int,
                                                   disk: bool, load: tuple[int, int, int], knobs: dict[str, int]) -> None:
    n_slots, n_ctx, n_gen = load
    args = ["-ctk", "f32", "-ctv", "f32", "--preempt-mode", mode, "--preempt-ram", str(ram_mib),
            "--preempt-sched", ",".join(f"{k}={v}" for k, v in knobs.items())]
    sched = _core.SchedParams()  # the server's defaults, but for the case's knobs
    fields = {"width-loss": ("width_loss", lambda v: v / 100), "width": ("n_width", int),
              "max-gap-ms": ("max_gap_us", lambda v: v * 1000), "restore-headroom": ("n_restore_headroom", int)}
    for k, v in knobs.items():
        name, conv = fields[k]
        setattr(sched, name, conv(v))
    if disk:
        args += ["--preempt-disk", str(tmp_path)]
    with Engine(stories_model, args, n_ctx=n_ctx, n_parallel=n_slots, n_batch=N_BATCH, kv_unified=True,
                n_threads=2) as eng:
        # distinct lengths, so no tie in the victim order depends on which slot a request took
        prompts = [long_prompt(12 + 5 * i, shift=5 * i) for i in range(n_slots)]
        n_prompt = [len(eng.tokenize(p)) for p in prompts]
        reqs = [eng.submit(p, n_predict=n_gen, temperature=0, ignore_eos=True, cache_prompt=False) for p in prompts]
        reports = eng.run(reqs, timeout=300)
        assert all(r.completion().n_generated == n_gen for r in reqs)
        st = eng.stats()
    parks = [e for rep in reports for e in rep.parked]
    assert parks, "the workload must overflow the pool"
    # the server's own state sizes, bytes = overhead + cells x per cell (as the simulator prices them)
    sizes = sorted({(e.n_tokens, e.bytes) for e in parks if e.bytes > 0})
    per_cell, overhead = 23040.0, 0.0
    if len(sizes) >= 2:
        (n1, b1), (n2, b2) = sizes[0], sizes[-1]
        per_cell = (b2 - b1) / (n2 - n1)
        overhead = b1 - per_cell * n1
    costs = server_costs(st, per_cell, overhead)
    p = sim_params(n_ctx=n_ctx, n_parallel=n_slots, n_batch=N_BATCH, preempt=True, preempt_ram_mib=ram_mib,
                   preempt_mode=mode, preempt_disk_mib=-1 if disk else 0, costs=costs, max_steps=100_000)
    p.sched = sched
    sim = _core.simulate([0.0] * n_slots, n_prompt, [n_gen] * n_slots, p)
    assert [q.outcome for q in sim.requests] == [_core.SimOutcome.COMPLETED] * n_slots
    tasks = [e.task for r in reports for e in r.finished]
    assert server_trace(reports, tasks) == sim_trace(sim.trace)
    tiers = {t for _, _, t, _ in server_trace(reports, tasks)}
    if disk:  # the disk tier took part (and, with a RAM budget, so did RAM)
        assert tiers == ({"disk"} if ram_mib == 0 else {"ram", "disk"})


# --- the prompt cache: a multi-turn chat, turn after turn ---

def chat_turns(eng: Engine, users: int, turns: int) -> tuple[list[list[int]], int]:
    """Each user's first prompt (0.6-0.7 MiB of f32 cells: one fits a 1 MiB cache, two do not): a
    system prompt every user shares, then the user's own story (its first word differs from every
    other user's, so two users share the system prompt exactly).
    Returns the first prompts' tokens and the tokens they all share."""
    system = eng.tokenize(long_prompt(150, shift=1))
    first = [system + eng.tokenize(f" {WORD_OF[u]} " + long_prompt(130 + 10 * u, shift=7 * u + 2), add_special=False)
             for u in range(users)]
    shared = {len(os.path.commonprefix([a, b])) for i, a in enumerate(first) for b in first[i + 1:]}
    assert len(shared) == 1, f"the users' prompts must share exactly the system prompt, got {shared}"
    return first, shared.pop()


WORD_OF = ("zebra", "castle", "pirate", "rocket", "dragon", "wizard")


def state_size(model: Path, n_ctx: int) -> tuple[float, float]:
    """A cached state's bytes as (per cell, header), from the server's own RAM cache: two prompts
    of different lengths saved to it, one after the other, by a third request."""
    with Engine(model, ["-ctk", "f32", "-ctv", "f32", "--cache-ram", "64"], n_ctx=n_ctx, n_parallel=1, n_batch=64,
                kv_unified=True, n_threads=2) as eng:
        points = []
        for i, n_words in enumerate((40, 160, 10)):
            r = eng.submit(f"{WORD_OF[i]} " + long_prompt(n_words), n_predict=1, temperature=0, cache_prompt=True)
            eng.run([r], timeout=60)
            points.append((r.completion().n_prompt, eng.metrics()["prompt_cache_bytes"]))
    (n0, _), (n1, b1), (_, b2) = points  # after the second the cache holds the first; after the third both
    per_cell = (b2 - 2 * b1) / (n1 - n0)
    return per_cell, b1 - per_cell * n0


@pytest.mark.parametrize("cache_mib, disk", [
    (1, False),   # one conversation fits the RAM cache: a returning turn keeps the system prompt only
    (1, True),    # the same, with the disk tier: each conversation's prompt comes back from its file
    (16, False),  # every conversation fits: each comes back from RAM
])
def test_the_simulator_makes_the_servers_prompt_cache_choices(stories_model: Path, tmp_path: Path, cache_mib: int,
                                                              disk: bool) -> None:
    """A multi-turn chat, one request at a time (each turn resends the conversation, its answer and a
    new question), through the live server and through the simulator: the same prompt tokens reused
    by every request, and the same prompts spilled to disk and read back. What is compared is the
    prompt cache's choices: which slot a request takes (upstream's similarity rule), what the RAM
    cache keeps within its limit, what leaves for disk, which file is read back (the policy's
    choose_prompt_read) and how much of the prompt is then computed."""
    users, turns, n_gen, n_ctx = 4, 3, 16, 4096
    args = ["-ctk", "f32", "-ctv", "f32", "--cache-ram", str(cache_mib), "--host-kv-ram", str(cache_mib)]
    if disk:
        args += ["--preempt-disk", str(tmp_path)]
    per_cell, overhead = state_size(stories_model, n_ctx)
    cached: list[int] = []
    n_prompt: list[int] = []
    conversation: list[int] = []
    with Engine(stories_model, args, n_ctx=n_ctx, n_parallel=2, n_batch=64, kv_unified=True, n_threads=2) as eng:
        convo, n_shared = chat_turns(eng, users, turns)
        for t in range(turns):
            for u in range(users):
                convo[u] = convo[u] + eng.tokenize(f" then {WORD_OF[u]} asked question {t} ?", add_special=False)
                r = eng.submit(convo[u], n_predict=n_gen, temperature=0, ignore_eos=True, cache_prompt=True,
                               return_tokens=True)
                eng.run([r], timeout=120)
                c = r.completion()
                assert c.n_generated == n_gen
                n_prompt.append(len(convo[u]))
                cached.append(int(c.timings["cache_n"]))
                conversation.append(u)
                convo[u] = convo[u] + list(c.response["tokens"])
        m = eng.metrics()
        st = eng.stats()
    costs = server_costs(st, per_cell, overhead)
    p = sim_params(n_ctx=n_ctx, n_parallel=2, n_batch=64, preempt=True, preempt_ram_mib=8192, preempt_mode="auto",
                   preempt_disk_mib=-1 if disk else 0, costs=costs, max_steps=100_000)
    p.cache_ram_mib = p.host_kv_ram_mib = cache_mib
    n = len(n_prompt)
    sim = _core.simulate([0.0] * n, n_prompt, [n_gen] * n, p, conversation=conversation, n_shared=[n_shared] * n,
                         after=list(range(-1, n - 1)))
    assert [q.outcome for q in sim.requests] == [_core.SimOutcome.COMPLETED] * n
    assert [q.n_prompt_cached for q in sim.requests] == cached
    assert (sim.n_prompt_cache_spilled, sim.n_prompt_cache_disk_hits) == \
        (int(m["n_prompt_cache_spilled_total"]), int(m["n_prompt_cache_disk_hits_total"]))
    returning = cached[users:]
    if cache_mib == 1 and not disk:
        assert returning == [n_shared] * len(returning), "only the system prompt comes back when RAM holds one chat"
    else:
        assert all(c > n_shared for c in returning), "each conversation's prompt comes back (from RAM or from disk)"
        assert sim.n_prompt_cache_disk_hits == (len(returning) if disk else 0)


@pytest.mark.parametrize("cache_mib, ram_mib, disk", [
    (16, -1, False),  # the conversations come back from RAM, then the turns overflow the pool: RAM parks
    (1, 1, True),     # one conversation in RAM, the rest from their files; the park within 1 MiB of RAM (the cache gives way)
])
def test_the_simulator_makes_the_servers_decisions_on_a_chat_that_parks(stories_model: Path, tmp_path: Path,
                                                                         cache_mib: int, ram_mib: int, disk: bool) -> None:
    """Each user's first turn one after another (the cache fills), then every user's next turn at
    once with a long answer: the turns come back from the cache (RAM, or their files) and overflow
    the pool together. The same reuse per request, and the same parks and resumes, live and
    simulated. (The first user's conversation is not reused in either: the second user's turn took
    its slot with half its cells shared, f_keep >= 0.5, so upstream did not save it.) The pool is
    off the edge the module docstring describes: at 2,176 cells the simulator parks a second
    victim that the live loop does not."""
    users, n_first, n_gen, n_ctx = 4, 16, 250, 2304
    args = ["-ctk", "f32", "-ctv", "f32", "--cache-ram", str(cache_mib), "--host-kv-ram", str(max(cache_mib, ram_mib)),
            "--preempt-ram", str(ram_mib), "--preempt-sched", "width-loss=0"]
    if disk:
        args += ["--preempt-disk", str(tmp_path)]
    per_cell, overhead = state_size(stories_model, n_ctx)
    n_prompt: list[int] = []
    cached: list[int] = []
    with Engine(stories_model, args, n_ctx=n_ctx, n_parallel=users, n_batch=N_BATCH, kv_unified=True, n_threads=2) as eng:
        convo, n_shared = chat_turns(eng, users, 1)
        for u in range(users):
            r = eng.submit(convo[u], n_predict=n_first, temperature=0, ignore_eos=True, cache_prompt=True,
                           return_tokens=True)
            eng.run([r], timeout=120)
            c = r.completion()
            n_prompt.append(len(convo[u]))
            cached.append(int(c.timings["cache_n"]))
            convo[u] = convo[u] + list(c.response["tokens"]) + eng.tokenize(f" then {WORD_OF[u]} asked again ?",
                                                                             add_special=False)
        reqs = [eng.submit(convo[u], n_predict=n_gen, temperature=0, ignore_eos=True, cache_prompt=True)
                for u in range(users)]
        reports = eng.run(reqs, timeout=300)
        assert all(r.completion().n_generated == n_gen for r in reqs)
        n_prompt += [len(convo[u]) for u in range(users)]
        cached += [int(r.completion().timings["cache_n"]) for r in reqs]
        st = eng.stats()
    parks = [e for rep in reports for e in rep.parked]
    assert parks, "the second turns must overflow the pool"
    costs = server_costs(st, per_cell, overhead)
    p = sim_params(n_ctx=n_ctx, n_parallel=users, n_batch=N_BATCH, preempt=True, preempt_ram_mib=ram_mib,
                   preempt_mode="auto", preempt_disk_mib=-1 if disk else 0, costs=costs, max_steps=100_000)
    p.cache_ram_mib, p.host_kv_ram_mib = cache_mib, max(cache_mib, ram_mib)
    p.sched = _core.parse_preempt_sched("width-loss=0")
    n = 2 * users
    # the first turns one after another; the second turns together, after the last first turn
    after = [-1, 0, 1, 2] + [users - 1] * users
    sim = _core.simulate([0.0] * n, n_prompt, [n_first] * users + [n_gen] * users, p,
                         conversation=list(range(users)) * 2, n_shared=[n_shared] * n, after=after)
    assert [q.outcome for q in sim.requests] == [_core.SimOutcome.COMPLETED] * n
    assert [q.n_prompt_cached for q in sim.requests] == cached
    assert {q.cached_from for q in sim.requests[users + 1:]} == {"disk" if disk else "ram"}
    tasks = [e.task for r in reports for e in r.finished]
    # the second turns are the simulator's requests 4..7, in the order they were submitted
    live = [(k, req + users, tier, reason) for k, req, tier, reason in server_trace(reports, tasks)]
    assert live == sim_trace(sim.trace)
