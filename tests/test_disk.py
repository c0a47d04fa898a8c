"""The disk tier (--preempt-disk): parked slots' state in files, read back byte-exact, every failure
ending in RECOMPUTE with the right answer, nothing left behind.

Test knobs used here: LLAMA_SERVER_PREEMPT_DISK_ALWAYS=1 sends every SWAP park to disk (in the
background when its host copy fits --preempt-ram); with --preempt-ram 0 every disk park is streamed
from the pool to its file before the park returns, one 1 MiB chunk at a time, and back the same way; LLAMA_SERVER_PREEMPT_DISK_FAIL=KIND makes every disk park meet that
failure; LLAMA_SERVER_PREEMPT_DISK_HOLD_MS=N keeps each write in flight N ms;
LLAMA_SERVER_PREEMPT_VERIFY=1 compares every park with upstream's serializer, and every disk read
back with upstream's bytes kept from the park, byte for byte.
"""
from __future__ import annotations

import os
import re
import signal
import stat
from pathlib import Path
from typing import Any

import pytest

from helpers import (ALL_DECODE, ON_THE_CPU, THREE_PROMPTS, BackgroundStream, complete, complete_all, layers_on_the_cpu,
                     logged, long_prompt, open_raw_stream, park_lines, run_cli, wait_for_parked, wait_until)
from llama_preempt.engine import Completion, Engine
from llama_preempt.server import LlamaServer, ServerStartError

FORCED = {"LLAMA_SERVER_PREEMPT_EVERY": "8"}
VERIFIED = {**FORCED, "LLAMA_SERVER_PREEMPT_VERIFY": "1"}
ALWAYS = {"LLAMA_SERVER_PREEMPT_DISK_ALWAYS": "1"}
# every park to disk, streamed to its file before the park returns (no RAM to write it from in the background)
ON_LOOP = ["--preempt-mode", "swap", "--preempt-ram", "0"]
MTP_ARGS = ["--spec-type", "draft-mtp", "--spec-draft-n-max", "2"]


def disk_args(d: Path, *more: str) -> list[str]:
    return ["--preempt-disk", str(d), *more]


def our_dirs(d: Path) -> list[Path]:
    return sorted(p for p in d.iterdir() if p.name.startswith("llama-preempt-"))


def park_files(d: Path) -> list[Path]:
    return sorted(d.glob("llama-preempt-*/park-*.kv"))


def assert_nothing_on_disk(srv: LlamaServer, d: Path) -> None:
    m = srv.metrics()
    assert m["preempt_disk_bytes"] == 0
    assert m["preempt_disk_writes_in_flight"] == 0
    assert m["preempt_ram_bytes"] == 0
    assert park_files(d) == []


# --- byte-exact: forced disk parks against the unparked answer ---

@pytest.mark.parametrize("flash", ["on", "off"], ids=["fa-on", "fa-off"])
def test_forced_disk_parks_read_back_upstreams_bytes_and_give_the_unparked_answer(
        start_server, stories_model: Path, tmp_path: Path, flash: str) -> None:
    # a prompt of 150 words: each park's state (640 bytes a token) is large enough to time
    prompt = long_prompt(150)
    ref = complete(start_server(stories_model, n_ctx=512, n_parallel=2, preempt=False, extra_args=["-fa", flash]),
                   prompt, 96).json()
    srv = start_server(stories_model, n_ctx=512, n_parallel=2, env=VERIFIED,
                       extra_args=["-fa", flash, *ON_LOOP, *disk_args(tmp_path)])
    got = complete(srv, prompt, 96).json()
    assert got["tokens_predicted"] == 96
    assert got["content"] == ref["content"]
    m = srv.metrics()
    n = m["n_preempt_total"]
    assert n >= 8
    by = srv.metrics().labeled
    assert by["preempt_parks_by_tier_total"]["disk"] == n
    assert by["preempt_parks_by_choice_total"]["ram_full"] == n  # --preempt-ram 0: no RAM left for any
    assert by["preempt_restores_by_tier_total"]["disk"] == m["n_resume_total"] == n
    # --preempt-ram 0: no park fits what parks may hold, so each is streamed from the pool to its file
    # and back through one staging chunk (upstream's serializer and its per-slice copy, nothing the
    # guard holds them to); the guard reads each restore's cells back against the file's bytes
    assert m["n_swap_verify_total"] == n
    assert m["n_swap_verify_mismatch_total"] == 0
    assert m["n_disk_write_bytes_total"] == m["n_disk_read_bytes_total"] > 0
    assert m["n_disk_restore_from_memory_total"] == 0
    assert sum(by["preempt_disk_failures_total"].values()) == 0
    # the disk rates are measured from its own files
    assert m["preempt_disk_write_bytes_per_second"] != 500_000_000
    assert m["preempt_disk_read_bytes_per_second"] != 1_000_000_000
    assert_nothing_on_disk(srv, tmp_path)
    logged(srv, "parked by swap to disk, written")
    logged(srv, "by a stream to its file")
    logged(srv, "restored by swap from disk")


