"""Issue 65, the disk tier's and the prompt cache's half: a bad or partial file, a full or vanished
disk never ends the server. Each fault is made for real (a directory removed under the server, a
small tmpfs, a filler file, an index cut short) and each test proves what the server does and
counts: the answers stay exact, parks fall back and come back to disk, the log says it once.

The tmpfs tests mount a filesystem of their own (root only; skipped with the reason otherwise) and
always unmount it afterwards.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from helpers import ON_THE_CPU, complete, logged, long_prompt
from llama_preempt.server import ServerStartError

FORCED = {"LLAMA_SERVER_PREEMPT_EVERY": "8"}
# every park to disk, streamed to its file before the park returns; a recompute, when the disk
# cannot take it, gives the same answer (the CPU's batch-invariant kernels)
ON_LOOP = ["--preempt-mode", "swap", "--preempt-ram", "0", "--deterministic", *ON_THE_CPU]
RESERVE_MIB = 64  # disk_store::RESERVE: free space the tier keeps for everything else


def disk_args(d: Path, *more: str) -> list[str]:
    return ["--preempt-disk", str(d), *more]


def store_dirs(d: Path) -> list[Path]:
    return sorted(p for p in d.iterdir() if p.name.startswith("llama-preempt-"))


def reference(start_server: Any, model: Path, prompt: str, n: int) -> str:
    srv = start_server(model, n_ctx=512, n_parallel=2, preempt=False, extra_args=["--deterministic", *ON_THE_CPU])
    return complete(srv, prompt, n).json()["content"]


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Callable[[int], Path]]:
    """mount(size_mib): a tmpfs of that size at a new directory; every one unmounted afterwards."""
    mounted: list[Path] = []

    def mount(size_mib: int) -> Path:
        if os.geteuid() != 0:
            pytest.skip("mounting a tmpfs needs root")
        d = tmp_path / f"tmpfs-{len(mounted)}"
        d.mkdir()
        p = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mib}m,mode=0700", "tmpfs", str(d)],
                           capture_output=True, text=True)
        if p.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {p.stderr.strip()}")
        mounted.append(d)
        return d

    yield mount
    for d in reversed(mounted):
        subprocess.run(["umount", "-l", str(d)], capture_output=True)


def fill(d: Path, leave_mib: float) -> Path:
    """A filler file that leaves about `leave_mib` MiB free on d's filesystem."""
    st = os.statvfs(d)
    free = st.f_bavail * st.f_frsize
    filler = d / "filler"
    size = max(0, free - int(leave_mib * 1048576))
    with open(filler, "wb") as f:
        chunk = b"\0" * (1 << 20)
        while size > 0:
            f.write(chunk[:min(size, len(chunk))])
            size -= len(chunk)
    return filler


def disk_parks(srv: Any) -> int:
    return int(srv.metrics().labeled["preempt_parks_by_tier_total"]["disk"])


# --- 1. the store's directory removed under the server ---

def test_a_store_directory_removed_mid_run_is_made_again_and_later_parks_go_to_disk(
        start_server, stories_model: Path, tmp_path: Path) -> None:
    prompt = long_prompt(150)
    ref = reference(start_server, stories_model, prompt, 64)
    d = tmp_path / "disk"
    d.mkdir()
    srv = start_server(stories_model, n_ctx=512, n_parallel=2, env=FORCED, extra_args=[*ON_LOOP, *disk_args(d)])
    assert complete(srv, prompt, 64).json()["content"] == ref
    before = disk_parks(srv)
    assert before >= 4
    (first,) = store_dirs(d)
    for p in d.iterdir():  # rm -rf DIR/*
        shutil.rmtree(p)
    assert complete(srv, prompt, 64).json()["content"] == ref
    (again,) = store_dirs(d)
    assert again.name != first.name and oct(again.stat().st_mode & 0o777) == "0o700" and (again / "lock").is_file()
    m = srv.metrics()
    assert m["n_disk_dir_remade_total"] == 1  # once per removal
    assert disk_parks(srv) >= before + 4  # the parks after it went to disk again
    logged(srv, f"the disk tier's directory {first} was removed under the server; made again as {again}")
    srv.stop()
    assert store_dirs(d) == []  # the new one goes at exit as the first would have


# --- 2. a filesystem too small for the tier ---

