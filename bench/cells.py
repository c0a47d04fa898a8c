"""The side-by-side benchmark: what preemption costs when it fires, what it costs when it never
fires, and how it compares with what operators do today to avoid the failure.

    python -m bench              # SmolLM2-135M-Instruct Q4_1, the full set of cells (about 10 min on 2 cores)
    python -m bench --quick      # stories260K, the same cells, smaller (under 3 min once stock is built)

Cells, per oversubscribed pool size (two of them), with N concurrent streamed chats (prompts of a
few hundred tokens, fixed-length answers with ignore_eos, temperature 0, fixed seed):

- stock: the vendored llama.cpp without our patches (bench/stock.py builds it once);
- ours --no-preempt; RECOMPUTE (--preempt-mode recompute); SWAP (--preempt-mode swap, no RAM limit); auto (the
  default: SWAP or RECOMPUTE per victim by measured cost, within the default 8192 MiB budget)
  and auto with a budget tight enough to force a mix of the two;
- static split: the same pool cut into fewer slots, each big enough for one whole request
  (--no-kv-unified): nothing fails, requests queue;

plus ample (a pool that holds every chat at once). Each cell runs --runs times, interleaved (A B C
A B C ...); the tables give medians and ranges. Also: the solo overhead (one chat, ample pool,
preemption on but never firing, against stock, per interleaved pair, output byte-identical) and the
planner's cost per step at 4, 64 and 256 slots. Results: bench/results/cells.{json,md} and PNG plots.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import random
import re
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import requests
from rich.console import Console
from rich.table import Table

from llama_preempt import _core
from llama_preempt.demo import TOPICS
from llama_preempt.rpc import RpcServer
from llama_preempt.server import LlamaServer, ServerConfig
from results_io import (RESULTS, display_path, md_table, smollm2_model, stories_model,  # bench/ is on sys.path
                        write_results)

# --- the load ---


@dataclass(frozen=True)
class Load:
    model: Path
    n_chats: int
    prompt_words: int   # roughly a token each
    n_predict: int
    pools: tuple[int, int]  # two oversubscribed pool sizes (cells)
    ample: int              # a pool that holds every chat at once
    split_slot: int         # cells per slot in the static split (a multiple of 256: llama.cpp pads to it)
    tight_mib: int          # a --preempt-ram that forces a mix of swap and recompute
    threads: int
    gpu_layers: int | None = None
    server_args: tuple[str, ...] = ()  # for every server, stock and ours (e.g. -fa on)
    rpc: int = 0                       # every server keeps its layers and KV cache on this many fresh ggml-rpc-servers

    def server_flags(self) -> list[str]:
        """What every server of the run gets: --server-args, and the offload."""
        return list(self.server_args) + ([] if self.gpu_layers is None else ["-ngl", str(self.gpu_layers)])

    def prompts(self) -> list[str]:
        out = []
        for i in range(self.n_chats):
            rng = random.Random(i)
            words = f"Write a long essay about {TOPICS[i % len(TOPICS)]}. ".split()
            filler = ("the river ran past the old mill and the children played by the water while "
                      "the baker sold warm bread to everyone in the small town ").split()
            while len(words) < self.prompt_words:
                words.append(filler[rng.randrange(len(filler))])
            out.append(" ".join(words))
        return out


@dataclass(frozen=True)
class Cell:
    name: str
    pool: int
    binary: str          # "stock" or "ours"
    n_parallel: int
    unified: bool
    args: tuple[str, ...] = ()


def cells_for(load: Load) -> list[Cell]:
    cells = []
    for pool in load.pools:
        n_split = max(1, pool // load.split_slot)
        cells += [
            Cell(f"{pool}: stock", pool, "stock", load.n_chats, True),
            Cell(f"{pool}: --no-preempt", pool, "ours", load.n_chats, True, ("--no-preempt",)),
            Cell(f"{pool}: recompute", pool, "ours", load.n_chats, True, ("--preempt-mode", "recompute")),
            Cell(f"{pool}: swap", pool, "ours", load.n_chats, True, ("--preempt-mode", "swap", "--preempt-ram", "-1")),
            Cell(f"{pool}: auto", pool, "ours", load.n_chats, True),
            Cell(f"{pool}: auto {load.tight_mib} MiB", pool, "ours", load.n_chats, True,
                 ("--preempt-ram", str(load.tight_mib))),
            Cell(f"{pool}: static split {n_split}x{load.split_slot}", pool, "ours", n_split, False),
        ]
    cells.append(Cell(f"{load.ample}: ample", load.ample, "ours", load.n_chats, True))
    return cells


# --- one run ---


@dataclass
class ChatResult:
    ok: bool
    error: str | None
    tokens: int
    t_first: float | None          # seconds from send to the first token
    gaps: list[float] = field(default_factory=list)  # inter-token latencies, seconds
    preempted_ms: float = 0.0
    text: str = ""
    lost: bool = False             # the connection failed: no answer at all, not even an error


@dataclass
class RunResult:
    cell: str
    run: int
    completed: int
    failed: int
    tokens: int
    wall_s: float
    tok_s: float
    ttft_p50_s: float | None
    ttft_p99_s: float | None
    itl_p50_ms: float | None
    itl_p99_ms: float | None
    parks_swap: int
    parks_recompute: int
    recomputed_tokens: int
    peak_ram_mib: float
    park_ms: list[float]
    restore_ms: list[float]
    longest_park_ms: float
    errors: list[str]
    timeline: list[dict[str, Any]] | None = None


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q / 100 * (len(s) - 1))))]


def stream_chat(url: str, prompt: str, n_predict: int, cache_prompt: bool = False) -> ChatResult:
    body = {"prompt": prompt, "n_predict": n_predict, "temperature": 0, "ignore_eos": True, "stream": True,
            "cache_prompt": cache_prompt}
    t0 = time.perf_counter()
    last = None
    res = ChatResult(False, None, 0, None)
    try:
        with requests.post(url + "/completion", json=body, stream=True, timeout=3600) as r:
            if r.status_code != 200:
                res.error = str(r.json().get("error", {}).get("message", r.status_code))
                return res
            for raw in r.iter_lines():
                if not raw.startswith(b"data: "):
                    continue
                d = json.loads(raw[6:])
                if "error" in d:
                    res.error = str(d["error"].get("message"))
                    return res
                now = time.perf_counter()
                if d.get("content") or d.get("tokens"):
                    res.tokens += 1
                    res.text += d.get("content", "")
                    if res.t_first is None:
                        res.t_first = now - t0
                    elif last is not None:
                        res.gaps.append(now - last)
                    last = now
                if d.get("stop"):
                    res.ok = d.get("tokens_predicted") == n_predict
                    res.preempted_ms = float((d.get("timings") or {}).get("preempted_ms", 0.0))
                    if not res.ok:
                        res.error = f"stopped at {d.get('tokens_predicted')} tokens ({d.get('stop_type')})"
    except requests.RequestException as e:
        res.error = f"{e.__class__.__name__}"
        res.lost = True
    return res


@contextlib.contextmanager
def polling(poll: Callable[[], None], every_s: float = 0.02) -> Iterator[None]:
    """Call poll() every `every_s` on a thread while the block runs (a /metrics watcher); a
    request that fails in between is skipped."""
    done = threading.Event()

    def loop() -> None:
        while not done.is_set():
            try:
                poll()
            except requests.RequestException:
                pass
            done.wait(every_s)

    watcher = threading.Thread(target=loop)
    watcher.start()
    try:
        yield
    finally:
        done.set()
        watcher.join()


def run_chats(url: str, load: Load) -> tuple[list[ChatResult], float]:
    """Every chat of the load at once, streamed: the results and the wall seconds they took."""
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=load.n_chats) as ex:
        chats = list(ex.map(lambda p: stream_chat(url, p, load.n_predict), load.prompts()))
    return chats, time.perf_counter() - t0


PARK_RE = re.compile(r"parked by swap \([\d.]+ MiB, \d+ tokens held[^)]*\) in ([\d.]+) ms")
RESTORE_RE = re.compile(r"restored by swap \([\d.]+ MiB, \d+ tokens\) in ([\d.]+) ms")


def cell_kind(cell: Cell) -> str:
    """What a cell runs, without its pool: stock, recompute, swap, auto, ... (--only picks by it)."""
    return cell.name.split(": ", 1)[1].split(" ", 1)[0] if ": " in cell.name else cell.name


def run_cell(cell: Cell, load: Load, binaries: dict[str, Path], run: int, timeline: bool = False) -> RunResult:
    with contextlib.ExitStack() as stack:
        rpcs = [stack.enter_context(RpcServer(threads=load.threads)) for _ in range(load.rpc)]
        rpc_flags = ["--rpc", ",".join(r.endpoint for r in rpcs), "-ngl", "99"] if rpcs else []
        return _run_cell(cell, load, binaries, run, timeline, rpc_flags)


def _run_cell(cell: Cell, load: Load, binaries: dict[str, Path], run: int, timeline: bool,
              rpc_flags: list[str]) -> RunResult:
    extra = list(cell.args) + load.server_flags() + rpc_flags
    cfg = ServerConfig(model=load.model, n_ctx=cell.pool, n_parallel=cell.n_parallel, kv_unified=cell.unified,
                       threads=load.threads, seed=1234, extra_args=extra)
    srv = LlamaServer(cfg, binary=binaries[cell.binary])
    with srv:
        peak = [0.0]
        frames: list[dict[str, Any]] = []
        has_preempt = cell.binary == "ours"
        t_start = time.perf_counter()

        def watch() -> None:
            if has_preempt:
                peak[0] = max(peak[0], srv.metrics().get("preempt_ram_bytes"))
            if timeline:
                frames.append({"t": time.perf_counter() - t_start, "slots": [
                    {"id": s["id"], "state": s.get("state"), "mode": s.get("preempt_mode")} for s in srv.slots()]})

        with polling(watch):
            chats, wall = run_chats(srv.url, load)
        m = srv.metrics() if has_preempt else None
        log = srv.log_text()
    ttfts = [c.t_first for c in chats if c.ok and c.t_first is not None]
    gaps = [g for c in chats if c.ok for g in c.gaps]
    tokens = sum(c.tokens for c in chats)
    p = pct(gaps, 50)
    q = pct(gaps, 99)
    return RunResult(
        cell=cell.name, run=run, completed=sum(c.ok for c in chats), failed=sum(not c.ok for c in chats),
        tokens=tokens, wall_s=round(wall, 3), tok_s=round(tokens / wall, 2),
        ttft_p50_s=pct(ttfts, 50), ttft_p99_s=pct(ttfts, 99),
        itl_p50_ms=None if p is None else round(p * 1000, 2), itl_p99_ms=None if q is None else round(q * 1000, 2),
        parks_swap=int(m.get("n_preempt_swap_total")) if m else 0,
        parks_recompute=int(m.get("n_preempt_recompute_total")) if m else 0,
        recomputed_tokens=int(m.get("n_recompute_tokens_total")) if m else 0,
        peak_ram_mib=round(peak[0] / 2**20, 2),
        park_ms=[float(x) for x in PARK_RE.findall(log)], restore_ms=[float(x) for x in RESTORE_RE.findall(log)],
        longest_park_ms=max((c.preempted_ms for c in chats), default=0.0),
        errors=sorted({c.error for c in chats if c.error}), timeline=frames if timeline else None)


# --- solo overhead and the planner's cost ---


def solo_overhead(load: Load, binaries: dict[str, Path], pairs: int, console: Console) -> dict[str, Any]:
    """One chat on an ample pool: ours (preemption on, never firing) against stock, interleaved
    (stock first in even pairs, ours first in odd ones)."""
    prompt = load.prompts()[0]
    ratios, texts_equal, stock_tps, ours_tps = [], [], [], []
    for i in range(pairs):
        got = {}
        for name in (("stock", "ours") if i % 2 == 0 else ("ours", "stock")):  # alternate who goes first
            cfg = ServerConfig(model=load.model, n_ctx=load.ample, n_parallel=2, kv_unified=True, threads=load.threads,
                               seed=1234, extra_args=load.server_flags())
            with LlamaServer(cfg, binary=binaries[name]) as srv:
                t0 = time.perf_counter()
                c = stream_chat(srv.url, prompt, load.n_predict)
                got[name] = (c, c.tokens / (time.perf_counter() - t0))
        ratios.append(got["ours"][1] / got["stock"][1])
        stock_tps.append(got["stock"][1])
        ours_tps.append(got["ours"][1])
        texts_equal.append(got["ours"][0].text == got["stock"][0].text)
        console.print(f"solo pair {i + 1}/{pairs}: stock {got['stock'][1]:.1f} tok/s, ours {got['ours'][1]:.1f} tok/s, "
                      f"ratio {ratios[-1]:.3f}, identical {texts_equal[-1]}")
    spread = (max(stock_tps) - min(stock_tps)) / statistics.median(stock_tps)
    return {"pairs": pairs, "ratio_per_pair": [round(r, 4) for r in ratios],
            "ratio_median": round(statistics.median(ratios), 4),
            "stock_tok_s": [round(x, 1) for x in stock_tps], "ours_tok_s": [round(x, 1) for x in ours_tps],
            "noise_stock_spread": round(spread, 4), "identical": all(texts_equal)}


def planner_cost() -> dict[str, float]:
    """Microseconds per plan_step() call (in C++), on a full pool with a park to decide."""
    out = {}
    for n in (4, 64, 256):
        rng = random.Random(n)
        slots = []
        for i in range(n):
            kind = i % 4
            if kind == 0:
                slots.append(_core.SlotView(i, _core.SlotPhase.PARKED, n_restore=rng.randint(50, 500),
                                            t_parked_us=i, n_preempt=rng.randint(1, 3)))
            elif kind == 1:
                slots.append(_core.SlotView(i, _core.SlotPhase.PROMPT, n_cells=rng.randint(0, 200),
                                            n_prompt_left=rng.randint(1, 300), is_new=rng.random() < 0.3))
            else:
                slots.append(_core.SlotView(i, _core.SlotPhase.GENERATING, n_cells=rng.randint(100, 800),
                                            priority=rng.randint(0, 2)))
        used = sum(s.n_cells for s in slots)
        params = _core.PlanParams(n_pool=max(16, int(used * 0.9)), n_batch=512)
        out[str(n)] = round(_core.time_plan_step(slots, params, 20000 if n < 100 else 5000), 3)
    return out


# --- summary, tables, plots ---


def rng_of(values: list[float]) -> list[float] | None:
    v = [x for x in values if x is not None]
    return [round(min(v), 3), round(max(v), 3)] if v else None


def med(values: list[Any]) -> float | None:
    v = [x for x in values if x is not None]
    return round(statistics.median(v), 3) if v else None


def summarize(cells: list[Cell], runs: list[RunResult]) -> list[dict[str, Any]]:
    rows = []
    for cell in cells:
        rs = [r for r in runs if r.cell == cell.name]
        parks = [x for r in rs for x in r.park_ms]
        restores = [x for r in rs for x in r.restore_ms]
        rows.append({
            "cell": cell.name, "runs": len(rs),
            "completed": f"{min(r.completed for r in rs)}/{rs[0].completed + rs[0].failed}",
            "failed_max": max(r.failed for r in rs),
            "tokens": med([r.tokens for r in rs]),
            "tok_s": med([r.tok_s for r in rs]), "tok_s_range": rng_of([r.tok_s for r in rs]),
            "ttft_p50_s": med([r.ttft_p50_s for r in rs]), "ttft_p99_s": med([r.ttft_p99_s for r in rs]),
            "ttft_p99_range": rng_of([r.ttft_p99_s for r in rs]),
            "itl_p50_ms": med([r.itl_p50_ms for r in rs]), "itl_p99_ms": med([r.itl_p99_ms for r in rs]),
            "parks_swap": med([r.parks_swap for r in rs]), "parks_recompute": med([r.parks_recompute for r in rs]),
            "recomputed_tokens": med([r.recomputed_tokens for r in rs]),
            "peak_ram_mib": max(r.peak_ram_mib for r in rs),
            "park_ms_median": med(parks), "park_ms_max": max(parks) if parks else None,
            "restore_ms_median": med(restores), "restore_ms_max": max(restores) if restores else None,
            "longest_park_ms": max(r.longest_park_ms for r in rs),
            "errors": sorted({e for r in rs for e in r.errors}),
        })
    return rows


def fmt(v: Any, unit: str = "") -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.3g}{unit}" if abs(v) < 100 else f"{v:.0f}{unit}"
    return f"{v}{unit}"


COLUMNS = [("cell", "cell"), ("completed", "completed"), ("tok/s (range)", None), ("TTFT p50 s", "ttft_p50_s"),
           ("TTFT p99 s (range)", None), ("ITL p50 ms", "itl_p50_ms"), ("ITL p99 ms", "itl_p99_ms"),
           ("parks swap/rec", None), ("recomputed", "recomputed_tokens"), ("peak RAM MiB", "peak_ram_mib"),
           ("park ms med/max", None), ("restore ms med/max", None), ("longest park ms", "longest_park_ms")]


def row_cells(r: dict[str, Any]) -> list[str]:
    out = []
    for title, key in COLUMNS:
        if key is not None:
            out.append(fmt(r[key]))
        elif title.startswith("tok/s"):
            lo, hi = r["tok_s_range"] or (None, None)
            out.append(f"{fmt(r['tok_s'])} ({fmt(lo)}-{fmt(hi)})")
        elif title.startswith("TTFT p99"):
            lo, hi = r["ttft_p99_range"] or (None, None)
            out.append("-" if r["ttft_p99_s"] is None else f"{fmt(r['ttft_p99_s'])} ({fmt(lo)}-{fmt(hi)})")
        elif title.startswith("parks"):
            out.append(f"{fmt(r['parks_swap'])}/{fmt(r['parks_recompute'])}")
        elif title.startswith("park ms"):
            out.append(f"{fmt(r['park_ms_median'])}/{fmt(r['park_ms_max'])}")
        else:
            out.append(f"{fmt(r['restore_ms_median'])}/{fmt(r['restore_ms_max'])}")
    return out


def plots(rows: list[dict[str, Any]], timeline_run: RunResult | None, out: Path, title: str,
          prefix: str = "cells") -> list[str]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    made = []
    names = [r["cell"] for r in rows]
    for key, rkey, label, fname in (("tok_s", "tok_s_range", "aggregate tokens/s", f"{prefix}_throughput.png"),
                                    ("ttft_p99_s", "ttft_p99_range", "TTFT p99 (s)", f"{prefix}_ttft_p99.png")):
        vals = [r[key] or 0 for r in rows]
        lo = [max(0.0, v - (r[rkey][0] if r[rkey] else v)) for v, r in zip(vals, rows)]
        hi = [max(0.0, (r[rkey][1] if r[rkey] else v) - v) for v, r in zip(vals, rows)]
        fig, ax = plt.subplots(figsize=(10, 5))
        colors = ["#999999" if "stock" in n or "no-preempt" in n else "#4C72B0" if "static" in n or "ample" in n
                  else "#DD8452" for n in names]
        ax.barh(range(len(names)), vals, xerr=[lo, hi], color=colors, capsize=3)
        ax.set_yticks(range(len(names)), names, fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel(label + " (median of runs, bars: range)")
        ax.set_title(title, fontsize=9)
        fig.tight_layout()
        fig.savefig(out / fname, dpi=110)
        plt.close(fig)
        made.append(fname)
    if timeline_run and timeline_run.timeline:
        colors = {"processing_prompt": "#8172B2", "started": "#CCB974", "generating": "#55A868",
                  "swap": "#C44E52", "recompute": "#DD8452"}
        frames = timeline_run.timeline
        n_slots = max(len(f["slots"]) for f in frames)
        fig, ax = plt.subplots(figsize=(10, 0.5 * n_slots + 1.5))
        for i in range(len(frames) - 1):
            t0, t1 = frames[i]["t"], frames[i + 1]["t"]
            for s in frames[i]["slots"]:
                key = s["mode"] if s["state"] == "preempted" else s["state"]
                if key in colors:
                    ax.broken_barh([(t0, t1 - t0)], (s["id"] - 0.4, 0.8), color=colors[key])
        ax.set_yticks(range(n_slots), [f"slot {i}" for i in range(n_slots)])
        ax.set_xlabel("seconds")
        handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in colors.values()]
        ax.legend(handles, ["prompt", "started", "generating", "parked (swap)", "parked (recompute)"],
                  loc="upper center", bbox_to_anchor=(0.5, -0.18), fontsize=7, ncol=5)
        ax.set_title(f"{timeline_run.cell}, run {timeline_run.run}: slot states from /slots every 20 ms", fontsize=9)
        fig.tight_layout()
        fig.savefig(out / f"{prefix}_timeline.png", dpi=110)
        plt.close(fig)
        made.append(f"{prefix}_timeline.png")
    return made


def markdown(record: dict[str, Any]) -> list[str]:
    rows, solo, planner = record["summary"], record["solo_overhead"], record["planner_us_per_step"]
    md = md_table([t for t, _ in COLUMNS], [row_cells(r) for r in rows]) + [""]
    if solo:
        md += [f"Solo overhead, ours / stock tok/s per interleaved pair: {solo['ratio_per_pair']} (median "
               f"{solo['ratio_median']}); stock's own run-to-run spread {solo['noise_stock_spread']:.1%}; output "
               f"byte-identical: {solo['identical']}."]
    md += ["Planner, microseconds per `plan_step()` call: " + ", ".join(f"{k} slots {v}" for k, v in planner.items()) + ".",
           f"Command: `{record['command'].strip()}` ({record['wall_s']} s)."]
    return md


def render(name: str, out: Path) -> None:
    """Tables and plots again from a saved run (bench/results/NAME.json), without running anything."""
    record = json.loads((out / f"{name}.json").read_text())
    (out / f"{name}.md").write_text("\n".join(markdown(record)) + "\n")
    timeline = next((RunResult(**r) for r in record["runs"] if r.get("timeline")), None)
    plots(record["summary"], timeline, out, f"{Path(record['model']).name}, {record['load']['n_chats']} chats x "
                                            f"{record['load']['n_predict']} tokens", prefix=name)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="stories260K, small load: under 3 minutes once stock is built")
    ap.add_argument("--model", type=Path, default=None, help="any gguf (default: SmolLM2, or stories260K with --quick)")
    ap.add_argument("--runs", type=int, default=3, help="runs per cell, interleaved (default 3)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--gpu-layers", type=int, default=None, help="-ngl for a GPU build")
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--name", default=None, help="results file stem (default: cells or cells_quick)")
    ap.add_argument("--server-args", default="", help="more flags for every server, e.g. '-fa on'")
    ap.add_argument("--rpc", type=int, default=0, metavar="N",
                    help="every server keeps the model and KV cache on N fresh ggml-rpc-servers over loopback (-ngl 99)")
    ap.add_argument("--only", nargs="+", default=None, metavar="KIND",
                    help="run only these cells: stock, --no-preempt, recompute, swap, auto, static, ample "
                         "(without stock: no stock build and no solo overhead)")
    shape = ap.add_argument_group("the load (defaults depend on --quick)")
    shape.add_argument("--chats", type=int, default=None)
    shape.add_argument("--tokens", type=int, default=None, help="tokens each chat generates")
    shape.add_argument("--prompt-words", type=int, default=None)
    shape.add_argument("--pools", default=None, help="two oversubscribed pool sizes, e.g. 1536,1024")
    shape.add_argument("--ample", type=int, default=None, help="a pool that holds every chat")
    shape.add_argument("--split-slot", type=int, default=None, help="cells per slot in the static split (x256)")
    shape.add_argument("--tight-mib", type=int, default=None, help="a --preempt-ram that forces a swap/recompute mix")
    ap.add_argument("--render", action="store_true", help="only redraw the tables and plots of a saved run")
    args = ap.parse_args(argv)
    console = Console()
    if args.render:
        render(args.name or ("cells_quick" if args.quick else "cells"), args.out)
        return 0

    if args.quick:
        model = stories_model(args.model)
        load = Load(model, n_chats=4, prompt_words=40, n_predict=100, pools=(512, 256), ample=1024, split_slot=256,
                    tight_mib=1, threads=args.threads, gpu_layers=args.gpu_layers)
    else:
        load = Load(smollm2_model(args.model), n_chats=6, prompt_words=200, n_predict=256, pools=(1536, 1024), ample=4096, split_slot=512,
                    tight_mib=12, threads=args.threads, gpu_layers=args.gpu_layers)

    from dataclasses import replace

    overrides: dict[str, Any] = {k: v for k, v in (("n_chats", args.chats), ("n_predict", args.tokens),
                                                    ("prompt_words", args.prompt_words), ("ample", args.ample),
                                                    ("split_slot", args.split_slot), ("tight_mib", args.tight_mib))
                                 if v is not None}
    if args.pools:
        a, b = (int(x) for x in args.pools.split(","))
        overrides["pools"] = (a, b)
    load = replace(load, server_args=tuple(args.server_args.split()), rpc=args.rpc, **overrides)

    from llama_preempt.binary import server_binary

    cells = [c for c in cells_for(load) if args.only is None or cell_kind(c) in args.only]
    if not cells:
        console.print(f"--only {' '.join(args.only)}: no such cells (kinds: "
                      f"{', '.join(sorted({cell_kind(c) for c in cells_for(load)}))})")
        return 2
    binaries = {"ours": server_binary()}
    with_stock = any(c.binary == "stock" for c in cells)
    if with_stock:
        from stock import stock_server
        binaries["stock"] = stock_server(lambda m: console.print(f"[dim]{m}[/]"))
    console.print(f"[bold]{len(cells)} cells x {args.runs} runs[/], {load.n_chats} chats x {load.n_predict} tokens, "
                  f"model {load.model.name}")
    t_start = time.perf_counter()
    runs: list[RunResult] = []
    timeline_cell = f"{load.pools[1]}: auto"
    for i in range(args.runs):
        for cell in cells:
            r = run_cell(cell, load, binaries, i + 1, timeline=(i == 0 and cell.name == timeline_cell))
            runs.append(r)
            console.print(f"run {i + 1} {cell.name:34s} {r.completed}/{r.completed + r.failed} ok, {r.tok_s:7.1f} tok/s, "
                          f"TTFT p99 {fmt(r.ttft_p99_s)} s, parks {r.parks_swap}/{r.parks_recompute}")
    solo = solo_overhead(load, binaries, 6 if not args.quick else 4, console) if with_stock else None
    planner = planner_cost()
    rows = summarize(cells, runs)

    table = Table(title=f"{load.n_chats} chats x {load.n_predict} tokens, {load.model.name}, {args.runs} runs per cell",
                  title_justify="left")
    for title, _ in COLUMNS:
        table.add_column(title, justify="left" if title == "cell" else "right")
    for r in rows:
        table.add_row(*row_cells(r))
    console.print(table)
    if solo:
        console.print(f"solo overhead (ours / stock tok/s per pair): {solo['ratio_per_pair']}, median {solo['ratio_median']}, "
                      f"stock's own spread {solo['noise_stock_spread']:.1%}, identical output: {solo['identical']}")
    console.print(f"planner, microseconds per step: {planner}")

    name = args.name or ("cells_quick" if args.quick else "cells")
    args.out.mkdir(parents=True, exist_ok=True)
    timeline_run = next((r for r in runs if r.timeline), None)
    pngs = plots(rows, timeline_run, args.out, f"{load.model.name}, {load.n_chats} chats x {load.n_predict} tokens",
                 prefix=name)
    record = {
        "command": "python -m bench " + " ".join(argv if argv is not None else sys.argv[1:]),
        "model": display_path(load.model),
        "load": {k: (display_path(v) if isinstance(v, Path) else v) for k, v in asdict(load).items()},
        "wall_s": round(time.perf_counter() - t_start, 1),
        "summary": rows, "solo_overhead": solo, "planner_us_per_step": planner, "plots": pngs,
        "runs": [asdict(r) for r in runs],
    }
    write_results(name, record, markdown(record), args.out)
    console.print(f"wrote {display_path(args.out / (name + '.json'))}, {name}.md and {len(pngs)} plots "
                  f"in {time.perf_counter() - t_start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