def test_background_writes_free_their_ram_and_the_next_back_is_ready_ahead(
        start_server, stories_model: Path, tmp_path: Path) -> None:
    # parked slots stay parked 50 ms, so each write finishes: its host copy is freed, except the
    # next slot back's, which keeps it; B starts once A was parked, so the two come back at
    # different times and the one that becomes next back after its copy was freed has its file
    # read while A decodes. A and B decode together and are parked in turn, and each answer must
    # be the one it gives alone: --deterministic, where the kernels are the CPU's (on a GPU the
    # byte checks of every copy are the proof)
    body = {"n_predict": 64, "temperature": 0, "ignore_eos": True, "cache_prompt": False}
    plain = start_server(stories_model, n_ctx=1024, n_parallel=2, preempt=False, deterministic=True)
    refs = [complete(plain, p, 64).json()["content"] for p in THREE_PROMPTS[:2]]
    srv = start_server(stories_model, n_ctx=1024, n_parallel=2, deterministic=True,
                       env={**VERIFIED, **ALWAYS, "LLAMA_SERVER_PREEMPT_HOLD_MS": "50"},
                       extra_args=["--preempt-mode", "swap", *disk_args(tmp_path)])
    a = BackgroundStream(srv, {**body, "prompt": THREE_PROMPTS[0]})
    wait_for_parked(srv)
    b = complete(srv, THREE_PROMPTS[1], 64).json()["content"]
    got_a = Completion.from_stream(a.join()).text
    if layers_on_the_cpu():
        assert [got_a, b] == refs
    m = srv.metrics()
    assert m["n_preempt_total"] >= 10
    assert srv.metrics().labeled["preempt_parks_by_tier_total"]["disk"] == m["n_preempt_total"]
    assert m["n_disk_read_ahead_total"] >= 1
    assert m["n_disk_restore_from_memory_total"] >= 1  # the next back kept its host copy
    assert m["n_disk_read_bytes_total"] > 0
    assert m["n_swap_verify_mismatch_total"] == 0
    logged(srv, "parked by swap to disk, written in the background")
    assert_nothing_on_disk(srv, tmp_path)


@pytest.mark.parametrize("flash", ["on", "off"], ids=["fa-on", "fa-off"])
def test_disk_parks_on_the_hybrid_mtp_model_give_the_unparked_answer(
        start_server, qwen35_mtp_model: Path, tmp_path: Path, flash: str) -> None:
    # recurrent state, attention cells and the MTP context, all through one file
    ref = complete(start_server(qwen35_mtp_model, n_ctx=1024, n_parallel=2, extra_args=MTP_ARGS + ["-fa", flash]),
                   "Once upon a time", 64).json()
    srv = start_server(qwen35_mtp_model, n_ctx=1024, n_parallel=2, env=VERIFIED,
                       extra_args=MTP_ARGS + ["-fa", flash, *ON_LOOP, *disk_args(tmp_path)])
    got = complete(srv, "Once upon a time", 64).json()
    assert got["tokens_predicted"] == 64
    assert got["content"] == ref["content"]
    m = srv.metrics()
    assert m["n_preempt_total"] >= 4
    assert srv.metrics().labeled["preempt_restores_by_tier_total"]["disk"] == m["n_preempt_total"]
    assert m["n_swap_verify_total"] == m["n_preempt_total"]  # streamed: each restore's cells against its file
    assert m["n_swap_verify_mismatch_total"] == 0
    assert_nothing_on_disk(srv, tmp_path)


