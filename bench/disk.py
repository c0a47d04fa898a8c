"""The disk tier: a RAM budget too small for the victims, RAM-then-RECOMPUTE against RAM-then-disk.

    python bench/disk.py            # SmolLM2-135M-Instruct Q4_1, --preempt-ram 4 (about 6 min on 2 cores)
    python bench/disk.py --quick    # stories260K with f32 cells, --preempt-ram 0 (under a minute)

The load is the cells' overloaded one (bench/cells.py): concurrent streamed chats that each fit the
pool alone but overflow it together, temperature 0, fixed-length answers. Three servers on it,
interleaved over --runs (A B C A B C ...):

- ram then recompute: `--preempt-ram N`, too small for any victim: every park recomputes;
- ram then disk: the same budget and `--preempt-disk DIR`: the victims go to files;
- a larger budget then disk (`--mix`, 24 MiB): a victim or two in RAM, the rest on disk, written in
  the background where their host copy fits the RAM left, and read back ahead where it can;
- ram unlimited: `--preempt-ram -1`, the ceiling (what the disk tier stands in for).

Per cell (medians, ranges over runs): completed, wall seconds, tok/s, TTFT p50/p99, ITL p50/p99
(measured by the client from the stream), parks by tier, recomputed tokens, the peak bytes on disk
(polled from /metrics) and written in all, files read back ahead and restored from the host copy. The disk park and restore GB/s are the bytes the disk
tier wrote and read over the time its I/O thread took for them (llamacpp:n_disk_write_bytes_total
over n_disk_write_us_total, the same for reads: checksums included), against the disk's own
sequential speed measured by this script in the same directory, the same way the tier does its
I/O (1 MiB pwrite/pread chunks, no fsync: the page cache), at the median size of a park's file and
at 256 MiB; the device itself (fsync'd writes, reads after dropping the file's cached pages) is
measured too, for the record. Target: the disk park and restore at 50 % of the sequential speed or
more. Results: bench/results/disk.{json,md} (disk_quick with --quick).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests
from rich.console import Console
from rich.table import Table

from cells import Load, pct, polling, run_chats  # bench/ is on sys.path
from llama_preempt.metrics import parse_prometheus
from llama_preempt.server import LlamaServer, ServerConfig
from results_io import RESULTS, display_path, md_table, smollm2_model, stories_model, write_results

CHUNK = 1 << 20  # the disk tier's own pwrite/pread size (csrc/store/preempt-disk.cpp)


@dataclass(frozen=True)
class Cell:
    name: str
    args: tuple[str, ...]
    disk: bool = False


def cells_for(ram_mib: int, mix_mib: int) -> list[Cell]:
    return [Cell(f"ram {ram_mib} MiB then recompute", ("--preempt-ram", str(ram_mib))),
            Cell(f"ram {ram_mib} MiB then disk", ("--preempt-ram", str(ram_mib)), disk=True),
            Cell(f"ram {mix_mib} MiB then disk", ("--preempt-ram", str(mix_mib)), disk=True),
            Cell("ram unlimited", ("--preempt-ram", "-1"))]


def run_cell(cell: Cell, load: Load, disk_root: Path, ctx: int, extra: list[str]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(dir=disk_root, prefix="bench-disk-") as d:
        args = [*cell.args, *extra, *(["--preempt-disk", d] if cell.disk else [])]
        cfg = ServerConfig(model=load.model, n_ctx=ctx, n_parallel=load.n_chats, threads=load.threads, seed=1234,
                           extra_args=args)
        with LlamaServer(cfg) as srv:
            peak = {"disk": 0.0, "ram": 0.0}

            def watch() -> None:
                m = srv.metrics()
                peak["disk"] = max(peak["disk"], m.get("preempt_disk_bytes"))
                peak["ram"] = max(peak["ram"], m.get("preempt_ram_bytes"))

            with polling(watch):
                chats, wall = run_chats(srv.url, load)
            snap = parse_prometheus(requests.get(srv.url + "/metrics", timeout=30).text)
    m = {k: v.value for k, v in snap.metrics.items()}
    tiers = snap.labeled.get("preempt_parks_by_tier_total", {})
    ttfts = [c.t_first for c in chats if c.ok and c.t_first is not None]
    gaps = [g for c in chats if c.ok for g in c.gaps]
    tokens = sum(c.tokens for c in chats)
    n_parks = tiers.get("disk", 0)

    def gbps(n_bytes: float, us: float) -> float | None:
        return round(n_bytes / us / 1e3, 3) if us > 0 else None

    return {
        "cell": cell.name, "completed": sum(c.ok for c in chats), "chats": len(chats),
        "errors": sorted({c.error for c in chats if c.error}), "wall_s": round(wall, 3),
        "tok_s": round(tokens / wall, 2),
        "ttft_p50_s": pct(ttfts, 50), "ttft_p99_s": pct(ttfts, 99),
        "itl_p50_ms": None if not gaps else round(pct(gaps, 50) * 1000, 2),
        "itl_p99_ms": None if not gaps else round(pct(gaps, 99) * 1000, 2),
        "parks": {k: int(v) for k, v in tiers.items()}, "recomputed": int(m.get("n_recompute_tokens_total", 0)),
        "disk_failures": {k: int(v) for k, v in snap.labeled.get("preempt_disk_failures_total", {}).items() if v},
        "peak_disk_mib": round(peak["disk"] / 2**20, 2), "peak_ram_mib": round(peak["ram"] / 2**20, 2),
        "written_mib": round(m.get("n_disk_write_bytes_total", 0) / 2**20, 2),
        "read_mib": round(m.get("n_disk_read_bytes_total", 0) / 2**20, 2),
        "park_file_mib": round(m.get("n_disk_write_bytes_total", 0) / n_parks / 2**20, 2) if n_parks else None,
        "disk_park_gbps": gbps(m.get("n_disk_write_bytes_total", 0), m.get("n_disk_write_us_total", 0)),
        "disk_restore_gbps": gbps(m.get("n_disk_read_bytes_total", 0), m.get("n_disk_read_us_total", 0)),
        "read_ahead": int(m.get("n_disk_read_ahead_total", 0)),
        "from_memory": int(m.get("n_disk_restore_from_memory_total", 0)),
    }


# --- the disk's own speed ---

def sequential(d: Path, n_bytes: int, reps: int) -> dict[str, float]:
    """GB/s of one file written and read back in CHUNK pieces, as the disk tier does (page cache),
    and through to the device (fsync, then the cached pages dropped before the read); medians."""
    # from a buffer of the file's size, as a park writes its state (not one hot chunk again and again)
    data = memoryview(os.urandom(n_bytes))
    out: dict[str, list[float]] = {"write": [], "read": [], "write_fsync": [], "read_cold": []}
    buf = bytearray(n_bytes)
    for rep in range(reps):
        path = d / f"seq-{rep}.bin"
        for sync in (False, True):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            t0 = time.perf_counter()
            for off in range(0, n_bytes, CHUNK):
                os.pwrite(fd, data[off:off + CHUNK], off)
            if sync:
                os.fsync(fd)
            out["write_fsync" if sync else "write"].append(n_bytes / (time.perf_counter() - t0) / 1e9)
            os.close(fd)
            fd = os.open(path, os.O_RDONLY)
            if sync:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            t0 = time.perf_counter()
            for off in range(0, n_bytes, CHUNK):
                os.preadv(fd, [memoryview(buf)[off:off + CHUNK]], off)
            out["read_cold" if sync else "read"].append(n_bytes / (time.perf_counter() - t0) / 1e9)
            os.close(fd)
        path.unlink()
    return {k: round(statistics.median(v), 3) for k, v in out.items()}


def med(rows: list[dict[str, Any]], key: str) -> Any:
    v = [r[key] for r in rows if r.get(key) is not None]
    return round(statistics.median(v), 3) if v else None


def rng(rows: list[dict[str, Any]], key: str) -> str:
    v = [r[key] for r in rows if r.get(key) is not None]
    return f"{min(v):g}-{max(v):g}" if v else "-"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="stories260K (f32 cells), one run")
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument("--runs", type=int, default=None, help="runs per cell (default 3, 1 with --quick)")
    ap.add_argument("--ram", type=int, default=None, help="--preempt-ram MiB (default 4, 0 with --quick)")
    ap.add_argument("--mix", type=int, default=None,
                    help="the --preempt-ram of a cell that holds a victim or two in RAM, the rest on disk "
                         "(default 24, 1 with --quick)")
    ap.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()),
                    help="the disk tier's directory is made under this (default: the system's temp dir)")
    args = ap.parse_args()
    con = Console()
    if args.quick:
        load = Load(stories_model(args.model), n_chats=4, prompt_words=100, n_predict=400, pools=(1024, 1024),
                    ample=4096, split_slot=512, tight_mib=0, threads=2)
        ctx, extra, runs, ram, name = 1024, ["-ctk", "f32", "-ctv", "f32"], args.runs or 1, args.ram if args.ram is not None else 0, "disk_quick"
    else:
        load = Load(smollm2_model(args.model), n_chats=4, prompt_words=250, n_predict=400, pools=(1024, 1024),
                    ample=4096, split_slot=512, tight_mib=4, threads=2)
        ctx, extra, runs, ram, name = 1024, [], args.runs or 3, args.ram if args.ram is not None else 4, "disk"
    args.dir.mkdir(parents=True, exist_ok=True)
    mix = args.mix if args.mix is not None else (1 if args.quick else 24)
    cells = cells_for(ram, mix)
    results: dict[str, list[dict[str, Any]]] = {c.name: [] for c in cells}
    for run in range(runs):
        for cell in cells:
            r = run_cell(cell, load, args.dir, ctx, extra)
            results[cell.name].append(r)
            con.print(f"run {run + 1}/{runs} {cell.name}: {r['completed']}/{r['chats']} in {r['wall_s']} s, "
                      f"{r['tok_s']} tok/s, parks {r['parks']}, disk park {r['disk_park_gbps']} GB/s, "
                      f"restore {r['disk_restore_gbps']} GB/s")
    disk_rows = results[cells[1].name]
    file_mib = med(disk_rows, "park_file_mib") or 8.0
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="bench-seq-") as d:
        seq_file = sequential(Path(d), max(1 << 20, int(file_mib * 2**20)), reps=9)
        seq_big = sequential(Path(d), 256 << 20, reps=3)

    headers = ["cell", "completed", "wall s (range)", "tok/s (range)", "TTFT p50 s", "TTFT p99 s", "ITL p50 ms",
               "ITL p99 ms", "parks ram/disk/recompute", "recomputed", "peak disk MiB", "written MiB",
               "read ahead", "from memory"]
    rows = []
    for c in cells:
        rs = results[c.name]
        parks = "/".join(str(statistics.median([r["parks"].get(t, 0) for r in rs])).removesuffix(".0")
                         for t in ("ram", "disk", "recompute"))
        rows.append([c.name, f"{min(r['completed'] for r in rs)}/{rs[0]['chats']}", f"{med(rs, 'wall_s')} ({rng(rs, 'wall_s')})",
                     f"{med(rs, 'tok_s')} ({rng(rs, 'tok_s')})", med(rs, "ttft_p50_s"), med(rs, "ttft_p99_s"),
                     med(rs, "itl_p50_ms"), med(rs, "itl_p99_ms"), parks, med(rs, "recomputed"),
                     med(rs, "peak_disk_mib"), med(rs, "written_mib"), med(rs, "read_ahead"), med(rs, "from_memory")])
    park, restore = med(disk_rows, "disk_park_gbps"), med(disk_rows, "disk_restore_gbps")

    def share(x: float | None, of: float) -> str:
        return "-" if x is None else f"{100 * x / of:.0f} %"

    speed_headers = ["", "GB/s", f"sequential, {file_mib:g} MiB files", "sequential, 256 MiB", "device, 256 MiB (fsync / cold read)"]
    speed_rows = [["disk park (write)", park, share(park, seq_file["write"]) + f" of {seq_file['write']}",
                   share(park, seq_big["write"]) + f" of {seq_big['write']}", f"{seq_big['write_fsync']}"],
                  ["disk restore (read)", restore, share(restore, seq_file["read"]) + f" of {seq_file['read']}",
                   share(restore, seq_big["read"]) + f" of {seq_big['read']}", f"{seq_big['read_cold']}"]]
    t = Table(title=f"{display_path(load.model)}: {load.n_chats} chats, -c {ctx}, {runs} run(s)", title_justify="left")
    for h in headers:
        t.add_column(h, no_wrap=True)
    for row in rows:
        t.add_row(*[str(x) for x in row])
    con.print(t)
    s = Table(title="disk park and restore against the disk's own sequential speed", title_justify="left")
    for h in speed_headers:
        s.add_column(h)
    for row in speed_rows:
        s.add_row(*[str(x) for x in row])
    con.print(s)
    md = [f"# The disk tier: {display_path(load.model)}, {load.n_chats} chats, -c {ctx}, {runs} run(s)", "",
          f"`python bench/disk.py{' --quick' if args.quick else ''}`; medians over runs (ranges in brackets).", ""]
    md += md_table(headers, rows) + [""] + md_table(speed_headers, speed_rows)
    write_results(name, {"model": display_path(load.model), "ctx": ctx, "chats": load.n_chats,
                         "prompt_words": load.prompt_words, "n_predict": load.n_predict, "ram_mib": ram,
                         "mix_mib": mix, "runs": runs, "cells": results, "sequential_file": seq_file, "sequential_256mib": seq_big,
                         "file_mib": file_mib, "disk_park_gbps": park, "disk_restore_gbps": restore}, md)
    con.print(f"written: {display_path(RESULTS / (name + '.md'))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
