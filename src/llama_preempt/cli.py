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


from .cli_common import CLIError, _console  # noqa: F401  (CLIError is this module's API too)
from .cli_simulate import DEFAULT_SIM_CTX, DEFAULT_SIM_PARALLEL, cmd_simulate


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