def test_a_resume_whose_file_is_still_being_written_restores_from_the_host_copy(
        start_server, stories_model: Path, tmp_path: Path) -> None:
    ref = complete(start_server(stories_model, n_ctx=512, n_parallel=2, preempt=False), "Once upon a time", 64).json()
    srv = start_server(stories_model, n_ctx=512, n_parallel=2,
                       env={**VERIFIED, **ALWAYS, "LLAMA_SERVER_PREEMPT_DISK_HOLD_MS": "600000"},
                       extra_args=["--preempt-mode", "swap", *disk_args(tmp_path)])
    got = complete(srv, "Once upon a time", 64).json()
    assert got["content"] == ref["content"]
    m = srv.metrics()
    assert m["n_preempt_total"] >= 6
    assert m["n_disk_restore_from_memory_total"] == m["n_resume_total"] == m["n_preempt_total"]
    assert m["n_disk_read_bytes_total"] == 0
    assert m["n_swap_verify_mismatch_total"] == 0
    assert_nothing_on_disk(srv, tmp_path)  # each file dropped while it was still being written


def test_a_write_in_flight_holds_its_ram_against_the_budget(start_server, stories_model: Path, tmp_path: Path) -> None:
    srv = start_server(stories_model, n_ctx=512, n_parallel=2,
                       env={**FORCED, **ALWAYS, "LLAMA_SERVER_PREEMPT_HOLD_MS": "600000",
                            "LLAMA_SERVER_PREEMPT_DISK_HOLD_MS": "600000"},
                       extra_args=["--preempt-mode", "swap", *disk_args(tmp_path)])
    sock = open_raw_stream(srv, "Once upon a time", 400)
    parked = wait_for_parked(srv)
    assert parked["preempt_tier"] == "disk"
    assert parked["preempt_ram_bytes"] > 0  # the host copy, until its file is written
    assert parked["preempt_disk_bytes"] == parked["preempt_ram_bytes"]
    m = wait_until(lambda: (lambda m: m if m["preempt_disk_writes_in_flight"] == 1 else None)(srv.metrics()), 30,
                   "the write to be in flight")
    assert m["preempt_ram_bytes"] == parked["preempt_ram_bytes"]
    assert m["preempt_disk_bytes"] == parked["preempt_disk_bytes"]
    sock.close()
    wait_until(lambda: srv.metrics()["requests_processing"] == 0, 30, "the cancelled request to end")
    assert_nothing_on_disk(srv, tmp_path)


# --- an overloaded pool, a tiny RAM budget ---

@pytest.mark.parametrize("mode,ram", [("swap", "0"), ("swap", "1"), ("auto", "1")])
def test_an_overloaded_pool_with_a_tiny_ram_budget_finishes_every_request_by_disk(
        start_server, stories_model: Path, tmp_path: Path, mode: str, ram: str) -> None:
    # four chats of about 900 tokens that each fit the 2048-cell pool alone but not together (two
    # at a time); f32 cells (1280 bytes a token): the first victim (about 510 tokens) fits 1 MiB of
    # RAM, the next ones do not and go to disk (with no RAM, all of them). In auto, prefill priced
    # at 1 token/s makes every recompute dearer than a disk park.
    # (--deterministic: beside the others, each answer is the one it gives alone, with the CPU's
    # kernels, on every build: a GPU's follow the batch)
    prompts = [long_prompt(100, shift=k) for k in range(4)]
    cache = ["-ctk", "f32", "-ctv", "f32", "--deterministic", *ON_THE_CPU]
    alone = start_server(stories_model, n_ctx=2048, n_parallel=1, preempt=False, extra_args=cache)
    refs = [complete(alone, p, 800).json()["content"] for p in prompts]
    env = {"LLAMA_SERVER_PREEMPT_RATES": "10,10,1,1,1"} if mode == "auto" else {}
    srv = start_server(stories_model, n_ctx=2048, n_parallel=4, env=env,
                       extra_args=[*cache, "--preempt-mode", mode, "--preempt-ram", ram, *disk_args(tmp_path), *ALL_DECODE])
    got = [r.json()["content"] for r in complete_all(srv, prompts, 800)]
    assert got == refs
    m = srv.metrics()
    by = srv.metrics().labeled
    assert by["preempt_parks_by_tier_total"]["disk"] >= 1
    assert by["preempt_parks_by_tier_total"]["recompute"] == 0
    choices = by["preempt_parks_by_choice_total"]
    assert choices["ram_full"] >= 1
    assert choices["ram_full"] + choices["disk_cheaper"] == by["preempt_parks_by_tier_total"]["disk"]
    if ram == "0":
        assert by["preempt_parks_by_tier_total"]["ram"] == 0
    assert m["n_recompute_tokens_total"] == 0
    assert m["n_resume_total"] == m["n_preempt_total"]
    assert_nothing_on_disk(srv, tmp_path)


