"""Upstream's prompt cache, one tier down: cached prompts that leave host RAM go to the disk tier
(--preempt-disk) and come back when a request's prefix matches, parked slots first on disk too.

A chat's long prompt, pushed out of a small RAM cache (--cache-ram 1) by other conversations,
returns from its file: prompt_n is small and the answer is a RAM hit's. A corrupt or truncated file
is caught by its checksum, counted, and the prompt is prefilled instead.
"""
from __future__ import annotations

import json
import os
import re
import stat
import threading
from pathlib import Path
from typing import Any

import pytest

from helpers import ON_THE_CPU, BackgroundStream, logged, long_prompt, rss_mib, run_cli, wait_until
from llama_preempt.engine import Completion, Engine

SMALL_CACHE = ["--cache-ram", "1", "--deterministic"]
# where a returning prompt's answer is compared with another run's (a prompt back from its file
# computes a token or two, or lies in other cells): the CPU, on every build, whose kernels
# --deterministic makes batch-invariant (a GPU's follow the batch)
ON_CPU_SMALL_CACHE = [*SMALL_CACHE, *ON_THE_CPU]


def complete(srv: Any, prompt: str, n_predict: int) -> Any:
    """A completion that may reuse a cached prompt (the tests' usual helper turns cache_prompt off)."""
    return srv.post("/completion", {"prompt": prompt, "n_predict": n_predict, "temperature": 0, "cache_prompt": True})


def chat(srv: Any) -> tuple[Any, Any]:
    """A long prompt, then six other conversations (each saved to the cache as the next starts),
    then the long prompt again: its first and its returning answer."""
    prompt = long_prompt(300, shift=3)
    first = complete(srv, prompt, 16).json()
    for i in range(6):
        assert complete(srv, long_prompt(250, shift=50 + 9 * i), 16).status_code == 200
    return first, complete(srv, prompt, 16).json()


def disk_dir(tmp_path: Path) -> Path:
    d = tmp_path / "disk"
    d.mkdir(exist_ok=True)
    return d


def prompt_files(d: Path) -> list[Path]:
    return sorted(d.glob("llama-preempt-*/*.kv"))


def test_a_prompt_evicted_from_ram_comes_back_from_disk_with_prompt_n_small_and_a_ram_hits_answer(
        start_server, stories_model: Path, tmp_path: Path) -> None:
    # the reference: a RAM cache large enough for every conversation, the returning prompt a RAM hit
    ram = start_server(stories_model, n_ctx=2048, n_parallel=2, extra_args=["--deterministic", *ON_THE_CPU])
    _, ram_hit = chat(ram)
    assert ram_hit["timings"]["prompt_n"] <= 2

    srv = start_server(stories_model, n_ctx=2048, n_parallel=2,
                       extra_args=ON_CPU_SMALL_CACHE + ["--preempt-disk", str(disk_dir(tmp_path))])
    first, back = chat(srv)
    assert first["timings"]["prompt_n"] > 400
    assert back["timings"]["prompt_n"] <= 2  # its cells came back from the file
    assert back["content"] == ram_hit["content"]
    m = srv.metrics()
    assert m["n_prompt_cache_spilled_total"] >= 1 and m["n_prompt_cache_disk_hits_total"] == 1
    assert m["n_prompt_cache_disk_failures_total"] == 0
    assert m["prompt_cache_disk_bytes"] > 0 and m["prompt_cache_bytes"] <= 1 << 20
    logged(srv, "read back from the disk tier")
    # `llama-preempt stats` shows the host and disk bytes by kind, and the prompts' trips to disk
    p = run_cli("stats", srv.url, "--once", timeout=60)
    assert p.returncode == 0, p.stderr
    assert "host KV: parked + prompts / budget" in p.stdout and "/ 8192.0 MiB" in p.stdout
    assert "of it cached prompts" in p.stdout
    assert f"{m['n_prompt_cache_spilled_total']:.0f} / 1 / 0 / 0" in p.stdout
    js = json.loads(run_cli("stats", srv.url, "--once", "--json", timeout=60).stdout)
    assert js["host"]["budget_bytes"] == 8192 << 20 and js["host"]["prompt_cache_bytes"] == m["prompt_cache_bytes"]
    assert js["prompt_cache"]["disk_hits"] == 1 and js["disk"]["prompt_cache_bytes"] == m["prompt_cache_disk_bytes"]


