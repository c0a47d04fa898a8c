"""The prompt cache's tiers on a multi-turn chat workload (issue 33).

    python bench/prompt_cache.py            # SmolLM2-135M-Instruct Q4_1, a few minutes

N users x M turns, taken round-robin (user 1 turn 1, user 2 turn 1, ..., user 1 turn 2, ...): each
turn resends the whole conversation (a long system prompt shared by all, then the user's turns and
the answers so far) and asks for a short answer. Between two turns of one user every other user
has a turn, so the RAM prompt cache must hold every conversation to reuse it; --cache-ram is set
so that it cannot. For each setup: the prompt tokens computed (timings.prompt_n) on returning turns,
the time to the first token per turn, and the server's peak resident memory above its resident
memory after loading, against the budget:
- ram:  upstream's RAM prompt cache alone (--cache-ram B);
- disk: one host budget (--host-kv-ram B) with the disk tier (--preempt-disk): prompts that leave
  RAM go to files and come back when their conversation does.

Beside each live run, the simulator's prediction (llama_preempt.simulate, csrc/sim/preempt-sim-cache.cpp)
of the same requests, one after another as sent: each request's prompt tokens as the server counted
them, its conversation, the prefix every user shares (the system prompt, tokenized by the server),
the warm-up prompt first, SmolLM2's bytes per cell and the default costs.
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import requests

from llama_preempt.server import LlamaServer, ServerConfig
from llama_preempt.simulator import Workload, simulate
from results_io import ask_cached, display_path, md_table, smollm2_model, write_results

WARM_WORDS = 2780  # the warm-up prompt's words (document(99, ...)): it fills most of the pool first

SYSTEM = ("You are a careful assistant for a small company. You answer questions about the company's products, "
          "shipping, returns and accounts, politely and briefly, and you never invent facts. ")


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


WORDS = ("invoice parcel courier refund warranty catalogue voucher account address delivery tracking ledger receipt "
         "discount shipment supplier warehouse checkout payment balance").split()


def document(user: int, n_words: int) -> str:
    """A user's own text (an order history pasted in), different for every user."""
    return " ".join(f"{WORDS[(user * 7 + i * (user + 3)) % len(WORDS)]}{(user * 131 + i) % 97}" for i in range(n_words)) + ". "


def ask(url: str, prompt: str) -> dict[str, Any]:
    return ask_cached(url, prompt, 24)


def after_restart(model: Path, extra: list[str], convo: list[str]) -> dict[str, Any]:
    """A new server with the same flags: every user's conversation sent again, its first turn after
    the restart (with --cache-persist its prompt comes back from the kept files)."""
    with LlamaServer(ServerConfig(model=model, n_ctx=8192, n_parallel=2, extra_args=extra)) as srv:
        got = [ask(srv.url, c) for c in convo]
        taken = [line for line in srv.log_text().splitlines() if "taken back" in line]
    return {"prompt_n": [d["timings"]["prompt_n"] for d in got], "ttft_ms": [d["timings"]["prompt_ms"] for d in got],
            "tokens": [d["tokens_evaluated"] for d in got], "log": taken}


