"""The server and the simulator make the same decisions: one policy, one executor interface.

The live server (the in-process Engine, the real llama-server loop) and the simulator both carry a
plan out through `apply_plan()` (csrc/policy/preempt-executor.h), which asks the policy for every
victim's tier and records each decision. Here the server's decision trace (each park's tier and
reason, each resume's tier and order, as its step events report them) is compared with the
simulator's on the same arrivals, with the server's own pool, slots, batch, prompt lengths, bytes
per cell and measured rates. A decision made anywhere but in the policy, or a simulator that
copies the server's control flow and drifts from it, makes the traces differ.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from helpers import long_prompt
from llama_preempt import _core
from llama_preempt.engine import Engine
from llama_preempt.simulator import Costs, sim_params

N_CTX, N_SLOTS, N_BATCH, N_GEN = 256, 4, 32, 100


def server_trace(reports: list[Any], tasks: list[int]) -> list[tuple[str, int, str, str]]:
    """(kind, request, tier, reason) per park and resume, in the order the server made them;
    requests numbered by submission (their task ids ascend in that order)."""
    request_of = {task: i for i, task in enumerate(sorted(tasks))}
    trace: list[tuple[str, int, str, str]] = []
    for rep in reports:
        # within a step the policy parks before it resumes (apply_plan's order), as the events list them
        trace += [("park", request_of[e.task], e.tier, e.reason.split(" (")[0].replace(" ", "_")) for e in rep.parked]
        trace += [("resume", request_of[e.task], e.tier, "") for e in rep.resumed]
    return trace


def sim_trace(decisions: list[Any]) -> list[tuple[str, int, str, str]]:
    out = []
    for d in decisions:
        if d.kind == _core.DecisionKind.PARK:
            out.append(("park", d.request, d.tier.name.lower(), d.reason.name.lower()))
        elif d.kind == _core.DecisionKind.RESUME:
            out.append(("resume", d.request, d.tier.name.lower(), ""))
    return out


@pytest.mark.parametrize("mode, ram_mib, disk", [
    ("swap", 1, True),        # RAM until the budget is spent, then disk: both tiers, reads ahead
    ("swap", 0, True),        # every park to disk, written while the loop waits
    ("recompute", 0, False),  # no copies: the planner's order alone
    ("swap", -1, False),      # RAM only
])
def test_the_simulator_makes_the_servers_decisions(stories_model: Path, tmp_path: Path, mode: str, ram_mib: int,
                                                   disk: bool) -> None:
    args = ["--preempt-mode", mode, "--preempt-ram", str(ram_mib)]
    if disk:
        args += ["--preempt-disk", str(tmp_path)]
    with Engine(stories_model, args, n_ctx=N_CTX, n_parallel=N_SLOTS, n_batch=N_BATCH, kv_unified=True,
                n_threads=2) as eng:
        # distinct lengths, so no tie in the victim order depends on which slot a request took
        prompts = [long_prompt(6 + 3 * i, shift=5 * i) for i in range(N_SLOTS)]
        n_prompt = [len(eng.tokenize(p)) for p in prompts]
        reqs = [eng.submit(p, n_predict=N_GEN, temperature=0, ignore_eos=True, cache_prompt=False) for p in prompts]
        reports = eng.run(reqs, timeout=300)
        assert all(r.completion().n_generated == N_GEN for r in reqs)
        st = eng.stats()
    parks = [e for rep in reports for e in rep.parked]
    assert parks, "the workload must overflow the pool"
    swapped = [e for e in parks if e.bytes > 0]
    # the server's own state size per cell (the simulator prices a state as cells x bytes per cell)
    bytes_per_cell = max(e.bytes / e.n_tokens for e in swapped) if swapped else 23040
    costs = Costs(bytes_per_cell=bytes_per_cell,
                  swap_out_gbps=st.preempt_park_bytes_per_second / 1e9,
                  swap_in_gbps=st.preempt_restore_bytes_per_second / 1e9,
                  disk_write_gbps=st.preempt_disk_write_bytes_per_second / 1e9 or Costs().disk_write_gbps,
                  disk_read_gbps=st.preempt_disk_read_bytes_per_second / 1e9 or Costs().disk_read_gbps)
    p = sim_params(n_ctx=N_CTX, n_parallel=N_SLOTS, n_batch=N_BATCH, preempt=True, preempt_ram_mib=ram_mib,
                   preempt_mode=mode, preempt_disk_mib=-1 if disk else 0, costs=costs, max_steps=100_000)
    sim = _core.simulate([0.0] * N_SLOTS, n_prompt, [N_GEN] * N_SLOTS, p)
    assert [q.outcome for q in sim.requests] == [_core.SimOutcome.COMPLETED] * N_SLOTS
    tasks = [e.task for r in reports for e in r.finished]
    assert server_trace(reports, tasks) == sim_trace(sim.trace)
    if disk and ram_mib == 0:
        assert {t for _, _, t, _ in server_trace(reports, tasks)} == {"disk"}
