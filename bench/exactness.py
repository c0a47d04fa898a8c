#!/usr/bin/env python3
"""Exactness: is an answer interrupted by parks the same as the uninterrupted one?

One request at a time, temperature 0. For each model: the stock path (--no-preempt) is the
reference; the unforced path with preemption on must be byte-identical to it; then forced parks
every N generated tokens (LLAMA_SERVER_PREEMPT_EVERY=N) by SWAP (default budget) and by RECOMPUTE
(--preempt-ram 0): number of parks, identical yes/no, first divergence (character and token) and
the park nearest before it. Results go to bench/results/exactness.{json,md}.

    python bench/exactness.py                       # stories260K and SmolLM2-135M, N in 8, 64, 200
    python bench/exactness.py --models stories --n-predict 400
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from llama_preempt.exactness import first_difference
from llama_preempt.server import LlamaServer, ServerConfig
from results_io import RESULTS, display_path, smollm2_model, stories_model  # bench/ is on sys.path when run as a script



@dataclass
class Row:
    model: str
    path: str            # stock | unforced | swap | recompute
    every: int | None    # forced park interval in generated tokens
    parks: int
    swaps: int
    recomputes: int
    chars: int
    identical: bool
    first_divergence_char: int | None
    first_divergence_token: int | None
    nearest_park_token: int | None


def run_one(model: Path, prompt: str, n_predict: int, n_ctx: int, extra: list[str],
            env: dict[str, str], preempt: bool) -> tuple[dict[str, Any], dict[str, float]]:
    cfg = ServerConfig(model=model, n_ctx=n_ctx, n_parallel=2, kv_unified=True, preempt=preempt,
                       extra_args=extra, env=env, seed=1234)
    with LlamaServer(cfg) as srv:
        r = srv.post("/completion", {"prompt": prompt, "n_predict": n_predict, "temperature": 0,
                                     "ignore_eos": True, "n_probs": 1, "cache_prompt": False}, timeout=3600)
        r.raise_for_status()
        m = srv.metrics()
        return r.json(), {k: m.get(k) for k in ("n_preempt_total", "n_preempt_swap_total",
                                                "n_preempt_recompute_total")}


def token_offsets(answer: dict[str, Any]) -> list[int]:
    """Character offset where each generated token starts."""
    offs, pos = [], 0
    for p in answer.get("completion_probabilities", []):
        offs.append(pos)
        pos += len(p.get("token", ""))
    return offs


def bench_model(name: str, model: Path, prompt: str, args: argparse.Namespace, console: Console) -> list[Row]:
    rows: list[Row] = []
    with console.status(f"{name}: stock"):
        ref, _ = run_one(model, prompt, args.n_predict, args.n_ctx, [], {}, preempt=False)
    ref_text = ref["content"]
    offs = token_offsets(ref)
    rows.append(Row(name, "stock", None, 0, 0, 0, len(ref_text), True, None, None, None))

    plans: list[tuple[str, int | None, list[str]]] = [("unforced", None, [])]
    for every in args.every:
        plans += [("swap", every, []), ("recompute", every, ["--preempt-ram", "0"])]
    for path, every, extra in plans:
        env = {"LLAMA_SERVER_PREEMPT_EVERY": str(every)} if every else {}
        with console.status(f"{name}: {path} every {every}"):
            got, m = run_one(model, prompt, args.n_predict, args.n_ctx, extra, env, preempt=True)
        text = got["content"]
        div = first_difference(ref_text, text)  # by character
        tok = None
        park = None
        if div is not None:
            tok = max((i for i, o in enumerate(offs) if o <= div), default=0)
            if every:
                park = (tok // every) * every if tok >= every else None
        rows.append(Row(name, path, every, int(m["n_preempt_total"]), int(m["n_preempt_swap_total"]),
                        int(m["n_preempt_recompute_total"]), len(text), div is None, div, tok, park))
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="stories,smollm2", help="comma list of stories,smollm2")
    ap.add_argument("--n-predict", type=int, default=600)
    ap.add_argument("--n-ctx", type=int, default=2048)
    ap.add_argument("--every", type=int, nargs="+", default=[8, 64, 200])
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)

    console = Console()
    rows: list[Row] = []
    for name in args.models.split(","):
        if name == "stories":
            rows += bench_model("stories260K", stories_model(), "Once upon a time", args, console)
        elif name == "smollm2":
            prompt = ("<|im_start|>user\nWrite a long story about a lighthouse keeper and a storm.<|im_end|>\n"
                      "<|im_start|>assistant\n")
            rows += bench_model("SmolLM2-135M", smollm2_model(), prompt, args, console)
        else:
            ap.error(f"--models: unknown model {name!r} (stories, smollm2)")

    table = Table(title=f"exactness: {args.n_predict} tokens at temperature 0, one request at a time")
    for col in ("model", "path", "park every", "parks", "chars", "identical", "first divergence", "nearest park before it"):
        table.add_column(col)

    def div_str(r: Row) -> str:
        return "-" if r.first_divergence_char is None else f"char {r.first_divergence_char} (token {r.first_divergence_token})"

    for r in rows:
        table.add_row(r.model, r.path, str(r.every or "-"), str(r.parks), str(r.chars), "yes" if r.identical else "no",
                      div_str(r), "-" if r.nearest_park_token is None else f"token {r.nearest_park_token}")
    console.print(table)

    args.out.mkdir(parents=True, exist_ok=True)
    cmd = "python bench/exactness.py " + " ".join(argv if argv is not None else sys.argv[1:])
    when = time.strftime("%Y-%m-%d %H:%M:%S")
    (args.out / "exactness.json").write_text(json.dumps(
        {"command": cmd.strip(), "when": when, "config": {k: (display_path(v) if isinstance(v, Path) else v)
                                                           for k, v in vars(args).items()},
         "rows": [asdict(r) for r in rows]}, indent=2) + "\n")
    lines = [f"# exactness ({when})", "", f"`{cmd.strip()}`", "",
             "| model | path | park every | parks | chars | identical | first divergence | nearest park before it |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r.model} | {r.path} | {r.every or '-'} | {r.parks} | {r.chars} | "
                     f"{'yes' if r.identical else 'no'} | {div_str(r)} | "
                     f"{'-' if r.nearest_park_token is None else f'token {r.nearest_park_token}'} |")
    (args.out / "exactness.md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
