"""`llama-preempt simulate`: the server's planner over a synthetic, chat or recorded load in
simulated time, one server or a fleet behind a router, printed as tables or JSON."""
from __future__ import annotations

import argparse
import json
import time
from typing import Any, Sequence

from .cli_common import CLIError, _console


DEFAULT_SIM_CTX = 1536      # the default synthetic load overflows it, so the table shows parks
DEFAULT_SIM_PARALLEL = 4

def _parse_sweep(items: Sequence[str]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for item in items:
        key, _, values = item.partition("=")
        key = {"ctx": "ctx", "c": "ctx", "ram": "ram", "preempt-ram": "ram", "preempt_ram": "ram"}.get(key.strip())
        if key is None or not values:
            raise CLIError(f"--sweep: expected ctx=N,N,... or ram=MIB,MIB,..., got {item!r}")
        try:
            out[key] = [int(v) for v in values.split(",") if v.strip()]
        except ValueError:
            raise CLIError(f"--sweep {item!r}: values must be integers") from None
    return out


def _sim_json(args: argparse.Namespace, wl: Any, costs: Any, elapsed: float, **results: Any) -> str:
    """simulate --json: the workload, the costs, the time taken, then the results by name."""
    return json.dumps({"workload": {"requests": len(wl), "source": str(args.workload) if args.workload else "synthetic"},
                       "costs": costs.__dict__, "elapsed_s": elapsed, **results}, indent=2)


def cmd_simulate(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from .simulator import Costs, Workload, calibrate, server_pool, sweep

    if args.workload is not None:
        wl = Workload.from_jsonl(args.workload)
    elif args.chat is not None:
        wl = _chat_workload(args)
    else:
        wl = Workload.synthetic(args.requests, rate=args.rate, prompt=args.prompt_len or "100-400",
                                gen=args.gen_len or "100-400", seed=args.seed)
    costs = Costs()
    pool_from = ""
    if args.calibrate:
        # the server's own pool and slots, unless given: a simulation of another pool says little
        cells, slots = server_pool(args.calibrate)
        if args.ctx is None and cells:
            args.ctx = cells
            pool_from = f"-c {cells}"
        if args.parallel is None and slots:
            args.parallel = slots
            pool_from += f"{', ' if pool_from else ''}-np {slots}"
        costs = calibrate(args.calibrate, costs)
    args.ctx = DEFAULT_SIM_CTX if args.ctx is None else args.ctx
    args.parallel = DEFAULT_SIM_PARALLEL if args.parallel is None else args.parallel
    overrides = {k: v for k, v in (("step_ms", args.step_ms), ("decode_token_ms", args.decode_ms),
                                   ("prefill_token_ms", args.prefill_ms), ("attend_cell_ns", args.attend_ns),
                                   ("bytes_per_cell", args.bytes_per_cell),
                                   ("swap_out_gbps", args.swap_out_gbps), ("swap_in_gbps", args.swap_in_gbps),
                                   ("disk_write_gbps", args.disk_write_gbps), ("disk_read_gbps", args.disk_read_gbps))
                 if v is not None}
    for k, v in overrides.items():
        if (v < 0 if k in ("step_ms", "attend_cell_ns") else v <= 0):
            raise CLIError(f"--{k.replace('_', '-')} must be {'>= 0' if k in ('step_ms', 'attend_cell_ns') else 'positive'}, got {v}")
    costs = replace(costs, **overrides)
    if args.servers < 1:
        raise CLIError(f"--servers must be at least 1, got {args.servers}")
    if args.servers > 1 or args.compare_routes:
        return _simulate_fleet(args, wl, costs)
    swept = _parse_sweep(args.sweep or [])
    t0 = time.perf_counter()
    reports = sweep(wl, ctxs=swept.get("ctx", [args.ctx]), budgets=swept.get("ram", [args.preempt_ram]),
                    n_parallel=args.parallel, n_batch=args.batch, preempt=not args.no_preempt,
                    preempt_mode=args.preempt_mode, preempt_disk_mib=args.preempt_disk_mib, costs=costs,
                    sched=args.sched, host_kv_ram_mib=args.host_kv_ram, cache_ram_mib=args.cache_ram)
    elapsed = time.perf_counter() - t0
    if args.json:
        print(_sim_json(args, wl, costs, elapsed, results=[r.to_json() for r in reports]))
        return 0
    from rich.table import Table

    t = Table(title=f"simulated: {len(wl)} requests, {args.parallel} slots, n_batch {args.batch}"
                    f"{', no preemption' if args.no_preempt else ''}", title_justify="left")
    # what reads whole at 80 columns; --wide adds the rest. --preempt-ram means nothing without preemption
    cols = [("-c", lambda r: str(r.n_ctx))]
    if not args.no_preempt:
        cols.append(("RAM", lambda r: "no limit" if r.preempt_ram_mib < 0 else f"{r.preempt_ram_mib} MiB"))
    cols += [("done", lambda r: str(r.completed)),
             ("failed", lambda r: f"[red]{r.failed}[/]" if r.failed else "0")]
    legend = ""
    if not args.no_preempt and args.preempt_disk_mib != 0:
        cols.append(("parks", lambda r: f"{r.parks_swap - r.parks_disk}/{r.parks_disk}/{r.parks_recompute}"))
        legend = "parks: SWAP to RAM / SWAP to disk / RECOMPUTE"
    elif not args.no_preempt:
        cols.append(("parks", lambda r: f"{r.parks_swap}/{r.parks_recompute}"))
        legend = "parks: by SWAP / by RECOMPUTE"
    if wl.has_chats:
        # what the prompt cache saved: the prompt tokens computed of all sent, and the files read back
        cols.append(("prompt computed", lambda r: f"{r.prompt_tokens_computed}/{sum(wl.n_prompt)}"))
        if args.preempt_disk_mib != 0:
            cols.append(("from disk", lambda r: str(r.prompt_cache_disk_hits)))
    cols += [("TTFT p99", lambda r: _secs(r.ttft_p99_s)), ("makespan", lambda r: f"{r.makespan_s:.1f} s")]
    if args.wide:
        cols[-1:-1] = [("recomputed tok", lambda r: str(r.recomputed_tokens)),
                       ("peak parked", lambda r: f"{r.peak_parked_mib:.1f} MiB"),
                       ("peak disk", lambda r: f"{r.peak_disk_mib:.1f} MiB"),
                       ("TTFT p50", lambda r: _secs(r.ttft_p50_s)), ("queue p99", lambda r: _secs(r.queue_p99_s)),
                       ("longest park", lambda r: f"{r.longest_park_s:.2f} s")]
    for name, _ in cols:
        t.add_column(name, justify="right", no_wrap=True)
    for r in reports:
        t.add_row(*[f(r) for _, f in cols])
    con = _console()
    con.print(t)
    if legend:
        con.print(f"[dim]{legend}[/]")
    # rounded, a line each that fits 80 columns
    con.print(f"[dim]costs: step {costs.step_ms:.3g} ms, decode {costs.decode_token_ms:.3g} ms/token, "
              f"prefill {costs.prefill_token_ms:.3g} ms/token[/]")
    con.print(f"[dim]       attention {costs.attend_cell_ns:.3g} ns/cell, {costs.bytes_per_cell:.0f} B/cell"
              f"{'' if args.wide else '; --wide for every column'}[/]")
    if pool_from:
        con.print(f"[dim]       pool from the server: {pool_from}[/]")
    con.print(f"[dim]{len(reports)} simulation(s) in {elapsed:.2f} s[/]")
    return 0


def _chat_workload(args: argparse.Namespace) -> Any:
    """simulate --chat USERS: a multi-turn chat workload from the flags."""
    from .simulator import Workload

    def count(flag: str, value: str, least: int) -> int:
        try:
            n = int(value)
        except ValueError:
            raise CLIError(f"{flag}: with --chat, a number of tokens, got {value!r}") from None
        if n < least:
            raise CLIError(f"{flag} must be at least {least}, got {n}")
        return n

    if args.chat < 1 or args.turns < 1:
        raise CLIError(f"--chat and --turns must be at least 1, got {args.chat} and {args.turns}")
    if args.think < 0 or args.rate < 0:
        raise CLIError("--think and --rate must be >= 0")
    return Workload.chat(args.chat, args.turns, system=count("--system-len", args.system_len, 0),
                         first=count("--prompt-len", args.prompt_len or "300", 0), turn=count("--turn-len", args.turn_len, 1),
                         gen=count("--gen-len", args.gen_len or "24", 1), think_s=args.think, rate=args.rate,
                         one_client=args.one_client, seed=args.seed)


def _simulate_fleet(args: argparse.Namespace, wl: Any, costs: Any) -> int:
    from .fleet import ROUTES, simulate_fleet

    if args.compare_routes and args.servers < 2:
        raise CLIError(f"--compare-routes needs --servers 2 or more, got {args.servers}")
    if args.sweep:
        raise CLIError("--sweep runs one server: drop --sweep, or --servers and --compare-routes")
    routes = ROUTES if args.compare_routes else (args.route,)
    t0 = time.perf_counter()
    fleets = [simulate_fleet(wl, n_servers=args.servers, route=route, n_ctx=args.ctx, n_parallel=args.parallel,
                             n_batch=args.batch, preempt=not args.no_preempt, preempt_ram_mib=args.preempt_ram,
                             preempt_mode=args.preempt_mode, preempt_disk_mib=args.preempt_disk_mib, costs=costs,
                             sched=args.sched, host_kv_ram_mib=args.host_kv_ram, cache_ram_mib=args.cache_ram)
              for route in routes]
    elapsed = time.perf_counter() - t0
    if args.json:
        print(_sim_json(args, wl, costs, elapsed, fleets=[f.to_json() for f in fleets]))
        return 0
    con = _console()
    for f in fleets:
        server = "--no-preempt" if args.no_preempt else f"--preempt-ram {args.preempt_ram}"
        con.print(_fleet_table(f, f"{f.route}: {len(wl)} requests, {f.n_servers} servers, each -c {args.ctx} "
                                  f"-np {args.parallel} {server}"))
    if len(fleets) > 1:
        con.print(_routes_table(fleets))
    con.print(f"[dim]{len(fleets)} fleet simulation(s) in {elapsed:.2f} s[/]")
    return 0


def _secs(*values: float) -> str:
    """'1.23 / 4.56 s'; '-' where nothing completed (a server that got no requests)."""
    if all(v != v for v in values):
        return "-"
    return " / ".join("-" if v != v else f"{v:.2f}" for v in values) + " s"


def _fleet_table(f: Any, title: str) -> Any:
    """One row per server and a total row; narrow enough for 80 columns."""
    from rich.table import Table

    t = Table(title=title, title_justify="left",
              caption="peak RAM: host RAM of parked requests; total: the most one server held", caption_justify="left")
    for col in ("server", "requests", "done", "failed", "parks", "peak RAM", "TTFT p99", "makespan"):
        t.add_column(col, justify="right", overflow="fold")
    rows = [(str(k), s) for k, s in enumerate(f.servers)] + [("total", f)]
    for k, (name, r) in enumerate(rows):
        t.add_row(name, str(r.requests), str(r.completed), f"[red]{r.failed}[/]" if r.failed else "0", str(r.parks),
                  f"{r.peak_parked_mib:.1f} MiB", _secs(r.ttft_p99_s), f"{r.makespan_s:.1f} s",
                  end_section=k == len(rows) - 2, style="bold" if name == "total" else None)
    return t


def _routes_table(fleets: list[Any]) -> Any:
    """The fleet totals of each route, side by side."""
    from rich.table import Table

    t = Table(title=f"the same load, {fleets[0].n_servers} servers, by route", title_justify="left")
    t.add_column("")
    for f in fleets:
        t.add_column(f.route, justify="right", overflow="fold")
    rows = [
        ("requests per server", lambda f: "-".join(str(n) for n in sorted({min(s.requests for s in f.servers),
                                                                             max(s.requests for s in f.servers)}))),
        ("completed", lambda f: str(f.completed)),
        ("failed", lambda f: f"[red]{f.failed}[/]" if f.failed else "0"),
        ("parks (swap / recompute)", lambda f: f"{f.parks} ({f.parks_swap} / {f.parks_recompute})"),
        ("peak parked, one server", lambda f: f"{f.peak_parked_mib:.1f} MiB"),
        ("TTFT p50 / p99", lambda f: _secs(f.ttft_p50_s, f.ttft_p99_s)),
        ("queue p50 / p99", lambda f: _secs(f.queue_p50_s, f.queue_p99_s)),
        ("makespan", lambda f: f"{f.makespan_s:.1f} s"),
    ]
    for name, fn in rows:
        t.add_row(name, *[fn(f) for f in fleets])
    return t
