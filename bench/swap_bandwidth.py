#!/usr/bin/env python3
"""SWAP bandwidth: how fast parks and restores move a sequence's state, against the machine's own
copy speed, measured in the same run.

The yardstick is `_core.measure_link_speeds()`: host memcpy between warm buffers, and on a GPU the
pinned device-to-host and host-to-device transfers of one large buffer. The parks and restores
come from a real server under load: four chats with prompts of different lengths decode together
(so their cells interleave through the shared pool), each parked by SWAP every 16 generated tokens
(LLAMA_SERVER_PREEMPT_EVERY), and every park and restore logs its bytes and its time. Each cell
runs twice: with our bulk copy, and with what shipped before it, upstream's copy one slice at a
time into freshly allocated memory (LLAMA_SERVER_PREEMPT_COPY=slice); and with flash attention
on and off (off stores V transposed: one slice per V element row upstream). A slot's first park
writes into fresh memory (page faults on a CPU); later ones reuse the warm pool, as a server under
repeated preemption does: the range shows both.

    python bench/swap_bandwidth.py                         # SmolLM2-135M on this machine
    python bench/swap_bandwidth.py --model M.gguf --gpu-layers 99 --name swap_bandwidth_gpu
    python bench/swap_bandwidth.py --rpc 1 --name swap_bandwidth_rpc   # KV on ggml-rpc-server(s), loopback

With --rpc N every cell runs against N fresh `ggml-rpc-server`s on loopback (`--rpc ... -ngl 99`:
the KV cache lives there), and the yardstick is the RPC device's own transfer speed over the link.

Results: bench/results/NAME.{json,md}.
"""
from __future__ import annotations

import argparse
import re
import statistics
import tempfile
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))

from llama_preempt import _core  # noqa: E402
from llama_preempt.rpc import RpcServer  # noqa: E402
from llama_preempt.server import LlamaServer, ServerConfig  # noqa: E402
from results_io import RESULTS, display_path, md_table, smollm2_model, write_results  # noqa: E402

PARK = re.compile(r"parked by swap \(([\d.]+) MiB, (\d+) tokens held in (\d+) cell ranges\) in ([\d.]+) ms")
RESTORE = re.compile(r"restored by swap \(([\d.]+) MiB, (\d+) tokens\) in ([\d.]+) ms")
MIB = 1 << 20
FILLER = ("the river ran past the old mill and the children played by the water while the baker "
          "sold warm bread to everyone in the small town").split()


def prompt(n_words: int, seed: int) -> str:
    words = [FILLER[(i * 7 + seed) % len(FILLER)] for i in range(n_words)]
    return "Write a long story. " + " ".join(words)


def gbps(mib: float, ms: float) -> float:
    return mib * MIB / (ms / 1e3) / 1e9 if ms > 0 else float("inf")


def run_cell(model: Path, fa: str, route: str, args: argparse.Namespace, log_dir: Path) -> dict[str, Any]:
    extra = ["-fa", fa, "--preempt-mode", "swap", "--preempt-ram", "-1"]
    if args.gpu_layers is not None:
        extra += ["-ngl", str(args.gpu_layers)]
    rpcs = [RpcServer(threads=args.threads or 1, log_dir=log_dir).start() for _ in range(args.rpc)]
    if rpcs:
        extra += ["--rpc", ",".join(r.endpoint for r in rpcs), "-ngl", "99"]
    cfg = ServerConfig(model=model, n_ctx=args.ctx, n_parallel=len(args.prompt_words), threads=args.threads,
                       extra_args=extra,
                       env={"LLAMA_SERVER_PREEMPT_EVERY": str(args.every), "LLAMA_SERVER_PREEMPT_COPY": route})
    try:
        srv = LlamaServer(cfg, log_dir=log_dir).start()
    except BaseException:
        for r in rpcs:
            r.stop()
        raise
    try:
        def one(i: int, n_words: int) -> int:
            body = {"prompt": prompt(n_words, i), "n_predict": args.n_predict, "temperature": 0,
                    "ignore_eos": True, "cache_prompt": False}
            r = srv.post("/completion", body)
            r.raise_for_status()
            return int(r.json()["tokens_predicted"])

        t0 = time.perf_counter()
        with ThreadPoolExecutor(len(args.prompt_words)) as ex:
            done = list(ex.map(one, range(len(args.prompt_words)), args.prompt_words))
        wall = time.perf_counter() - t0
        log = srv.log_text()
    finally:
        srv.stop()
        for r in rpcs:
            r.stop()
    parks = [(float(m[0]), int(m[2]), float(m[3])) for m in PARK.findall(log)]      # MiB, ranges, ms
    restores = [(float(m[0]), float(m[2])) for m in RESTORE.findall(log)]          # MiB, ms
    return {"fa": fa, "route": route, "tokens": sum(done), "wall_s": wall,
            "parks": [{"mib": a, "ranges": b, "ms": c} for a, b, c in parks],
            "restores": [{"mib": a, "ms": b} for a, b in restores]}