def test_a_waiting_requests_prompt_file_is_read_ahead_while_no_slot_is_free(
        start_server, stories_model: Path, tmp_path: Path) -> None:
    srv = start_server(stories_model, n_ctx=2048, n_parallel=2, extra_args=SMALL_CACHE + ["--preempt-disk", str(disk_dir(tmp_path))])
    prompt = long_prompt(300, shift=3)
    first = complete(srv, prompt, 16).json()
    for i in range(6):
        assert complete(srv, long_prompt(250, shift=50 + 9 * i), 16).status_code == 200
    assert srv.metrics()["prompt_cache_disk_bytes"] > 0
    # both slots busy, held parked through the slot API: the returning request waits for one
    streams = []
    for text in ("Once upon a time", "There was a dog"):
        streams.append(BackgroundStream(srv, {"prompt": text, "n_predict": 1000, "ignore_eos": True, "stream": True}))
        sid = wait_until(lambda: next((s for s in srv.slots() if s["is_processing"] and not s["is_preempted"]), None),
                         30, "a slot generating")["id"]
        assert srv.post(f"/slots/{sid}?action=park", {}).status_code == 200
    back: list[Any] = []
    waiting = threading.Thread(target=lambda: back.append(complete(srv, prompt, 16).json()))
    waiting.start()
    wait_until(lambda: srv.metrics()["n_prompt_cache_read_ahead_total"] >= 1, 30, "its file to be read ahead")
    assert not back  # still waiting for a slot
    for s in srv.slots():
        if s["is_preempted"]:
            assert srv.post(f"/slots/{s['id']}?action=unpark", {}).status_code == 200
    waiting.join(60)
    for st in streams:
        st.join()
    assert back[0]["timings"]["prompt_n"] <= 2 and back[0]["tokens_predicted"] == 16
    m = srv.metrics()
    assert m["n_prompt_cache_disk_hits_total"] == 1 and m["n_prompt_cache_disk_failures_total"] == 0
    logged(srv, "(read ahead while the request waited for a slot)")


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs /proc to read RSS")
def test_prompts_written_to_disk_leave_host_ram(start_server, stories_model: Path, tmp_path: Path) -> None:
    srv = start_server(stories_model, n_ctx=2048, n_parallel=2, extra_args=SMALL_CACHE + ["--preempt-disk", str(disk_dir(tmp_path))])
    def prompt(i: int) -> str:  # a conversation of its own: no file matches it
        return f"Conversation number {i}. " + long_prompt(600, shift=i)

    for i in range(8):  # warm up the allocator and the pool's pages
        assert complete(srv, prompt(i), 1).status_code == 200
    before, on_disk = rss_mib(srv.proc.pid), srv.metrics()["prompt_cache_disk_bytes"]
    for i in range(8, 40):
        assert complete(srv, prompt(i), 1).status_code == 200
    m = srv.metrics()
    written = (m["prompt_cache_disk_bytes"] - on_disk) / 2**20
    grown = rss_mib(srv.proc.pid) - before
    assert written >= 16 and m["prompt_cache_bytes"] <= 1 << 20
    assert grown < written / 4, f"RSS grew {grown:.1f} MiB while {written:.1f} MiB of prompts went to disk"


@pytest.mark.parametrize("fault", ["corrupt", "truncate"])
def test_a_corrupt_or_truncated_prompt_file_is_prefilled_and_counted(
        start_server, stories_model: Path, tmp_path: Path, fault: str) -> None:
    srv = start_server(stories_model, n_ctx=2048, n_parallel=2, env={"LLAMA_SERVER_PREEMPT_DISK_FAIL": fault},
                       extra_args=ON_CPU_SMALL_CACHE + ["--preempt-disk", str(disk_dir(tmp_path))])
    first, back = chat(srv)
    assert back["timings"]["prompt_n"] == first["timings"]["prompt_n"]  # prefilled again, whole
    assert back["content"] == first["content"]
    m = srv.metrics()
    assert m["n_prompt_cache_disk_failures_total"] == 1 and m["n_prompt_cache_disk_hits_total"] == 0
    assert sum(srv.metrics().labeled["preempt_disk_failures_total"].values()) == 1
    logged(srv, "failed to read back")


