"""What sharing one pool costs at many slots: the static split against one unified pool (issue 56).

    python bench/shared_pool.py                       # stories260K, 64 slots, flash attention on and off
    python bench/shared_pool.py --smollm2             # SmolLM2-135M, 32 slots against the 32-slot split
    python bench/shared_pool.py --fa on --runs 1      # a quicker look

A chat load (bench/mixed.py's: log-normal prompts and answers, Poisson arrivals, streamed by the
cells' client) into one pool of --ctx cells, served these ways, the cells taking turns run by run:

- static split: --no-kv-unified with as many slots as the pool holds copies of the longest request
  (nothing can fail; the rest wait for a slot), or --split N slots;
- unified, N slots, --no-preempt (upstream's unified server with this build's attention);
- auto, N slots: llama-preempt's defaults;
- the same two with --no-attn-own-cells: attention over every cell up to the pool's highest used
  one, as upstream's does (the "before"; --no-dense leaves them out). With flash attention the CPU
  walks each request's runs of cells; with -fa off (and on a GPU) each request's cells are gathered
  into a stream of their own.

Each with flash attention on (-fa on) and off (-fa off) as --fa says. Per cell: tokens/s, TTFT and
end-to-end latency (p50, p99), medians of the runs with their ranges, each against the split of the
same flash-attention setting; and issue 56's goals. Written to bench/results/NAME.{json,md}.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any, Callable

from rich.console import Console

from llama_preempt.server import LlamaServer, ServerConfig
from llama_preempt.simulator import Workload
from mixed import median_of, median_range, prompt_of, run_load, summarize, workload_words
from results_io import md_table, smollm2_model, stories_model, write_results

FIGURES = [("tok_s", "tok/s"), ("ttft_p50_s", "TTFT p50 s"), ("ttft_p99_s", "TTFT p99 s"),
           ("e2e_p50_s", "end-to-end p50 s"), ("e2e_p99_s", "end-to-end p99 s"), ("step_ms", "ms/step")]


def cell_specs(n_slots: int, n_split: int, fa: str, dense: bool) -> list[tuple[str, dict[str, Any]]]:
    """(label, how to serve it) for one flash-attention setting."""
    fa_args = ["-fa", fa]
    out = [(f"split {n_split}, fa {fa}", {"n_parallel": n_split, "unified": False, "extra": fa_args}),
           (f"unified {n_slots}, fa {fa}", {"n_parallel": n_slots, "unified": True, "extra": fa_args, "preempt": False}),
           (f"auto {n_slots}, fa {fa}", {"n_parallel": n_slots, "unified": True, "extra": fa_args})]
    if dense:
        off = [*fa_args, "--no-attn-own-cells"]
        out += [(f"unified {n_slots}, fa {fa}, every cell", {"n_parallel": n_slots, "unified": True, "extra": off,
                                                             "preempt": False}),
                (f"auto {n_slots}, fa {fa}, every cell", {"n_parallel": n_slots, "unified": True, "extra": off})]
    return out


def goal_rows(runs: dict[str, list[dict[str, Any]]], n_slots: int, n_split: int, fas: list[str],
              smollm2: bool) -> list[list[str]]:
    """Issue 56's goals on the medians."""
    def m(label: str, k: str) -> float:
        return median_of(runs.get(label, []), k) or float("nan")

    rows = []
    for fa in fas:
        split = f"split {n_split}, fa {fa}"
        if split not in runs or (smollm2 and fa == "off"):  # the SmolLM2 goals are flash attention's
            continue
        floor = 1.0 if smollm2 else (0.95 if fa == "on" else 0.9)
        for kind in (("auto",) if smollm2 else ("unified", "auto")):
            cell = f"{kind} {n_slots}, fa {fa}"
            ratio = m(cell, "tok_s") / m(split, "tok_s")
            rows.append([cell, f"tok/s >= {floor:g}x split", "met" if ratio >= floor else "**not met**", f"{ratio:.2f}x"])
            if kind == "auto" and fa == "on":
                bound = 1.0 if smollm2 else 1.05
                e2e = m(cell, "e2e_p99_s") / m(split, "e2e_p99_s")
                rows.append([cell, f"end-to-end p99 <= {bound:g}x split", "met" if e2e <= bound else "**not met**",
                             f"{e2e:.2f}x"])
                if not smollm2:
                    ttft = m(cell, "ttft_p50_s") / m(split, "ttft_p50_s")
                    rows.append([cell, "TTFT p50 <= split", "met" if ttft <= 1.0 else "**not met**", f"{ttft:.2f}x"])
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smollm2", action="store_true", help="SmolLM2-135M (default: stories260K)")
    ap.add_argument("--model", type=Path, default=None, help="a gguf in place of the default of its kind")
    ap.add_argument("--requests", type=int, default=None, help="default 360 (stories260K), 96 (SmolLM2)")
    ap.add_argument("--rate", type=float, default=None, help="arrivals per second (default 150, SmolLM2 30)")
    ap.add_argument("--ctx", type=int, default=None, help="the pool (default 16384, SmolLM2 8192)")
    ap.add_argument("--slots", type=int, default=None, help="slots of the unified cells (default 64, SmolLM2 32)")
    ap.add_argument("--split", type=int, default=None,
                    help="slots of the static split (default: as many as hold the longest request; SmolLM2 32)")
    ap.add_argument("--prompt-median", type=int, default=None, help="prompt words, median (default 40, SmolLM2 48)")
    ap.add_argument("--gen-median", type=int, default=None, help="answer tokens, median (default 46, SmolLM2 48)")
    ap.add_argument("--fa", choices=("on", "off", "both"), default="both", help="flash attention of every cell")
    ap.add_argument("--no-dense", action="store_true", help="leave out the --no-attn-own-cells cells")
    ap.add_argument("--runs", type=int, default=2, help="runs per cell, interleaved (medians and ranges)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--name", default=None)
    ap.add_argument("--log-dir", type=Path, default=None, help="keep each cell's server log here")
    args = ap.parse_args(argv)
    console = Console()
    smol = args.smollm2
    model = (smollm2_model if smol else stories_model)(args.model)
    ctx = args.ctx or (8192 if smol else 16384)
    n_slots = args.slots or (32 if smol else 64)
    n_req = args.requests or (96 if smol else 360)
    rate = args.rate or (30.0 if smol else 150.0)
    name = args.name or ("shared_pool_smollm2" if smol else "shared_pool")
    fas = ["on", "off"] if args.fa == "both" else [args.fa]
    # the lengths are bounded by the pool a split slot gets where the split's slots are given (so that
    # every request fits one), else by the whole pool (the split then has as many slots as fit)
    split_given = args.split or (32 if smol else None)
    wl_words = workload_words("chat", n_req, rate, ctx // split_given if split_given else ctx,
                              args.prompt_median or (48 if smol else 40), args.gen_median or (48 if smol else 46),
                              args.seed)
    prompts = [prompt_of(n, i) for i, n in enumerate(wl_words.n_prompt)]

    def server(n_parallel: int, unified: bool, extra: list[str], preempt: bool | None = None) -> LlamaServer:
        cfg = ServerConfig(model=model, n_ctx=ctx, n_parallel=n_parallel, kv_unified=unified, threads=args.threads,
                           seed=1234, extra_args=extra, preempt=preempt)
        return LlamaServer(cfg, log_dir=args.log_dir)

    with server(1, True, []) as srv:
        n_prompt = [len(srv.post("/tokenize", {"content": p, "add_special": True}).json()["tokens"]) for p in prompts]
    wl = Workload(wl_words.t_arrival, tuple(n_prompt), wl_words.n_gen)
    longest = max(p + g for p, g in zip(wl.n_prompt, wl.n_gen)) + 1
    n_split = split_given or max(1, ctx // (-(-longest // 256) * 256))
    console.print(f"{model.name}: {len(wl)} chats at {rate}/s into {ctx} cells; prompts median "
                  f"{statistics.median(n_prompt):g} tokens (max {max(n_prompt)}), answers median "
                  f"{statistics.median(wl.n_gen):g} (max {max(wl.n_gen)}); split {n_split}, unified {n_slots}")

    cells: list[tuple[str, Callable[[], LlamaServer]]] = []
    for fa in fas:
        for label, how in cell_specs(n_slots, n_split, fa, not args.no_dense):
            cells.append((label, lambda how=how: server(how["n_parallel"], how["unified"], how["extra"], how.get("preempt"))))
    runs: dict[str, list[dict[str, Any]]] = {label: [] for label, _ in cells}
    for run in range(args.runs):  # interleaved: every cell once per run
        for label, make in cells:
            with make() as srv:
                out, wall = run_load(srv, prompts, wl)
                row = summarize(label, out, wall, srv.metrics())
            runs[label].append(row)
            console.print(f"run {run + 1}/{args.runs}: {label}: {row['completed']} done, {row['tok_s']} tok/s, "
                          f"TTFT p50 {row['ttft_p50_s']} s, end-to-end p99 {row['e2e_p99_s']} s")

    keys = [k for k, _ in FIGURES]
    table = []
    for label, _ in cells:
        rs = runs[label]
        fa = label.split("fa ")[1].split(",")[0]
        split_tok = median_of(runs[f"split {n_split}, fa {fa}"], "tok_s")
        ratio = (median_of(rs, "tok_s") or 0.0) / split_tok if split_tok else float("nan")
        table.append([label, len(rs), rs[0]["completed"], *[median_range([r[k] for r in rs]) for k in keys], f"{ratio:.2f}x"])
    headers = ["cell", "runs", "completed", *[h for _, h in FIGURES], "tok/s vs split"]
    goals = goal_rows(runs, n_slots, n_split, fas, smol)
    cmd = "python bench/shared_pool.py " + " ".join(argv if argv is not None else sys.argv[1:])
    md = [f"# {name}", "", f"`{cmd.strip()}`", "",
          f"{model.name}: {len(wl)} chats at {rate}/s into {ctx} cells, prompts median {statistics.median(n_prompt):g} "
          f"tokens, answers median {statistics.median(wl.n_gen):g}; {args.runs} interleaved runs, medians (range).", "",
          *md_table(headers, table), "", "Issue 56's goals:", "", *md_table(["cell", "goal", "", "measured"], goals)]
    record = {"command": cmd.strip(), "model": model.name, "ctx": ctx, "n_slots": n_slots, "n_split": n_split,
              "requests": len(wl), "rate": rate, "runs": runs, "goals": goals}
    write_results(name, record, md)
    console.print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
