#!/usr/bin/env python3
"""Soak: many concurrent clients on loopback against one server whose pool is far smaller than the
load, for a bounded time, and every request accounted for.

    python tests/soak.py --duration 600 --clients 8      # the long soak (prints a summary)
    pytest tests/test_soak.py                            # the short one, in CI

Clients send random prompt and answer lengths, streamed and not, some with n_cmpl = 2; the server
also parks every generating slot every 37 tokens (LLAMA_SERVER_PREEMPT_EVERY), so forced parks mix
with the natural ones. `--preempt-ram` picks the mode: 1 MiB (SWAP: a stories260K slot's state is
well under it), 0 (RECOMPUTE). Checked:

- every request ends complete (stop type and token count checked, streamed or not) or with an error
  it deserved (an n_cmpl family the pool cannot hold even with its choices parked one at a time);
- the server never dies, and at idle no slot holds a request, nothing is parked and no host RAM
  is held;
- the server's RSS stays bounded, and the parked bytes (polled) never exceed the budget.
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests

sys.path.insert(0, str(Path(__file__).resolve().parent))
from helpers import long_prompt, rss_mib  # noqa: E402

from llama_preempt.server import LlamaServer, ServerConfig  # noqa: E402

SERVER_ENV = {"LLAMA_SERVER_PREEMPT_EVERY": "37"}


@dataclass
class SoakResult:
    duration_s: float
    requests: int = 0
    completed: int = 0
    deserved_errors: int = 0
    lost: list[str] = field(default_factory=list)       # undeserved errors, truncations, hangs
    streamed: int = 0
    families: int = 0
    parks: dict[str, int] = field(default_factory=dict)
    peak_parked_bytes: int = 0
    budget_bytes: int = 1 << 20
    over_budget: int = 0
    rss_start_mib: float = 0.0
    rss_end_mib: float = 0.0
    idle_ok: bool = False
    server_alive: bool = False

    def summary(self) -> str:
        return (f"{self.duration_s:.0f} s, {self.requests} requests ({self.streamed} streamed, {self.families} n_cmpl=2): "
                f"{self.completed} completed, {self.deserved_errors} deserved errors, {len(self.lost)} lost; parks "
                f"{self.parks}; peak parked {self.peak_parked_bytes / 2**20:.2f} MiB of {self.budget_bytes / 2**20:g} MiB "
                f"({self.over_budget} samples over); RSS {self.rss_start_mib:.1f} -> {self.rss_end_mib:.1f} MiB; "
                f"idle clean {self.idle_ok}; server alive {self.server_alive}")


def one_request(srv: LlamaServer, rng: random.Random, res: SoakResult, lock: threading.Lock) -> None:
    n_words = rng.randint(3, 60)
    n_predict = rng.randint(1, 150)
    family = rng.random() < 0.1
    stream = not family and rng.random() < 0.5
    body: dict[str, Any] = {"prompt": long_prompt(n_words, shift=rng.randrange(40)), "n_predict": n_predict,
                            "temperature": rng.choice([0, 0.8]), "ignore_eos": True, "seed": rng.randrange(1000)}
    if family:
        body["n_cmpl"] = 2
        body["n_predict"] = n_predict = min(n_predict, 40)
    outcome, why = "lost", ""
    try:
        if stream:
            body["stream"] = True
            n_tokens, final = 0, None
            with requests.post(srv.url + "/completion", json=body, stream=True, timeout=300) as r:
                if r.status_code != 200:
                    why = f"stream HTTP {r.status_code}: {r.text[:120]}"
                else:
                    for raw in r.iter_lines():
                        if not raw.startswith(b"data: "):
                            continue
                        d = json.loads(raw[6:])
                        if "error" in d:
                            why = f"stream error: {d['error']}"
                            break
                        if d.get("stop"):
                            final = d
                        elif d.get("tokens"):
                            n_tokens += len(d["tokens"])
            if final is not None:
                if final.get("stop_type") == "limit" and final.get("tokens_predicted") == n_predict == n_tokens:
                    outcome = "completed"
                else:
                    why = f"truncated stream: {n_tokens} tokens, final {final.get('stop_type')} " \
                          f"{final.get('tokens_predicted')} of {n_predict}"
        else:
            r = requests.post(srv.url + "/completion", json=body, timeout=300)
            if r.status_code == 200:
                outs = r.json() if isinstance(r.json(), list) else [r.json()]
                bad = [o for o in outs if o.get("stop_type") != "limit" or o.get("tokens_predicted") != n_predict]
                if len(outs) == (2 if family else 1) and not bad:
                    outcome = "completed"
                else:
                    why = f"truncated: {[(o.get('stop_type'), o.get('tokens_predicted')) for o in outs]} of {n_predict}"
            elif family and r.status_code == 400 and "exceed" in r.text:
                outcome = "deserved"  # a family still in its prompt cannot be parked: when only it could make room, it ends
            else:
                why = f"HTTP {r.status_code}: {r.text[:120]}"
    except requests.RequestException as e:
        why = f"{e.__class__.__name__}: {e}"
    with lock:
        res.requests += 1
        res.streamed += int(stream)
        res.families += int(family)
        if outcome == "completed":
            res.completed += 1
        elif outcome == "deserved":
            res.deserved_errors += 1
        else:
            res.lost.append(why)


def soak(model: Path, duration_s: float, clients: int = 6, seed: int = 0, log_dir: Path | None = None,
         ram_mib: int = 1) -> SoakResult:
    res = SoakResult(duration_s=duration_s, budget_bytes=ram_mib << 20)
    cfg = ServerConfig(model=model, n_ctx=384, n_parallel=4, kv_unified=True,
                       # no RAM prompt cache (--cache-ram 0): it grows by design up to its own limit and would
                       # hide a leak from the RSS check
                       extra_args=["--preempt-ram", str(ram_mib), "-b", "64", "--cache-ram", "0"], env=SERVER_ENV)
    with LlamaServer(cfg, log_dir=log_dir) as srv:
        assert srv.proc is not None
        lock = threading.Lock()
        deadline = time.monotonic() + duration_s
        done = threading.Event()

        def client(i: int) -> None:
            rng = random.Random(seed * 1000 + i)
            while time.monotonic() < deadline:
                one_request(srv, rng, res, lock)

        def watch() -> None:
            while not done.is_set():
                try:
                    held = int(srv.metrics().get("preempt_ram_bytes"))
                except requests.RequestException:
                    held = 0
                with lock:
                    res.peak_parked_bytes = max(res.peak_parked_bytes, held)
                    res.over_budget += int(held > res.budget_bytes)
                done.wait(0.05)

        one_request(srv, random.Random(seed), res, threading.Lock())  # warm up before the RSS baseline
        res.rss_start_mib = rss_mib(srv.proc.pid)
        watcher = threading.Thread(target=watch)
        watcher.start()
        threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(duration_s + 600)
            if t.is_alive():
                res.lost.append("a client hung past the deadline")
        done.set()
        watcher.join()
        m = srv.metrics()
        res.parks = {"swap": int(m.get("n_preempt_swap_total")), "recompute": int(m.get("n_preempt_recompute_total"))}
        slots = srv.slots()
        res.idle_ok = (not any(s["is_processing"] for s in slots) and m.get("requests_preempted") == 0
                       and m.get("preempt_ram_bytes") == 0)
        res.rss_end_mib = rss_mib(srv.proc.pid)
        res.server_alive = srv.proc.poll() is None
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=float, default=60.0, help="seconds of load (default 60)")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--preempt-ram", type=int, default=1, help="MiB: 1 (swap, default) or 0 (recompute)")
    ap.add_argument("--model", type=Path, default=Path(__file__).resolve().parent.parent.parent / "shared" / "models"
                    / "stories260K.gguf")
    args = ap.parse_args()
    res = soak(args.model, args.duration, args.clients, args.seed, ram_mib=args.preempt_ram)
    print(res.summary())
    for why in res.lost[:20]:
        print("  lost:", why)
    ok = not res.lost and res.idle_ok and res.server_alive and res.over_budget == 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
