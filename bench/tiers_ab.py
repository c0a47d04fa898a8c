"""The simulator before and after a behaviour-preserving change (issue 40: the tiers redesign).

    python bench/tiers_ab.py --save results/tiers_ab_before.json   # on the build before the change
    python bench/tiers_ab.py --against results/tiers_ab_before.json  # on the build after it

Runs the simulator (the server's own planner, park choice and step-cost fit) over the project's
recorded workloads (`results/*_workload.jsonl`: the mixed load and the three overload shapes) in
configurations that exercise every tier: the default host budget (SWAP), RECOMPUTE only, a small
RAM budget with a disk tier (RAM, then disk), and the disk tier alone, at 4, 8 and 16 slots. For
each run it records what a redesign must not change: the steps, the makespan, the parks by tier and
choice, the resumes, the re-prefilled tokens, and a digest of every request's timings. `--against`
compares with a saved run and lists every difference (none: the simulator's behaviour is the same).
Writes bench/results/tiers_ab.md and .json.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

from llama_preempt.simulator import Workload, simulate
from results_io import md_table, write_results

HERE = Path(__file__).resolve().parent
WORKLOADS = ("mixed", "overload_chat", "overload_long", "overload_many")
# (name, simulate() keywords): the default host budget, RECOMPUTE only, RAM then disk, disk alone
CONFIGS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("auto", {}),
    ("recompute", {"preempt_mode": "recompute"}),
    ("ram 2 MiB + disk", {"preempt_ram_mib": 2, "preempt_disk_mib": -1}),
    ("disk only", {"preempt_ram_mib": 0, "preempt_disk_mib": 256}),
)
SLOTS = (4, 8, 16)
FIELDS = ("steps", "makespan_s", "parks_swap", "parks_recompute", "parks_disk", "resumes", "recomputed_tokens",
          "tokens_generated", "peak_cells", "peak_parked_mib", "peak_disk_mib", "parks_by_choice")


def fingerprint(workload: Workload, n_parallel: int, kw: dict[str, Any]) -> dict[str, Any]:
    r = simulate(workload, n_ctx=1024, n_parallel=n_parallel, **kw)
    d = {k: getattr(r, k) for k in FIELDS}
    d["makespan_s"] = round(d["makespan_s"], 9)
    timings = json.dumps([[q["outcome"], q["t_start"], q["t_first"], q["t_second"], q["t_done"], q["n_preempt"]]
                          for q in r.per_request])
    d["requests_digest"] = hashlib.sha256(timings.encode()).hexdigest()[:16]
    return d


def run() -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for wl in WORKLOADS:
        workload = Workload.from_jsonl(HERE / "results" / f"{wl}_workload.jsonl")
        for name, kw in CONFIGS:
            for n in SLOTS:
                out[f"{wl} | {name} | {n}"] = fingerprint(workload, n, kw)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--save", type=Path, help="write this run's figures to this JSON file (relative to bench/)")
    ap.add_argument("--against", type=Path, help="compare with a run saved by --save (relative to bench/)")
    args = ap.parse_args(argv)
    now = run()
    if args.save:
        path = args.save if args.save.is_absolute() else HERE / args.save
        path.write_text(json.dumps(now, indent=1, sort_keys=True) + "\n")
        print(f"saved {len(now)} runs to {path}")
    rows = []
    n_diff = 0
    before = None
    if args.against:
        path = args.against if args.against.is_absolute() else HERE / args.against
        before = json.loads(path.read_text())
    for key, d in now.items():
        wl, cfg, n = key.split(" | ")
        row = {"workload": wl, "configuration": cfg, "slots": n, "steps": d["steps"],
               "makespan s": f"{d['makespan_s']:.3f}", "parks swap/rec/disk":
               f"{d['parks_swap']}/{d['parks_recompute']}/{d['parks_disk']}", "recomputed": d["recomputed_tokens"]}
        if before is not None:
            old = before.get(key)
            diff = ["missing"] if old is None else [k for k in d if d[k] != old.get(k)]
            n_diff += bool(diff)
            row["against the saved run"] = "identical" if not diff else "differs: " + ", ".join(diff)
        rows.append(row)
    headers = list(rows[0])
    table = md_table(headers, [[r[h] for h in headers] for r in rows])
    print("\n".join(table))
    if before is not None:
        print(f"\n{len(rows) - n_diff} of {len(rows)} runs identical to {args.against}")
    write_results("tiers_ab", {"runs": now, "n_differ": n_diff if before is not None else None},
                  ["The simulator's fingerprint on the recorded workloads (steps, makespan, parks by tier, "
                   "re-prefilled tokens, every request's timings)"
                   + (f", against `{args.against}`" if before is not None else "") + ".", ""] + table
                  + ["", "Command: `python bench/tiers_ab.py" + (f" --against {args.against}`." if before is not None else "`.")])
    return 1 if n_diff else 0


if __name__ == "__main__":
    sys.exit(main())