def test_prompt_files_live_in_the_disk_tiers_private_directory_and_go_with_it(
        start_server, stories_model: Path, tmp_path: Path) -> None:
    srv = start_server(stories_model, n_ctx=2048, n_parallel=2, extra_args=SMALL_CACHE + ["--preempt-disk", str(disk_dir(tmp_path))])
    for i in range(6):
        assert complete(srv, long_prompt(250, shift=9 * i), 8).status_code == 200
    files = prompt_files(disk_dir(tmp_path))
    assert files and srv.metrics()["n_prompt_cache_spilled_total"] >= 1
    (store,) = {f.parent for f in files}
    assert stat.S_IMODE(os.stat(store).st_mode) == 0o700
    assert all(stat.S_IMODE(os.stat(f).st_mode) == 0o600 and not f.is_symlink() for f in files)
    srv.stop()
    assert list(disk_dir(tmp_path).iterdir()) == []


def test_parks_take_the_disk_before_cached_prompts(start_server, stories_model: Path, tmp_path: Path) -> None:
    # a 1 MiB disk budget that prompt files fill, then disk parks (no RAM for parks) that need it
    srv = start_server(stories_model, n_ctx=2048, n_parallel=2,
                       env={"LLAMA_SERVER_PREEMPT_EVERY": "8"},
                       extra_args=SMALL_CACHE + ["--preempt-disk", str(disk_dir(tmp_path)), "--preempt-disk-mib", "1",
                                                 "--preempt-ram", "0", "--host-kv-ram", "1", "--preempt-mode", "swap"])
    for i in range(12):
        assert complete(srv, long_prompt(250, shift=9 * i), 4).status_code == 200
    before = srv.metrics()["prompt_cache_disk_bytes"]
    assert before > (1 << 20) // 2
    got = complete(srv, long_prompt(400, shift=77), 48).json()
    assert got["tokens_predicted"] == 48
    m = srv.metrics()
    assert m.labeled["preempt_parks_by_tier_total"]["disk"] == m["n_preempt_total"] >= 4  # every park on disk
    assert m["prompt_cache_disk_bytes"] < before  # prompt files gave way
    assert sum(m.labeled["preempt_disk_failures_total"].values()) == 0


def hybrid_chat_back(start_server: Any, model: Path, tmp_path: Path, cache_mib: str) -> tuple[Any, Any]:
    """The hybrid MTP model's chat() against a RAM cache that holds every conversation: the server
    with --cache-ram `cache_mib` and a disk tier, after its returning prompt answered as the RAM hit
    did (prompt_n and content). Both on the CPU: the returning prompt may lie in other cells on each,
    which a GPU's kernels may sum otherwise."""
    mtp = ["--spec-type", "draft-mtp", "--spec-draft-n-max", "2", *ON_THE_CPU]
    _, ram_hit = chat(start_server(model, n_ctx=2048, n_parallel=2, extra_args=mtp))
    srv = start_server(model, n_ctx=2048, n_parallel=2,
                       extra_args=mtp + ["--cache-ram", cache_mib, "--preempt-disk", str(disk_dir(tmp_path))])
    first, back = chat(srv)
    assert back["timings"]["prompt_n"] == ram_hit["timings"]["prompt_n"] < first["timings"]["prompt_n"] // 4
    assert back["content"] == ram_hit["content"]
    return srv, srv.metrics()


def test_a_hybrid_models_cached_prompt_comes_back_from_disk_with_its_checkpoints_and_a_ram_hits_answer(
        start_server, qwen35_mtp_model: Path, tmp_path: Path) -> None:
    # recurrent + attention layers: a cached prompt carries context checkpoints (~2.4 MiB a prompt with
    # them); a 5 MiB RAM cache holds two of the seven conversations, the rest go to disk and back
    srv, m = hybrid_chat_back(start_server, qwen35_mtp_model, tmp_path, "5")
    assert m["n_prompt_cache_spilled_total"] >= 1 and m["n_prompt_cache_disk_hits_total"] == 1
    assert m["n_prompt_cache_disk_skipped_total"] == 0 and m["n_prompt_cache_disk_failures_total"] == 0
    log = logged(srv, "read back from the disk tier")
    assert re.search(r"\(\d+ shared with this request, \d+ context checkpoints\) read back from the disk tier", log)