def test_a_filesystem_within_the_reserve_is_a_warning_in_the_log_and_props_and_parks_recompute(
        start_server, stories_model: Path, tmpfs) -> None:
    small = tmpfs(16)
    prompt = long_prompt(150)
    ref = reference(start_server, stories_model, prompt, 64)
    srv = start_server(stories_model, n_ctx=512, n_parallel=2, env=FORCED, extra_args=[*ON_LOOP, *disk_args(small)])
    warning = srv.props()["llama_preempt"]["preempt_disk_warning"]
    assert warning and "can never hold a parked slot" in warning and str(small) in warning
    logged(srv, "can never hold a parked slot or a prompt file")
    assert complete(srv, prompt, 64).json()["content"] == ref
    by = srv.metrics().labeled
    assert by["preempt_parks_by_tier_total"]["disk"] == 0
    assert by["preempt_parks_by_choice_total"]["over_budget"] >= 4


def test_props_has_no_disk_warning_on_a_filesystem_that_can_hold_parks(start_server, stories_model: Path,
                                                                       tmp_path: Path) -> None:
    srv = start_server(stories_model, n_ctx=256, n_parallel=2, extra_args=disk_args(tmp_path))
    assert srv.props()["llama_preempt"]["preempt_disk_warning"] is None


@pytest.mark.parametrize("size_mib,mib", [(16, "1"), (80, "32")], ids=["within-the-reserve", "beyond-what-is-left"])
def test_an_explicit_disk_limit_the_filesystem_can_never_hold_is_a_startup_error_naming_the_flag(
        start_server, stories_model: Path, tmpfs, size_mib: int, mib: str) -> None:
    d = tmpfs(size_mib)
    with pytest.raises(ServerStartError, match=re.escape(f"--preempt-disk-mib {mib} asks for more than the filesystem")) as e:
        start_server(stories_model, n_ctx=256, n_parallel=2, extra_args=disk_args(d, "--preempt-disk-mib", mib))
    assert re.match(r"llama-server exited with -?[1-9]", str(e.value)), e.value


def test_an_explicit_disk_limit_the_filesystem_can_hold_starts(start_server, stories_model: Path, tmpfs) -> None:
    d = tmpfs(80)  # 16 MiB beyond the reserve
    srv = start_server(stories_model, n_ctx=256, n_parallel=2, extra_args=disk_args(d, "--preempt-disk-mib", "8"))
    props = srv.props()["llama_preempt"]
    assert props["preempt_disk_mib"] == 8 and props["preempt_disk_warning"] is None


# --- 3. the filesystem filling during a run ---

def test_a_full_filesystem_is_counted_as_full_and_logged_once_per_episode_with_exact_answers(
        start_server, stories_model: Path, tmpfs) -> None:
    d = tmpfs(RESERVE_MIB + 16)
    prompt = long_prompt(150)
    ref = reference(start_server, stories_model, prompt, 64)
    srv = start_server(stories_model, n_ctx=512, n_parallel=2, env=FORCED,
                       extra_args=[*ON_LOOP, *disk_args(d, "--preempt-disk-mib", "8")])
    assert complete(srv, prompt, 64).json()["content"] == ref
    on_disk = disk_parks(srv)
    assert on_disk >= 4 and srv.metrics()["preempt_disk_full_total"] == 0

    filler = fill(d, RESERVE_MIB - 1)  # below the reserve: no room for any park
    for _ in range(2):  # one episode, however many parks it refuses
        assert complete(srv, prompt, 64).json()["content"] == ref
    m = srv.metrics()
    assert m["preempt_disk_full_total"] >= 8
    assert disk_parks(srv) == on_disk
    assert m.labeled["preempt_parks_by_choice_total"]["over_budget"] >= 8
    logged(srv, "is full:")
    assert srv.log_text().count("preemption: the filesystem of the disk tier") == 1

    filler.unlink()  # room again: parks go to disk, and the episode ends with the first write
    assert complete(srv, prompt, 64).json()["content"] == ref
    assert disk_parks(srv) > on_disk
    logged(srv, "the disk tier's filesystem has room again")

    fill(d, RESERVE_MIB - 1)  # a second episode: said again, once
    assert complete(srv, prompt, 64).json()["content"] == ref
    assert srv.log_text().count("preemption: the filesystem of the disk tier") == 2


