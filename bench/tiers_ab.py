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

    python bench/tiers_ab.py --chat --against results/tiers_ab_chat_before.json

`--chat` runs multi-turn chats instead (the simulator's prompt cache, which the recorded workloads
never reuse): one client asking for six users in turn, and eight users each with its own pace, with
the RAM prompt cache alone, a small one over the disk tier, and one that holds everything, at 2 and
4 slots; each run also records the prompt tokens computed, the cache's hits, spills and read backs
and every request's reused prefix. Its baseline was saved on the build that brought the model in.
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
# --chat: the multi-turn workloads, the prompt cache's setups (64 MiB of SmolLM2 cells keep three of
# the six conversations), and the prompt cache's own figures
CHATS = (("one client, 6 users x 4 turns", Workload.chat(6, 4, system=300, first=400, turn=20, gen=24, one_client=True)),
         ("8 users x 3 turns, own pace", Workload.chat(8, 3, system=200, first=300, turn=30, gen=60, think_s=2.0, rate=1.0)))
CHAT_CONFIGS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("cache 64 MiB", {"cache_ram_mib": 64, "host_kv_ram_mib": 64}),
    ("cache 64 MiB + disk", {"cache_ram_mib": 64, "host_kv_ram_mib": 64, "preempt_disk_mib": -1}),
    ("cache 8192 MiB", {"cache_ram_mib": 8192}),
    # a pool the turns overflow together: parks (RAM, then disk) beside the cached prompts
    ("-c 2048, ram 8 MiB, cache 64 MiB + disk", {"n_ctx": 2048, "preempt_ram_mib": 8, "cache_ram_mib": 64,
                                                 "host_kv_ram_mib": 64, "preempt_disk_mib": -1}),
)
CHAT_SLOTS = (2, 4)
CHAT_FIELDS = ("prompt_tokens_computed", "prompt_cache_ram_hits", "prompt_cache_disk_hits", "prompt_cache_spilled",
               "peak_cache_mib")


def fingerprint(workload: Workload, n_parallel: int, kw: dict[str, Any], n_ctx: int = 1024,
                fields: tuple[str, ...] = FIELDS) -> dict[str, Any]:
    r = simulate(workload, n_parallel=n_parallel, **{"n_ctx": n_ctx, **kw})
    d = {k: getattr(r, k) for k in fields}
    d["makespan_s"] = round(d["makespan_s"], 9)
    per = [[q["outcome"], q["t_start"], q["t_first"], q["t_second"], q["t_done"], q["n_preempt"]] for q in r.per_request]
    if fields is not FIELDS:  # a chat: what each request reused, and from where
        per = [p + [q["n_prompt_cached"], q["cached_from"]] for p, q in zip(per, r.per_request)]
    d["requests_digest"] = hashlib.sha256(json.dumps(per).encode()).hexdigest()[:16]
    return d


def run(chat: bool = False) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    if chat:
        for wl_name, workload in CHATS:
            for name, kw in CHAT_CONFIGS:
                for n in CHAT_SLOTS:
                    out[f"{wl_name} | {name} | {n}"] = fingerprint(workload, n, kw, 8192, FIELDS + CHAT_FIELDS)
        return out
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
    ap.add_argument("--chat", action="store_true", help="the multi-turn chats (the prompt cache) instead")
    ap.add_argument("--name", help="the results' name under bench/results/ (default: tiers_ab, or tiers_ab_chat with --chat)")
    args = ap.parse_args(argv)
    now = run(args.chat)
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
        if args.chat:
            row["prompt computed"] = d["prompt_tokens_computed"]
            row["hits ram/disk, spilled"] = f"{d['prompt_cache_ram_hits']}/{d['prompt_cache_disk_hits']}, {d['prompt_cache_spilled']}"
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
    write_results(args.name or ("tiers_ab_chat" if args.chat else "tiers_ab"), {"runs": now, "n_differ": n_diff if before is not None else None},
                  ["The simulator's fingerprint on the recorded workloads (steps, makespan, parks by tier, "
                   "re-prefilled tokens, every request's timings)"
                   + (f", against `{args.against}`" if before is not None else "") + ".", ""] + table
                  + ["", "Command: `python bench/tiers_ab.py" + (" --chat" if args.chat else "")
                     + (f" --against {args.against}`." if before is not None else "`.")])
    return 1 if n_diff else 0


if __name__ == "__main__":
    sys.exit(main())
