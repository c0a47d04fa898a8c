"""A fleet of simulated servers behind a router: llama_preempt.fleet and `simulate --servers`."""
from __future__ import annotations

import json
from typing import Any

import pytest

from llama_preempt import cli
from llama_preempt.fleet import FleetReport, simulate_fleet
from llama_preempt.simulator import Costs, Workload, WorkloadError, simulate


def skewed(n_servers: int = 2, n: int = 40) -> Workload:
    """One arrival a second; every n_servers-th is long (prompt 200, 800 tokens), the rest short
    (prompt 50, 20 tokens): round robin sends every long request to server 0."""
    return Workload(tuple(float(i) for i in range(n)),
                    tuple(200 if i % n_servers == 0 else 50 for i in range(n)),
                    tuple(800 if i % n_servers == 0 else 20 for i in range(n)))


SKEWED = dict(n_ctx=1024, n_parallel=4)


def as_json(x: Any) -> str:
    # NaN percentiles (nothing completed) compare equal as text, not as floats
    return json.dumps(x.to_json(per_request=True), sort_keys=True)


@pytest.mark.parametrize("route", ["round-robin", "least-parked"])
@pytest.mark.parametrize("wl, kw", [
    (Workload.synthetic(60, rate=4, prompt="50-400", gen="100-600", seed=2), dict(n_ctx=2048, n_parallel=6)),
    (Workload.synthetic(30, rate=0, prompt="50-100", gen=200, seed=1), dict(n_ctx=1024, n_parallel=8, preempt_ram_mib=0)),
    (Workload.synthetic(12, rate=0, prompt=300, gen=300, seed=1), dict(n_ctx=1024, n_parallel=4, preempt=False)),
    # recorded out of order, with a request too large for the pool
    (Workload((3.0, 0.5, 0.5, 9.0, 0.0), (100, 900, 40, 60, 2000), (300, 200, 500, 100, 100)),
     dict(n_ctx=1024, n_parallel=2, preempt_mode="recompute")),
    (Workload.synthetic(40, rate=0, prompt="50-100", gen=400, seed=3), dict(n_ctx=512, n_parallel=8, max_steps=300)),
])
def test_a_fleet_of_one_server_is_simulate_exactly(wl: Workload, kw: dict[str, Any], route: str) -> None:
    alone = simulate(wl, **kw)
    fleet = simulate_fleet(wl, n_servers=1, route=route, **kw)
    assert as_json(fleet.servers[0]) == as_json(alone)
    assert fleet.server_of == [0] * len(wl)
    assert (fleet.requests, fleet.completed, fleet.failed, fleet.parks_swap, fleet.parks_recompute,
            fleet.makespan_s, fleet.hit_step_limit) == (alone.requests, alone.completed, alone.failed, alone.parks_swap,
                                                        alone.parks_recompute, alone.makespan_s, alone.hit_step_limit)
    assert json.dumps([fleet.ttft_p50_s, fleet.ttft_p99_s, fleet.queue_p50_s, fleet.queue_p99_s]) == \
        json.dumps([alone.ttft_p50_s, alone.ttft_p99_s, alone.queue_p50_s, alone.queue_p99_s])


def test_each_server_of_a_fleet_is_simulate_of_the_requests_it_got() -> None:
    """The servers share nothing: server k does what a lone server does with the requests routed to it."""
    wl = skewed(3, 30)
    fleet = simulate_fleet(wl, n_servers=3, route="least-parked", **SKEWED)
    assert len({*fleet.server_of}) == 3
    for k, srv in enumerate(fleet.servers):
        mine = [i for i, j in enumerate(fleet.server_of) if j == k]
        alone = simulate(Workload(*(tuple(col[i] for i in mine) for col in (wl.t_arrival, wl.n_prompt, wl.n_gen))),
                         **SKEWED)
        assert as_json(srv) == as_json(alone)
    assert fleet.requests == sum(s.requests for s in fleet.servers) == len(wl)


@pytest.mark.parametrize("n_servers", [2, 3, 5])
def test_round_robin_sends_the_ith_arrival_to_server_i_mod_n(n_servers: int) -> None:
    wl = Workload.synthetic(23, rate=3, prompt="50-400", gen="100-600", seed=5)
    fleet = simulate_fleet(wl, n_servers=n_servers, route="round-robin", n_ctx=1024, n_parallel=2)
    assert fleet.server_of == [i % n_servers for i in range(23)]
    assert [s.requests for s in fleet.servers] == [len(range(k, 23, n_servers)) for k in range(n_servers)]
    # a recorded load out of time order: the i-th arrival in time, not in the file
    rec = Workload((2.0, 0.0, 1.0, 3.0, 1.0), (50,) * 5, (50,) * 5)
    assert simulate_fleet(rec, n_servers=2, route="round-robin", n_ctx=1024, n_parallel=2).server_of == [1, 0, 1, 0, 0]