def test_a_budget_with_no_room_left_is_not_counted_as_a_full_disk(start_server, stories_model: Path,
                                                                   tmp_path: Path) -> None:
    # --preempt-disk-mib 1 against states of ~100 KiB each, eight parks at once: the budget, an
    # operator's choice, refuses some; the disk itself has room
    prompts = [long_prompt(150, shift=7 * i) for i in range(2)]
    srv = start_server(stories_model, n_ctx=512, n_parallel=2, env=FORCED,
                       extra_args=[*ON_LOOP, *disk_args(tmp_path, "--preempt-disk-mib", "1")])
    for p in prompts:
        assert complete(srv, p, 64).status_code == 200
    assert srv.metrics()["preempt_disk_full_total"] == 0


# --- 4. what is left at exit ---

def test_a_clean_exit_after_write_faults_leaves_nothing_behind(start_server, stories_model: Path,
                                                               tmp_path: Path) -> None:
    prompt = long_prompt(150)
    for fault in ("write", "full", "remove"):
        d = tmp_path / fault
        d.mkdir()
        srv = start_server(stories_model, n_ctx=512, n_parallel=2,
                           env={**FORCED, "LLAMA_SERVER_PREEMPT_DISK_FAIL": fault}, extra_args=[*ON_LOOP, *disk_args(d)])
        assert complete(srv, prompt, 64).status_code == 200
        assert srv.metrics()["n_preempt_total"] >= 4
        srv.stop()
        assert srv.proc.returncode == 0
        assert list(d.iterdir()) == [], fault
        assert "could not be emptied at exit" not in srv.log_text()


def test_what_a_clean_exit_cannot_remove_is_named_in_the_log(start_server, stories_model: Path,
                                                             tmp_path: Path) -> None:
    srv = start_server(stories_model, n_ctx=512, n_parallel=2, env=FORCED, extra_args=[*ON_LOOP, *disk_args(tmp_path)])
    (mine,) = store_dirs(tmp_path)
    (mine / "notes.txt").write_text("an operator's file, not the server's to remove")
    assert complete(srv, long_prompt(150), 32).status_code == 200
    srv.stop()
    assert srv.proc.returncode == 0
    assert sorted(p.name for p in mine.iterdir()) == ["notes.txt"]  # its own files went, the lock too
    logged(srv, f"the disk tier's directory {mine} could not be emptied at exit, left behind: "
                "notes.txt: not a file this server makes")


# --- 5. the prompt cache's index damaged between runs ---

SMALL_CACHE = ["--cache-ram", "1", "--deterministic", *ON_THE_CPU]


def persist_args(d: Path, n_ctx: int = 2048, n_parallel: int = 2) -> dict[str, Any]:
    return {"n_ctx": n_ctx, "n_parallel": n_parallel, "extra_args": [*SMALL_CACHE, *disk_args(d, "--cache-persist")]}


def cached(srv: Any, prompt: str, n: int = 16) -> Any:
    return srv.post("/completion", {"prompt": prompt, "n_predict": n, "temperature": 0, "cache_prompt": True}).json()


def first_run(start_server: Any, model: Path, d: Path) -> tuple[str, Any]:
    """A long prompt pushed to disk by six others, then a clean exit: the prompt and its answer."""
    srv = start_server(model, **persist_args(d))
    prompt = long_prompt(300, shift=3)
    first = cached(srv, prompt)
    for i in range(6):
        assert cached(srv, long_prompt(250, shift=50 + 9 * i), 8)["tokens_predicted"] == 8
    assert srv.metrics()["n_prompt_cache_spilled_total"] >= 1
    srv.stop()
    assert srv.proc.returncode == 0
    return prompt, first