def measure_links(n_rpc: int) -> list[tuple[str, str, float, bool]]:
    """The yardstick; with RPC, one RPC server of its own (it serves one client at a time)."""
    if not n_rpc:
        return list(_core.measure_link_speeds(256 << 20, 5))
    with RpcServer() as rpc:
        return list(_core.measure_link_speeds(64 << 20, 5, rpc=[rpc.endpoint]))


def summarize(cell: dict[str, Any], min_mib: float, park_ref: float, restore_ref: float) -> dict[str, Any]:
    parks = [gbps(p["mib"], p["ms"]) for p in cell["parks"] if p["mib"] >= min_mib]
    restores = [gbps(r["mib"], r["ms"]) for r in cell["restores"] if r["mib"] >= min_mib]
    sizes = [p["mib"] for p in cell["parks"] if p["mib"] >= min_mib]
    ranges = [p["ranges"] for p in cell["parks"] if p["mib"] >= min_mib]

    def stat(v: list[float]) -> dict[str, float] | None:
        return None if not v else {"median": statistics.median(v), "min": min(v), "max": max(v)}

    park, restore = stat(parks), stat(restores)
    return {
        "fa": cell["fa"], "route": cell["route"], "n_parks": len(parks), "n_restores": len(restores),
        "mib": stat(sizes), "ranges": stat([float(r) for r in ranges]),
        "park_gbps": park, "restore_gbps": restore,
        "park_pct_of_link": None if not park else 100 * park["median"] / park_ref,
        "restore_pct_of_link": None if not restore else 100 * restore["median"] / restore_ref,
    }


