"""A state ten times the host budget, parked and cached on disk (issue 41).

    python bench/large_state.py              # SmolLM2-135M-Instruct Q4_1, about two minutes
    python bench/large_state.py --dir PATH   # the disk tier on another filesystem (default: the system's temp dir)

SmolLM2 holds about 23 KiB of KV state a token, so a 5,300-token conversation is about 117 MiB:
fourteen times a host budget of 8 MiB (--host-kv-ram 8). Such a state fits no host copy, so it moves between
the pool and its file on the disk tier one chunk at a time (store/preempt-stream.h: 1 MiB of host
RAM), never whole. Two cases:

- park: the conversation is parked every 8 decode steps (the test knob LLAMA_SERVER_PREEMPT_EVERY)
  and resumed, its state streamed to its file and back each time. Three setups, without a prompt
  cache (--cache-ram 0) and with --deterministic (the answers comparable byte for byte): no parks,
  parks in host RAM (a budget that holds the state: the whole state in RAM), and streamed parks (8 MiB);
- prompt: the conversation ends, another takes its slot (upstream caches the idle slot's prompt,
  and skips one larger than --cache-ram 8: streamed to the disk tier instead), and the conversation
  returns (streamed from its file straight into a slot). Against the same without a disk tier.

For each: the server's peak resident memory above its resident memory after a warm-up that touched
the pool's pages (sampled every 10 ms, and the kernel's high-water mark VmHWM), against the budget
plus one chunk; the streamed write and read rates against this disk's own sequential rate (a file
of the state's size written and read in 1 MiB blocks, no fsync, as the tier's files are). The read
rates include the page cache where the file is still in it: so do the tier's reads.
"""
from __future__ import annotations

import argparse
import os
import re
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import requests

from llama_preempt.server import LlamaServer, ServerConfig
from results_io import display_path, md_table, smollm2_model, write_results

CHUNK = 1 << 20  # the disk tier's staging chunk (disk_store::CHUNK)
WORDS = ("harbour lantern orchard meadow quarry summit canyon glacier tundra estuary delta lagoon prairie savanna "
         "plateau ravine valley marsh").split()


def text(seed: int, n_words: int) -> str:
    return " ".join(f"{WORDS[(seed + k * 7) % len(WORDS)]}{(seed * 13 + k) % 89}" for k in range(n_words))


