#!/usr/bin/env python3
"""Does the simulator reproduce a live run? Calibrate it against the run's own cells, then compare.

    python bench/sim_reproduce.py bench/results/h200-2026-12-04b/mixed/mixed_gpu.json \
        --fit-from bench/results/h200-2026-12-04b/mixed/auto__64_slots_run_1.metrics.txt --name sim_reproduce_h200
    python bench/sim_reproduce.py bench/results/overload_chat.json --name sim_reproduce_cpu

Reads a `bench/mixed.py` result (its cells' live figures and its workload, `NAME_workload.jsonl`
beside it) and simulates every cell the simulator can model: the static split (its slots' own
shares, each slot's attention spanning its own cells), auto with N slots, with the width on and
off, and upstream's unified pool with every slot decoding (`--no-preempt`, which the simulator
runs as a unified pool that never overflows). The step cost's fixed and per-prompt-token parts
come from the run's calibration (the server's own fit after a calibration load, in the result's
`costs`), or with --fit-from from a live cell's `/metrics` (the server's fit of the run's own steps,
`preempt_step_*`); the two parts a
calibration load of a few requests cannot see are fitted to the cells' throughput and median TTFT
(the service rate and the queue it builds): the cost per generated token (host work per token:
sampling, processing, sending) and per cell the attention spans (in a unified pool every token
spans the pool's used cells). The tails (TTFT p99, end-to-end p99) are not fitted: they are the
check. Results: bench/results/NAME.{json,md}.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from rich.console import Console

from llama_preempt.metrics import parse_prometheus
from llama_preempt.simulator import Costs, Workload, simulate
from results_io import display_path, md_table, write_results

COMPARED = [("tok_s", "tok/s"), ("ttft_p50_s", "TTFT p50 s"), ("ttft_p99_s", "TTFT p99 s"), ("e2e_p99_s", "end-to-end p99 s")]


def cell_params(name: str, ctx: int, own_cells: bool = False) -> dict[str, Any] | None:
    """The simulate() arguments of a mixed.py cell, by its name (None: not one the simulator models);
    `own_cells`: the run's unified pools walked each slot's own cells (--attn-own-cells on the CPU)."""
    if m := re.fullmatch(r"static split (\d+)x(\d+)", name):
        n, share = int(m.group(1)), int(m.group(2))
        return {"n_ctx": n * share, "n_parallel": n, "preempt": False, "kv_unified": False}
    if m := re.fullmatch(r"unified, (\d+) slots, no preempt", name):
        return {"n_ctx": ctx, "n_parallel": int(m.group(1)), "preempt": False, "attn_own_cells": own_cells}
    if m := re.fullmatch(r"auto, (\d+) slots(, width off)?", name):
        return {"n_ctx": ctx, "n_parallel": int(m.group(1)), "sched": "width-loss=0" if m.group(2) else None,
                "attn_own_cells": own_cells}
    return None


def live_figures(rows: list[dict[str, Any]]) -> dict[str, float]:
    """A cell's live figures: the median over its runs."""
    out = {}
    for key, _ in COMPARED:
        v = sorted(r[key] for r in rows if r.get(key) is not None)
        out[key] = v[len(v) // 2]
    return out


def run_cells(wl: Workload, cells: dict[str, dict[str, Any]], costs: Costs) -> dict[str, dict[str, float]]:
    out = {}
    for name, kw in cells.items():
        r = simulate(wl, costs=costs, cache_ram_mib=0, **kw)
        out[name] = {"tok_s": r.tok_s, "ttft_p50_s": r.ttft_p50_s, "ttft_p99_s": r.ttft_p99_s, "e2e_p99_s": r.e2e_p99_s,
                     "steps": r.steps, "width": r.decode_width_mean, "completed": r.completed}
    return out


FITTED = ("tok_s", "ttft_p50_s")


def fitted_error(sim: dict[str, dict[str, float]], live: dict[str, dict[str, float]]) -> float:
    """The largest relative error of the fitted figures over the cells."""
    return max(abs(sim[n][k] - live[n][k]) / live[n][k] for n in live for k in FITTED)


def fit_costs(wl: Workload, cells: dict[str, dict[str, Any]], live: dict[str, dict[str, float]], base: Costs,
              console: Console) -> tuple[Costs, dict[str, dict[str, float]]]:
    """The per-token and per-spanned-cell costs that bring every cell's simulated throughput and
    median TTFT nearest the live ones (the largest relative error, least): a coarse grid, then a
    finer one around its best."""
    def grid(tokens: list[float], spans: list[float]) -> tuple[float, Costs, dict[str, dict[str, float]]]:
        best: tuple[float, Costs, dict[str, dict[str, float]]] | None = None
        for d in tokens:
            for s in spans:
                c = replace(base, decode_token_ms=d, span_cell_ns=s)
                sim = run_cells(wl, cells, c)
                err = fitted_error(sim, live)
                if best is None or err < best[0]:
                    best = (err, c, sim)
        assert best is not None
        return best

    # the scale of a token's cost: the live cell with the most throughput, as if all of it were per token
    top = max(v["tok_s"] for v in live.values())
    d0 = 1000.0 / top
    err, c, sim = grid([d0 * f for f in (0.25, 0.5, 0.75, 1.0)], [0.0, 2.0, 5.0, 10.0, 20.0])
    console.print(f"coarse: {c.decode_token_ms:.3f} ms/token, {c.span_cell_ns:g} ns/spanned cell, off by {err:.0%} at most")
    d, s = c.decode_token_ms, c.span_cell_ns
    err, c, sim = grid([d * f for f in (0.8, 0.85, 0.9, 0.95, 1.0, 1.05, 1.1, 1.15, 1.2)],
                       [max(0.0, s + k) for k in (-3.0, -2.0, -1.0, 0.0, 1.0, 2.0, 3.0)])
    console.print(f"fine: {c.decode_token_ms:.3f} ms/token, {c.span_cell_ns:g} ns/spanned cell, off by {err:.0%} at most")
    return c, sim


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("result", type=Path, help="a bench/mixed.py result (.json), its _workload.jsonl beside it")
    ap.add_argument("--fit-from", type=Path, default=None,
                    help="a cell's saved /metrics (mixed.py --log-dir): the step's fixed and per-prompt-token parts "
                         "from the server's fit of the run's own steps, not from the calibration load")
    ap.add_argument("--name", default="sim_reproduce")
    ap.add_argument("--own-cells", action="store_true",
                    help="the run's unified pools walked each slot's own cells (--attn-own-cells: the CPU's flash "
                         "attention from issue 56 on); default: they spanned the pool (the H200's, the CPU's before)")
    args = ap.parse_args(argv)
    console = Console()
    d = json.loads(args.result.read_text())
    wl_path = args.result.with_name(args.result.stem + "_workload.jsonl")
    if not wl_path.is_file():
        raise SystemExit(f"sim_reproduce.py: no workload beside the result: {wl_path} (bench/mixed.py writes NAME_workload.jsonl)")
    wl = Workload.from_jsonl(wl_path)
    ctx = int(d["workload"]["ctx"])
    cells = {n: p for n in d["runs"] if (p := cell_params(n, ctx, args.own_cells)) is not None}
    if not cells:
        raise SystemExit(f"sim_reproduce.py: {args.result} has no cell the simulator models (static split, auto, unified)")
    live = {n: live_figures(d["runs"][n]) for n in cells}
    known = {k: v for k, v in d["costs"].items() if k in Costs.__dataclass_fields__}
    base = Costs(**known)
    if args.fit_from is not None:
        m = parse_prometheus(args.fit_from.read_text())
        if m.get("preempt_step_cost_samples", 0) < 32:
            raise SystemExit(f"sim_reproduce.py: {args.fit_from} has no trusted step fit (preempt_step_cost_samples < 32)")
        base = replace(base, step_ms=m["preempt_step_fixed_ns"] / 1e6, prefill_token_ms=m["preempt_step_prompt_token_ns"] / 1e6)
    costs, sim = fit_costs(wl, cells, live, base, console)

    rows, worst = [], 0.0
    for n in cells:
        cols = []
        for key, _ in COMPARED:
            s, l = sim[n][key], live[n][key]
            err = (s - l) / l
            worst = max(worst, abs(err))
            cols.append(f"{s:.3g} / {l:.3g} ({err:+.0%})")
        rows.append([n] + cols + [f"{sim[n]['width']:.1f}"])
    headers = ["cell"] + [label for _, label in COMPARED] + ["mean width (sim)"]
    cmd = "python bench/sim_reproduce.py " + " ".join(sys.argv[1:] if argv is None else argv)
    source = f"the server's fit in `{display_path(args.fit_from)}`" if args.fit_from else "the run's calibration"
    md = [f"The simulator against the live cells of `{display_path(args.result)}` (simulated / live, and the error). "
          f"The step's fixed and per-prompt-token parts are {source}; the cost per generated token and "
          f"per cell the attention spans are fitted to the cells' throughput and median TTFT; the tails (TTFT p99, "
          f"end-to-end p99) are not fitted.", ""] + \
        md_table(headers, rows) + \
        ["", f"Costs: {asdict(costs)}.", "", f"Largest error: {worst:.0%} "
         f"({'within' if worst <= 0.15 else 'beyond'} the 15 % goal).", "", f"Command: `{cmd}`."]
    write_results(args.name, {"result": display_path(args.result), "costs": asdict(costs),
                              "cells": {n: {"simulated": sim[n], "live": live[n]} for n in cells}, "largest_error": worst}, md)
    console.print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
