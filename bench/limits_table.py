"""Issue 41's table, tried again on this build as an operator would (SmolLM2, the flags the docs
recommend for a chat server that keeps its prompt cache):

    python bench/limits_table.py

Rows (each printed with what it found, and saved to bench/results/limits_table.{json,md}):
- the kept cache after four short runs with --cache-persist, against the disk limit in force;
- a 416-token conversation with --cache-ram 1 --preempt-ram 1, pushed out by other traffic, asked
  again, then again after a restart: its prompt_n each time;
- {"prompt": "Hi", "n_predict": 2, "n_probs": 100000000}: the status and the body's size;
- logit_bias with token id 999999999: the status and the message;
- SIGTERM while 10 streams run and 2 wait in the queue: how soon the 2 are answered, and how;
- the log and `llama-preempt stats` with --host-kv-ram 16: the budget figures they show.
"""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import requests

from llama_preempt.server import LlamaServer, ServerConfig
from results_io import display_path, md_table, smollm2_model, write_results

WORDS = "river stone lamp garden window ladder orchard kettle meadow candle harbor violin".split()


def text(seed: int, n_words: int) -> str:
    return " ".join(f"{WORDS[(seed + i * 5) % len(WORDS)]}{(seed * 7 + i) % 53}" for i in range(n_words))


def ask(url: str, prompt: str, **extra: Any) -> requests.Response:
    return requests.post(url + "/completion", json={"prompt": prompt, "n_predict": 8, "temperature": 0, "cache_prompt": True,
                                                    **extra}, timeout=600)


def kept_mib(d: Path) -> float:
    return sum(f.stat().st_size for f in d.glob("llama-preempt-cache-*/*.kv")) / 2**20


def chat_server(model: Path, d: Path, extra: list[str] | None = None) -> LlamaServer:
    args = ["--preempt-disk", str(d), "--host-kv-ram", "16", "--cache-persist"] + (extra or [])
    return LlamaServer(ServerConfig(model=model, n_ctx=1024, n_parallel=8, extra_args=args))


def row_kept_cache(model: Path) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        sizes = []
        for run in range(4):
            with chat_server(model, d) as srv:
                limit = srv.get("/props").json()["llama_preempt"]["preempt_disk_mib"]
                for i in range(30):
                    ask(srv.url, text(100 * run + i, 300))
            sizes.append(round(kept_mib(d), 1))
    return {"kept_mib_after_each_run": sizes, "limit_mib": limit}


def row_large_prompt(model: Path) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        extra = ["--cache-ram", "1", "--preempt-ram", "1"]
        convo = text(7, 330)
        got = []
        with LlamaServer(ServerConfig(model=model, n_ctx=1024, n_parallel=2,
                                      extra_args=["--preempt-disk", str(d), "--cache-persist"] + extra)) as srv:
            got.append(ask(srv.url, convo).json()["timings"]["prompt_n"])
            for i in range(4):
                ask(srv.url, text(50 + i, 300))
            got.append(ask(srv.url, convo).json()["timings"]["prompt_n"])
        with LlamaServer(ServerConfig(model=model, n_ctx=1024, n_parallel=2,
                                      extra_args=["--preempt-disk", str(d), "--cache-persist"] + extra)) as srv:
            got.append(ask(srv.url, convo).json()["timings"]["prompt_n"])
    return {"prompt_n": got}


def row_n_probs_and_logit_bias(model: Path) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp, chat_server(model, Path(tmp)) as srv:
        r = requests.post(srv.url + "/completion", json={"prompt": "Hi", "n_predict": 2, "n_probs": 100000000}, timeout=600)
        b = requests.post(srv.url + "/completion", json={"prompt": "Hi", "n_predict": 2, "logit_bias": [[999999999, 1]]},
                          timeout=600)
        return {"n_probs": {"status": r.status_code, "bytes": len(r.content), "message": r.json().get("error", {}).get("message")},
                "logit_bias": {"status": b.status_code, "message": b.json().get("error", {}).get("message")}}


