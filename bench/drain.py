"""How long a drain takes, and what it does with the requests in flight.

    python bench/drain.py            # SmolLM2-135M-Instruct Q4_1, about a minute

Three cases on one server (-c 1024, 4 slots, a park every 8 tokens, so slots are parked and
resumed while it drains), each with 4 requests in flight (2 streamed, 2 not) when SIGTERM arrives:
- drain: --drain-timeout 120, the requests finish;
- timeout: the requests are kept parked (a test knob), --drain-timeout 2 runs out;
- second signal: kept parked, --drain-timeout 120, a second SIGTERM 1 s into the drain.
For each: seconds from the signal to the exit, the exit status, and the requests answered in full
or with an error.
"""
from __future__ import annotations

import argparse
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import requests

from llama_preempt.server import LlamaServer, ServerConfig
from cells import stream_chat
from results_io import display_path, md_table, smollm2_model, write_results

FORCED = {"LLAMA_SERVER_PREEMPT_EVERY": "8"}
HELD = {**FORCED, "LLAMA_SERVER_PREEMPT_HOLD_MS": "600000"}


def request(url: str, i: int, n: int, stream: bool, out: list[str]) -> None:
    prompt = f"Story {i}: once upon a time"
    if stream:  # the cells' streamed client: an error event, or the stream cut, is not a full answer
        res = stream_chat(url, prompt, n)
        out[i] = "full" if res.ok else "lost" if res.lost else f"error {res.error}"
        return
    try:
        r = requests.post(url + "/completion", json={"prompt": prompt, "n_predict": n, "temperature": 0,
                                                     "ignore_eos": True}, timeout=300)
        out[i] = "full" if r.status_code == 200 and r.json()["tokens_predicted"] == n else f"error {r.status_code}"
    except requests.RequestException as e:
        out[i] = f"lost ({e.__class__.__name__})"


def case(model: Path, name: str, drain: int, env: dict[str, str], second_after: float | None, n: int) -> dict[str, Any]:
    cfg = ServerConfig(model=model, n_ctx=1024, n_parallel=4, extra_args=["--drain-timeout", str(drain)], env=env)
    with LlamaServer(cfg) as srv:
        out = [""] * 4
        threads = [threading.Thread(target=request, args=(srv.url, i, n, i % 2 == 0, out)) for i in range(4)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 60
        while not (sum(s["is_processing"] for s in srv.slots()) == 4 and srv.metrics()["n_preempt_total"] >= 2):
            if time.monotonic() > deadline:
                raise SystemExit(f"{name}: the requests never ran")
            time.sleep(0.01)
        assert srv.proc is not None
        t0 = time.monotonic()
        srv.proc.send_signal(signal.SIGTERM)
        if second_after is not None:
            time.sleep(second_after)
            srv.proc.send_signal(signal.SIGTERM)
        rc = srv.proc.wait(timeout=300)
        exit_s = time.monotonic() - t0
        for t in threads:
            t.join(60)
    return {"case": name, "drain_timeout_s": drain, "exit_s": round(exit_s, 2), "rc": rc,
            "full": sum(o == "full" for o in out), "error": sum(o.startswith("error") for o in out),
            "lost": sum(o.startswith("lost") or not o for o in out)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument("--tokens", type=int, default=200)
    args = ap.parse_args(argv)
    model = smollm2_model(args.model)
    rows = [case(model, "drain", 120, FORCED, None, args.tokens),
            case(model, "timeout", 2, HELD, None, args.tokens),
            case(model, "second signal", 120, HELD, 1.0, args.tokens)]
    headers = ["case", "--drain-timeout s", "signal to exit s", "exit status", "answered in full", "ended with an error",
               "lost"]
    md = [f"The drain on {display_path(model)}, -c 1024, 4 slots, 4 requests of {args.tokens} tokens in flight "
          "(2 streamed), slots parked when SIGTERM came.", ""] + \
         md_table(headers, [[r["case"], r["drain_timeout_s"], r["exit_s"], r["rc"], r["full"], r["error"], r["lost"]]
                            for r in rows]) + ["", "Command: `python bench/drain.py`."]
    write_results("drain", {"cases": rows}, md)
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