def test_a_hybrid_models_prompt_larger_than_the_ram_cache_streams_to_disk_and_back_with_its_checkpoints(
        start_server, qwen35_mtp_model: Path, tmp_path: Path) -> None:
    # --cache-ram 1: every prompt (~2.4 MiB with its checkpoints, the MTP context's state beside the
    # target's) is larger than the whole RAM cache, which upstream skips: streamed from its slot to a
    # file, recurrent state and checkpoints included, and streamed back into a slot when it returns
    srv, m = hybrid_chat_back(start_server, qwen35_mtp_model, tmp_path, "1")
    assert m["n_prompt_cache_streamed_total"] >= 1 and m["n_prompt_cache_streamed_back_total"] == 1
    assert m["prompt_cache_bytes"] == 0  # none of them ever sat in the RAM cache
    assert m["n_prompt_cache_disk_skipped_total"] == 0 and m["n_prompt_cache_disk_failures_total"] == 0
    log = logged(srv, "streamed back from the disk tier")
    assert re.search(r"\(\d+ shared with this request, \d+ context checkpoints\) streamed back from the disk tier", log)


# --- --cache-persist: the disk tier's cached prompts across a restart ---

def persist_args(tmp_path: Path, n_ctx: int = 2048) -> dict[str, Any]:
    # a prompt taken back after the restart is answered as the first run answered it
    return {"n_ctx": n_ctx, "n_parallel": 2,
            "extra_args": ON_CPU_SMALL_CACHE + ["--preempt-disk", str(disk_dir(tmp_path)), "--cache-persist"]}


def first_run(start_server: Any, model: Path, tmp_path: Path) -> tuple[str, Any]:
    """A server that caches a long prompt to disk and exits cleanly: the prompt and its answer."""
    srv = start_server(model, **persist_args(tmp_path))
    prompt = long_prompt(300, shift=3)
    first = complete(srv, prompt, 16).json()
    for i in range(6):
        assert complete(srv, long_prompt(250, shift=50 + 9 * i), 16).status_code == 200
    assert srv.metrics()["n_prompt_cache_spilled_total"] >= 1
    srv.stop()
    assert srv.proc.returncode == 0
    return prompt, first


def cache_dirs(tmp_path: Path) -> list[Path]:
    return sorted(disk_dir(tmp_path).glob("llama-preempt-cache-*"))


def test_a_restart_with_the_same_model_and_flags_takes_the_prompt_files_back(
        start_server, stories_model: Path, tmp_path: Path) -> None:
    prompt, first = first_run(start_server, stories_model, tmp_path)
    (kept,) = cache_dirs(tmp_path)
    assert (kept / "index").is_file() and list(kept.glob("park-*.kv"))
    srv = start_server(stories_model, **persist_args(tmp_path))
    back = complete(srv, prompt, 16).json()
    assert back["timings"]["prompt_n"] <= 2  # no prefill after the restart
    assert back["content"] == first["content"]
    m = srv.metrics()
    assert m["n_prompt_cache_disk_hits_total"] == 1 and m["n_prompt_cache_disk_failures_total"] == 0
    logged(srv, "cached prompts of the last run taken back")
    assert not (kept / "index").exists()  # used once: a crash now leaves no index listing files it removed


def test_the_conversation_still_in_a_slot_at_exit_comes_back_after_a_restart(
        start_server, stories_model: Path, tmp_path: Path) -> None:
    # served last, never pushed into the cache by a later request: its cells are still in its slot
    srv = start_server(stories_model, **persist_args(tmp_path))
    prompt = long_prompt(300, shift=3)
    first = complete(srv, prompt, 16).json()
    assert srv.metrics()["n_prompt_cache_spilled_total"] == 0
    srv.stop()
    assert srv.proc.returncode == 0
    logged(srv, "prompts still in the slots at exit written to the disk tier: 1")
    srv = start_server(stories_model, **persist_args(tmp_path))
    back = complete(srv, prompt, 16).json()
    assert back["timings"]["prompt_n"] <= 2 and back["content"] == first["content"]
    assert srv.metrics()["n_prompt_cache_disk_hits_total"] == 1


def test_an_engine_with_cache_persist_leaves_its_prompts_to_the_next_engine(stories_model: Path, tmp_path: Path) -> None:
    args = persist_args(tmp_path)["extra_args"]
    prompt = long_prompt(300, shift=3)

    def ask(eng: Engine) -> Completion:
        req = eng.submit(prompt, n_predict=16, temperature=0, cache_prompt=True)
        eng.run(req)
        return req.completion()

    with Engine(stories_model, args, n_ctx=2048, n_parallel=2) as eng:
        first = ask(eng)  # its prompt is still in its slot when the Engine closes
    with Engine(stories_model, args, n_ctx=2048, n_parallel=2) as eng:
        back = ask(eng)
        assert eng.metrics()["n_prompt_cache_disk_hits_total"] == 1
    assert back.timings["prompt_n"] <= 2 and back.text == first.text


