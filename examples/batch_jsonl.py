"""Answer every prompt of a JSONL file with the in-process Engine, with a progress bar, and write
one JSON line per answer (in input order). Each input line is {"prompt": "..."} or
{"messages": [...]}, with optional "max_tokens" and "temperature".

    python examples/batch_jsonl.py MODEL.gguf prompts.jsonl answers.jsonl --parallel 8
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from llama_preempt import Completion, Engine, SamplingParams


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("input", type=Path)
    ap.add_argument("output", type=Path)
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--parallel", type=int, default=4)
    args = ap.parse_args()

    rows = [json.loads(line) for line in args.input.read_text().splitlines() if line.strip()]
    prompts = [r["messages"] if "messages" in r else r["prompt"] for r in rows]
    params = [SamplingParams(max_tokens=r.get("max_tokens", 64), temperature=r.get("temperature", 0.0)) for r in rows]
    with Engine(args.model, n_ctx=args.ctx, n_parallel=args.parallel) as eng, \
            Progress(TextColumn("answering"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()) as bar:
        task = bar.add_task("answers", total=len(rows))
        outs = eng.generate(prompts, params, return_exceptions=True,
                            progress=lambda done, total, _rep: bar.update(task, completed=done))
        parks = eng.stats().n_preempt_total
    with args.output.open("w") as f:
        for row, out in zip(rows, outs):
            if isinstance(out, Completion):
                f.write(json.dumps({**row, "answer": out.text, "tokens": out.n_generated, "stop": out.stop}) + "\n")
            else:
                f.write(json.dumps({**row, "error": str(out)}) + "\n")
    print(f"{len(rows)} answers in {args.output} ({parks} parks)")


if __name__ == "__main__":
    main()
