"""The llama-preempt command line: demo, stats, simulate, serve.

Every error is one line on stderr and a non-zero exit ("llama-preempt: error: ..."), never a
traceback; Ctrl-C ends any command cleanly (exit 130).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, NoReturn, Sequence

from . import __version__, _core
from .stats import PREEMPT_MODES


class CLIError(Exception):
    pass


def _console(stderr: bool = False) -> Any:
    """A terminal's own width; piped into a file or another program, wide enough that no table is
    cut (rich would assume 80 columns there) unless COLUMNS says otherwise."""
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    width = None if stream.isatty() or os.environ.get("COLUMNS") else 200
    return Console(stderr=stderr, highlight=False, width=width)


# --- demo ---

def _chat_table(label: str, chats: list[Any], n_tokens: int) -> Any:
    from rich.progress_bar import ProgressBar
    from rich.table import Table

    errors = sorted({c.error for c in chats if c.error})
    t = Table(title=label, title_justify="left", expand=False,
              caption=("lost: " + "; ".join(errors)) if errors else None, caption_justify="left")
    t.add_column("chat", justify="right")
    t.add_column("topic")
    t.add_column("progress", width=24)
    t.add_column("tokens", justify="right")
    t.add_column("state")
    t.add_column("parks")
    style = {"done": "green", "lost": "red", "parked": "yellow", "paused": "blue", "generating": "cyan"}
    for c in chats:
        state = c.state if c.state != "parked" else f"parked ({c.parked_mode})"
        parks = ", ".join(c.modes) if c.modes else ""
        t.add_row(str(c.index + 1), c.topic[:24], ProgressBar(total=n_tokens, completed=min(c.tokens, n_tokens), width=22),
                  str(c.tokens), f"[{style.get(c.state, 'white')}]{state}[/]", parks)
    return t


def _summary_table(runs: list[Any]) -> Any:
    from rich.table import Table

    t = Table(title="summary: the same load, twice", title_justify="left")
    t.add_column("")
    for r in runs:
        t.add_column(r.label, justify="right")
    rows = [
        ("chats completed", lambda r: f"{r.completed} / {r.chats}"),
        ("chats lost", lambda r: f"[red]{r.lost}[/]" if r.lost else "0"),
        ("tokens delivered", lambda r: str(r.tokens)),
        ("aggregate tok/s", lambda r: f"{r.tok_s:.1f}"),
        ("wall time", lambda r: f"{r.wall_s:.1f} s"),
        ("parks by swap", lambda r: str(r.parks_swap)),
        ("parks by recompute", lambda r: str(r.parks_recompute)),
        ("pauses (decode width)", lambda r: str(r.pauses)),
        ("recomputed tokens", lambda r: str(r.recomputed_tokens)),
        ("peak host RAM held", lambda r: f"{r.peak_ram_bytes / 2**20:.1f} MiB"),
    ]
    for name, fn in rows:
        t.add_row(name, *[fn(r) for r in runs])
    return t


def cmd_demo(args: argparse.Namespace) -> int:
    from .demo import DemoConfig, answers_alone, n_identical, run_scenario
    from .models import ModelChoice, default_model

    err = _console(stderr=True)
    log = (lambda msg: None) if args.json else (lambda msg: err.print(f"[dim]{msg}[/]"))
    if args.model is not None:
        if not args.model.is_file():
            raise CLIError(f"--model: no such file: {args.model}")
        choice = ModelChoice(args.model, args.model.name, "--model")
    else:
        choice = default_model(log)
    for flag, value, low in (("--ctx", args.ctx, 16), ("--parallel", args.parallel, 2), ("--chats", args.chats, 1),
                             ("--tokens", args.tokens, 1)):
        if value < low:
            raise CLIError(f"{flag} must be at least {low}, got {value}")
    try:
        _core.parse_preempt_ram_mib(str(args.preempt_ram))  # llama-server's own check and words
    except ValueError as e:
        raise CLIError(str(e)) from None
    cfg = DemoConfig(model=choice.path, n_ctx=args.ctx, n_parallel=args.parallel, n_chats=args.chats,
                     n_tokens=args.tokens, preempt_ram_mib=args.preempt_ram, preempt_mode=args.preempt_mode,
                     engine=args.engine, threads=args.threads, deterministic=args.deterministic,
                     verbose=args.verbose)

    out = _console()
    if not args.json:
        out.print(f"[bold]llama-preempt demo[/]: {cfg.n_chats} chats x {cfg.n_tokens} tokens on one unified pool of "
                  f"{cfg.n_ctx} cells, {cfg.n_parallel} slots; model {choice.name} ({choice.how}); "
                  f"{'in-process Engine' if cfg.engine == 'engine' else 'drop-in llama-server over HTTP'}")
    runs = []
    for preempt in (False, True):
        if args.json:
            runs.append(run_scenario(cfg, preempt, lambda label, chats: None))
            continue
        from rich.live import Live

        with Live(console=out, refresh_per_second=10, transient=False) as live:
            runs.append(run_scenario(cfg, preempt, lambda label, chats: live.update(_chat_table(label, chats, cfg.n_tokens))))
        out.print()
    identical = None
    if cfg.deterministic:
        if args.json:
            alone = answers_alone(cfg)
        else:
            with out.status("--deterministic: the same chats, one at a time, without pressure"):
                alone = answers_alone(cfg)
        identical = n_identical(runs[1], alone)
    if args.json:
        print(json.dumps({"model": {"path": str(choice.path), "name": choice.name, "source": choice.how},
                          "config": {"ctx": cfg.n_ctx, "parallel": cfg.n_parallel, "chats": cfg.n_chats,
                                     "tokens": cfg.n_tokens, "preempt_ram_mib": cfg.preempt_ram_mib,
                                     "preempt_mode": cfg.preempt_mode, "engine": cfg.engine,
                                     "deterministic": cfg.deterministic},
                          "runs": [{k: v for k, v in r.to_json().items() if k != "answers"} for r in runs],
                          **({"identical_to_alone": identical} if identical is not None else {})}, indent=2))
        return 0
    out.print(_summary_table(runs))
    stock, ours = runs
    out.print(f"upstream lost [bold red]{stock.lost} of {stock.chats}[/] chats; llama-preempt completed "
              f"[bold green]{ours.completed} of {ours.chats}[/] ({ours.parks_swap + ours.parks_recompute} parks, "
              f"{ours.pauses} pauses).")
    if identical is not None:
        style = "bold green" if identical == ours.chats else "bold red"
        out.print(f"--deterministic: [{style}]{identical} of {ours.chats}[/] answers are identical to the same chats "
                  f"run one at a time without pressure.")
    return 0


# --- stats ---

def stats_url(positional: str | None, option: str | None) -> str:
    """The server to watch, given as the positional URL or as --url (curl's way): one of them."""
    if positional and option and positional != option:
        raise CLIError(f"stats: the server is given twice, as {positional} and as --url {option}: give one")
    url = positional or option
    if not url:
        raise CLIError("stats: which server? give its URL, e.g. llama-preempt stats http://127.0.0.1:8080 "
                       "(or --url http://127.0.0.1:8080)")
    return url


def cmd_stats(args: argparse.Namespace) -> int:
    import requests

    from .statsview import fetch, rates, render, to_json

    if args.interval <= 0:
        raise CLIError(f"--interval must be positive, got {args.interval}")
    args.url = stats_url(args.url, args.url_opt)
    session = requests.Session()
    snap = fetch(args.url, session)
    if args.once:
        if args.json:
            print(json.dumps(to_json(snap, None), indent=2))
        else:
            _console().print(render(snap, None))
        return 0
    prev = None
    if args.json:  # one JSON object a line, every interval
        while True:
            print(json.dumps(to_json(snap, rates(prev, snap))), flush=True)
            time.sleep(args.interval)
            prev, snap = snap, fetch(args.url, session)
    if not sys.stdout.isatty():  # piped or to a file: every refresh written, one after another
        con = _console()
        while True:
            con.print(render(snap, rates(prev, snap)))
            sys.stdout.flush()
            time.sleep(args.interval)
            prev, snap = snap, fetch(args.url, session)
    from rich.live import Live

    with Live(render(snap, None), console=_console(), refresh_per_second=4) as live:
        while True:
            time.sleep(args.interval)
            prev, snap = snap, fetch(args.url, session)
            live.update(render(snap, rates(prev, snap)))


# --- simulate ---

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


# --- serve ---

def cmd_serve(args: argparse.Namespace) -> int:
    from .binary import server_binary

    exe = str(server_binary())
    os.execv(exe, [exe, *args.server_args])  # replaces this process: signals reach llama-server itself
    return 0  # not reached


def cmd_rpc_server(args: argparse.Namespace) -> int:
    from .binary import rpc_server_binary

    exe = str(rpc_server_binary())
    os.execv(exe, [exe, *args.server_args])  # replaces this process, as serve does
    return 0  # not reached


def cmd_doctor(args: argparse.Namespace) -> int:
    """llama-server --preempt-selftest with the flags given: the table and report, or JSON."""
    from .doctor import DoctorError, run_doctor

    server_args = list(args.server_args)
    if "-h" in server_args or "--help" in server_args:
        print("usage: llama-preempt doctor [--json] [LLAMA-SERVER FLAGS ...]\n\n"
              "Loads the model with llama-server's flags (-m, -ngl, --rpc, -fa, --preempt-disk, ...; without -m the demo's\n"
              "model), parks one sequence by every route this build and device can take (SWAP by the bulk copier, by device\n"
              "graphs, by single slices, restore ahead, to disk, RECOMPUTE), checks every copy byte for byte against\n"
              "upstream's own and the answer against the unparked one, and prints a table and a report for bug reports.\n"
              "Exit status 0 when every route is right, 1 when one is wrong, 2 when it could not run.\n"
              "  --json   the result as JSON instead of the table")
        return 0
    as_json = "--json" in server_args
    server_args = [a for a in server_args if a != "--json"]
    if not any(a in ("-m", "--model") or a.startswith("--model=") for a in server_args) and "LLAMA_ARG_MODEL" not in os.environ:
        from .models import default_model

        server_args = ["-m", str(default_model(lambda msg: print(f"llama-preempt doctor: {msg}", file=sys.stderr)).path),
                       *server_args]
    try:
        rep = run_doctor(server_args)
    except DoctorError as e:
        print(f"llama-preempt doctor: error: {e}", file=sys.stderr)
        return 2
    if as_json:
        print(json.dumps(dataclasses.asdict(rep), indent=2))
    else:
        print(rep.text, end="")
    return rep.returncode


def cmd_server_path(args: argparse.Namespace) -> int:
    from .binary import server_binary

    print(server_binary())
    return 0


class _Parser(argparse.ArgumentParser):
    """argparse that says a bad flag in one line (the README's error format), not a usage block."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    ap = _Parser(prog="llama-preempt", description="KV preemption for llama.cpp's HTTP server")
    ap.add_argument("--version", action="version", version=f"llama-preempt {__version__}")
    sub = ap.add_subparsers(dest="cmd", required=True, metavar="COMMAND", parser_class=_Parser)

    d = sub.add_parser("demo", help="the overflow scenario, without and with preemption, on a real model")
    d.add_argument("--model", type=Path, default=None, help="any gguf (default: SmolLM2-135M-Instruct Q4_1 from PyPI)")
    d.add_argument("--ctx", type=int, default=1024, help="cells in the unified KV pool (-c; default 1024)")
    d.add_argument("--parallel", type=int, default=4, help="slots (-np; default 4)")
    d.add_argument("--chats", type=int, default=4, help="concurrent chats (default 4)")
    d.add_argument("--tokens", type=int, default=400, help="tokens each chat generates (default 400)")
    d.add_argument("--preempt-ram", type=int, default=8192,
                   help="MiB parked slots may hold (-1 no limit, 0 recompute only; default 8192)")
    d.add_argument("--preempt-mode", choices=PREEMPT_MODES, default="auto",
                   help="SWAP or RECOMPUTE per victim: auto (the cheaper by measured cost), swap, recompute (default auto)")
    d.add_argument("--engine", choices=("engine", "server"), default="engine",
                   help="engine: the in-process Engine (default); server: the drop-in llama-server over HTTP")
    d.add_argument("--threads", type=int, default=None, help="CPU threads (default: llama.cpp's choice)")
    d.add_argument("--deterministic", action="store_true",
                   help="run with --deterministic and count the answers identical to the same chats run one at a time")
    d.add_argument("--json", action="store_true", help="print the summary as JSON (no live view)")
    d.add_argument("--verbose", action="store_true", help="keep llama.cpp's log")
    d.set_defaults(fn=cmd_demo)

    s = sub.add_parser("stats", help="a live view of a running server's slots and preemption")
    s.add_argument("url", nargs="?", help="the server, e.g. http://127.0.0.1:8080 (or --url)")
    s.add_argument("--url", dest="url_opt", metavar="URL", help="the server, as the positional URL")
    s.add_argument("--once", action="store_true", help="one snapshot, then exit")
    s.add_argument("--json", action="store_true", help="JSON (with --once one object, else one a line)")
    s.add_argument("--interval", type=float, default=1.0, help="seconds between refreshes (default 1)")
    s.set_defaults(fn=cmd_stats)

    m = sub.add_parser("simulate", help="run a workload through the server's planner in simulation")
    src = m.add_argument_group("workload (synthetic unless --workload)")
    src.add_argument("--workload", type=Path, default=None,
                     help='JSONL: {"t": seconds, "prompt_tokens": N, "max_tokens": M} per line')
    src.add_argument("--requests", type=int, default=100, help="synthetic: number of requests (default 100)")
    src.add_argument("--rate", type=float, default=2.0, help="synthetic: arrivals per second, 0 = all at once (default 2)")
    src.add_argument("--prompt-len", default=None,
                     help="synthetic: prompt tokens, N or LO-HI (default 100-400); --chat: a user's own first tokens (default 300)")
    src.add_argument("--gen-len", default=None,
                     help="synthetic: generated tokens, N or LO-HI (default 100-400); --chat: each answer's (default 24)")
    src.add_argument("--seed", type=int, default=0)
    src.add_argument("--chat", type=int, default=None, metavar="USERS",
                     help="a multi-turn chat instead: USERS conversations, each turn resending the conversation "
                          "(--prompt-len: a user's own tokens in its first turn, --gen-len: each answer)")
    src.add_argument("--turns", type=int, default=4, help="--chat: turns per user (default 4)")
    src.add_argument("--system-len", default="300", help="--chat: the system prompt every user shares, tokens (default 300)")
    src.add_argument("--turn-len", default="20", help="--chat: each later turn's new tokens (default 20)")
    src.add_argument("--think", type=float, default=0.0, help="--chat: seconds from an answer to the user's next turn")
    src.add_argument("--one-client", action="store_true",
                     help="--chat: one client asks for every user in turn, one request at a time (bench/prompt_cache.py)")
    srv = m.add_argument_group("server")
    srv.add_argument("--ctx", type=int, default=None,
                     help=f"cells in the unified pool (-c; default: the --calibrate server's, else {DEFAULT_SIM_CTX}: "
                          "the default load overflows it, so it parks)")
    srv.add_argument("--parallel", type=int, default=None,
                     help=f"slots (-np; default: the --calibrate server's, else {DEFAULT_SIM_PARALLEL})")
    srv.add_argument("--batch", type=int, default=512, help="n_batch (-b; default 512)")
    srv.add_argument("--preempt-ram", type=int, default=8192, help="MiB (-1 no limit, 0 recompute only; default 8192)")
    srv.add_argument("--preempt-mode", choices=PREEMPT_MODES, default="auto",
                     help="SWAP or RECOMPUTE per victim: auto (the cheapest by the costs), swap, recompute (default auto)")
    srv.add_argument("--preempt-disk-mib", type=int, default=0,
                     help="a disk tier of N MiB for parked slots (-1 no limit; default 0: none), priced with the disk rates")
    srv.add_argument("--cache-ram", type=int, default=None,
                     help="upstream's RAM prompt cache, MiB (-1 no limit, 0 none; default: the server's 8192 for "
                          "--chat or a workload with conversations, else none)")
    srv.add_argument("--host-kv-ram", type=int, default=-2,
                     help="llama-server's --host-kv-ram: the one host budget parks and the prompt cache share (MiB)")
    srv.add_argument("--no-preempt", action="store_true", help="upstream's behaviour: a full pool fails every running request")
    srv.add_argument("--sched", default=None, metavar="KEY=N,...",
                     help="llama-server's --preempt-sched: the planner's knobs (width-loss=0: every slot decodes at once)")
    srv.add_argument("--sweep", action="append", metavar="KEY=V,V,...",
                     help="ctx=1024,2048,... and/or ram=0,256,-1: one row per combination")
    fl = m.add_argument_group("fleet (N identical, independent servers behind a router)")
    fl.add_argument("--servers", type=int, default=1, help="servers, each configured as above (default 1)")
    fl.add_argument("--route", choices=("round-robin", "least-parked"), default="round-robin",
                    help="round-robin: the i-th arrival to server i %% N; least-parked: to the server with the fewest "
                         "requests parked then (default round-robin)")
    fl.add_argument("--compare-routes", action="store_true", help="run both routes and print them side by side")
    cost = m.add_argument_group("costs (defaults: SmolLM2-135M Q4_1 on 2 CPU cores)")
    cost.add_argument("--calibrate", metavar="URL", help="measure decode and prefill costs from a running server")
    cost.add_argument("--step-ms", type=float, default=None)
    cost.add_argument("--decode-ms", type=float, default=None, help="per generated token")
    cost.add_argument("--prefill-ms", type=float, default=None, help="per prompt or replayed token")
    cost.add_argument("--attend-ns", type=float, default=None, help="per cell a step's tokens attend (summed over them)")
    cost.add_argument("--bytes-per-cell", type=float, default=None, help="KV bytes per cell")
    cost.add_argument("--swap-out-gbps", type=float, default=None)
    cost.add_argument("--swap-in-gbps", type=float, default=None)
    cost.add_argument("--disk-write-gbps", type=float, default=None, help="the disk tier's file writes")
    cost.add_argument("--disk-read-gbps", type=float, default=None, help="the disk tier's file reads")
    m.add_argument("--json", action="store_true")
    m.add_argument("--wide", action="store_true", help="every column (the default table reads whole at 80 columns)")
    m.set_defaults(fn=cmd_simulate)

    # `serve` takes llama-server's own flags: main() hands them over before argparse sees them
    sub.add_parser("serve", help="run the drop-in llama-server with the given flags (llama-preempt serve -m M ...)")

    sub.add_parser("rpc-server", help="run llama.cpp's RPC server, a device for llama-server --rpc "
                   "(llama-preempt rpc-server -H 127.0.0.1 -p 50052)")

    sub.add_parser("doctor", help="check every park route on this machine with your model and flags "
                   "(llama-preempt doctor -m M -ngl 99 ...; --json for JSON); exit 0 when all are right")

    p = sub.add_parser("server-path", help="print the path of the drop-in llama-server binary")
    p.set_defaults(fn=cmd_server_path)
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    passthrough = {"serve": cmd_serve, "rpc-server": cmd_rpc_server, "doctor": cmd_doctor}
    if argv[:1] and argv[0] in passthrough:
        try:
            return passthrough[argv[0]](argparse.Namespace(server_args=argv[1:]))
        except Exception as e:  # the binary is missing or cannot run
            print(f"llama-preempt: error: {e}", file=sys.stderr)
            return 2
    args = build_parser().parse_args(argv)
    from .binary import ServerBinaryNotFound
    from .demo import DemoError
    from .models import ModelNotInstalled
    from .server import ServerStartError
    from .simulator import CalibrationError, WorkloadError
    from .statsview import StatsError

    known: tuple[type[BaseException], ...] = (CLIError, DemoError, ModelNotInstalled, ServerStartError, CalibrationError,
                                              WorkloadError, StatsError, ServerBinaryNotFound)
    try:
        from .engine import EngineArgumentError, EngineError
        known += (EngineError, EngineArgumentError)
    except ImportError:  # the compiled core is missing: the commands that need it say so below
        pass
    try:
        return int(args.fn(args))
    except KeyboardInterrupt:
        print("llama-preempt: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except known as e:
        msg = str(e).strip().splitlines()[0] if str(e).strip() else e.__class__.__name__
        print(f"llama-preempt: error: {msg}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