# --- every failure ends in RECOMPUTE with the right answer ---

FAULTS = [  # (LLAMA_SERVER_PREEMPT_DISK_FAIL, the kind counted, when it strikes)
    ("write", "write", "park"),
    ("full", "full", "park"),
    ("read", "read", "resume"),
    ("remove", "missing", "resume"),
    ("corrupt", "checksum", "resume"),
    ("truncate", "short_read", "resume"),
]


@pytest.mark.parametrize("fault,kind,when", FAULTS, ids=[f[0] for f in FAULTS])
def test_a_disk_failure_recomputes_the_slot_with_the_right_answer(
        start_server, stories_model: Path, tmp_path: Path, fault: str, kind: str, when: str) -> None:
    # --deterministic: a recompute (the tokens re-prefilled in one batch) gives the same tokens as the
    # uninterrupted run, with the CPU's kernels, on every build (a GPU's follow the batch)
    det = ["--deterministic", *ON_THE_CPU]
    ref = complete(start_server(stories_model, n_ctx=512, n_parallel=2, preempt=False, extra_args=det),
                   "Once upon a time", 64).json()
    srv = start_server(stories_model, n_ctx=512, n_parallel=2, env={**FORCED, "LLAMA_SERVER_PREEMPT_DISK_FAIL": fault},
                       extra_args=[*det, *ON_LOOP, *disk_args(tmp_path)])
    got = complete(srv, "Once upon a time", 64).json()
    assert got["tokens_predicted"] == 64
    assert got["content"] == ref["content"]
    m = srv.metrics()
    by = srv.metrics().labeled
    n = m["n_preempt_total"]
    assert n >= 4
    assert by["preempt_disk_failures_total"][kind] >= 1
    assert sum(v for k, v in by["preempt_disk_failures_total"].items() if k != kind) == 0
    assert m["n_recompute_tokens_total"] > 0
    if when == "park":  # the write fails before the park ends: it parks by recompute at once
        assert by["preempt_parks_by_choice_total"]["swap_failed"] == n
        assert by["preempt_parks_by_tier_total"]["recompute"] == n
    else:  # written, then the read back fails: the resume recomputes
        assert by["preempt_parks_by_tier_total"]["disk"] == n
        assert by["preempt_restores_by_tier_total"]["recompute"] == n
        assert m["n_swap_restore_fail_total"] == n
    logged(srv, f"failed ({kind})")
    assert_nothing_on_disk(srv, tmp_path)


@pytest.mark.parametrize("fault", ["write", "full"])
def test_a_background_write_that_fails_keeps_the_host_copy(start_server, stories_model: Path, tmp_path: Path,
                                                           fault: str) -> None:
    # written in the background, the host copy (within --preempt-ram) is still there when the file
    # fails: the slot stays parked in RAM and comes back exact, nothing recomputed
    ref = complete(start_server(stories_model, n_ctx=512, n_parallel=2, preempt=False), "Once upon a time", 64).json()
    srv = start_server(stories_model, n_ctx=512, n_parallel=2,
                       env={**FORCED, **ALWAYS, "LLAMA_SERVER_PREEMPT_HOLD_MS": "50",
                            "LLAMA_SERVER_PREEMPT_DISK_FAIL": fault},
                       extra_args=["--preempt-mode", "swap", *disk_args(tmp_path)])
    got = complete(srv, "Once upon a time", 64).json()
    assert got["content"] == ref["content"]
    m = srv.metrics()
    by = srv.metrics().labeled
    n = m["n_preempt_total"]
    assert n >= 4 and by["preempt_parks_by_tier_total"]["disk"] == n
    assert by["preempt_disk_failures_total"][fault] == n
    assert by["preempt_restores_by_tier_total"]["ram"] == n
    assert m["n_recompute_tokens_total"] == 0 and m["n_swap_restore_fail_total"] == 0
    logged(srv, f"writing its file in the background failed ({fault})")
    logged(srv, "kept in host RAM")
    assert_nothing_on_disk(srv, tmp_path)