def test_a_different_context_size_ignores_and_removes_the_kept_prompts(
        start_server, stories_model: Path, tmp_path: Path) -> None:
    prompt, first = first_run(start_server, stories_model, tmp_path)
    (old,) = cache_dirs(tmp_path)
    srv = start_server(stories_model, **persist_args(tmp_path, n_ctx=1024))
    assert not old.exists()  # another model or flags: never usable, removed
    (mine,) = cache_dirs(tmp_path)
    assert mine.name != old.name
    back = complete(srv, prompt, 16).json()
    assert back["timings"]["prompt_n"] == first["timings"]["prompt_n"]
    assert srv.metrics()["n_prompt_cache_disk_hits_total"] == 0


def test_a_kept_prompt_file_changed_between_runs_is_prefilled_and_counted(
        start_server, stories_model: Path, tmp_path: Path) -> None:
    prompt, first = first_run(start_server, stories_model, tmp_path)
    (kept,) = cache_dirs(tmp_path)
    for f in kept.glob("park-*.kv"):  # a byte of every kept file changes on disk
        data = bytearray(f.read_bytes())
        data[len(data) // 2] ^= 0xFF
        f.write_bytes(bytes(data))
    srv = start_server(stories_model, **persist_args(tmp_path))
    back = complete(srv, prompt, 16).json()
    assert back["timings"]["prompt_n"] == first["timings"]["prompt_n"] and back["content"] == first["content"]
    m = srv.metrics()
    assert m["n_prompt_cache_disk_failures_total"] == 1
    assert srv.metrics().labeled["preempt_disk_failures_total"]["checksum"] == 1


def test_a_link_planted_at_the_kept_directorys_name_is_never_followed(
        start_server, stories_model: Path, tmp_path: Path) -> None:
    first_run(start_server, stories_model, tmp_path)
    (kept,) = cache_dirs(tmp_path)
    import shutil
    shutil.rmtree(kept)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep-me").write_text("not the server's")
    kept.symlink_to(elsewhere)
    srv = start_server(stories_model, **persist_args(tmp_path))
    logged(srv, "the prompt cache is not kept across restarts")
    for i in range(6):
        assert complete(srv, long_prompt(250, shift=9 * i), 8).status_code == 200
    srv.stop()
    assert kept.is_symlink() and sorted(p.name for p in elsewhere.iterdir()) == ["keep-me"]


def test_cache_persist_without_a_disk_tier_is_refused_naming_the_flag(stories_model: Path) -> None:
    import subprocess

    from llama_preempt.binary import server_binary

    p = subprocess.run([str(server_binary()), "-m", str(stories_model), "--cache-persist"], capture_output=True, text=True,
                       timeout=60)
    assert p.returncode != 0 and "--cache-persist needs --preempt-disk DIR" in p.stderr


def test_links_planted_in_the_kept_directory_are_never_followed(start_server, stories_model: Path, tmp_path: Path) -> None:
    # between two runs, the index and a kept file are replaced by links to a file that is not the server's
    prompt, first = first_run(start_server, stories_model, tmp_path)
    (kept,) = cache_dirs(tmp_path)
    victim = tmp_path / "victim"
    victim.write_text("not the server's")
    (kept / "index").unlink()
    (kept / "index").symlink_to(victim)
    files = sorted(kept.glob("park-*.kv"))
    files[0].unlink()
    files[0].symlink_to(victim)
    srv = start_server(stories_model, **persist_args(tmp_path))
    # a linked index is not read, a linked file not taken back: the other files are, from their own tokens
    logged(srv, "the index of the kept prompts was a link in its place, not read", f"{files[0].name}: a link, not a file")
    back = complete(srv, prompt, 16).json()
    assert back["timings"]["prompt_n"] == first["timings"]["prompt_n"] and back["content"] == first["content"]
    srv.stop()
    assert victim.read_text() == "not the server's"  # the links were removed, never followed
    assert not kept.exists() or not any(p.is_symlink() for p in kept.iterdir())
