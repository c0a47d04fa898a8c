"""The compressed host tier (--preempt-compress q8_0, issue 52) against a plain RAM park.

    python bench/compressed_tier.py            # SmolLM2-135M-Instruct Q4_1 (f16 cells), about a minute

One request alone on a server (a prompt of about --words words, then --n-predict tokens, greedy) is
parked through the slot API once it generates and unparked at once; its answer is compared token
for token with the same request unparked on a server of its own (the same batches). Two setups:
- ram:    --preempt-mode swap with RAM to spare: a plain host copy, byte-exact;
- ram_q8: --preempt-mode swap --preempt-compress q8_0 with --preempt-ram below the state's size,
          so only the packed copy fits.
For each: the state's bytes and what host RAM held while parked (/slots), the park, pack, unpack
and restore times from the server's log, and where the answer first differs from the unparked one.
"""
from __future__ import annotations

import argparse
import re
import statistics
import threading
import time
from pathlib import Path
from typing import Any

from llama_preempt.server import LlamaServer, ServerConfig
from results_io import display_path, md_table, smollm2_model, write_results

WORDS = ("the quick brown fox jumps over a lazy dog while seven tired sailors sing about distant harbours and "
         "the river keeps its slow course through fields of barley").split()


def prompt_of(n_words: int) -> str:
    return "Summarize this: " + " ".join(WORDS[(i * 7) % len(WORDS)] for i in range(n_words))


def ask(srv: LlamaServer, prompt: str, n_predict: int) -> dict[str, Any]:
    r = srv.post("/completion", {"prompt": prompt, "n_predict": n_predict, "temperature": 0, "ignore_eos": True,
                                 "cache_prompt": False, "return_tokens": True})
    r.raise_for_status()
    return r.json()


def wait_for(pred: Any, timeout: float = 120) -> Any:
    t_end = time.monotonic() + timeout
    while time.monotonic() < t_end:
        got = pred()
        if got:
            return got
        time.sleep(0.005)
    raise TimeoutError("the request never started generating")


def ms_in(log: str, pattern: str) -> float | None:
    m = re.findall(pattern, log)
    return float(m[-1]) if m else None


def parked_run(srv: LlamaServer, prompt: str, n_predict: int) -> dict[str, Any]:
    got: dict[str, Any] = {}
    t = threading.Thread(target=lambda: got.update(ask(srv, prompt, n_predict)))
    t.start()
    sid = wait_for(lambda: next((s for s in srv.slots() if s["state"] == "generating"), None))["id"]
    park = srv.post(f"/slots/{sid}?action=park", {})
    park.raise_for_status()
    slot = next(s for s in srv.slots() if s["id"] == sid)
    srv.post(f"/slots/{sid}?action=unpark", {}).raise_for_status()
    t.join(300)
    log = srv.log_text()
    return {"answer": got, "tier": slot["preempt_tier"], "held_bytes": slot["preempt_ram_bytes"],
            "state_mib": ms_in(log, r"parked by swap(?: to ram_q8)? \(([\d.]+) MiB"),
            "park_ms": ms_in(log, r"parked by swap(?: to ram_q8)? \([^)]*\) in ([\d.]+) ms"),
            "pack_ms": ms_in(log, r"packed to q8_0: [\d.]+ MiB of state held in [\d.]+ MiB in ([\d.]+) ms"),
            "restore_ms": ms_in(log, r"restored by swap \([^)]*\) in ([\d.]+) ms")}


def first_difference(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument("--words", type=int, default=1500)
    ap.add_argument("--n-predict", type=int, default=96)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--name", default="compressed_tier")
    args = ap.parse_args()
    model = smollm2_model(args.model)
    prompt = prompt_of(args.words)

    def server(**kw: Any) -> LlamaServer:
        return LlamaServer(ServerConfig(model, n_ctx=4096, n_parallel=2, n_batch=512, **kw)).start()

    ref_srv = server(preempt=False)
    try:
        ref = ask(ref_srv, prompt, args.n_predict)
    finally:
        ref_srv.stop()
    n_prompt = ref["timings"]["prompt_n"]
    # f16 cells: 30 layers x K and V x 192 values x 2 bytes per token
    state_mib = n_prompt * 30 * 2 * 192 * 2 / 2**20
    setups = {
        "ram": dict(preempt_mode="swap"),
        "ram_q8": dict(preempt_mode="swap", preempt_ram_mib=max(1, int(state_mib * 0.75)),
                       extra_args=["--preempt-compress", "q8_0"]),
    }
    rows: list[list[Any]] = []
    record: dict[str, Any] = {"model": display_path(model), "prompt_tokens": n_prompt, "n_predict": args.n_predict,
                              "runs": args.runs, "setups": {}}
    for name, kw in setups.items():
        runs = []
        for _ in range(args.runs):
            srv = server(**kw)  # a fresh server a run: the same batches and cells as the reference
            try:
                r = parked_run(srv, prompt, args.n_predict)
            finally:
                srv.stop()
            r["first_difference"] = first_difference(ref["tokens"], r["answer"]["tokens"])
            r.pop("answer")
            runs.append(r)
        record["setups"][name] = {"flags": kw, "runs": runs}

        def med(key: str) -> str:
            xs = [r[key] for r in runs if r[key] is not None]
            return f"{statistics.median(xs):.2f}" if xs else "-"

        diffs = [r["first_difference"] for r in runs]
        rows.append([name, ", ".join(sorted({r["tier"] for r in runs})), med("state_mib"),
                     f"{statistics.median(r['held_bytes'] for r in runs) / 2**20:.2f}", med("park_ms"), med("pack_ms"),
                     med("restore_ms"),
                     ", ".join("same" if d is None else f"token {d}" for d in diffs)])
    md = [f"# The compressed host tier against a plain RAM park ({display_path(model)})", "",
          f"`python bench/compressed_tier.py --words {args.words} --n-predict {args.n_predict} --runs {args.runs}`: "
          f"one request of {n_prompt} prompt tokens parked through the API while it generates, alone on a fresh "
          f"server each run; medians of {args.runs} runs. 'first difference' compares the answer's tokens with the "
          "same request unparked.", "",
          *md_table(["setup", "tier", "state MiB", "held MiB", "park ms", "pack ms", "restore ms (unpack incl.)",
                     "first difference"], rows)]
    print("\n".join(md))
    write_results(args.name, record, md)


if __name__ == "__main__":
    main()