def test_a_write_waits_for_the_parks_transfer_to_host_ram(start_server, stories_model: Path, tmp_path: Path) -> None:
    # each park's copy counts as in flight 20 ms (on a device the transfer to host RAM runs on
    # behind the next decode): its write is queued held, its bytes taken from the disk budget, and
    # starts once the transfer settled
    ref = complete(start_server(stories_model, n_ctx=512, n_parallel=2, preempt=False), "Once upon a time", 64).json()
    srv = start_server(stories_model, n_ctx=512, n_parallel=2,
                       env={**FORCED, **ALWAYS, "LLAMA_SERVER_PREEMPT_HOLD_MS": "60",
                            "LLAMA_SERVER_PREEMPT_COPY_HOLD_MS": "20"},
                       extra_args=["--preempt-mode", "swap", *disk_args(tmp_path)])
    got = complete(srv, "Once upon a time", 64).json()
    assert got["content"] == ref["content"]
    m = srv.metrics()
    assert m["n_preempt_total"] >= 4
    assert srv.metrics().labeled["preempt_parks_by_tier_total"]["disk"] == m["n_preempt_total"]
    assert m["n_disk_write_bytes_total"] > 0
    assert sum(srv.metrics().labeled["preempt_disk_failures_total"].values()) == 0
    assert_nothing_on_disk(srv, tmp_path)


# --- nothing left behind, nobody else's ---

def test_files_are_private_and_a_cancelled_requests_file_goes_at_once(
        start_server, stories_model: Path, tmp_path: Path) -> None:
    srv = start_server(stories_model, n_ctx=512, n_parallel=2, env={**FORCED, "LLAMA_SERVER_PREEMPT_HOLD_MS": "600000"},
                       extra_args=[*ON_LOOP, *disk_args(tmp_path)])
    sock = open_raw_stream(srv, "Once upon a time", 400)
    parked = wait_for_parked(srv)
    assert parked["preempt_tier"] == "disk" and parked["preempt_mode"] == "swap"
    assert parked["preempt_disk_bytes"] > 0 and parked["preempt_ram_bytes"] == 0
    [ours] = our_dirs(tmp_path)
    assert ours.name.startswith(f"llama-preempt-{srv.proc.pid}-")
    assert stat.S_IMODE(ours.stat().st_mode) == 0o700
    [f] = park_files(tmp_path)
    assert stat.S_IMODE(f.stat().st_mode) == 0o600
    assert f.stat().st_size > parked["preempt_disk_bytes"]  # the state and its header
    assert srv.metrics()["preempt_disk_bytes"] == parked["preempt_disk_bytes"]

    sock.close()  # the client goes away while its slot is parked on disk
    wait_until(lambda: park_files(tmp_path) == [], 30, "the cancelled request's file to be removed")
    wait_until(lambda: srv.metrics()["requests_processing"] == 0, 30, "the request to end")
    assert_nothing_on_disk(srv, tmp_path)
    assert complete(srv, "Once", 8).json()["tokens_predicted"] == 8  # still serving


def test_a_killed_servers_files_are_removed_at_the_next_start_and_a_live_ones_kept(
        start_server, stories_model: Path, tmp_path: Path) -> None:
    disk = tmp_path / "disk"
    disk.mkdir()

    def server(**env: str) -> LlamaServer:
        return start_server(stories_model, n_ctx=512, n_parallel=2, env=env, extra_args=[*ON_LOOP, *disk_args(disk)])

    crashed = server(**FORCED, LLAMA_SERVER_PREEMPT_HOLD_MS="600000")
    live = None
    try:
        sock = open_raw_stream(crashed, "Once upon a time", 400)
        wait_for_parked(crashed)
        assert len(park_files(disk)) == 1
        assert crashed.proc is not None
        crashed.proc.send_signal(signal.SIGKILL)  # no clean-up: its directory and file stay
        crashed.proc.wait(timeout=30)
        sock.close()
        [left] = our_dirs(disk)
        assert left.name.startswith(f"llama-preempt-{crashed.proc.pid}-") and len(park_files(disk)) == 1

        live = server()
        assert left not in our_dirs(disk) and park_files(disk) == []
        logged(live, "removed 1 left by servers that are gone")
        [mine] = our_dirs(disk)
        assert mine.name.startswith(f"llama-preempt-{live.proc.pid}-")  # type: ignore[union-attr]

        other = server()  # a second live server in the same directory keeps the first one's
        try:
            assert len(our_dirs(disk)) == 2 and mine in our_dirs(disk)
            assert "left by servers that are gone" not in other.log_text()
        finally:
            other.stop()
        assert our_dirs(disk) == [mine]  # a clean exit removes its own directory
    finally:
        crashed.stop()
        if live is not None:
            live.stop()
    assert our_dirs(disk) == []


