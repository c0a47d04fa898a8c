#!/usr/bin/env python3
"""--deterministic: is a request's answer the one it gives alone, whatever runs beside it and however
it is parked? And what does the flag cost?

Exactness matrix: for each model, the same settings with and without --deterministic. The reference
is each request run alone on an idle server (`-c 4096 -np 4`, unified pool, no prompt cache); every
row runs it again another way and compares the generated token ids (temperature 0, unless the row
says it samples with a fixed seed): identical, or the first token that differs.

Cost, side by side in the same run: decode tok/s of one request and of 4 concurrent ones, prefill
tok/s of a long prompt, and the overloaded bench cells (RECOMPUTE and auto, bench/cells.py).
Results: bench/results/deterministic.{json,md}.

    python bench/deterministic.py                    # stories260K, SmolLM2-135M, the hybrid MTP model
    python bench/deterministic.py --models smollm2 --no-cost
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from rich.console import Console
from rich.table import Table

from llama_preempt.binary import server_binary
from llama_preempt.engine import Engine
from llama_preempt.exactness import Ask, first_difference, one_at_a_time, staggered, together
from llama_preempt.server import LlamaServer, ServerConfig

import cells  # bench/ is on sys.path when run as a script
from results_io import RESULTS, ROOT, display_path, md_table, smollm2_model, stories_model, write_results

SHARED_MTP = ROOT.parent / "shared" / "models" / "tiny-qwen35-mtp.gguf"

TARGET = "Once upon a time, in a small village by the sea, there lived"
NEIGHBOURS = ["The quick brown fox jumps over the lazy dog and then",
              "Tell me a story about a dragon who",
              "In the year 3000, humans had finally"]
LATECOMER = "Lily and Ben went to the park"


@dataclass
class ModelSpec:
    name: str
    path: Path
    n_predict: int
    args: tuple[str, ...] = ()          # every server of this model gets them

    @property
    def overload_ctx(self) -> int:
        """A pool one answer fits alone and four overflow together (llama.cpp pads it to 256)."""
        return 256 * -(-(2 * self.n_predict + 64) // 256)


@dataclass
class Row:
    model: str
    case: str
    flag: bool
    compared: int                        # answers compared with their alone run
    identical: int
    first_differences: list[int | None] = field(default_factory=list)

    def cell(self) -> str:
        if self.identical == self.compared:
            return "identical" if self.compared == 1 else f"{self.identical}/{self.compared} identical"
        diffs = [d for d in self.first_differences if d is not None]
        at = f"differs at token {min(diffs)}"
        return at if self.compared == 1 else f"{self.identical}/{self.compared} identical ({at})"


def asks(spec: ModelSpec) -> tuple[Ask, list[Ask]]:
    n = spec.n_predict
    target = Ask(TARGET, n)
    neighbours = [Ask(NEIGHBOURS[0], max(8, n // 4)), Ask(NEIGHBOURS[1], n + n // 4), Ask(NEIGHBOURS[2], n // 2)]
    return target, neighbours


def server(spec: ModelSpec, flag: bool, *, n_ctx: int = 4096, n_parallel: int = 4, unified: bool = True,
           extra: tuple[str, ...] = (), env: dict[str, str] | None = None) -> LlamaServer:
    no_cache = [] if "--cache-ram" in extra else ["--cache-ram", "0"]  # a row may set its own
    args = list(spec.args) + no_cache + list(extra) + (["--deterministic"] if flag else [])
    return LlamaServer(ServerConfig(model=spec.path, n_ctx=n_ctx, n_parallel=n_parallel, kv_unified=unified,
                                    extra_args=args, env=env or {}, seed=1234, threads=2))


def exactness(spec: ModelSpec, flag: bool, console: Console) -> list[Row]:
    target, neighbours = asks(spec)
    sampled = Ask(TARGET, spec.n_predict, temperature=0.8, seed=7)
    overload = [Ask(p, spec.n_predict) for p in [TARGET] + NEIGHBOURS]
    with console.status(f"{spec.name}, flag {'on' if flag else 'off'}: references (one at a time)"):
        with server(spec, flag) as srv:
            ref: dict[Ask, list[int]] = {a: ids for a, ids in zip([target, sampled, *neighbours, *overload],
                                                                    one_at_a_time(srv, [target, sampled, *neighbours, *overload]))}

    rows: list[Row] = []

    def row(case: str, got: list[tuple[Ask, list[int]]]) -> None:
        diffs = [first_difference(ref[a], ids) for a, ids in got]
        rows.append(Row(spec.name, case, flag, len(got), sum(d is None for d in diffs), diffs))
        console.print(f"  {spec.name} [{'on' if flag else 'off'}] {case}: {rows[-1].cell()}")

    def run(case: str, fn: Callable[[], list[tuple[Ask, list[int]]]]) -> None:
        with console.status(f"{spec.name}, flag {'on' if flag else 'off'}: {case}"):
            row(case, fn())

    # staggered: a long one, the target while it decodes, a short one that ends at once, then two more: the
    # last takes the short one's slot and frees its cells, which the running ones fill out of position order
    late = [neighbours[1], None, Ask(NEIGHBOURS[0], 8), neighbours[2], Ask(LATECOMER, spec.n_predict // 2)]

    def beside(srv: LlamaServer, first: Ask, how: Callable[..., list[list[int]]]) -> list[tuple[Ask, list[int]]]:
        order = [first, *neighbours] if how is together else [first if a is None else a for a in late]
        ids = how(srv, order)
        return [(first, ids[order.index(first)])]

    def on(extra: tuple[str, ...] = (), env: dict[str, str] | None = None, **kw: Any) -> LlamaServer:
        return server(spec, flag, extra=extra, env=env, **kw)

    def beside_together() -> list[tuple[Ask, list[int]]]:
        with on() as srv:
            return beside(srv, target, together)

    def beside_staggered() -> list[tuple[Ask, list[int]]]:
        with on() as srv:
            return beside(srv, target, staggered)

    def sampled_beside() -> list[tuple[Ask, list[int]]]:
        with on() as srv:
            return beside(srv, sampled, together)

    def forced(mode: str, every: int) -> Callable[[], list[tuple[Ask, list[int]]]]:
        def go() -> list[tuple[Ask, list[int]]]:
            with on(("--preempt-mode", mode), {"LLAMA_SERVER_PREEMPT_EVERY": str(every)}) as srv:
                return [(target, one_at_a_time(srv, [target])[0])]
        return go

    def overloaded(mode: str) -> Callable[[], list[tuple[Ask, list[int]]]]:
        def go() -> list[tuple[Ask, list[int]]]:
            with on(("--preempt-mode", mode), n_ctx=spec.overload_ctx) as srv:
                ids = together(srv, overload)
                m = srv.metrics()
                if not m.get("n_preempt_total"):
                    console.print(f"  [yellow]{spec.name}: the overloaded pool parked nothing[/]")
                return list(zip(overload, ids))
        return go

    def small_batches() -> list[tuple[Ask, list[int]]]:
        with on(("-ub", "7")) as srv:
            return beside(srv, target, together)

    def split_pool() -> list[tuple[Ask, list[int]]]:
        with on(unified=False) as srv:
            return beside(srv, target, together)

    def one_thread() -> list[tuple[Ask, list[int]]]:
        with on(("-t", "1", "-tb", "1")) as srv:
            return beside(srv, target, together)

    def cache_hit() -> list[tuple[Ask, list[int]]]:
        cached = Ask(TARGET, spec.n_predict, cache_prompt=True)
        with on() as srv:
            one_at_a_time(srv, [Ask(TARGET + " a baker", 16, cache_prompt=True)])  # leaves the shared prefix cached
            ids = one_at_a_time(srv, [cached])[0]
            ref[cached] = ref[target]
            return [(cached, ids)]

    def host_cache() -> list[tuple[Ask, list[int]]]:
        cached = Ask(TARGET, spec.n_predict, cache_prompt=True)
        ref[cached] = ref[target]
        with on(("--cache-ram", "256", "--no-preempt"), n_parallel=1) as srv:
            first = one_at_a_time(srv, [cached])[0]
            one_at_a_time(srv, [Ask(NEIGHBOURS[1], 16, cache_prompt=True)])  # the slot's state goes to host RAM
            again = one_at_a_time(srv, [cached])[0]                         # and comes back from it
            return [(cached, first), (cached, again)]

    def engine_together() -> list[tuple[Ask, list[int]]]:
        argv = list(spec.args) + ["--cache-ram", "0", "--log-disable"]
        with Engine(spec.path, argv, n_ctx=4096, n_parallel=4, kv_unified=True, seed=1234, n_threads=2,
                    deterministic=flag) as eng:
            reqs = [eng.submit(path="/completion", body=a.body()) for a in [target, *neighbours]]
            return [(target, [int(t) for t in reqs[0].completion().response["tokens"]])]

    run("beside 3 others, started together", beside_together)
    run("staggered, a slot reused mid-run (cells out of order)", beside_staggered)
    run("sampled (temperature 0.8, seed 7), beside 3 others", sampled_beside)
    for every in (8, 40):
        run(f"RECOMPUTE park every {every} tokens", forced("recompute", every))
    run("SWAP park every 40 tokens", forced("swap", 40))
    run(f"overloaded pool ({spec.overload_ctx} cells), auto: all 4 answers", overloaded("auto"))
    run(f"overloaded pool ({spec.overload_ctx} cells), RECOMPUTE: all 4 answers", overloaded("recompute"))
    run("-ub 7 (not 512), beside 3 others", small_batches)
    run("split pool (--no-kv-unified), beside 3 others", split_pool)
    run("one thread (-t 1), beside 3 others", one_thread)
    run("prompt cache hit (cache_prompt, shared prefix)", cache_hit)
    run("host prompt cache (--cache-ram, -np 1): miss, then restored", host_cache)
    run("in-process Engine, beside 3 others", engine_together)
    return rows


# --- cost ---


def median_of(n: int, fn: Callable[[], float]) -> float:
    return round(statistics.median(fn() for _ in range(n)), 1)


def cost(spec: ModelSpec, flag: bool, repeats: int, console: Console) -> dict[str, Any]:
    out: dict[str, Any] = {"model": spec.name, "flag": flag}
    long_prompt = " ".join(["the river ran past the old mill and the children played by the water"] * 30)
    with console.status(f"{spec.name}, flag {'on' if flag else 'off'}: decode and prefill"):
        with server(spec, flag) as srv:
            def decode_one() -> float:
                r = srv.post("/completion", {**Ask(TARGET, 128).body()}, timeout=600).json()
                return float(r["timings"]["predicted_per_second"])

            def decode_four() -> float:
                t0 = time.perf_counter()
                ids = together(srv, [Ask(TARGET, 128), *[Ask(p, 128) for p in NEIGHBOURS]])
                return sum(len(x) for x in ids) / (time.perf_counter() - t0)

            def prefill() -> float:
                r = srv.post("/completion", {"prompt": long_prompt, "n_predict": 1, "cache_prompt": False},
                             timeout=600).json()
                return float(r["timings"]["prompt_per_second"])

            decode_one()  # warm
            out["decode_1_tok_s"] = median_of(repeats, decode_one)
            out["decode_4_tok_s"] = median_of(repeats, decode_four)
            out["prefill_tok_s"] = median_of(repeats, prefill)
            out["prefill_tokens"] = len(srv.post("/tokenize", {"content": long_prompt}).json()["tokens"])
    load = cells.Load(model=spec.path, n_chats=4, prompt_words=200, n_predict=min(spec.n_predict, 200),
                      pools=(1024, 1024), ample=4096, split_slot=512, tight_mib=1, threads=2,
                      server_args=tuple(spec.args) + (("--deterministic",) if flag else ()))
    for name, args in (("recompute", ("--preempt-mode", "recompute")), ("auto", ())):
        cell = cells.Cell(f"1024: {name}", 1024, "ours", 4, True, args)
        with console.status(f"{spec.name}, flag {'on' if flag else 'off'}: overloaded cell {cell.name}"):
            runs = [cells.run_cell(cell, load, {"ours": server_binary()}, i) for i in range(repeats)]
        out[f"cell_{name}_tok_s"] = round(statistics.median(r.tok_s for r in runs), 1)
        out[f"cell_{name}_wall_s"] = round(statistics.median(r.wall_s for r in runs), 2)
        out[f"cell_{name}_completed"] = min(r.completed for r in runs)
        out[f"cell_{name}_parks"] = int(statistics.median(r.parks_swap + r.parks_recompute for r in runs))
    return out


def ratio(on: float, off: float) -> str:
    return f"{on / off:.2f}x" if off else "-"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="stories,smollm2,mtp", help="comma list of stories,smollm2,mtp")
    ap.add_argument("--n-predict", type=int, default=400)
    ap.add_argument("--repeats", type=int, default=3, help="runs of each cost figure (the median is kept)")
    ap.add_argument("--no-cost", action="store_true", help="only the exactness matrix")
    ap.add_argument("--no-exactness", action="store_true", help="only the cost")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)

    specs: list[ModelSpec] = []
    for name in args.models.split(","):
        if name == "stories":
            specs.append(ModelSpec("stories260K", stories_model(), args.n_predict))
        elif name == "smollm2":
            specs.append(ModelSpec("SmolLM2-135M Q4_1", smollm2_model(), args.n_predict))
        elif name == "mtp":
            if not SHARED_MTP.is_file():
                print(f"deterministic: skipping the hybrid MTP model: no {display_path(SHARED_MTP)}")
                continue
            specs.append(ModelSpec("tiny Qwen3.5 hybrid + MTP", SHARED_MTP, args.n_predict,
                                   ("--spec-type", "draft-mtp", "--spec-draft-n-max", "2")))
        else:
            ap.error(f"--models: unknown model {name!r} (stories, smollm2, mtp)")

    console = Console()
    rows: list[Row] = []
    costs: list[dict[str, Any]] = []
    for spec in specs:
        for flag in (False, True) if not args.no_exactness else ():
            rows += exactness(spec, flag, console)
    if not args.no_cost:
        for spec in specs:
            if spec.name.startswith("tiny Qwen"):
                continue  # random weights: its speed says nothing
            for flag in (False, True):
                costs.append(cost(spec, flag, args.repeats, console))

    table = Table(title=f"exactness: {args.n_predict} generated tokens compared with the same request alone")
    for col in ("model", "case", "default", "--deterministic"):
        table.add_column(col)
    matrix: list[list[Any]] = []
    for spec in specs:
        for case in dict.fromkeys(r.case for r in rows if r.model == spec.name):
            off = next(r for r in rows if r.model == spec.name and r.case == case and not r.flag)
            on = next(r for r in rows if r.model == spec.name and r.case == case and r.flag)
            matrix.append([spec.name, case, off.cell(), on.cell()])
            table.add_row(*matrix[-1])
    console.print(table)

    cost_rows: list[list[Any]] = []
    keys = [("decode_1_tok_s", "decode tok/s, 1 request"), ("decode_4_tok_s", "decode tok/s, 4 concurrent"),
            ("prefill_tok_s", "prefill tok/s"), ("cell_recompute_tok_s", "overloaded cell, RECOMPUTE: tok/s"),
            ("cell_recompute_wall_s", "overloaded cell, RECOMPUTE: wall s"),
            ("cell_auto_tok_s", "overloaded cell, auto: tok/s"), ("cell_auto_wall_s", "overloaded cell, auto: wall s")]
    if costs:
        ct = Table(title="cost: --deterministic against the default, same run")
        for col in ("model", "figure", "default", "--deterministic", "ratio"):
            ct.add_column(col)
        for spec in specs:
            off = next((c for c in costs if c["model"] == spec.name and not c["flag"]), None)
            on = next((c for c in costs if c["model"] == spec.name and c["flag"]), None)
            if off is None or on is None:
                continue
            for key, label in keys:
                cost_rows.append([spec.name, label, off[key], on[key], ratio(on[key], off[key])])
                ct.add_row(*[str(x) for x in cost_rows[-1]])
        console.print(ct)

    cmd = "python bench/deterministic.py " + " ".join(argv if argv is not None else sys.argv[1:])
    md = [f"# --deterministic: exactness and cost", "", f"`{cmd.strip()}`, {time.strftime('%Y-%m-%d')}.", "",
          f"Each row: the generated token ids ({args.n_predict} tokens, temperature 0 unless sampled) against the "
          "same request run alone on an idle `-c 4096 -np 4` unified pool, without and with the flag.", ""]
    md += md_table(["model", "case", "default", "--deterministic"], matrix)
    if cost_rows:
        md += ["", "## Cost (medians of %d runs; overloaded cells: 4 chats of 200-word prompts and 200-token answers, pool 1024)" % args.repeats, ""]
        md += md_table(["model", "figure", "default", "--deterministic", "on/off"], cost_rows)
    write_results("deterministic", {"command": cmd.strip(), "rows": [asdict(r) for r in rows], "cost": costs,
                                    "models": {s.name: display_path(s.path) for s in specs}}, md, args.out)
    console.print(f"wrote {display_path(args.out / 'deterministic.md')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
