"""The planner's overload knobs swept in the simulator, against the static split (issues 31, 39).

    python bench/overload_sweep.py      # about a minute on 2 cores

The simulator runs the server's own planner (`plan_step()`) and the server's own step-cost fit, so
its scheduling knobs (`--preempt-sched`: width-loss, width, max-gap-ms, prompt-budget,
restore-headroom, near-finish, starved, age-step-ms, pass-limit-ms) can be explored over many
workloads in seconds before the live server confirms the defaults (`bench/mixed.py`). Three
workload shapes, twelve seeds each, on a 1,024-cell pool, with the step cost the live server fitted
for SmolLM2-135M on this machine (`bench/mixed.py`'s calibration):

- chat: 36 requests at 1.5/s, log-normal lengths, prompts median 124 tokens, answers median 63;
- long: 36 at 1.5/s, a few very long prompts among many short chats (sigma 1.6, prompts median 40);
- many: 72 at 3/s, many more short requests than slots (sigma 0.8, prompts median 48, answers 32).

Per configuration and slot count: the median over the seeds of each figure divided by the static
split's on the same seed (the split sized for the longest request, as `bench/mixed.py` sizes it),
and the worst seed for the tails. Goals: TTFT p50 at most 0.5, TTFT p99 at most 0.8, end-to-end p99
at most 1, tok/s at least 1.

Then the GPU shape: the same planner with a step cost from one H200 (the figures in
`../shared/notes/scheduling-2026-12.md`: 8 chats of a Llama-3.2-1B-shaped model decode at 1336
tok/s together, a step of about 6 ms for 8 tokens), on a load sized for it: the width it chooses
and the same ratios. Writes bench/results/overload.md and .json.
"""
from __future__ import annotations

import statistics
import sys
from typing import Any

from llama_preempt.simulator import Costs, Workload, simulate
from results_io import md_table, write_results

# the step cost the live server fits for SmolLM2-135M Q4_1 on 2 cores under the chat load (the
# simulator's defaults; bench/README.md, "Overload")
COSTS = Costs()
# one H200, a Llama-3.2-1B-shaped model: a step of 5 ms fixed (weights read once, launches) and
# 0.125 ms a generated token gives 8 / (5 + 8 x 0.125) = 1333 tok/s for 8 chats, the measured 1336;
# prefill at 30k tokens/s; attention 2 ns a cell
GPU_COSTS = Costs(step_ms=5.0, decode_token_ms=0.125, prefill_token_ms=0.033, attend_cell_ns=2.0,
                  bytes_per_cell=32768, swap_out_gbps=25, swap_in_gbps=25)
POOL = 1024
SEEDS = range(1, 13)


def pct(v: list[float], q: float) -> float:
    s = sorted(v)
    k = (len(s) - 1) * q / 100
    f = int(k)
    c = min(f + 1, len(s) - 1)
    return s[f] + (s[c] - s[f]) * (k - f)


def figures(rep: Any) -> dict[str, float]:
    ok = [q for q in rep.per_request if q["outcome"] == "completed"]
    ttft = [q["t_first"] - q["t_arrival"] for q in ok]
    e2e = [q["t_done"] - q["t_arrival"] for q in ok]
    return {"done": len(ok) / len(rep.per_request), "tok": rep.tokens_generated / rep.makespan_s,
            "t50": pct(ttft, 50), "t99": pct(ttft, 99), "e99": pct(e2e, 99), "parks": rep.parks,
            "recomputed": rep.recomputed_tokens, "width": rep.decode_width_mean,
            "gap": rep.gap_max_s, "s99": rep.ttst_p99_s}


