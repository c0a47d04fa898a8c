"""The disk tier's limit across restarts (issue 41): a restart soak with --cache-persist.

    python bench/disk_limit.py               # SmolLM2-135M-Instruct Q4_1, 20 runs per setup
    python bench/disk_limit.py --runs 4      # quicker

Each run starts llama-server with --cache-persist on the same directory, answers a few distinct
long conversations (a --cache-ram that holds a few of them pushes the rest out of RAM to the disk
tier; the ones left in RAM and in the slots go to disk at the clean exit), and
exits cleanly; the kept directory's size is read after every run. Two setups: --preempt-disk-mib
left at its default (a tenth of the filesystem, at most half its free space and 64 GiB) and a small
one. What a limit means: the directory never holds more than it, run after run, the newest prompts
kept (the last run's last conversation comes back from disk after the next start).
"""
from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path
from typing import Any

from llama_preempt.server import LlamaServer, ServerConfig
from results_io import ask_cached, display_path, md_table, smollm2_model, write_results

WORDS = ("harbour lantern orchard meadow quarry summit canyon glacier tundra estuary delta lagoon prairie savanna "
         "plateau ravine valley marsh").split()


def conversation(run: int, i: int, n_words: int) -> str:
    """A long, distinct prompt per run and conversation."""
    seed = run * 37 + i * 11
    return " ".join(f"{WORDS[(seed + k * (i + 2)) % len(WORDS)]}{(seed * 13 + k) % 89}" for k in range(n_words)) + ". Summarise."


def ask(url: str, prompt: str) -> dict[str, Any]:
    return ask_cached(url, prompt, 8)


def kept(d: Path) -> tuple[int, int]:
    """The kept directory's prompt files: their count and bytes."""
    files = list(d.glob("llama-preempt-cache-*/*.kv"))
    return len(files), sum(f.stat().st_size for f in files)


def soak(model: Path, runs: int, convos: int, words: int, cache_mib: int, limit_mib: int | None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="llama-preempt-disk-limit-") as tmp:
        d = Path(tmp)
        extra = ["--cache-ram", str(cache_mib), "--preempt-disk", str(d), "--cache-persist"]
        if limit_mib is not None:
            extra += ["--preempt-disk-mib", str(limit_mib)]
        rows: list[dict[str, Any]] = []
        limit = None
        last = ""
        for run in range(runs):
            with LlamaServer(ServerConfig(model=model, n_ctx=4096, n_parallel=2, extra_args=extra)) as srv:
                limit = srv.get("/props").json()["llama_preempt"]["preempt_disk_mib"]
                back = ask(srv.url, last)["timings"]["prompt_n"] if last else None
                prompts = [conversation(run, i, words) for i in range(convos)]
                for p in prompts:
                    ask(srv.url, p)
                m = srv.metrics()
                taken = [line.split("--cache-persist: ", 1)[-1] for line in srv.log_text().splitlines() if "taken back" in line]
            n, b = kept(d)
            rows.append({"run": run + 1, "files": n, "kept_mib": b / 2**20, "limit_mib": limit,
                         "spilled": int(m["n_prompt_cache_spilled_total"]),
                         "dropped": int(m["n_prompt_cache_disk_skipped_total"]),
                         "streamed": int(m["n_prompt_cache_streamed_total"]),
                         "streamed_back": int(m["n_prompt_cache_streamed_back_total"]),
                         "last_back_prompt_n": back, "start_log": taken[0] if taken else ""})
            last = prompts[-1]
            print(f"  run {run + 1:2d}: {n:3d} files, {b / 2**20:7.2f} MiB kept of {limit} MiB; "
                  f"the last run's last conversation back with prompt_n {back}")
        return {"limit_mib": limit, "limit_given": limit_mib, "runs": rows,
                "max_kept_mib": max(r["kept_mib"] for r in rows),
                "within_limit": all(r["kept_mib"] <= r["limit_mib"] for r in rows)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--convos", type=int, default=6, help="distinct long conversations per run")
    ap.add_argument("--words", type=int, default=300, help="words per conversation")
    ap.add_argument("--cache-ram", type=int, default=64, help="--cache-ram MiB (a prompt larger than it is streamed to the "
                                                             "disk tier from its slot, and back into a slot)")
    ap.add_argument("--small-mib", type=int, default=64, help="the small limit's MiB")
    args = ap.parse_args()
    model = smollm2_model()
    out: dict[str, Any] = {"model": display_path(model), "runs": args.runs, "convos": args.convos, "words": args.words,
                           "cache_ram_mib": args.cache_ram,
                           "fs_bytes": None, "setups": {}}
    st = os.statvfs(tempfile.gettempdir())
    out["fs_bytes"] = st.f_blocks * st.f_frsize
    out["fs_free_bytes"] = st.f_bavail * st.f_frsize
    for name, mib in (("default", None), (f"{args.small_mib} MiB", args.small_mib)):
        print(f"{name}:")
        out["setups"][name] = soak(model, args.runs, args.convos, args.words, args.cache_ram, mib)
    rows = [[name, s["limit_mib"], f"{s['max_kept_mib']:.1f}", "yes" if s["within_limit"] else "NO",
             sum(r["spilled"] for r in s["runs"]), sum(r["streamed"] for r in s["runs"]),
             sum(r["streamed_back"] for r in s["runs"]), sum(r["dropped"] for r in s["runs"]),
             ", ".join(str(r["last_back_prompt_n"]) for r in s["runs"][1:])]
            for name, s in out["setups"].items()]
    table = md_table(["setup", "limit MiB", "max kept MiB", "within", "spilled", "of them streamed", "streamed back", "dropped",
                      "last conversation's prompt_n after each restart"], rows)
    print("\n".join(table))
    write_results("disk_limit", out, table)


if __name__ == "__main__":
    main()
