#!/usr/bin/env python3
"""Overflow benchmark: concurrent chats that each fit the unified pool alone but not together.

Runs the same load against the drop-in server with --no-preempt (stock llama.cpp behaviour), with
RECOMPUTE only (--preempt-ram 0) and with SWAP (--preempt-ram -1, no limit, so the peak host RAM
it reaches is the budget that keeps the run all-swap), and reports completed requests, errors,
tokens delivered, wall time, the preemption counters from /metrics and the peak of
llamacpp:preempt_ram_bytes while the load ran. Results go to bench/results/overflow.{json,md}.

    python bench/overflow.py                      # SmolLM2-135M, -c 1024 -np 4, 4 x 400 tokens
    python bench/overflow.py --n-ctx 2048 --n-predict 600
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

from rich.console import Console
from rich.table import Table

from llama_preempt.demo import TOPICS
from llama_preempt.server import LlamaServer, ServerConfig
from results_io import RESULTS, display_path, smollm2_model  # bench/ is on sys.path when run as a script



@dataclass
class RunResult:
    mode: str
    n_requests: int
    n_ok: int
    n_error: int
    errors: list[str]
    tokens_delivered: int
    wall_s: float
    peak_ram_mib: float = 0.0
    metrics: dict[str, float] = field(default_factory=dict)


MODE_ARGS = {"stock": (False, []), "recompute": (True, ["--preempt-ram", "0"]),
             "swap": (True, ["--preempt-ram", "-1"]), "default": (True, [])}


def run(model: Path, mode: str, args: argparse.Namespace) -> RunResult:
    preempt, extra = MODE_ARGS[mode]
    cfg = ServerConfig(model=model, n_ctx=args.n_ctx, n_parallel=args.n_parallel, kv_unified=True,
                       preempt=preempt, extra_args=extra, threads=args.threads, seed=1234)
    with LlamaServer(cfg) as srv:
        def one(i: int) -> tuple[int, str, int]:
            body = {"messages": [{"role": "user", "content": f"Write a long essay about {TOPICS[i % len(TOPICS)]}."}],
                    "max_tokens": args.n_predict, "temperature": 0, "ignore_eos": True}
            r = srv.post("/v1/chat/completions", body, timeout=1800)
            if r.status_code != 200:
                return r.status_code, r.text[:200], 0
            return 200, "", int(r.json()["usage"]["completion_tokens"])

        done = threading.Event()
        peak = [0.0]

        def watch_ram() -> None:
            while not done.is_set():
                peak[0] = max(peak[0], srv.metrics().get("preempt_ram_bytes"))
                done.wait(0.02)

        watcher = threading.Thread(target=watch_ram)
        watcher.start()
        t0 = time.perf_counter()
        with ThreadPoolExecutor(max_workers=args.n_requests) as ex:
            outs = list(ex.map(one, range(args.n_requests)))
        wall = time.perf_counter() - t0
        done.set()
        watcher.join()
        m = srv.metrics()
        keep = ["n_preempt_total", "n_preempt_swap_total", "n_preempt_recompute_total", "n_resume_total",
                "n_recompute_tokens_total", "tokens_predicted_total", "prompt_tokens_total", "n_decode_total"]
        return RunResult(mode=mode, n_requests=args.n_requests,
                         n_ok=sum(1 for s, _, _ in outs if s == 200),
                         n_error=sum(1 for s, _, _ in outs if s != 200),
                         errors=sorted({e for s, e, _ in outs if s != 200}),
                         tokens_delivered=sum(n for _, _, n in outs), wall_s=round(wall, 2),
                         peak_ram_mib=round(peak[0] / 1048576, 2), metrics={k: m.get(k) for k in keep})


def row_cells(r: RunResult) -> list[str]:
    m = r.metrics
    return [r.mode, f"{r.n_ok}/{r.n_requests}", str(r.n_error), str(r.tokens_delivered), f"{r.wall_s:.1f}",
            f"{m.get('n_preempt_total', 0):.0f} ({m.get('n_preempt_swap_total', 0):.0f}/"
            f"{m.get('n_preempt_recompute_total', 0):.0f})",
            f"{m.get('n_resume_total', 0):.0f}", f"{m.get('n_recompute_tokens_total', 0):.0f}", f"{r.peak_ram_mib:.2f}"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n-ctx", type=int, default=1024)
    ap.add_argument("--n-parallel", type=int, default=4)
    ap.add_argument("--n-requests", type=int, default=4)
    ap.add_argument("--n-predict", type=int, default=400)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--modes", default="stock,recompute,swap",
                    help="comma list of stock, recompute (--preempt-ram 0), swap (--preempt-ram -1), default")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)

    model = smollm2_model()
    console = Console()
    results = []
    for mode in args.modes.split(","):
        if mode not in MODE_ARGS:
            ap.error(f"--modes: unknown mode {mode!r} (choose from {', '.join(MODE_ARGS)})")
        with console.status(f"{mode}: {args.n_requests} chats x {args.n_predict} tokens, -c {args.n_ctx} -np {args.n_parallel}"):
            results.append(run(model, mode, args))

    table = Table(title=f"overflow: SmolLM2-135M Q4_1, -c {args.n_ctx} -np {args.n_parallel} --kv-unified, "
                        f"{args.n_requests} concurrent x {args.n_predict} tokens")
    for col in ("mode", "completed", "errors", "tokens delivered", "wall s", "parks (swap/recompute)", "resumes",
                "recomputed tokens", "peak RAM MiB"):
        table.add_column(col)
    for r in results:
        table.add_row(*row_cells(r))
    console.print(table)
    for r in results:
        for e in r.errors:
            console.print(f"[red]{r.mode} error:[/red] {e}")

    args.out.mkdir(parents=True, exist_ok=True)
    record = {"command": "python bench/overflow.py " + " ".join(argv if argv is not None else sys.argv[1:]),
              "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
              "when": time.strftime("%Y-%m-%d %H:%M:%S"), "config": vars(args) | {"out": display_path(args.out)},
              "results": [asdict(r) for r in results]}
    (args.out / "overflow.json").write_text(json.dumps(record, indent=2) + "\n")
    lines = [f"# overflow ({record['when']})", "", f"`{record['command']}`", "",
             "| mode | completed | errors | tokens delivered | wall s | parks (swap/recompute) | resumes | "
             "recomputed tokens | peak RAM MiB |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        lines.append("| " + " | ".join(row_cells(r)) + " |")
    (args.out / "overflow.md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
