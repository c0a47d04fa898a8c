"""The planner's overload knobs swept in the simulator, against the static split (issue 31).

    python bench/overload_sweep.py      # a second on 2 cores

The simulator runs the server's own planner (`plan_step()`), so its scheduling knobs
(`--preempt-sched`: prompt-budget, restore-headroom, near-finish, starved, age-step-ms,
pass-limit-ms) can be
explored over many workloads in seconds before the live server confirms the defaults
(`bench/mixed.py`). Two workload shapes, twelve seeds each, 36 requests at 1.5/s on a 1,024-cell
pool, with the costs `bench/mixed.py` calibrated against SmolLM2-135M on this machine:

- chat: log-normal lengths, prompts median 100 tokens, answers median 63 (the workload of issue 31);
- long: a few very long prompts among many short chats (sigma 1.6, prompts median 40, up to 600).

Per configuration and slot count: the median over the seeds of each figure divided by the static
split's on the same seed (the split sized for the longest request, as `bench/mixed.py` sizes it),
and the worst seed for the tails. Goals: TTFT p50 at most 0.7, TTFT p99 and end-to-end p99 at most
1, tok/s at least 1. Writes bench/results/overload.md and .json.
"""
from __future__ import annotations

import statistics
import sys
from typing import Any

from llama_preempt import _core
from llama_preempt.simulator import Costs, Workload, simulate
from results_io import md_table, write_results

COSTS = Costs(step_ms=6.28, decode_token_ms=7.47, prefill_token_ms=4.63)  # bench/results/mixed.md's calibration
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
            "recomputed": rep.recomputed_tokens}


def workload(shape: str, seed: int) -> Workload:
    if shape == "long":
        return Workload.lognormal(36, rate=1.5, prompt_median=40, gen_median=40, sigma=1.6, max_prompt=600,
                                  max_gen=200, seed=seed)
    return Workload.lognormal(36, rate=1.5, prompt_median=100, gen_median=63, max_prompt=POOL // 3,
                              max_gen=POOL // 4, seed=seed)


def static_split(wl: Workload) -> dict[str, float]:
    longest = max(p + g for p, g in zip(wl.n_prompt, wl.n_gen)) + 1
    slot = -(-longest // 256) * 256
    n = max(1, POOL // slot)
    return figures(simulate(wl, n_ctx=n * slot, n_parallel=n, preempt=False, costs=COSTS))


def sched(**kw: int) -> Any:
    s = _core.SchedParams()
    for k, v in kw.items():
        setattr(s, k, v)
    return s


CONFIGS = [
    ("defaults", {}),
    ("no budget, headroom, near-finish", {"n_prompt_budget": 0, "n_restore_headroom": 0, "n_near_finish": 0}),
    ("prompt-budget=64", {"n_prompt_budget": 64}),
    ("prompt-budget=0", {"n_prompt_budget": 0}),
    ("restore-headroom=0", {"n_restore_headroom": 0}),
    ("restore-headroom=16", {"n_restore_headroom": 16}),
    ("near-finish=0", {"n_near_finish": 0}),
    ("near-finish=32", {"n_near_finish": 32}),
    ("starved=1", {"n_starved": 1}),
    ("age-step-ms=0", {"age_step_us": 0}),
    ("pass-limit-ms=0 (strict arrival order)", {"pass_limit_us": 0}),
    ("pass-limit-ms=never (pass freely)", {"pass_limit_us": 10**15}),
]


def main() -> int:
    rows: list[list[Any]] = []
    record: list[dict[str, Any]] = []
    for shape in ("chat", "long"):
        wls = [workload(shape, s) for s in SEEDS]
        base = [static_split(w) for w in wls]
        for name, kw in CONFIGS:
            for n_par in (4, 8, 16):
                got = [figures(simulate(w, n_ctx=POOL, n_parallel=n_par, costs=COSTS, sched=sched(**kw))) for w in wls]
                ratio = {k: statistics.median(g[k] / b[k] for g, b in zip(got, base)) for k in ("t50", "t99", "e99", "tok")}
                worst = {k: max(g[k] / b[k] for g, b in zip(got, base)) for k in ("t99", "e99")}
                done = min(g["done"] for g in got)
                parks = statistics.median(g["parks"] for g in got)
                rec = statistics.median(g["recomputed"] for g in got)
                rows.append([shape, name, n_par, f"{done:.0%}", f"{ratio['t50']:.2f}", f"{ratio['t99']:.2f} ({worst['t99']:.2f})",
                             f"{ratio['e99']:.2f} ({worst['e99']:.2f})", f"{ratio['tok']:.2f}", f"{parks:g}", f"{rec:g}"])
                record.append({"shape": shape, "config": name, "sched": kw, "n_parallel": n_par, "completed": done,
                               "ratio": ratio, "worst": worst, "parks": parks, "recomputed": rec})
                print(" | ".join(str(c) for c in rows[-1]))
    headers = ["shape", "configuration", "slots", "completed", "TTFT p50", "TTFT p99 (worst seed)",
               "end-to-end p99 (worst seed)", "tok/s", "parks (median)", "recomputed (median)"]
    md = ["The planner's overload knobs in the simulator, as ratios to the static split on the same seed "
          "(median over 12 seeds; the worst seed in brackets). Lower is better except tok/s. "
          f"Costs: {COSTS}. Defaults: {sched()}.", ""] + md_table(headers, rows) + \
         ["", "Command: `python bench/overload_sweep.py`."]
    write_results("overload", {"pool": POOL, "seeds": list(SEEDS), "rows": record}, md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
