"""A realistic load: many short requests and a few long ones, arriving over time.

    python bench/mixed.py            # SmolLM2-135M-Instruct Q4_1 (about 6 min on 2 cores)
    python bench/mixed.py --quick    # stories260K, in about a minute

Chat and agent traffic mixes many short prompts and answers with a few long ones. The workload is
log-normal in both lengths (most requests short, a few many times the median) with Poisson
arrivals, written to bench/results/mixed_workload.jsonl in the simulator's format. One pool of
--ctx cells, three ways to serve it:

- stock: unpatched llama-server, --parallel slots over one unified pool: when the requests in
  flight overflow it together, every running request fails;
- static split: --no-kv-unified with as many slots as the pool holds copies of the longest
  request (so nothing can fail); the rest wait for a slot;
- auto: llama-preempt, --parallel slots over the unified pool; a slot is parked when it fills.

Per cell: completed, tokens/s over the whole run, TTFT and end-to-end latency (p50, p99, from each
request's arrival), parks. The simulator (`llama-preempt simulate`) runs the same workload with
costs calibrated against the live server, for the static split and auto, next to the live figures.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rich.console import Console

from llama_preempt.server import LlamaServer, ServerConfig
from llama_preempt.simulator import Workload, calibrate, simulate
from cells import ChatResult, pct, stream_chat
from results_io import RESULTS, display_path, md_table, smollm2_model, stories_model, write_results
from stock import stock_server

WORDS = ("once upon a time there was a little girl named lily she loved to play outside in the park one day "
         "she saw a big red ball and her mom said be careful").split()


def prompt_of(n_words: int, i: int) -> str:
    return f"{i}: " + " ".join(WORDS[(i + k) % len(WORDS)] for k in range(n_words))


def run_load(srv: LlamaServer, prompts: list[str], wl: Workload) -> tuple[list[tuple[ChatResult, float]], float]:
    """Every request at its arrival time, streamed (the cells' client); ((result, end-to-end s) per
    request, wall seconds)."""
    out: list[tuple[ChatResult, float]] = [(ChatResult(False, None, 0, None), 0.0)] * len(prompts)
    t0 = time.monotonic()

    def one(i: int) -> None:
        time.sleep(max(0.0, t0 + wl.t_arrival[i] - time.monotonic()))
        start = time.monotonic()
        res = stream_chat(srv.url, prompts[i], wl.n_gen[i])
        out[i] = (res, time.monotonic() - start)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out, time.monotonic() - t0


def r3(v: float | None) -> float | None:
    return None if v is None else round(v, 3)


def summarize(name: str, out: list[tuple[ChatResult, float]], wall: float, parks: int) -> dict[str, Any]:
    ok = [(res, e2e) for res, e2e in out if res.ok]  # ok: every token asked for arrived
    ttft = [res.t_first for res, _ in ok if res.t_first is not None]
    e2e = [t for _, t in ok]
    return {
        "cell": name, "completed": f"{len(ok)}/{len(out)}",
        "tok_s": round(sum(res.tokens for res, _ in ok) / wall, 1),
        "ttft_p50_s": r3(pct(ttft, 50)), "ttft_p99_s": r3(pct(ttft, 99)),
        "e2e_p50_s": r3(pct(e2e, 50)), "e2e_p99_s": r3(pct(e2e, 99)),
        "parks": parks, "wall_s": round(wall, 1),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="stories260K and a smaller pool")
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--rate", type=float, default=None, help="arrivals per second (default 2, --quick 150)")
    ap.add_argument("--ctx", type=int, default=None, help="the pool (default 1024, --quick 512)")
    ap.add_argument("--parallel", type=int, default=8, help="slots of stock and auto")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--name", default=None)
    args = ap.parse_args(argv)
    console = Console()
    quick = args.quick
    model = (stories_model if quick else smollm2_model)(args.model)
    ctx = args.ctx or (512 if quick else 1024)
    rate = args.rate or (150.0 if quick else 2.0)
    name = args.name or ("mixed_quick" if quick else "mixed")
    wl_words = Workload.lognormal(args.requests, rate=rate, prompt_median=48 if quick else 64,
                                  gen_median=48 if quick else 48, max_prompt=ctx // 3, max_gen=ctx // 4, seed=args.seed)
    prompts = [prompt_of(n, i) for i, n in enumerate(wl_words.n_prompt)]

    def server(binary: Path | None, n_parallel: int, unified: bool, extra: list[str] | None = None) -> LlamaServer:
        cfg = ServerConfig(model=model, n_ctx=ctx, n_parallel=n_parallel, kv_unified=unified, threads=args.threads,
                           seed=1234, extra_args=extra or [])
        return LlamaServer(cfg, binary=binary)

    # the workload in tokens (as the model counts them), and the simulator's costs, from our server
    with server(None, args.parallel, True) as srv:
        n_prompt = [len(srv.post("/tokenize", {"content": p, "add_special": True}).json()["tokens"]) for p in prompts]
        costs = calibrate(srv.url)
    wl = Workload(wl_words.t_arrival, tuple(n_prompt), wl_words.n_gen)
    wl.to_jsonl(RESULTS / f"{name}_workload.jsonl")
    longest = max(p + g for p, g in zip(wl.n_prompt, wl.n_gen)) + 1
    slot = -(-longest // 256) * 256  # llama.cpp pads a slot's context to 256
    n_split = max(1, ctx // slot)
    console.print(f"workload: {len(wl)} requests at {rate}/s, prompts {min(n_prompt)}-{max(n_prompt)} tokens "
                  f"(median {statistics.median(n_prompt)}), answers {min(wl.n_gen)}-{max(wl.n_gen)} "
                  f"(median {statistics.median(wl.n_gen)}); longest {longest} cells; pool {ctx}")

    cells = [("stock", server(stock_server(console.print), args.parallel, True)),
             (f"static split {n_split}x{ctx // n_split}", server(None, n_split, False)),
             ("auto (llama-preempt)", server(None, args.parallel, True))]
    rows: list[dict[str, Any]] = []
    for cell_name, srv in cells:
        with srv:
            out, wall = run_load(srv, prompts, wl)
            parks = int(srv.metrics().get("n_preempt_total", 0)) if "stock" not in cell_name else 0
        rows.append(summarize(cell_name, out, wall, parks))
        console.print(rows[-1])

    sims = []
    for label, n_par, preempt in ((f"static split {n_split}x{ctx // n_split}", n_split, False),
                                  ("auto (llama-preempt)", args.parallel, True)):
        rep = simulate(wl, n_ctx=ctx if preempt else n_split * slot, n_parallel=n_par, preempt=preempt, costs=costs)
        e2e = [q["t_done"] - q["t_arrival"] for q in rep.per_request if q["outcome"] == "completed"]
        sims.append({"cell": f"simulated {label}", "completed": f"{rep.completed}/{rep.requests}",
                     "tok_s": round(rep.tokens_generated / rep.makespan_s, 1) if rep.makespan_s else None,
                     "ttft_p50_s": round(rep.ttft_p50_s, 3), "ttft_p99_s": round(rep.ttft_p99_s, 3),
                     "e2e_p50_s": r3(pct(e2e, 50)), "e2e_p99_s": r3(pct(e2e, 99)), "parks": rep.parks, "wall_s": round(rep.makespan_s, 1)})
        console.print(sims[-1])

    headers = ["cell", "completed", "tok/s", "TTFT p50 s", "TTFT p99 s", "end-to-end p50 s", "end-to-end p99 s",
               "parks", "wall s"]
    table = [[r["cell"], r["completed"], r["tok_s"], r["ttft_p50_s"], r["ttft_p99_s"], r["e2e_p50_s"], r["e2e_p99_s"],
              r["parks"], r["wall_s"]] for r in rows + sims]
    cmd = "python bench/mixed.py" + (" --quick" if quick else "")
    md = [f"Mixed load on {display_path(model)}: {len(wl)} requests, Poisson arrivals at {rate}/s, log-normal lengths "
          f"(prompts {min(n_prompt)}-{max(n_prompt)} tokens, median {statistics.median(n_prompt)}; answers "
          f"{min(wl.n_gen)}-{max(wl.n_gen)}, median {statistics.median(wl.n_gen)}); one pool of {ctx} cells; the "
          f"longest request needs {longest}. Workload: `{name}_workload.jsonl`.", ""] + md_table(headers, table) + \
         ["", f"Simulated with costs calibrated against the live server: {asdict(costs)}.", "", f"Command: `{cmd}`."]
    write_results(name, {"workload": {"n": len(wl), "rate": rate, "ctx": ctx}, "cells": rows, "simulated": sims,
                         "costs": asdict(costs)}, md)
    console.print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
