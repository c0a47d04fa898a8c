"""A realistic load: many short requests and a few long ones, arriving over time.

    python bench/mixed.py            # SmolLM2-135M-Instruct Q4_1 (about 6 min on 2 cores)
    python bench/mixed.py --quick    # stories260K, in about a minute

Chat and agent traffic mixes many short prompts and answers with a few long ones. The workload is
log-normal in both lengths (most requests short, a few many times the median) with Poisson
arrivals, written to bench/results/NAME_workload.jsonl in the simulator's format. Three shapes:
chat (log-normal lengths), long (a few very long prompts among many short chats) and many (many
more short requests than slots). One pool of --ctx cells, served these ways:

- stock: unpatched llama-server, --parallel slots over one unified pool: when the requests in
  flight overflow it together, every running request fails (--no-stock leaves it out);
- static split: --no-kv-unified with as many slots as the pool holds copies of the longest
  request (so nothing can fail); the rest wait for a slot;
- auto: llama-preempt's defaults, --parallel slots over the unified pool: the oldest slots decode,
  as many as the measured step cost pays for, the rest pause; a slot is parked when the pool fills;
- auto, width off (--width-off N): the same with every slot decoding at once (width-loss=0);
- more cells that separate causes (--cell, repeatable): `unified:N` (one pool, --no-preempt: upstream's
  unified server, every slot decoding), `auto:N`, each optionally `+width0` (width-loss=0) and
  `+bsample` (--backend-sampling: upstream's sampling on the device instead of the host).

With --log-dir each cell's server log and its final /metrics are kept there.

Per cell and run: completed, tokens/s over the whole run, TTFT, time to second token and
end-to-end latency (p50, p99, from each request's arrival), the longest gap between two tokens of
any request, parks and pauses. With --runs N the cells take turns and the tables give medians with
their ranges. The simulator (`llama-preempt simulate`) runs the same workload with costs calibrated
against the live server (its fitted step cost), beside the live figures, with its error; and the
goals of issue 39 are checked against the static split.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable

from rich.console import Console

from llama_preempt.server import LlamaServer, ServerConfig
from llama_preempt.simulator import Costs, Workload, calibrate, simulate
from cells import ChatResult, pct, stream_chat
from results_io import RESULTS, display_path, md_table, smollm2_model, stories_model, write_results
from stock import stock_server

WORDS = ("once upon a time there was a little girl named lily she loved to play outside in the park one day "
         "she saw a big red ball and her mom said be careful").split()

# the figures a run reports, and how the tables name them
FIGURES = [("tok_s", "tok/s"), ("ttft_p50_s", "TTFT p50 s"), ("ttft_p99_s", "TTFT p99 s"),
           ("ttst_p99_s", "2nd token p99 s"), ("e2e_p50_s", "end-to-end p50 s"), ("e2e_p99_s", "end-to-end p99 s"),
           ("gap_max_s", "longest gap s"), ("parks", "parks"), ("pauses", "pauses"), ("wall_s", "wall s"),
           ("step_ms", "ms/step"), ("loop_ms", "decode/post/other ms")]


def prompt_of(n_words: int, i: int) -> str:
    return f"{i}: " + " ".join(WORDS[(i + k) % len(WORDS)] for k in range(n_words))


def run_load(srv: LlamaServer, prompts: list[str], wl: Workload,
             cache_prompt: bool = False) -> tuple[list[tuple[ChatResult, float]], float]:
    """Every request at its arrival time, streamed (the cells' client); ((result, end-to-end s) per
    request, wall seconds). cache_prompt: upstream's default (True) where a load's prompts share text."""
    out: list[tuple[ChatResult, float]] = [(ChatResult(False, None, 0, None), 0.0)] * len(prompts)
    t0 = time.monotonic()

    def one(i: int) -> None:
        time.sleep(max(0.0, t0 + wl.t_arrival[i] - time.monotonic()))
        start = time.monotonic()
        res = stream_chat(srv.url, prompts[i], wl.n_gen[i], cache_prompt)
        out[i] = (res, time.monotonic() - start)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out, time.monotonic() - t0


def r3(v: float | None) -> float | None:
    return None if v is None else round(v, 3)


def summarize(name: str, out: list[tuple[ChatResult, float]], wall: float, m: Any) -> dict[str, Any]:
    ok = [(res, e2e) for res, e2e in out if res.ok]  # ok: every token asked for arrived
    ttft = [res.t_first for res, _ in ok if res.t_first is not None]
    ttst = [res.t_first + res.gaps[0] for res, _ in ok if res.t_first is not None and res.gaps]
    e2e = [t for _, t in ok]
    gaps = [max(res.gaps) for res, _ in ok if res.gaps]
    # where the server loop's time went, per step (preempt_loop_us_total over n_loop_steps_total)
    loop = m.labeled.get("preempt_loop_us_total", {}) if m else {}
    n_steps = int(m.get("n_loop_steps_total", 0)) if m else 0
    per = {part: loop.get(part, 0.0) / n_steps / 1e3 for part in ("plan", "decode", "post", "other")} if n_steps else {}
    return {
        "cell": name, "completed": f"{len(ok)}/{len(out)}",
        "tok_s": round(sum(res.tokens for res, _ in ok) / wall, 1),
        "ttft_p50_s": r3(pct(ttft, 50)), "ttft_p99_s": r3(pct(ttft, 99)),
        "ttst_p50_s": r3(pct(ttst, 50)), "ttst_p99_s": r3(pct(ttst, 99)),
        "e2e_p50_s": r3(pct(e2e, 50)), "e2e_p99_s": r3(pct(e2e, 99)),
        "gap_max_s": r3(max(gaps, default=None)), "gap_p99_s": r3(pct(gaps, 99)),
        "parks": int(m.get("n_preempt_total", 0)), "pauses": int(m.get("n_paused_total", 0)),
        "recomputed": int(m.get("n_recompute_tokens_total", 0)), "wall_s": round(wall, 1),
        "step_ms": r3(sum(per.values())) if per else None,
        "loop_ms": "/".join(f"{per[p]:.2f}" for p in ("decode", "post", "other")) if per else None,
        "loop_ms_per_step": {p: round(v, 4) for p, v in per.items()}, "n_steps": n_steps,
    }


def median_range(values: list[float | str | None]) -> str:
    """"median (lo-hi)" of the runs, or "-" when a run had none (texts: each run's, joined)."""
    v = [x for x in values if x is not None]
    if not v:
        return "-"
    if any(isinstance(x, str) for x in v):
        return ", ".join(str(x) for x in v)
    med = statistics.median(v)
    return f"{med:g}" if len(v) == 1 else f"{med:g} ({min(v):g}-{max(v):g})"


def median_of(rows: list[dict[str, Any]], key: str) -> float | None:
    v = [r[key] for r in rows if r.get(key) is not None]
    return statistics.median(v) if v else None


def workload_words(shape: str, n: int, rate: float, ctx: int, prompt_median: int, gen_median: int,
                   seed: int) -> Workload:
    """chat: many short prompts and answers, a few long; long: a few very long prompts among many
    short chats (sigma 1.6); many: many short requests, narrower lengths (sigma 0.8). Lengths in
    words (about one token each)."""
    if shape == "long":
        return Workload.lognormal(n, rate=rate, prompt_median=prompt_median, gen_median=gen_median,
                                  sigma=1.6, max_prompt=ctx * 3 // 8, max_gen=ctx // 5, seed=seed)
    if shape == "many":
        return Workload.lognormal(n, rate=rate, prompt_median=prompt_median, gen_median=gen_median,
                                  sigma=0.8, max_prompt=ctx // 4, max_gen=ctx // 5, seed=seed)
    return Workload.lognormal(n, rate=rate, prompt_median=prompt_median, gen_median=gen_median,
                              max_prompt=ctx // 3, max_gen=ctx // 4, seed=seed)


def sim_row(label: str, rep: Any) -> dict[str, Any]:
    """A simulated run in the live runs' terms."""
    return {"cell": label, "completed": f"{rep.completed}/{rep.requests}", "tok_s": round(rep.tok_s, 1),
            "ttft_p50_s": r3(rep.ttft_p50_s), "ttft_p99_s": r3(rep.ttft_p99_s), "ttst_p50_s": r3(rep.ttst_p50_s),
            "ttst_p99_s": r3(rep.ttst_p99_s), "e2e_p50_s": r3(rep.e2e_p50_s), "e2e_p99_s": r3(rep.e2e_p99_s),
            "gap_max_s": r3(rep.gap_max_s), "parks": rep.parks, "pauses": None, "wall_s": round(rep.makespan_s, 1),
            "step_ms": r3(rep.makespan_s / rep.steps * 1e3) if rep.steps else None, "loop_ms": None}


def goals(split: list[dict[str, Any]], cell: list[dict[str, Any]], n_requests: int) -> list[tuple[str, bool, str]]:
    """Issue 39's goals for one cell against the static split, on the medians of the runs."""
    def m(rows: list[dict[str, Any]], k: str) -> float:
        return median_of(rows, k) or float("nan")

    done = all(r["completed"] == f"{n_requests}/{n_requests}" for r in cell)
    return [
        ("completion 100 %", done, f"{min(int(r['completed'].split('/')[0]) for r in cell)}/{n_requests}"),
        ("end-to-end p99 <= split", m(cell, "e2e_p99_s") <= m(split, "e2e_p99_s"),
         f"{m(cell, 'e2e_p99_s'):.2f} vs {m(split, 'e2e_p99_s'):.2f}"),
        ("TTFT p99 <= 0.8x split", m(cell, "ttft_p99_s") <= 0.8 * m(split, "ttft_p99_s"),
         f"{m(cell, 'ttft_p99_s') / m(split, 'ttft_p99_s'):.2f}x"),
        ("TTFT p50 <= 0.5x split", m(cell, "ttft_p50_s") <= 0.5 * m(split, "ttft_p50_s"),
         f"{m(cell, 'ttft_p50_s') / m(split, 'ttft_p50_s'):.2f}x"),
        ("tok/s >= split", m(cell, "tok_s") >= m(split, "tok_s"), f"{m(cell, 'tok_s'):.1f} vs {m(split, 'tok_s'):.1f}"),
    ]


def extra_cell(spec: str, server: Callable[..., LlamaServer],
               sched_args: Callable[..., list[str]]) -> tuple[str, Callable[[], LlamaServer], dict[str, Any]]:
    """A --cell: `auto:N` or `unified:N` (one pool, --no-preempt), with `+width0` and `+bsample`."""
    names = {"width0": ", width off", "bsample": ", backend sampling"}
    head, *opts = spec.split("+")
    kind, _, n = head.partition(":")
    if kind not in ("auto", "unified") or not n.isdigit() or any(o not in names for o in opts):
        raise SystemExit(f"--cell {spec!r}: expected KIND:N[+width0][+bsample] with KIND auto or unified")
    n_par = int(n)
    flags = ["--backend-sampling"] if "bsample" in opts else []
    extra = (sched_args("width-loss=0") if "width0" in opts else sched_args()) + flags
    label = (f"auto, {n_par} slots" if kind == "auto" else f"unified, {n_par} slots, no preempt") + \
        "".join(names[o] for o in opts)
    if kind == "unified":
        return label, lambda: server(None, n_par, True, flags, preempt=False), {}
    # the simulator does not model --no-preempt's timing (its --no-preempt is the failure mode): not simulated
    return label, lambda: server(None, n_par, True, extra), {"n_parallel": n_par,
                                                            "sched": "width-loss=0" if "width0" in opts else None}


def keep_cell_record(log_dir: Path, label: str, srv: LlamaServer) -> None:
    """The cell's /metrics (raw) and /slots beside its server log, named after the cell."""
    slug = "".join(c if c.isalnum() else "_" for c in label).strip("_")
    (log_dir / f"{slug}.metrics.txt").write_text(srv.get("/metrics").text)
    (log_dir / f"{slug}.slots.json").write_text(srv.get("/slots").text)
    (log_dir / f"{slug}.server-log.name").write_text(srv.log_path.name + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="stories260K and a smaller pool")
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--rate", type=float, default=None, help="arrivals per second (default 2, --quick 150)")
    ap.add_argument("--ctx", type=int, default=None, help="the pool (default 1024, --quick 512)")
    ap.add_argument("--parallel", default="8", help="slots of the auto cells, comma-separated (stock takes the first)")
    ap.add_argument("--width-off", default="", help="slot counts of auto cells run with every slot decoding "
                                                    "(--preempt-sched width-loss=0), comma-separated")
    ap.add_argument("--shape", choices=("chat", "long", "many"), default="chat",
                    help="chat: log-normal lengths; long: a few very long prompts among many short chats; "
                         "many: many short requests")
    ap.add_argument("--runs", type=int, default=1, help="runs per cell, interleaved (medians and ranges)")
    ap.add_argument("--prompt-median", type=int, default=None, help="prompt words, median (default 64, --quick 48)")
    ap.add_argument("--gen-median", type=int, default=48, help="answer tokens, median")
    ap.add_argument("--sched", default=None, help="--preempt-sched for the auto cells (default: the server's)")
    ap.add_argument("--cell", action="append", default=[], metavar="KIND:N[+width0][+bsample]",
                    help="an extra cell: KIND auto or unified (one pool, --no-preempt); +width0: every slot "
                         "decodes; +bsample: --backend-sampling (repeatable)")
    ap.add_argument("--log-dir", type=Path, default=None, help="keep each cell's server log and /metrics here")
    ap.add_argument("--no-stock", action="store_true", help="leave out the stock cell")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--name", default=None)
    args = ap.parse_args(argv)
    console = Console()
    quick = args.quick
    model = (stories_model if quick else smollm2_model)(args.model)
    ctx = args.ctx or (512 if quick else 1024)
    rate = args.rate or (150.0 if quick else 2.0)
    name = args.name or ("mixed_quick" if quick else "mixed")
    parallel = [int(x) for x in args.parallel.split(",")]
    width_off = [int(x) for x in args.width_off.split(",") if x.strip()]
    wl_words = workload_words(args.shape, args.requests, rate, ctx, args.prompt_median or (48 if quick else 64),
                              args.gen_median, args.seed)
    prompts = [prompt_of(n, i) for i, n in enumerate(wl_words.n_prompt)]

    def sched_args(*extra: str) -> list[str]:
        keys = [k for k in (args.sched, *extra) if k]
        return ["--preempt-sched", ",".join(keys)] if keys else []

    def server(binary: Path | None, n_parallel: int, unified: bool, extra: list[str] | None = None,
               preempt: bool | None = None) -> LlamaServer:
        cfg = ServerConfig(model=model, n_ctx=ctx, n_parallel=n_parallel, kv_unified=unified, threads=args.threads,
                           seed=1234, extra_args=extra or [], preempt=preempt)
        return LlamaServer(cfg, binary=binary, log_dir=args.log_dir)

    # the workload in tokens (as the model counts them), and the simulator's costs: our server's own
    # fit of its steps under a calibration load (simulate --calibrate)
    with server(None, max(parallel), True, sched_args()) as srv:
        n_prompt = [len(srv.post("/tokenize", {"content": p, "add_special": True}).json()["tokens"]) for p in prompts]
        costs = calibrate(srv.url)
    wl = Workload(wl_words.t_arrival, tuple(n_prompt), wl_words.n_gen)
    wl.to_jsonl(RESULTS / f"{name}_workload.jsonl")
    longest = max(p + g for p, g in zip(wl.n_prompt, wl.n_gen)) + 1
    slot = -(-longest // 256) * 256  # llama.cpp pads a slot's context to 256
    n_split = max(1, ctx // slot)
    console.print(f"workload ({args.shape}): {len(wl)} requests at {rate}/s, prompts {min(n_prompt)}-{max(n_prompt)} tokens "
                  f"(median {statistics.median(n_prompt)}), answers {min(wl.n_gen)}-{max(wl.n_gen)} "
                  f"(median {statistics.median(wl.n_gen)}); longest {longest} cells; pool {ctx}; costs {costs}")

    split_name = f"static split {n_split}x{ctx // n_split}"
    cells: list[tuple[str, Callable[[], LlamaServer], dict[str, Any]]] = []
    if not args.no_stock:
        cells.append((f"stock, {parallel[0]} slots", lambda: server(stock_server(console.print), parallel[0], True),
                      {}))
    cells.append((split_name, lambda: server(None, n_split, False), {"n_parallel": n_split, "preempt": False, "kv_unified": False,
                                                                      "n_ctx": n_split * slot}))
    for n_par in parallel:
        cells.append((f"auto, {n_par} slots", lambda n_par=n_par: server(None, n_par, True, sched_args()),
                      {"n_parallel": n_par, "sched": args.sched}))
    for n_par in width_off:
        off = ",".join(k for k in (args.sched, "width-loss=0") if k)
        cells.append((f"auto, {n_par} slots, width off", lambda n_par=n_par: server(None, n_par, True, sched_args("width-loss=0")),
                      {"n_parallel": n_par, "sched": off}))
    for spec in args.cell:
        cells.append(extra_cell(spec, server, sched_args))
    runs: dict[str, list[dict[str, Any]]] = {c: [] for c, _, _ in cells}
    for run in range(args.runs):  # interleaved: every cell once per run
        for cell_name, make, _ in cells:
            with make() as srv:
                out, wall = run_load(srv, prompts, wl)
                m = srv.metrics() if not cell_name.startswith("stock") else {}
                if args.log_dir is not None and not cell_name.startswith("stock"):
                    keep_cell_record(args.log_dir, f"{cell_name} run {run + 1}", srv)
            row = summarize(cell_name, out, wall, m)
            runs[cell_name].append(row)
            console.print(f"run {run + 1}/{args.runs}", row)

    keys = [k for k, _ in FIGURES]
    rows = []
    for cell_name, _, _ in cells:
        rs = runs[cell_name]
        n_done = sorted(int(r["completed"].split("/")[0]) for r in rs)
        done = f"{n_done[0]}/{len(wl)}" if n_done[0] == n_done[-1] else f"{n_done[0]}-{n_done[-1]}/{len(wl)}"
        rows.append([cell_name, len(rs), done] + [median_range([r[k] for r in rs]) for k in keys])

    # the simulator, the same cells, the same workload
    sims: dict[str, dict[str, Any]] = {}
    for cell_name, _, sim_kw in cells:
        if not sim_kw:
            continue  # stock: the simulator's --no-preempt is its failure mode, not its timing
        kw = {"n_ctx": ctx, "preempt": True, **sim_kw}
        rep = simulate(wl, costs=costs, **kw)
        sims[cell_name] = sim_row(f"simulated {cell_name}", rep)
    sim_rows = [[r["cell"], 1, r["completed"]] + [("-" if r[k] is None else f"{r[k]:g}") for k in keys]
                for r in sims.values()]

    # the simulator against the live medians
    err_rows = []
    compared = ["tok_s", "ttft_p50_s", "ttft_p99_s", "e2e_p99_s"]
    for cell_name, sim in sims.items():
        cols = []
        for k in compared:
            live = median_of(runs[cell_name], k)
            cols.append("-" if not live or sim[k] is None else f"{sim[k]:g} / {live:g} ({(sim[k] - live) / live:+.0%})")
        err_rows.append([cell_name] + cols)

    # the goals, for each auto cell with the width on
    goal_rows = []
    for cell_name, _, _ in cells:
        if cell_name.startswith("auto") and "width off" not in cell_name:
            for goal, met, detail in goals(runs[split_name], runs[cell_name], len(wl)):
                goal_rows.append([cell_name, goal, "met" if met else "**not met**", detail])
    if len(parallel) > 1:
        lo, hi = f"auto, {min(parallel)} slots", f"auto, {max(parallel)} slots"
        worse = []
        for k, label in FIGURES[:7]:  # tok/s: higher is better; the latencies: lower
            a, b = median_of(runs[hi], k), median_of(runs[lo], k)
            if a is not None and b is not None and ((a < b) if k == "tok_s" else (a > b)):
                worse.append(label)
        goal_rows.append([f"{hi} vs {lo}", "no worse on any figure", "met" if not worse else "**not met**",
                          "worse on: " + ", ".join(worse) if worse else "-"])

    headers = ["cell", "runs", "completed"] + [label for _, label in FIGURES]
    given = sys.argv[1:] if argv is None else argv
    cmd = "python bench/mixed.py" + "".join(" " + a for a in given)
    md = [f"Mixed load ({args.shape}) on {display_path(model)}: {len(wl)} requests, Poisson arrivals at {rate}/s, "
          f"log-normal lengths (prompts {min(n_prompt)}-{max(n_prompt)} tokens, median {statistics.median(n_prompt)}; "
          f"answers {min(wl.n_gen)}-{max(wl.n_gen)}, median {statistics.median(wl.n_gen)}); one pool of {ctx} cells; "
          f"the longest request needs {longest}. Workload: `{name}_workload.jsonl`. Medians over the runs, with their "
          f"ranges; the cells took turns. 2nd token: time from arrival to the second token; longest gap: the "
          f"longest wait between two tokens of any request.", ""] + md_table(headers, rows + sim_rows) + \
         ["", "The simulator against the live medians (simulated / live, and its error):", ""] + \
         md_table(["cell", "tok/s", "TTFT p50 s", "TTFT p99 s", "end-to-end p99 s"], err_rows) + \
         ["", "The goals (issue 39), on the medians:", ""] + md_table(["cell", "goal", "", "figures"], goal_rows) + \
         ["", f"Simulated with costs calibrated against the live server (its fitted step cost): {asdict(costs)}.", "",
          f"Command: `{cmd}`."]
    write_results(name, {"workload": {"n": len(wl), "rate": rate, "ctx": ctx, "shape": args.shape},
                         "runs": runs, "simulated": sims, "costs": asdict(costs)}, md)
    console.print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
