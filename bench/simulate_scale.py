#!/usr/bin/env python3
"""How fast the simulator sizes a large deployment: 256 slots, a 1M-cell pool, 10,000 requests.

The load oversubscribes the pool (prompts of 1,000-8,000 tokens, answers of 500-4,000, arriving at
40 requests/s), so the planner parks and resumes all along. Prints and saves the wall time of
each configuration to bench/results/simulate_scale.{json,md}.

    python bench/simulate_scale.py
"""
from __future__ import annotations

import sys
import time

from llama_preempt.simulator import Workload, simulate
from results_io import md_table, write_results  # bench/ is on sys.path when run as a script


def main() -> int:
    wl = Workload.synthetic(10_000, rate=40.0, prompt="1000-8000", gen="500-4000", seed=7)
    rows = []
    for ram in (-1, 0, 4096):
        t0 = time.perf_counter()
        r = simulate(wl, n_ctx=1 << 20, n_parallel=256, n_batch=2048, preempt_ram_mib=ram)
        wall = time.perf_counter() - t0
        rows.append({"preempt_ram_mib": ram, "wall_s": round(wall, 2), "steps": r.steps, "completed": r.completed,
                     "failed": r.failed, "parks_swap": r.parks_swap, "parks_recompute": r.parks_recompute,
                     "recomputed_tokens": r.recomputed_tokens, "makespan_s": round(r.makespan_s, 1),
                     "us_per_step": round(wall / max(1, r.steps) * 1e6, 1)})
        print(rows[-1])
    out = {"command": "python bench/simulate_scale.py",
           "workload": "10,000 requests, rate 40/s, prompt 1000-8000, gen 500-4000, seed 7; -c 1048576 -np 256 -b 2048",
           "runs": rows}
    keys = ["preempt_ram_mib", "wall_s", "steps", "us_per_step", "completed", "failed", "parks_swap", "parks_recompute",
            "makespan_s"]
    md = md_table(["--preempt-ram", "wall s", "steps", "µs/step", "completed", "failed", "parks swap", "parks recompute",
                   "simulated makespan s"], [[r[k] for k in keys] for r in rows])
    write_results("simulate_scale", out, md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