def workload(shape: str, seed: int) -> Workload:
    if shape == "long":
        return Workload.lognormal(36, rate=1.5, prompt_median=40, gen_median=40, sigma=1.6, max_prompt=POOL * 3 // 8,
                                  max_gen=POOL // 5, seed=seed)
    if shape == "many":
        return Workload.lognormal(72, rate=3.0, prompt_median=48, gen_median=32, sigma=0.8, max_prompt=POOL // 4,
                                  max_gen=POOL // 5, seed=seed)
    return Workload.lognormal(36, rate=1.5, prompt_median=124, gen_median=63, max_prompt=POOL // 3,
                              max_gen=POOL // 4, seed=seed)


def static_split(wl: Workload, pool: int, costs: Costs) -> dict[str, float]:
    longest = max(p + g for p, g in zip(wl.n_prompt, wl.n_gen)) + 1
    slot = -(-longest // 256) * 256
    n = max(1, pool // slot)
    return figures(simulate(wl, n_ctx=n * slot, n_parallel=n, preempt=False, costs=costs))


CONFIGS = [
    ("defaults", ""),
    ("width off (width-loss=0)", "width-loss=0"),
    ("width-loss=25", "width-loss=25"),
    ("width-loss=75", "width-loss=75"),
    ("max-gap-ms=0 (no bound)", "max-gap-ms=0"),
    ("max-gap-ms=1500", "max-gap-ms=1500"),
    ("max-gap-ms=6000", "max-gap-ms=6000"),
    ("prompt-budget=64", "prompt-budget=64"),
    ("prompt-budget=1024", "prompt-budget=1024"),
    ("pass-limit-ms=0 (strict arrival order)", "pass-limit-ms=0"),
]


def ratios(got: list[dict[str, float]], base: list[dict[str, float]]) -> tuple[dict[str, float], dict[str, float]]:
    ratio = {k: statistics.median(g[k] / b[k] for g, b in zip(got, base)) for k in ("t50", "t99", "e99", "tok")}
    worst = {k: max(g[k] / b[k] for g, b in zip(got, base)) for k in ("t99", "e99")}
    return ratio, worst


def main() -> int:
    rows: list[list[Any]] = []
    record: list[dict[str, Any]] = []
    for shape in ("chat", "long", "many"):
        wls = [workload(shape, s) for s in SEEDS]
        base = [static_split(w, POOL, COSTS) for w in wls]
        for name, sched in CONFIGS:
            for n_par in (4, 8, 16):
                got = [figures(simulate(w, n_ctx=POOL, n_parallel=n_par, costs=COSTS, sched=sched)) for w in wls]
                ratio, worst = ratios(got, base)
                done = min(g["done"] for g in got)
                med = {k: statistics.median(g[k] for g in got) for k in ("parks", "recomputed", "width", "gap", "s99")}
                rows.append([shape, name, n_par, f"{done:.0%}", f"{ratio['t50']:.2f}", f"{ratio['t99']:.2f} ({worst['t99']:.2f})",
                             f"{ratio['e99']:.2f} ({worst['e99']:.2f})", f"{ratio['tok']:.2f}", f"{med['width']:.2f}",
                             f"{med['s99']:.1f}", f"{med['gap']:.1f}", f"{med['parks']:g}"])
                record.append({"shape": shape, "config": name, "sched": sched, "n_parallel": n_par, "completed": done,
                               "ratio": ratio, "worst": worst, **med})
                print(" | ".join(str(c) for c in rows[-1]))

    # the GPU shape: 240 chats at 40/s (prompts median 400 tokens, answers 250) on a 32,768-cell pool
    gpu_rows: list[list[Any]] = []
    gpu_pool = 32768
    gwls = [Workload.lognormal(240, rate=40.0, prompt_median=400, gen_median=250, max_prompt=4096, max_gen=2048, seed=s)
            for s in range(1, 5)]
    gbase = [static_split(w, gpu_pool, GPU_COSTS) for w in gwls]
    for name, sched in CONFIGS[:2]:
        for n_par in (32, 64, 128):
            got = [figures(simulate(w, n_ctx=gpu_pool, n_parallel=n_par, costs=GPU_COSTS, sched=sched)) for w in gwls]
            ratio, worst = ratios(got, gbase)
            width = statistics.median(g["width"] for g in got)
            gpu_rows.append([name, n_par, f"{min(g['done'] for g in got):.0%}", f"{width:.1f}", f"{ratio['t50']:.2f}",
                             f"{ratio['t99']:.2f}", f"{ratio['e99']:.2f}", f"{ratio['tok']:.2f}"])
            record.append({"shape": "gpu", "config": name, "sched": sched, "n_parallel": n_par, "ratio": ratio,
                           "worst": worst, "width": width})
            print("gpu | " + " | ".join(str(c) for c in gpu_rows[-1]))

    headers = ["shape", "configuration", "slots", "completed", "TTFT p50", "TTFT p99 (worst seed)",
               "end-to-end p99 (worst seed)", "tok/s", "mean width", "2nd token p99 s", "longest gap s",
               "parks (median)"]
    md = ["The planner's overload knobs in the simulator, as ratios to the static split on the same seed "
          "(median over 12 seeds; the worst seed in brackets). Lower is better except tok/s. Mean width: the "
          "decode width the planner chose, averaged over the steps where a slot generated (median over the seeds); "
          f"2nd token p99 and longest gap in seconds (medians over the seeds). CPU costs: {COSTS}.", ""] + \
         md_table(headers, rows) + \
         ["", "The GPU shape (one H200, a Llama-3.2-1B-shaped model; 240 chats at 40/s, prompts median 400 tokens, "
              f"answers 250; a 32,768-cell pool; 4 seeds). Costs: {GPU_COSTS}.", ""] + \
         md_table(["configuration", "slots", "completed", "mean width", "TTFT p50", "TTFT p99", "end-to-end p99",
                   "tok/s"], gpu_rows) + \
         ["", "Command: `python bench/overload_sweep.py`."]
    write_results("overload", {"pool": POOL, "seeds": list(SEEDS), "rows": record}, md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