def fmt_stat(s: dict[str, float] | None, digits: int = 2) -> str:
    if not s:
        return "-"
    return f"{s['median']:.{digits}f} ({s['min']:.{digits}f}-{s['max']:.{digits}f})"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=None, help="any gguf (default: SmolLM2-135M Q4_1)")
    ap.add_argument("--gpu-layers", type=int, default=None)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--rpc", type=int, default=0, metavar="N",
                    help="keep the model and KV cache on N ggml-rpc-servers over loopback (-ngl 99)")
    ap.add_argument("--ctx", type=int, default=8192)
    ap.add_argument("--prompt-words", type=int, nargs="+", default=[100, 300, 700, 1500],
                    help="one chat per length (default 100 300 700 1500)")
    ap.add_argument("--n-predict", type=int, default=160)
    ap.add_argument("--every", type=int, default=16, help="park every N generated tokens (default 16)")
    ap.add_argument("--fa", nargs="+", default=["on", "off"])
    ap.add_argument("--routes", nargs="+", default=["bulk", "slice"])
    ap.add_argument("--min-mib", type=float, default=1.0, help="events at least this large count (default 1)")
    ap.add_argument("--name", default="swap_bandwidth")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    console = Console()

    args.model = smollm2_model(args.model)

    links = [{"device": d, "what": w, "gbps": g, "pinned": p} for d, w, g, p in measure_links(args.rpc)]
    memcpy = next(link["gbps"] for link in links if link["what"] == "memcpy")
    d2h = next((link["gbps"] for link in links if link["what"] == "device_to_host"), None)
    h2d = next((link["gbps"] for link in links if link["what"] == "host_to_device"), None)
    park_ref, restore_ref = (d2h, h2d) if (args.gpu_layers or args.rpc) and d2h and h2d else (memcpy, memcpy)
    yardstick = ("RPC device-to-host / host-to-device over loopback" if args.rpc and park_ref is not memcpy
                 else "pinned device-to-host / host-to-device" if park_ref is not memcpy else "host memcpy")
    console.print(f"yardstick ({yardstick}): park {park_ref:.2f} GB/s, restore {restore_ref:.2f} GB/s; "
                  + ", ".join(f"{x['device']} {x['what']} {x['gbps']:.2f} GB/s" for x in links))

    t0 = time.perf_counter()
    cells, rows = [], []
    log_dir = Path(tempfile.mkdtemp(prefix="swap_bandwidth_"))  # the servers' logs, parsed above
    for fa in args.fa:
        for route in args.routes:
            console.print(f"[bold]fa {fa}, {route} copy[/]")
            cell = run_cell(args.model, fa, route, args, log_dir)
            cells.append(cell)
            rows.append(summarize(cell, args.min_mib, park_ref, restore_ref))
    elapsed = time.perf_counter() - t0

    headers = ["flash attn", "copy", "parks", "MiB per park", "cell ranges", "park GB/s med (range)",
               "park % of link", "restore GB/s med (range)", "restore % of link"]
    table_rows = [[r["fa"], r["route"], r["n_parks"], fmt_stat(r["mib"], 1), fmt_stat(r["ranges"], 0),
                   fmt_stat(r["park_gbps"]),
                   "-" if r["park_pct_of_link"] is None else f"{r['park_pct_of_link']:.0f}%",
                   fmt_stat(r["restore_gbps"]),
                   "-" if r["restore_pct_of_link"] is None else f"{r['restore_pct_of_link']:.0f}%"] for r in rows]
    t = Table(title=f"SWAP bandwidth, {args.model.name}, parks of {args.min_mib:g} MiB and more "
                    f"(yardstick: {yardstick} {park_ref:.1f} / {restore_ref:.1f} GB/s)", title_justify="left")
    for h in headers:
        t.add_column(h, justify="right")
    for row in table_rows:
        t.add_row(*[str(c) for c in row])
    console.print(t)

    command = "python bench/swap_bandwidth.py" + ("" if len(sys.argv) < 2 else " " + " ".join(sys.argv[1:]))
    md = [f"SWAP park and restore bandwidth, {args.model.name}, {len(args.prompt_words)} chats "
          f"({', '.join(map(str, args.prompt_words))} prompt words) x {args.n_predict} tokens, parked every "
          f"{args.every} tokens, -c {args.ctx}; parks and restores of {args.min_mib:g} MiB and more.", "",
          f"Yardstick, measured by the same script: {yardstick}, park {park_ref:.2f} GB/s, restore "
          f"{restore_ref:.2f} GB/s (" + ", ".join(f"{x['device']} {x['what']} {x['gbps']:.2f}" for x in links) + ").",
          "", *md_table(headers, table_rows), "", f"Command: `{command}` ({elapsed:.0f} s)."]
    write_results(args.name, {"model": display_path(args.model), "links": links, "yardstick": yardstick,
                              "park_ref_gbps": park_ref, "restore_ref_gbps": restore_ref,
                              "args": {k: (display_path(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
                              "summary": rows, "cells": cells, "elapsed_s": elapsed}, md, args.out)
    console.print(f"wrote {args.out / (args.name + '.md')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