def test_sigterm_with_a_slot_parked_on_disk_exits_0_and_removes_its_directory(
        start_server, stories_model: Path, tmp_path: Path) -> None:
    disk = tmp_path / "disk"
    disk.mkdir()
    srv = start_server(stories_model, n_ctx=512, n_parallel=2, env={**FORCED, "LLAMA_SERVER_PREEMPT_HOLD_MS": "600000"},
                       extra_args=[*ON_LOOP, *disk_args(disk), "--drain-timeout", "1"])
    sock = open_raw_stream(srv, "Once upon a time", 400)
    wait_for_parked(srv)
    assert len(park_files(disk)) == 1
    assert srv.proc is not None
    srv.proc.send_signal(signal.SIGTERM)
    assert srv.proc.wait(timeout=30) == 0, srv.log_tail()
    sock.close()
    assert our_dirs(disk) == []


# --- flags, /props, /slots, the Engine, the CLI ---

def test_the_disk_tier_shows_in_props_and_the_startup_line(start_server, stories_model: Path, tmp_path: Path) -> None:
    srv = start_server(stories_model, n_ctx=256, n_parallel=2, extra_args=disk_args(tmp_path, "--preempt-disk-mib", "64"))
    props = srv.props()["llama_preempt"]
    assert props["preempt_disk"] == str(tmp_path) and props["preempt_disk_mib"] == 64
    logged(srv, "SWAP to RAM or disk, or RECOMPUTE, by measured cost within 8192 MiB of host RAM, disk (64 MiB, --preempt-disk-mib) above it")
    assert re.search(r"disk tier in .*llama-preempt-\d+-[0-9a-f]{16} \(mode 0700", srv.log_text())
    plain = start_server(stories_model, n_ctx=256, n_parallel=2)
    assert plain.props()["llama_preempt"]["preempt_disk"] is None


def test_the_disk_tier_comes_from_the_environment(start_server, stories_model: Path, tmp_path: Path) -> None:
    srv = start_server(stories_model, n_ctx=256, n_parallel=2,
                       env={"LLAMA_ARG_PREEMPT_DISK": str(tmp_path), "LLAMA_ARG_PREEMPT_DISK_MIB": "16"})
    props = srv.props()["llama_preempt"]
    assert props["preempt_disk"] == str(tmp_path) and props["preempt_disk_mib"] == 16
    assert len(our_dirs(tmp_path)) == 1


@pytest.mark.parametrize("args,flag", [
    (["--preempt-disk", "/nonexistent/llama-preempt-disk"], "--preempt-disk: no directory at"),
    (["--preempt-disk", ""], "--preempt-disk expects a directory"),
    (["--preempt-disk-mib", "0"], "--preempt-disk-mib expects"),
    (["--preempt-disk-mib", "-2"], "--preempt-disk-mib expects"),
    (["--preempt-disk-mib", "lots"], "--preempt-disk-mib expects"),
], ids=["missing-dir", "empty", "mib-0", "mib-negative", "mib-word"])
def test_a_bad_disk_flag_is_a_startup_error_naming_it(start_server, stories_model: Path, args: list[str],
                                                      flag: str) -> None:
    with pytest.raises(ServerStartError, match=re.escape(flag)) as e:
        start_server(stories_model, n_ctx=256, n_parallel=2, extra_args=args)
    assert re.match(r"llama-server exited with -?[1-9]", str(e.value)), e.value