def status_kib(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


class Watch:
    """The server's resident memory, sampled every 10 ms from `base` on."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.base = status_kib(pid, "VmRSS")
        self.hwm0 = status_kib(pid, "VmHWM")
        self.peak = self.base
        self.stop = threading.Event()
        self.t = threading.Thread(target=self.run)
        self.t.start()

    def run(self) -> None:
        while not self.stop.is_set():
            self.peak = max(self.peak, status_kib(self.pid, "VmRSS"))
            time.sleep(0.01)

    def done(self) -> dict[str, float]:
        self.stop.set()
        self.t.join()
        hwm = status_kib(self.pid, "VmHWM")
        return {"peak_above_mib": (self.peak - self.base) / 1024, "hwm_above_mib": max(0, hwm - max(self.hwm0, self.base)) / 1024}


def complete(url: str, prompt: str, n: int, cache: bool) -> dict[str, Any]:
    r = requests.post(url + "/completion", json={"prompt": prompt, "n_predict": n, "temperature": 0, "ignore_eos": True,
                                                 "cache_prompt": cache}, timeout=1200)
    r.raise_for_status()
    return r.json()


def warm(url: str, n_words: int) -> None:
    # the KV pool is host memory on a CPU, its pages touched as cells are first used: fill it first,
    # so that what grows after is what the park or the cache takes
    complete(url, text(999, n_words), 1, False)


def park_case(model: Path, disk: Path, name: str, budget_mib: int | None, n_words: int, parks: bool) -> dict[str, Any]:
    # no prompt cache: what grows is the parks' memory alone; --deterministic: a park inside the
    # prompt does not change its answer (without it, the rest of the prompt is batched differently)
    extra = ["--preempt-mode", "swap", "--cache-ram", "0", "--deterministic", "--preempt-disk", str(disk)]
    if budget_mib is not None:
        extra += ["--host-kv-ram", str(budget_mib)]
    env = {"LLAMA_SERVER_PREEMPT_EVERY": "8"} if parks else {}
    cfg = ServerConfig(model=model, n_ctx=8192, n_parallel=2, extra_args=extra, env=env)
    with LlamaServer(cfg) as srv:
        warm(srv.url, n_words)
        w = Watch(srv.proc.pid)
        got = complete(srv.url, text(1, n_words), 32, False)
        mem = w.done()
        m = srv.metrics()
    n_parks = int(m.get("n_preempt_total", 0))
    wb, wus = m.get("n_disk_write_bytes_total", 0), m.get("n_disk_write_us_total", 0)
    rb, rus = m.get("n_disk_read_bytes_total", 0), m.get("n_disk_read_us_total", 0)
    return {"case": "park", "name": name, "budget_mib": budget_mib, "prompt_tokens": got["tokens_evaluated"],
            "parks": n_parks, "state_mib": (wb / n_parks / 2**20) if n_parks and wb else None, **mem,
            "write_mbps": wb / wus if wus else None, "read_mbps": rb / rus if rus else None, "content": got["content"]}


def prompt_case(model: Path, disk: Path | None, name: str, n_words: int) -> dict[str, Any]:
    extra = ["--cache-ram", "8", "--host-kv-ram", "8"] + (["--preempt-disk", str(disk)] if disk else [])
    # room in the pool for two conversations: the returning one's cells are placed while the other
    # slot still holds its own (upstream clears idle slots only after the load)
    cfg = ServerConfig(model=model, n_ctx=16384, n_parallel=2, extra_args=extra)
    with LlamaServer(cfg) as srv:
        warm(srv.url, n_words)
        w = Watch(srv.proc.pid)
        convo = text(2, n_words)
        first = complete(srv.url, convo, 8, True)
        complete(srv.url, text(3, n_words), 8, True)  # another conversation: the first's slot is saved and cleared
        complete(srv.url, text(4, n_words), 8, True)
        back = complete(srv.url, convo, 8, True)
        mem = w.done()
        log = srv.log_text()
    out = re.search(r"a prompt of (\d+) tokens \(([\d.]+) MiB\) larger than the RAM cache streamed to the disk tier in ([\d.]+) ms", log)
    inn = re.search(r"streamed back from the disk tier into slot \d+, ([\d.]+) MiB in ([\d.]+) ms", log)
    return {"case": "prompt", "name": name, "budget_mib": 8, "prompt_tokens": first["tokens_evaluated"],
            "prompt_n_back": back["timings"]["prompt_n"], "prompt_ms_back": back["timings"]["prompt_ms"],
            "prompt_ms_first": first["timings"]["prompt_ms"], **mem,
            "state_mib": float(out.group(2)) if out else None,
            "write_mbps": float(out.group(2)) * 2**20 / float(out.group(3)) / 1e3 if out else None,
            "read_mbps": float(inn.group(1)) * 2**20 / float(inn.group(2)) / 1e3 if inn else None,
            "same_answer": back["content"] == first["content"]}


def sequential_rates(disk: Path, n_bytes: int) -> dict[str, float]:
    """This disk's own rate for a file of the state's size, in 1 MiB blocks, no fsync (as the tier's)."""
    path = disk / "sequential.bin"
    block = os.urandom(CHUNK)
    t0 = time.perf_counter()
    with open(path, "wb", buffering=0) as f:
        for _ in range(n_bytes // CHUNK):
            f.write(block)
    t_w = time.perf_counter() - t0
    t0 = time.perf_counter()
    with open(path, "rb", buffering=0) as f:
        while f.read(CHUNK):
            pass
    t_r = time.perf_counter() - t0
    path.unlink()
    return {"write_mbps": n_bytes / t_w / 1e6, "read_mbps": n_bytes / t_r / 1e6}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument("--dir", type=Path, default=None, help="where the disk tier's directory goes (default: the temp dir)")
    ap.add_argument("--words", type=int, default=1800, help="the conversation's words (about 5,300 tokens)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    model = smollm2_model(args.model)
    with tempfile.TemporaryDirectory(prefix="llama-preempt-large-", dir=args.dir) as tmp:
        d = Path(tmp)
        rows = [park_case(model, d, "no parks", None, args.words, parks=False),
                park_case(model, d, "parks in host RAM (--host-kv-ram 1024)", 1024, args.words, parks=True),
                park_case(model, d, "streamed parks (--host-kv-ram 8)", 8, args.words, parks=True),
                prompt_case(model, None, "--cache-ram 8, no disk tier", args.words),
                prompt_case(model, d, "--cache-ram 8, disk tier: streamed", args.words)]
        state = max((r["state_mib"] or 0) for r in rows)
        seq = sequential_rates(d, int(state * 2**20))
    same = rows[0]["content"] == rows[1]["content"] == rows[2]["content"]
    headers = ["case", "setup", "prompt tokens", "state MiB", "parks", "peak RSS above warm (sampled / VmHWM) MiB",
               "budget + chunk MiB", "write MB/s", "read MB/s", "returning prompt_n"]
    table = []
    for r in rows:
        table.append([r["case"], r["name"], r["prompt_tokens"], f"{r['state_mib']:.1f}" if r["state_mib"] else "-",
                      r.get("parks", "-"), f"{r['peak_above_mib']:.1f} / {r['hwm_above_mib']:.1f}",
                      f"{r['budget_mib'] + CHUNK / 2**20:.0f}" if r["budget_mib"] else "-",
                      f"{r['write_mbps']:.0f}" if r["write_mbps"] else "-", f"{r['read_mbps']:.0f}" if r["read_mbps"] else "-",
                      r.get("prompt_n_back", "-")])
    md = ["# A state ten times the host budget (issue 41)", "",
          f"`python bench/large_state.py` on {display_path(model)}; this disk's sequential rate for a file of the "
          f"state's size, 1 MiB blocks, no fsync: write {seq['write_mbps']:.0f} MB/s, read {seq['read_mbps']:.0f} MB/s.", "",
          *md_table(headers, table), "",
          f"Parked answers equal the unparked one: {same}. The returning prompt's answer equals its first: "
          f"{rows[4]['same_answer']}."]
    print("\n".join(md))
    write_results("large_state", {"model": display_path(model), "rows": rows, "sequential": seq, "same_answer": same},
                  md, args.out or Path(__file__).resolve().parent / "results")


if __name__ == "__main__":
    main()
