"""Requests that share a long prompt prefix, and n>1 requests, in one pool (issue 66's load).

    python bench/shared_prefix.py                 # both parts, SmolLM2-135M and stories260K
    python bench/shared_prefix.py --part prefix   # only the shared-prefix load
    python bench/shared_prefix.py --part n        # only the n>1 requests into a full pool

The shared-prefix load: SmolLM2-135M, one pool of --ctx cells (8,192), --requests (48) arriving at
--rate (3/s). Every prompt is the same text (about 777 tokens) followed by a question of its own;
48-token answers, streamed from /completion with `cache_prompt` at upstream's default (true).
Cells, each run --runs times, interleaved:

- static split: --no-kv-unified, --split slots (8) of ctx/8 cells each;
- upstream's unified pool, --slots (24) slots, --no-preempt;
- auto, 8 slots and auto, --slots slots: llama-preempt's defaults.

Per cell: requests completed, tok/s, TTFT p50, end-to-end p99, prompt tokens evaluated
(llamacpp:prompt_tokens_total) and parks. Held once, the common text and the questions are what a
pool that shares a prefix would evaluate; the table gives that figure beside the measured ones.

The n>1 part: stories260K, -c 1024 -np 6: six ordinary 200-400-token requests beside four n>1
requests (n_cmpl 3 on /completion twice, n 3 on /v1/completions twice), each family small enough
for the pool alone; how many families and choices were lost (a 4xx/5xx), per run.

Written to bench/results/shared_prefix.{json,md}.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Callable

import requests
from rich.console import Console

from llama_preempt.server import LlamaServer, ServerConfig
from llama_preempt.simulator import Workload
from mixed import WORDS, median_of, median_range, run_load, summarize
from results_io import md_table, smollm2_model, stories_model, write_results

FIGURES = [("completed", "completed"), ("tok_s", "tok/s"), ("ttft_p50_s", "TTFT p50 s"), ("e2e_p99_s", "end-to-end p99 s"),
           ("prompt_evaluated", "prompt tokens evaluated"), ("prompt_linked", "prompt tokens linked"), ("parks", "parks")]
QUESTIONS = ("what did the girl find in the park and why did she keep it",
             "who helped the dog when it was lost near the big tree",
             "where did the children go after the rain stopped that day",
             "how did the little bird learn to sing the happy song")


def common_text(n_words: int) -> str:
    return " ".join(WORDS[k % len(WORDS)] for k in range(n_words))


def question(i: int) -> str:
    """A question of its own: 30 to 110 words, never the same twice."""
    n = 30 + (i * 37) % 80
    words = " ".join(QUESTIONS[(i + k) % len(QUESTIONS)] for k in range(n // 10 + 1)).split()[:n]
    return f"\n\nQuestion {i}: " + " ".join(words) + "?\nAnswer:"


def prefix_cells(n_slots: int, n_split: int) -> list[tuple[str, dict[str, Any]]]:
    no_share = ["--no-prefix-share"]
    return [(f"static split, {n_split} slots", {"n_parallel": n_split, "unified": False}),
            (f"upstream's unified pool, {n_slots} slots", {"n_parallel": n_slots, "unified": True, "preempt": False}),
            (f"auto, {n_split} slots, no sharing", {"n_parallel": n_split, "unified": True, "extra": no_share}),
            (f"auto, {n_slots} slots, no sharing", {"n_parallel": n_slots, "unified": True, "extra": no_share}),
            (f"auto, {n_split} slots, prefix shared", {"n_parallel": n_split, "unified": True}),
            (f"auto, {n_slots} slots, prefix shared", {"n_parallel": n_slots, "unified": True})]


def run_prefix(args: argparse.Namespace, console: Console) -> tuple[list[str], dict[str, Any]]:
    model = smollm2_model(args.model)

    def server(n_parallel: int, unified: bool, preempt: bool | None = None, extra: list[str] | None = None) -> LlamaServer:
        return LlamaServer(ServerConfig(model=model, n_ctx=args.ctx, n_parallel=n_parallel, kv_unified=unified,
                                        threads=args.threads, seed=1234, preempt=preempt, extra_args=list(extra or [])),
                           log_dir=args.log_dir)

    common = common_text(args.common_words)
    prompts = [common + question(i) for i in range(args.requests)]
    with server(1, True) as srv:
        def n_tok(text: str) -> int:
            return len(srv.post("/tokenize", {"content": text, "add_special": True}).json()["tokens"])
        n_common = n_tok(common)
        n_prompt = [n_tok(p) for p in prompts]
    held_once = n_common + sum(n - n_common for n in n_prompt)
    gap = 1.0 / args.rate
    wl = Workload(tuple(i * gap for i in range(args.requests)), tuple(n_prompt), tuple([args.gen] * args.requests))
    console.print(f"{model.name}: {args.requests} requests at {args.rate}/s into {args.ctx} cells; common text "
                  f"{n_common} tokens, prompts {min(n_prompt)}-{max(n_prompt)}; held once: {held_once} prompt tokens")
    cells: list[tuple[str, Callable[[], LlamaServer]]] = [
        (label, lambda how=how: server(how["n_parallel"], how["unified"], how.get("preempt"), how.get("extra")))
        for label, how in prefix_cells(args.slots, args.split) if not args.only or args.only in label]
    runs: dict[str, list[dict[str, Any]]] = {label: [] for label, _ in cells}
    for run in range(args.runs):
        for label, make in cells:
            with make() as srv:
                out, wall = run_load(srv, prompts, wl, cache_prompt=True)
                m = srv.metrics()
                row = summarize(label, out, wall, m)
            row["prompt_evaluated"] = int(m.get("prompt_tokens_total", 0))
            row["prompt_linked"] = int(m.get("n_prompt_tokens_linked_total", 0))
            runs[label].append(row)
            console.print(f"run {run + 1}/{args.runs}: {label}: {row['completed']} done, {row['tok_s']} tok/s, "
                          f"TTFT p50 {row['ttft_p50_s']} s, end-to-end p99 {row['e2e_p99_s']} s, "
                          f"{row['prompt_evaluated']} prompt tokens evaluated, {row['prompt_linked']} linked, "
                          f"{row['parks']} parks")
    table = []
    for label, _ in cells:
        rs = runs[label]
        table.append([label, len(rs), *[median_range([r[k] for r in rs]) if k != "completed" else rs[-1][k]
                                        for k, _ in FIGURES]])
    split = f"static split, {args.split} slots"
    auto = f"auto, {args.slots} slots, prefix shared"
    def ratio_of(key: str) -> float:
        if not runs.get(auto) or not runs.get(split):
            return float("nan")
        return (median_of(runs[auto], key) or 0.0) / (median_of(runs[split], key) or float("nan"))
    ratio = ratio_of("tok_s")
    md = [f"{model.name}: {args.requests} requests at {args.rate}/s into one pool of {args.ctx} cells; a common text of "
          f"{n_common} tokens and a question of its own (prompts of {min(n_prompt)}-{max(n_prompt)} tokens), "
          f"{args.gen}-token answers, streamed, cache_prompt on; {args.runs} interleaved run(s), medians (range). "
          f"Held once, the common text and the questions are {held_once} prompt tokens.", "",
          *md_table(["cell", "runs", *[h for _, h in FIGURES]], table), "",
          f"auto at {args.slots} slots with the prefix shared against the split: {ratio:.2f}x its tok/s, "
          f"{ratio_of('ttft_p50_s'):.2f}x its TTFT p50, {ratio_of('e2e_p99_s'):.2f}x its end-to-end p99."]
    record = {"model": model.name, "ctx": args.ctx, "requests": args.requests, "rate": args.rate,
              "n_common": n_common, "n_prompt": n_prompt, "held_once": held_once, "runs": runs}
    return md, record


def run_n(args: argparse.Namespace, console: Console) -> tuple[list[str], dict[str, Any]]:
    model = stories_model(None)
    rows = []
    for run in range(args.runs):
        cfg = ServerConfig(model=model, n_ctx=1024, n_parallel=6, kv_unified=True, threads=args.threads, seed=1234)
        with LlamaServer(cfg, log_dir=args.log_dir) as srv:
            def plain(i: int) -> tuple[str, int, int]:
                r = requests.post(srv.url + "/completion", json={"prompt": f"Once upon a time {i}", "n_predict": 200 + 40 * i,
                                                                 "ignore_eos": True, "temperature": 0}, timeout=600)
                return "plain", r.status_code, 1

            def family(i: int) -> tuple[str, int, int]:
                prompt = f"The little dog {i} ran to the park"
                if i % 2 == 0:
                    r = requests.post(srv.url + "/completion", json={"prompt": prompt, "n_predict": 200, "n_cmpl": 3,
                                                                     "ignore_eos": True}, timeout=600)
                else:
                    r = requests.post(srv.url + "/v1/completions", json={"prompt": prompt, "max_tokens": 200, "n": 3,
                                                                         "ignore_eos": True}, timeout=600)
                return "family", r.status_code, 3

            from concurrent.futures import ThreadPoolExecutor
            with ThreadPoolExecutor(max_workers=10) as ex:
                futures = [ex.submit(plain, i) for i in range(6)] + [ex.submit(family, i) for i in range(4)]
                done = [f.result() for f in futures]
            m = srv.metrics()
        lost_fam = sum(1 for kind, code, _ in done if kind == "family" and code != 200)
        lost_choices = sum(n for kind, code, n in done if kind == "family" and code != 200)
        lost_plain = sum(1 for kind, code, _ in done if kind == "plain" and code != 200)
        rows.append([run + 1, f"{4 - lost_fam}/4", f"{12 - lost_choices}/12", f"{6 - lost_plain}/6",
                     int(m.get("n_preempt_total", 0))])
        console.print(f"n>1 run {run + 1}: families {4 - lost_fam}/4, choices {12 - lost_choices}/12, "
                      f"ordinary {6 - lost_plain}/6, parks {rows[-1][-1]}")
    md = [f"{model.name}, -c 1024 -np 6: six ordinary requests (200-400 tokens) beside four n>1 requests of 3 "
          "choices (n_cmpl on /completion, n on /v1/completions), 200 tokens each, all at once.", "",
          *md_table(["run", "n>1 families completed", "choices", "ordinary completed", "parks"], rows)]
    return md, {"model": model.name, "rows": rows}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--part", choices=("prefix", "n", "both"), default="both")
    ap.add_argument("--model", type=Path, default=None, help="a gguf in place of SmolLM2-135M (the prefix part)")
    ap.add_argument("--requests", type=int, default=48)
    ap.add_argument("--rate", type=float, default=3.0, help="arrivals per second")
    ap.add_argument("--ctx", type=int, default=8192, help="the pool's cells")
    ap.add_argument("--slots", type=int, default=24, help="slots of the unified pool and the larger auto cell")
    ap.add_argument("--split", type=int, default=8, help="slots of the static split and the smaller auto cell")
    ap.add_argument("--common-words", type=int, default=700, help="words of the common text (700: 700 SmolLM2 tokens; the issue measured 777)")
    ap.add_argument("--gen", type=int, default=48, help="tokens per answer")
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--only", default="", help="run only the cells whose label holds this text (e.g. 'prefix shared')")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--name", default="shared_prefix")
    ap.add_argument("--log-dir", type=Path, default=None, help="keep each cell's server log here")
    args = ap.parse_args(argv)
    console = Console()
    cmd = "python bench/shared_prefix.py " + " ".join(argv if argv is not None else sys.argv[1:])
    md = [f"# {args.name}", "", f"`{cmd.strip()}`", ""]
    record: dict[str, Any] = {"command": cmd.strip()}
    if args.part in ("prefix", "both"):
        part_md, record["prefix"] = run_prefix(args, console)
        md += ["## A shared prefix", "", *part_md, ""]
    if args.part in ("n", "both"):
        part_md, record["n"] = run_n(args, console)
        md += ["## n>1 requests into a full pool", "", *part_md, ""]
    write_results(args.name, record, md)
    console.print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