def run(model: Path, name: str, extra: list[str], users: int, turns: int, system_words: int, doc_words: int) -> dict[str, Any]:
    cfg = ServerConfig(model=model, n_ctx=8192, n_parallel=2, extra_args=extra)
    with LlamaServer(cfg) as srv:
        pid = srv.proc.pid
        # the KV pool is host memory on a CPU, its pages touched as cells are first used: a prompt that
        # fills most of it first, so that what grows after is the caches, not the pool
        warm = requests.post(srv.url + "/completion", json={"prompt": document(99, WARM_WORDS), "n_predict": 1,
                                                            "cache_prompt": False}, timeout=600)
        warm.raise_for_status()
        n_warm = int(warm.json()["tokens_evaluated"])
        base = rss_kib(pid)
        peak = [base]
        stop = threading.Event()

        held = [0]

        def watch() -> None:
            while not stop.is_set():
                peak[0] = max(peak[0], rss_kib(pid))
                m = srv.metrics()
                held[0] = max(held[0], int(m["prompt_cache_bytes"] + m["preempt_ram_bytes"]))
                time.sleep(0.02)

        w = threading.Thread(target=watch)
        w.start()
        system = (SYSTEM * (system_words // len(SYSTEM.split()) + 1))
        convo = [system for _ in range(users)]
        # the prefix every user's prompt shares, as the server tokenizes it (the simulator's n_shared)
        firsts = [requests.post(srv.url + "/tokenize", json={"content": system + f"\nUser {u}: {document(u, doc_words)}",
                                                               "add_special": True}, timeout=60).json()["tokens"]
                  for u in (0, 1)]
        n_shared = next((i for i, (a, b) in enumerate(zip(*firsts)) if a != b), min(map(len, firsts)))
        rows: list[dict[str, Any]] = []
        try:
            for t in range(turns):
                for u in range(users):
                    doc = document(u, doc_words) if t == 0 else ""  # each user's own material, in the first turn
                    convo[u] += f"\nUser {u}: {doc}question {t} about order {1000 * u + t}?\nAssistant:"
                    t0 = time.perf_counter()
                    r = requests.post(srv.url + "/completion", json={"prompt": convo[u], "n_predict": 24, "temperature": 0,
                                                                     "cache_prompt": True}, timeout=600)
                    r.raise_for_status()
                    d = r.json()
                    convo[u] += d["content"]
                    rows.append({"user": u, "turn": t, "prompt_tokens": d["tokens_evaluated"],
                                 "gen_tokens": d["tokens_predicted"],
                                 "prompt_n": d["timings"]["prompt_n"], "ttft_ms": d["timings"]["prompt_ms"],
                                 "wall_ms": (time.perf_counter() - t0) * 1000})
        finally:
            stop.set()
            w.join()
        # a RAM hit: the conversation just answered, sent again at once
        hit = ask(srv.url, convo[users - 1])
        m = srv.metrics()
    restart = after_restart(model, extra, convo) if "--cache-persist" in extra else None
    return {"name": name, "rows": rows, "n_warm": n_warm, "n_shared": n_shared,
            "ram_hit_ttft_ms": hit["timings"]["prompt_ms"], "ram_hit_prompt_n": hit["timings"]["prompt_n"],
            "restart": restart, "peak_rss_above_load_mib": (peak[0] - base) / 1024, "peak_held_mib": held[0] / 2**20,
            "spilled": int(m["n_prompt_cache_spilled_total"]), "disk_hits": int(m["n_prompt_cache_disk_hits_total"]),
            "cache_mib": m["prompt_cache_bytes"] / 2**20, "disk_mib": m["prompt_cache_disk_bytes"] / 2**20}


def predict(r: dict[str, Any], budget_mib: int, disk: bool) -> dict[str, Any]:
    """The simulator's run of the same requests: the warm-up, then every turn after the answer before it."""
    rows = r["rows"]
    n = len(rows) + 1
    wl = Workload((0.0,) * n, (r["n_warm"], *(x["prompt_tokens"] for x in rows)), (1, *(max(1, x["gen_tokens"]) for x in rows)),
                  (-1, *(x["user"] for x in rows)), (0, *(r["n_shared"] for _ in rows)), tuple(range(-1, n - 1)))
    rep = simulate(wl, n_ctx=8192, n_parallel=2, cache_ram_mib=budget_mib, host_kv_ram_mib=budget_mib if disk else -2,
                   preempt_disk_mib=-1 if disk else 0)
    per = rep.per_request[1:]
    back = [(x, q) for x, q in zip(rows, per) if x["turn"] > 0]
    return {"prompt_n_returning": sum(x["prompt_tokens"] - q["n_prompt_cached"] for x, q in back),
            "ttft_ms_returning": [(q["t_first"] - q["t_start"]) * 1000 for _, q in back],
            "ttft_ms_first": [(q["t_first"] - q["t_start"]) * 1000 for x, q in zip(rows, per) if x["turn"] == 0],
            "spilled": rep.prompt_cache_spilled, "disk_hits": rep.prompt_cache_disk_hits,
            "peak_cache_mib": rep.peak_cache_mib}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument("--users", type=int, default=6)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--system-words", type=int, default=300, help="words of the shared system prompt (default 300)")
    ap.add_argument("--doc-words", type=int, default=300, help="words of each user's own text in its first turn (default 300)")
    ap.add_argument("--budget-mib", type=int, default=64, help="the host budget / --cache-ram in MiB (default 64)")
    args = ap.parse_args()
    model = smollm2_model(args.model)
    b = str(args.budget_mib)
    with tempfile.TemporaryDirectory(prefix="llama-preempt-bench-") as disk:
        setups = [("ram", ["--cache-ram", b]),
                  ("disk", ["--cache-ram", b, "--host-kv-ram", b, "--preempt-disk", disk, "--cache-persist"])]
        runs = [run(model, name, extra, args.users, args.turns, args.system_words, args.doc_words) for name, extra in setups]
    table = []
    for r in runs:
        back = [x for x in r["rows"] if x["turn"] > 0]
        r["predicted"] = sim = predict(r, args.budget_mib, r["name"] == "disk")
        table.append([r["name"], sum(x["prompt_n"] for x in back), sum(x["prompt_tokens"] for x in back),
                      f"{statistics.median(x['ttft_ms'] for x in back):.0f}",
                      f"{max(x['ttft_ms'] for x in back):.0f}",
                      f"{statistics.median(x['ttft_ms'] for x in r['rows'] if x['turn'] == 0):.0f}",
                      f"{r['peak_held_mib']:.0f}", f"{r['peak_rss_above_load_mib']:.0f}", r["spilled"], r["disk_hits"]])
        table.append([f"{r['name']} (simulated)", sim["prompt_n_returning"], sum(x["prompt_tokens"] for x in back),
                      f"{statistics.median(sim['ttft_ms_returning']):.0f}", f"{max(sim['ttft_ms_returning']):.0f}",
                      f"{statistics.median(sim['ttft_ms_first']):.0f}", f"{sim['peak_cache_mib']:.0f} (cache)", "-",
                      sim["spilled"], sim["disk_hits"]])
    headers = ["setup", "prompt tokens computed (returning turns)", "prompt tokens sent (returning turns)",
               "TTFT ms p50 (returning)", "TTFT ms max (returning)", "TTFT ms p50 (first turns)",
               "peak cached + parked, MiB", "peak RSS above the warm pool, MiB", "prompts to disk", "read back"]
    md = [f"# The prompt cache's tiers on a multi-turn chat ({display_path(model)})", "",
          f"`python bench/prompt_cache.py --users {args.users} --turns {args.turns} --system-words {args.system_words} "
          f"--doc-words {args.doc_words} --budget-mib {args.budget_mib}`: {args.users} users x {args.turns} turns "
          f"round-robin, each turn resending the conversation (a {args.system_words}-word shared system prompt, the "
          f"user's own {args.doc_words}-word text in its first turn), 24 tokens an answer; -c 8192 -np 2; "
          f"budget {args.budget_mib} MiB. TTFT is the server's prompt time (timings.prompt_ms). RSS: the "
          "server's resident memory above what it had after a first prompt filled most of the KV pool (on a CPU the pool "
          "is host memory); cached + parked: the host budget's own count (/metrics). A (simulated) row: the "
          "simulator's prediction of the same requests (see the module docstring).", "",
          *md_table(headers, table)]
    rows2 = []
    for r in runs:
        rows2.append([r["name"], "same server, the conversation just answered (a RAM hit)", r["ram_hit_prompt_n"],
                      f"{r['ram_hit_ttft_ms']:.0f}"])
        if r["restart"]:
            x = r["restart"]
            rows2.append([r["name"], f"after a restart (--cache-persist): each of the {len(x['prompt_n'])} conversations "
                          "sent again", f"{sum(x['prompt_n'])} of {sum(x['tokens'])}",
                          f"{statistics.median(x['ttft_ms']):.0f} (max {max(x['ttft_ms']):.0f})"])
    md += ["", "A returning prompt after a restart, against a RAM hit:", "",
           *md_table(["setup", "what", "prompt tokens computed", "TTFT ms (p50)"], rows2)]
    print("\n".join(md))
    write_results("prompt_cache", {"runs": runs, "args": vars(args) | {"model": display_path(model)}}, md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
