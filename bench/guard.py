"""What the copy guard costs when nothing is wrong, and how long the doctor takes.

    python bench/guard.py            # SmolLM2-135M-Instruct Q4_1, about a minute
    python bench/guard.py --runs 3 --rpc 1

One request (a 600-token prompt, 256 generated tokens) on a server that parks it every 8 tokens
by swap, with --preempt-verify never / 3 (the default) / always. From the server's own log lines
(each park's and restore's milliseconds, which include the guard's check when it runs) it prints
the mean park and restore time of the first 3 copies and of the copies after them, the copies
checked, and the request's wall time; then the time `llama-preempt doctor` takes on the model.
"""
from __future__ import annotations

import argparse
import re
import statistics
import time
from pathlib import Path
from typing import Any

import requests

from llama_preempt.doctor import run_doctor
from llama_preempt.rpc import RpcServer
from llama_preempt.server import LlamaServer, ServerConfig
from results_io import display_path, md_table, smollm2_model, write_results

SETTINGS = ["never", "3", "always"]
PARK = re.compile(r"parked by swap \(([\d.]+) MiB[^)]*\) in ([\d.]+) ms")
RESTORE = re.compile(r"restored by swap \(([\d.]+) MiB, \d+ tokens\) in ([\d.]+) ms")


def one(model: Path, verify: str, rpc: list[RpcServer]) -> dict[str, Any]:
    extra = ["--preempt-mode", "swap", "--preempt-verify", verify]
    if rpc:
        extra += ["--rpc", ",".join(r.endpoint for r in rpc), "-ngl", "99"]
    cfg = ServerConfig(model=model, n_ctx=2048, n_parallel=2, extra_args=extra, env={"LLAMA_SERVER_PREEMPT_EVERY": "8"})
    with LlamaServer(cfg) as srv:
        prompt = " ".join(f"word{i % 50}" for i in range(300))
        t0 = time.monotonic()
        r = requests.post(srv.url + "/completion", json={"prompt": prompt, "n_predict": 256, "temperature": 0,
                                                         "ignore_eos": True}, timeout=600)
        wall = time.monotonic() - t0
        r.raise_for_status()
        log = srv.log_text()
        m = srv.metrics()
    parks = [float(ms) for _, ms in PARK.findall(log)]
    restores = [float(ms) for _, ms in RESTORE.findall(log)]
    mib = statistics.mean(float(x) for x, _ in PARK.findall(log)) if parks else 0.0
    return {"verify": verify, "parks": parks, "restores": restores, "mib": mib, "wall_s": wall,
            "checked": int(m["n_swap_verify_total"]), "mismatch": int(m["n_swap_verify_mismatch_total"])}


def mean(xs: list[float]) -> float:
    return statistics.mean(xs) if xs else float("nan")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument("--runs", type=int, default=2, help="runs of each setting, interleaved (default 2)")
    ap.add_argument("--rpc", type=int, default=0, help="RPC servers on loopback to put the layers on (default 0: the CPU)")
    ap.add_argument("--name", default=None, help="results name (default guard, guard_rpcN)")
    args = ap.parse_args()
    model = smollm2_model(args.model)
    rpcs = [RpcServer(threads=1).start() for _ in range(args.rpc)]
    try:
        runs = [one(model, v, rpcs) for _ in range(args.runs) for v in SETTINGS]
        t0 = time.monotonic()
        rep = run_doctor(["-m", str(model), "-c", "2048", *(["--rpc", ",".join(r.endpoint for r in rpcs), "-ngl", "99"]
                                                            if rpcs else [])])
        doctor_s = time.monotonic() - t0
    finally:
        for r in rpcs:
            r.stop()
    rows = []
    for v in SETTINGS:
        mine = [r for r in runs if r["verify"] == v]
        first_p = [x for r in mine for x in r["parks"][:3]]
        rest_p = [x for r in mine for x in r["parks"][3:]]
        first_r = [x for r in mine for x in r["restores"][:3]]
        rest_r = [x for r in mine for x in r["restores"][3:]]
        rows.append([v, f"{mean([r['mib'] for r in mine]):.2f}", f"{mean([len(r['parks']) for r in mine]):.0f}",
                     f"{mean([r['checked'] for r in mine]):.0f}", f"{mean(first_p):.2f}", f"{mean(rest_p):.2f}",
                     f"{mean(first_r):.2f}", f"{mean(rest_r):.2f}", f"{mean([r['wall_s'] for r in mine]):.2f}"])
    headers = ["--preempt-verify", "MiB a park", "parks", "copies checked", "park ms (first 3)", "park ms (after)",
               "restore ms (first 3)", "restore ms (after)", "request s"]
    where = f"{args.rpc} RPC server(s) on loopback, -ngl 99" if args.rpc else "the CPU"
    md = [f"# The copy guard's cost ({display_path(model)}, {where})", "",
          f"`python bench/guard.py --runs {args.runs} --rpc {args.rpc}`: one request (600-token prompt, 256 tokens) parked "
          "by swap every 8 tokens; times from the server's park and restore log lines (a checked copy's time includes "
          f"its check); {args.runs} runs of each setting, interleaved.", "", *md_table(headers, rows), "",
          f"`llama-preempt doctor` on the same model and flags: {doctor_s:.1f} s, result {'OK' if rep.ok else 'FAILED'}."]
    print("\n".join(md))
    write_results(args.name or (f"guard_rpc{args.rpc}" if args.rpc else "guard"),
                  {"runs": runs, "doctor_s": doctor_s, "doctor_ok": rep.ok, "model": display_path(model), "rpc": args.rpc}, md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