def test_least_parked_never_sends_an_arrival_to_a_server_with_more_parked_requests() -> None:
    wl = skewed(2, 40)
    lp = simulate_fleet(wl, n_servers=2, route="least-parked", **SKEWED)
    assert all(seen[j] == min(seen) for seen, j in zip(lp.parked_seen, lp.server_of))
    # and the load puts that to the test: round robin does send arrivals to the more parked server
    rr = simulate_fleet(wl, n_servers=2, route="round-robin", **SKEWED)
    assert sum(1 for seen, j in zip(rr.parked_seen, rr.server_of) if seen[j] > min(seen)) >= 5
    assert sum(1 for seen in lp.parked_seen if max(seen) > min(seen)) >= 5


def test_least_parked_breaks_ties_by_load_then_lowest_index() -> None:
    """All at once nothing is parked yet: each arrival goes to the least loaded server, the lowest
    index among equals, so 7 requests on 3 servers go 0 1 2 0 1 2 0."""
    wl = Workload.synthetic(7, rate=0, prompt=50, gen=50, seed=0)
    lp = simulate_fleet(wl, n_servers=3, route="least-parked", n_ctx=4096, n_parallel=4)
    assert lp.server_of == [0, 1, 2, 0, 1, 2, 0]
    assert all(seen == [0, 0, 0] for seen in lp.parked_seen)


def test_least_parked_parks_fewer_than_round_robin_when_round_robin_piles_long_requests_on_one_server() -> None:
    """With -c 2048: 52 parks of 18 requests by round robin, 25 of 15 by least-parked. (Fewer parks
    need not mean fewer requests parked: with -c 1024 it is 70 parks of 19 against 39 of 19.)"""
    wl = skewed(2, 40)
    # every slot decodes at once, so the long requests' growth overflows the pool they share
    rr = simulate_fleet(wl, n_servers=2, route="round-robin", n_ctx=2048, n_parallel=4, sched="width-loss=0")
    lp = simulate_fleet(wl, n_servers=2, route="least-parked", n_ctx=2048, n_parallel=4, sched="width-loss=0")
    assert rr.completed == lp.completed == 40 and rr.failed == lp.failed == 0
    assert rr.servers[0].parks > 0 and rr.servers[1].parks == 0  # every long request on server 0
    assert lp.parks < rr.parks
    assert sum(1 for s in lp.servers for q in s.per_request if q["n_preempt"]) < \
        sum(1 for s in rr.servers for q in s.per_request if q["n_preempt"])
    assert lp.ttft_p99_s < rr.ttft_p99_s


def test_the_fleet_report_totals_its_servers() -> None:
    fleet = simulate_fleet(Workload.synthetic(80, rate=6, prompt="50-400", gen="100-600", seed=4),
                           n_servers=3, route="round-robin", n_ctx=1024, n_parallel=4, costs=Costs())
    assert isinstance(fleet, FleetReport) and fleet.n_servers == 3 and len(fleet.servers) == 3
    assert fleet.completed == sum(s.completed for s in fleet.servers) == 80
    assert fleet.parks == sum(s.parks for s in fleet.servers) > 0
    assert fleet.peak_parked_mib == max(s.peak_parked_mib for s in fleet.servers) > 0
    assert fleet.makespan_s == max(s.makespan_s for s in fleet.servers)
    assert min(s.ttft_p99_s for s in fleet.servers) <= fleet.ttft_p99_s <= max(s.ttft_p99_s for s in fleet.servers)
    assert fleet.queue_p99_s >= fleet.queue_p50_s
    d = fleet.to_json()
    assert "server_of" not in d and "per_request" not in d["servers"][0] and d["completed"] == 80
    assert len(fleet.to_json(per_request=True)["server_of"]) == 80


@pytest.mark.parametrize("kw, needle", [
    (dict(n_servers=0), "--servers"),
    (dict(route="random"), "--route"),
    (dict(n_parallel=0), "--parallel"),
])
def test_simulate_fleet_errors_name_the_flag(kw: dict[str, Any], needle: str) -> None:
    args: dict[str, Any] = dict(n_servers=2, route="round-robin", n_ctx=1024, n_parallel=2) | kw
    with pytest.raises(WorkloadError, match=needle):
        simulate_fleet(Workload.synthetic(4), **args)


# --- the command line ---