@pytest.mark.parametrize("damage", ["truncated", "deleted"])
def test_a_damaged_or_missing_prompt_index_is_rebuilt_from_the_files_and_they_are_reused(
        start_server, stories_model: Path, tmp_path: Path, damage: str) -> None:
    d = tmp_path / "disk"
    d.mkdir()
    prompt, first = first_run(start_server, stories_model, d)
    (kept,) = d.glob("llama-preempt-cache-*")
    n_files = len(list(kept.glob("park-*.kv")))
    index = kept / "index"
    if damage == "truncated":
        data = index.read_bytes()
        index.write_bytes(data[: len(data) // 2])
    else:
        index.unlink()
    srv = start_server(stories_model, **persist_args(d))
    why = "damaged" if damage == "truncated" else "missing"
    logged(srv, f"the index of the kept prompts was {why}", f"{n_files} prompt files rebuilt from their own tokens, 0 dropped")
    back = cached(srv, prompt)
    assert back["timings"]["prompt_n"] <= 2 and back["content"] == first["content"]
    m = srv.metrics()
    assert m["n_prompt_cache_disk_hits_total"] == 1 and m["n_prompt_cache_disk_failures_total"] == 0


def test_prompt_files_of_an_older_version_are_dropped_with_the_reason(start_server, stories_model: Path,
                                                                      tmp_path: Path) -> None:
    d = tmp_path / "disk"
    d.mkdir()
    prompt, first = first_run(start_server, stories_model, d)
    (kept,) = d.glob("llama-preempt-cache-*")
    files = sorted(kept.glob("park-*.kv"))
    for f in files:  # as the last version wrote them: its magic
        data = bytearray(f.read_bytes())
        data[:8] = b"LPKVSEQ1"
        f.write_bytes(bytes(data))
    srv = start_server(stories_model, **persist_args(d))
    logged(srv, f"0 prompt files rebuilt from their own tokens, {len(files)} dropped",
           "written by an older version (LPKVSEQ1")
    back = cached(srv, prompt)
    assert back["timings"]["prompt_n"] == first["timings"]["prompt_n"] and back["content"] == first["content"]
    assert srv.metrics()["n_prompt_cache_disk_hits_total"] == 0
    assert list(kept.glob("park-*.kv")) == [] or all(f.read_bytes()[:8] == b"LPKVSEQ2" for f in kept.glob("park-*.kv"))


def test_a_kept_cache_directory_removed_mid_run_is_made_again_under_its_name_and_kept(
        start_server, stories_model: Path, tmp_path: Path) -> None:
    """--cache-persist: the directory the next run finds by its key is made again with the same name;
    the prompts spilled after the removal are kept at exit and taken back by the next run."""
    d = tmp_path / "disk"
    d.mkdir()
    srv = start_server(stories_model, **persist_args(d))
    (kept,) = d.glob("llama-preempt-cache-*")
    shutil.rmtree(kept)
    prompt = long_prompt(300, shift=3)
    first = cached(srv, prompt)
    for i in range(6):  # the prompt leaves RAM for the disk tier, which finds its directory gone
        assert cached(srv, long_prompt(250, shift=50 + 9 * i), 8)["tokens_predicted"] == 8
    m = srv.metrics()
    assert m["n_disk_dir_remade_total"] == 1 and m["n_prompt_cache_spilled_total"] >= 1
    logged(srv, f"the disk tier's directory {kept} was removed under the server; made again as {kept}")
    srv.stop()
    assert srv.proc.returncode == 0 and kept.is_dir() and list(kept.glob("park-*.kv"))
    again = start_server(stories_model, **persist_args(d))
    back = cached(again, prompt)
    assert back["timings"]["prompt_n"] <= 2 and back["content"] == first["content"]
    assert again.metrics()["n_prompt_cache_disk_hits_total"] == 1


# --- 6. a read back counts as a hit only once its state is in the slot ---

def test_prompts_read_back_after_a_restart_count_as_hits_only_when_restored_into_their_slot(
        start_server, stories_model: Path, tmp_path: Path) -> None:
    # three slots in a pool that holds two of the prompts at once: the three come back together
    # after a restart, and the third finds no room for its cells while the other two run
    d = tmp_path / "disk"
    d.mkdir()
    prompts = [long_prompt(300, shift=3 + 40 * i) for i in range(3)]
    srv = start_server(stories_model, **persist_args(d, n_ctx=1024, n_parallel=3))
    first = [cached(srv, p) for p in prompts]
    srv.stop()
    assert srv.proc.returncode == 0
    srv = start_server(stories_model, **persist_args(d, n_ctx=1024, n_parallel=3))
    with ThreadPoolExecutor(3) as ex:
        back = list(ex.map(lambda p: cached(srv, p), prompts))
    assert [b["content"] for b in back] == [f["content"] for f in first]
    n_back = sum(b["timings"]["prompt_n"] <= 2 for b in back)
    m = srv.metrics()
    # each hit is a state restored into its slot (one may still give way to the pool's room before
    # its slot runs: counted, its tokens prefilled); none is a read whose restore was refused
    assert 1 <= n_back <= m["n_prompt_cache_disk_hits_total"] <= 3
    assert m["n_prompt_cache_load_failures_total"] == 0
    text = srv.log_text()
    assert "failed to load prompt from cache" not in text and "could not be restored into slot" not in text
