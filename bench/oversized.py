"""An oversized request is refused before it costs: a short request's latency alone and while one
client keeps sending bodies that cannot fit (issue 57).

    python bench/oversized.py                  # stories260K, 2,048 cells, 4 slots
    python bench/oversized.py --mb 20 --rounds 30

Three cells, one server (`--max-body-mib` at its default, 32): a short request (8 tokens) sent
`--rounds` times alone; the same while another client sends, one after another, JSON bodies of
`--mb` MB whose prompt cannot fit the context (refused with 400 before tokenizing); and while it
sends bodies over the body limit (413 before they are parsed). Per cell: the short request's
latency p50 and p99, and how long each oversized request took to be answered. Written to
bench/results/NAME.{json,md}.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import requests
from rich.console import Console

from llama_preempt.server import LlamaServer, ServerConfig
from results_io import md_table, stories_model, write_results


def percentile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


def short_latencies(url: str, rounds: int) -> list[float]:
    out = []
    for _ in range(rounds):
        t = time.monotonic()
        r = requests.post(url + "/completion", json={"prompt": "Once upon a time", "n_predict": 8, "temperature": 0},
                          timeout=120)
        r.raise_for_status()
        out.append(time.monotonic() - t)
    return out


def hammer(url: str, body: bytes, stop: threading.Event, answers: list[tuple[int, float]]) -> None:
    """Send `body` again and again until `stop`: (status, seconds to the answer) each time."""
    while not stop.is_set():
        t = time.monotonic()
        try:
            r = requests.post(url + "/completion", data=body, headers={"Content-Type": "application/json"}, timeout=300)
            answers.append((r.status_code, time.monotonic() - t))
        except requests.RequestException:
            answers.append((0, time.monotonic() - t))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument("--ctx", type=int, default=2048)
    ap.add_argument("--mb", type=int, default=20, help="MB of prompt in each oversized body (default 20)")
    ap.add_argument("--rounds", type=int, default=40, help="short requests per cell (default 40)")
    ap.add_argument("--name", default="oversized")
    args = ap.parse_args(argv)
    console = Console()
    model = stories_model(args.model)
    too_long = b'{"prompt": "' + b"Once upon a time " * (args.mb * 1_000_000 // 17) + b'", "n_predict": 4}'
    too_big = b'{"prompt": "' + b"a" * (33 << 20) + b'"}'
    rows: list[list[Any]] = []
    record: dict[str, Any] = {"model": model.name, "ctx": args.ctx, "mb": args.mb, "rounds": args.rounds, "cells": {}}
    cfg = ServerConfig(model=model, n_ctx=args.ctx, n_parallel=4, kv_unified=True, threads=2, seed=1234)
    with LlamaServer(cfg) as srv:
        short_latencies(srv.url, 3)  # warm
        for label, body in (("alone", None), (f"beside {args.mb} MB prompts that cannot fit", too_long),
                            ("beside 33 MiB bodies", too_big)):
            stop, answers = threading.Event(), []  # type: ignore[var-annotated]
            th = None
            if body is not None:
                th = threading.Thread(target=hammer, args=(srv.url, body, stop, answers))
                th.start()
                time.sleep(0.5)
            lat = short_latencies(srv.url, args.rounds)
            stop.set()
            if th is not None:
                th.join()
            codes = sorted({c for c, _ in answers})
            refused = [s for _, s in answers]
            cell = {"short_p50_s": round(statistics.median(lat), 4), "short_p99_s": round(percentile(lat, 0.99), 4),
                    "oversized_sent": len(answers), "oversized_status": codes,
                    "oversized_p50_s": round(statistics.median(refused), 4) if refused else None}
            record["cells"][label] = cell
            rows.append([label, cell["short_p50_s"], cell["short_p99_s"], len(answers), ",".join(map(str, codes)) or "-",
                         cell["oversized_p50_s"] if refused else "-"])
            console.print(f"{label}: short p50 {cell['short_p50_s']} s, p99 {cell['short_p99_s']} s; "
                          f"{len(answers)} oversized answered {codes} in {cell['oversized_p50_s']} s (p50)")
    md = [f"# {args.name}", "", f"`python bench/oversized.py {' '.join(argv if argv is not None else sys.argv[1:])}`",
          "", f"{model.name}, {args.ctx} cells, 4 slots; a short request (8 tokens) {args.rounds} times per cell.", ""]
    md += md_table(["cell", "short p50 s", "short p99 s", "oversized sent", "their status", "their answer p50 s"], rows)
    write_results(args.name, record, md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