def row_drain(model: Path) -> dict[str, Any]:
    cfg = ServerConfig(model=model, n_ctx=4096, n_parallel=10, extra_args=["--drain-timeout", "120"])
    with LlamaServer(cfg) as srv:
        ends: dict[int, tuple[float, int, str | None, bool]] = {}

        def stream(i: int) -> None:
            with requests.post(srv.url + "/completion", json={"prompt": text(i, 20), "n_predict": 200, "stream": True,
                                                              "ignore_eos": True}, stream=True, timeout=600) as r:
                whole = False
                for raw in r.iter_lines():
                    line = raw.decode()
                    if line.startswith("data: ") and '"stop":true' in line.replace(" ", "") and '"error"' not in line:
                        whole = True  # its last event: the answer ended by its own stop, not by the drain
                ends[i] = (time.monotonic(), r.status_code, r.headers.get("Retry-After"), whole)

        threads = [threading.Thread(target=stream, args=(i,), daemon=True) for i in range(12)]
        for t in threads[:10]:
            t.start()
        while sum(s["is_processing"] for s in srv.slots()) < 10:
            time.sleep(0.01)
        for t in threads[10:]:
            t.start()
        while srv.metrics()["requests_deferred"] < 2:
            time.sleep(0.01)
        t0 = time.monotonic()
        srv.proc.send_signal(signal.SIGTERM)
        for t in threads:
            t.join(120)
        srv.proc.wait(timeout=60)
    queued = [ends[i] for i in (10, 11)]
    running = [ends[i] for i in range(10)]
    return {"queued": [{"after_s": round(e[0] - t0, 2), "status": e[1], "retry_after": e[2]} for e in queued],
            "running_done_after_s": round(max(e[0] for e in running) - t0, 2),
            "running_status": sorted({e[1] for e in running}), "running_whole": sum(e[3] for e in running)}


def row_budget_views(model: Path) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp, chat_server(model, Path(tmp)) as srv:
        log = [line.split("preemption: ", 1)[1][:140] for line in srv.log_text().splitlines()
               if "MiB of host RAM" in line or "one host budget" in line]
        p = subprocess.run([sys.executable, "-m", "llama_preempt.cli", "stats", srv.url, "--once"], capture_output=True,
                           text=True, timeout=60, env={"COLUMNS": "160", "PATH": ""})
        rows = [" ".join(line.replace("│", " ").split()) for line in p.stdout.splitlines() if "MiB" in line and "/" in line]
    return {"log": log, "stats": rows}


def main() -> None:
    model = smollm2_model()
    out: dict[str, Any] = {"model": display_path(model)}
    for name, fn in (("kept cache", row_kept_cache), ("large prompt", row_large_prompt),
                     ("n_probs, logit_bias", row_n_probs_and_logit_bias), ("drain", row_drain),
                     ("budget views", row_budget_views)):
        out[name] = fn(model)
        print(f"{name}: {json.dumps(out[name])}")
    kc, lp, nl, dr = out["kept cache"], out["large prompt"], out["n_probs, logit_bias"], out["drain"]
    rows = [
        ["four runs with --cache-persist", f"kept {kc['kept_mib_after_each_run']} MiB, limit {kc['limit_mib']} MiB"],
        ["416-token conversation, --cache-ram 1 --preempt-ram 1: prompt_n first / again / after restart", str(lp["prompt_n"])],
        ["n_probs 100000000", f"{nl['n_probs']['status']}, {nl['n_probs']['bytes']} bytes: {nl['n_probs']['message']}"],
        ["logit_bias id 999999999", f"{nl['logit_bias']['status']}: {nl['logit_bias']['message']}"],
        ["SIGTERM, 10 streams + 2 queued", f"queued: {dr['queued']}; running: {dr['running_whole']} of 10 whole answers "
                                           f"after {dr['running_done_after_s']} s, status {dr['running_status']}"],
        ["--host-kv-ram 16: log / stats", "; ".join(out["budget views"]["log"] + out["budget views"]["stats"])],
    ]
    table = md_table(["tried", "got"], rows)
    print("\n".join(table))
    write_results("limits_table", out, table)


if __name__ == "__main__":
    main()
