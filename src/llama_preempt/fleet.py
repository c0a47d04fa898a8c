"""Size a fleet: N independent servers behind a router, one load, in simulation.

    from llama_preempt.fleet import simulate_fleet
    wl = Workload.synthetic(n_requests=400, rate=8.0, prompt="100-400", gen="200-600", seed=1)
    print(simulate_fleet(wl, n_servers=4, route="least-parked", n_ctx=4096, n_parallel=4))

Each server is the simulator of `llama_preempt.simulator` (the server loop with the server's own
planner) with its own pool, slots, host-RAM budget and clock; they share nothing but the arrivals.
The router places each arrival as it comes (`_core.simulate_fleet`, csrc/sim/preempt-fleet.cpp):
`round-robin` sends the i-th arrival to server i % N; `least-parked` to the server with the fewest
requests parked at that moment (ties: the fewest busy and queued requests, then the lowest index).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from . import _core
from .simulator import (Costs, SimReport, Workload, WorkloadError, _pct, default_cache_ram, latencies, sim_params,
                        sim_report)

ROUTES = ("round-robin", "least-parked")


@dataclass(frozen=True)
class FleetReport:
    route: str
    n_servers: int
    servers: list[SimReport]  # one per server, of its own requests, as simulate() reports a lone server
    requests: int
    completed: int
    failed: int
    parks_swap: int
    parks_recompute: int
    peak_parked_mib: float  # the most host RAM one server held for parked requests (each server has its own)
    ttft_p50_s: float
    ttft_p99_s: float
    queue_p50_s: float
    queue_p99_s: float
    makespan_s: float  # the last server to finish
    hit_step_limit: bool = False
    server_of: list[int] = field(default_factory=list, repr=False)  # per request: the server it went to
    # per request: each server's parked requests when the router placed it
    parked_seen: list[list[int]] = field(default_factory=list, repr=False)

    @property
    def parks(self) -> int:
        return self.parks_swap + self.parks_recompute

    def to_json(self, per_request: bool = False) -> dict[str, Any]:
        d = asdict(self)
        d["servers"] = [s.to_json(per_request) for s in self.servers]
        if not per_request:
            d.pop("server_of")
            d.pop("parked_seen")
        return d


def simulate_fleet(workload: Workload, *, n_servers: int = 2, route: str = "round-robin", n_ctx: int,
                   n_parallel: int, n_batch: int = 512, preempt: bool = True, preempt_ram_mib: int = 8192,
                   preempt_mode: str = "auto", preempt_disk_mib: int = 0, costs: Costs = Costs(),
                   max_steps: int = 50_000_000, sched: Any = None, host_kv_ram_mib: int = -2,
                   cache_ram_mib: int | None = None) -> FleetReport:
    """Run the workload through `n_servers` identical simulated servers, each configured as
    simulate() configures its one, behind the `route` router; see the module docstring. Each
    server has its own prompt cache: a chat's next turn finds its prompt only where it went before."""
    if n_servers < 1:
        raise WorkloadError(f"--servers must be at least 1, got {n_servers}")
    if route not in ROUTES:
        raise WorkloadError(f"--route expects {' or '.join(ROUTES)}, got {route!r}")
    p = sim_params(n_ctx=n_ctx, n_parallel=n_parallel, n_batch=n_batch, preempt=preempt,
                   preempt_ram_mib=preempt_ram_mib, preempt_mode=preempt_mode, preempt_disk_mib=preempt_disk_mib,
                   costs=costs, max_steps=max_steps, sched=sched, host_kv_ram_mib=host_kv_ram_mib,
                   cache_ram_mib=default_cache_ram(workload, cache_ram_mib))
    r = _core.simulate_fleet(list(workload.t_arrival), list(workload.n_prompt), list(workload.n_gen), p,
                             n_servers, route, list(workload.conversation), list(workload.n_shared), list(workload.after))
    server_of = list(r.server_of)
    servers = [sim_report(res, [t for t, j in zip(workload.t_arrival, server_of) if j == k], n_ctx=n_ctx,
                          n_parallel=n_parallel, preempt=preempt, preempt_ram_mib=preempt_ram_mib,
                          preempt_mode=preempt_mode, preempt_disk_mib=preempt_disk_mib, cache_ram_mib=p.cache_ram_mib)
               for k, res in enumerate(r.servers)]
    ttft, queue = latencies(q for s in servers for q in s.per_request)
    return FleetReport(
        route=route, n_servers=n_servers, servers=servers, requests=len(workload),
        completed=sum(s.completed for s in servers), failed=sum(s.failed for s in servers),
        parks_swap=sum(s.parks_swap for s in servers), parks_recompute=sum(s.parks_recompute for s in servers),
        peak_parked_mib=max(s.peak_parked_mib for s in servers),
        ttft_p50_s=_pct(ttft, 50), ttft_p99_s=_pct(ttft, 99), queue_p50_s=_pct(queue, 50), queue_p99_s=_pct(queue, 99),
        makespan_s=max(s.makespan_s for s in servers), hit_step_limit=any(s.hit_step_limit for s in servers),
        server_of=server_of, parked_seen=r.parked_seen())