SIM = ["simulate", "--requests", "120", "--rate", "6", "--gen-len", "100-600", "--ctx", "2048"]


def run_cli(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, *args: str,
            columns: int = 80) -> tuple[int, str, str]:
    monkeypatch.setenv("COLUMNS", str(columns))
    rc = cli.main(list(args))
    out, err = capsys.readouterr()
    return rc, out, err


def test_one_server_prints_what_simulate_printed_before(capsys: pytest.CaptureFixture[str],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    _, before, _ = run_cli(capsys, monkeypatch, *SIM, "--json", columns=160)
    _, after, _ = run_cli(capsys, monkeypatch, *SIM, "--servers", "1", "--route", "least-parked", "--json", columns=160)
    b, a = json.loads(before), json.loads(after)
    b.pop("elapsed_s"), a.pop("elapsed_s")
    assert a == b and "results" in a and "fleets" not in a
    _, plain, _ = run_cli(capsys, monkeypatch, *SIM, columns=160)
    _, one, _ = run_cli(capsys, monkeypatch, *SIM, "--servers", "1", "--route", "least-parked", columns=160)
    assert plain.startswith("simulated: 120 requests")
    assert one.splitlines()[:-1] == plain.splitlines()[:-1]  # all but "1 simulation(s) in X s"


def test_the_fleet_table_reads_whole_at_80_columns(capsys: pytest.CaptureFixture[str],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    rc, out, err = run_cli(capsys, monkeypatch, *SIM, "--servers", "4", "--compare-routes", "--preempt-ram", "-1")
    assert rc == 0, err
    lines = out.splitlines()
    assert "…" not in out and max(len(line) for line in lines) <= 80
    rc, js, _ = run_cli(capsys, monkeypatch, *SIM, "--servers", "4", "--compare-routes", "--preempt-ram", "-1", "--json")
    fleets = json.loads(js)["fleets"]
    assert [f["route"] for f in fleets] == ["round-robin", "least-parked"]
    for f in fleets:
        # a server's row and the total row carry every column, on one line each
        title = next(i for i, line in enumerate(lines) if line.startswith(f"{f['route']}: 120 requests, 4 servers"))
        rows = [line for line in lines[title:] if line.startswith("│")][:5]
        for k, s in enumerate(f["servers"]):
            cells = [c.strip() for c in rows[k].strip("│").split("│")]
            assert cells[:5] == [str(k), str(s["requests"]), str(s["completed"]), str(s["failed"]),
                                 str(s["parks_swap"] + s["parks_recompute"])]
            assert cells[7] == f"{s['makespan_s']:.1f} s"
        total = [c.strip() for c in rows[4].strip("│").split("│")]
        assert total[:5] == ["total", "120", str(f["completed"]), str(f["failed"]),
                             str(f["parks_swap"] + f["parks_recompute"])]
    side = [line for line in lines if line.startswith("│ parks (swap / recompute)")]
    assert len(side) == 1 and all(f"{f['parks_swap'] + f['parks_recompute']} (" in side[0] for f in fleets)


def test_one_route_prints_one_table_and_json(capsys: pytest.CaptureFixture[str],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    rc, out, _ = run_cli(capsys, monkeypatch, *SIM, "--servers", "2", "--route", "least-parked")
    assert rc == 0 and out.startswith("least-parked: 120 requests, 2 servers") and "round-robin" not in out
    assert "by route" not in out
    _, js, _ = run_cli(capsys, monkeypatch, *SIM, "--servers", "2", "--route", "least-parked", "--json")
    (f,) = json.loads(js)["fleets"]
    assert f["route"] == "least-parked" and f["n_servers"] == 2 and f["requests"] == 120
    assert sum(s["requests"] for s in f["servers"]) == 120


@pytest.mark.parametrize("args, needle", [
    (["--servers", "0"], "--servers must be at least 1"),
    (["--compare-routes"], "--compare-routes needs --servers 2"),
    (["--servers", "2", "--sweep", "ctx=1024,2048"], "--sweep"),
])
def test_fleet_flag_errors_are_one_line(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
                                        args: list[str], needle: str) -> None:
    rc, _, err = run_cli(capsys, monkeypatch, *SIM, *args)
    lines = [line for line in err.splitlines() if line.strip()]
    assert rc == 2 and len(lines) == 1 and lines[0].startswith("llama-preempt: error: ") and needle in lines[0]


def test_an_unknown_route_is_refused_naming_the_flag(capsys: pytest.CaptureFixture[str],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(SystemExit) as e:
        run_cli(capsys, monkeypatch, *SIM, "--servers", "2", "--route", "random")
    assert e.value.code == 2 and "--route" in capsys.readouterr().err