def test_a_file_or_a_read_only_directory_is_refused(start_server, stories_model: Path, tmp_path: Path) -> None:
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    with pytest.raises(ServerStartError, match="is not a directory"):
        start_server(stories_model, n_ctx=256, n_parallel=2, extra_args=disk_args(a_file))
    if os.geteuid() != 0:  # root writes anywhere
        ro = tmp_path / "ro"
        ro.mkdir(mode=0o500)
        with pytest.raises(ServerStartError, match="cannot write to"):
            start_server(stories_model, n_ctx=256, n_parallel=2, extra_args=disk_args(ro))


def test_the_engine_parks_to_disk_and_reports_the_tier(stories_model: Path, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    for k, v in {**FORCED, "LLAMA_SERVER_PREEMPT_VERIFY": "1"}.items():
        monkeypatch.setenv(k, v)
    with Engine(stories_model, n_ctx=512, n_parallel=2, preempt_mode="swap", preempt_ram_mib=0,
                preempt_disk=tmp_path) as eng:
        assert len(our_dirs(tmp_path)) == 1
        req = eng.submit("Once upon a time", n_predict=48)
        parks: list[Any] = []
        resumes: list[Any] = []
        while not req.done():
            rep = eng.step()
            parks += rep.parked
            resumes += rep.resumed
        assert req.completion().n_generated == 48
        assert len(parks) >= 4 and {p.tier for p in parks} == {"disk"}
        assert all(p.mode == "swap" and p.choice == "ram_full" and p.bytes > 0 for p in parks)
        assert all(p.disk_ms_predicted > 0 for p in parks)
        assert {r.tier for r in resumes} == {"disk"}
        st = eng.stats()
        assert st.parks_by_tier["disk"] == len(parks)
        assert st.restores_by_tier["disk"] == len(resumes)
        assert st.n_disk_read_bytes_total > 0 and st.preempt_disk_bytes == 0
        assert st.n_swap_verify_mismatch_total == 0
    assert our_dirs(tmp_path) == []  # closing the Engine removes its directory


def test_stats_show_the_disk_tier(start_server, stories_model: Path, tmp_path: Path) -> None:
    import json

    srv = start_server(stories_model, n_ctx=512, n_parallel=2, env={**FORCED, "LLAMA_SERVER_PREEMPT_HOLD_MS": "600000"},
                       extra_args=[*ON_LOOP, *disk_args(tmp_path, "--preempt-disk-mib", "32")])
    sock = open_raw_stream(srv, "Once upon a time", 400)
    try:
        wait_for_parked(srv)
        p = run_cli("stats", srv.url, "--once", "--json", timeout=60)
        assert p.returncode == 0, p.stderr
        snap = json.loads(p.stdout)
        [parked] = [s for s in snap["slots"] if s["is_preempted"]]
        assert parked["preempt_tier"] == "disk" and parked["preempt_disk_bytes"] > 0
        assert snap["disk"]["dir"] == str(tmp_path) and snap["disk"]["budget_bytes"] == 32 << 20
        assert snap["disk"]["held_bytes"] == parked["preempt_disk_bytes"]
        assert snap["tiers"]["parks"]["disk"] >= 1
        p = run_cli("stats", srv.url, "--once", timeout=60)
        assert p.returncode == 0, p.stderr
        assert "disk held / budget" in p.stdout and "32 MiB" in p.stdout and "disk" in p.stdout
    finally:
        sock.close()


def test_park_lines_price_the_disk_only_where_there_is_a_disk_tier(start_server, stories_model: Path,
                                                                   tmp_path: Path) -> None:
    plain = start_server(stories_model, n_ctx=512, n_parallel=2, env=FORCED, extra_args=["--preempt-mode", "swap"])
    complete(plain, "Once upon a time", 24)
    parks = park_lines(plain)
    assert parks and all("(predicted ram" in x and ", disk " not in x for x in parks)
    srv = start_server(stories_model, n_ctx=512, n_parallel=2, env=FORCED, extra_args=[*ON_LOOP, *disk_args(tmp_path)])
    complete(srv, "Once upon a time", 24)
    parks = park_lines(srv)
    assert parks and all(re.search(r"\(predicted ram [\d.]+ ms, disk [\d.]+ ms, recompute", x) for x in parks)
