"""Preemption on a real device backend: llama.cpp's RPC backend over loopback.

`ggml-rpc-server` (built and installed with this package) is a ggml device with its own buffers,
asynchronous transfers, events and graph compute. With helpers.on_rpc()'s flags (`llama-server --rpc
HOST:PORT -dev RPC0 -ngl 99`) the model's layers and the KV cache live there and nowhere else (not
on a GPU build's own GPU, nor where LLAMA_PREEMPT_TEST_GPU_LAYERS would put them), so every SWAP
park gathers on that device and comes to host RAM over the link, and every restore goes back the
same way: the device copy path, for real. Two RPC servers with the layers split between them are
the multi-GPU case.

An RPC server serves its build's accelerator where it has one (CUDA0 on a CUDA build), else its
CPU. Tests that compare answers computed in other batches (several requests decoding together and
parked in turn, against each alone) run on RPC servers pinned to their CPU with its batch-invariant
kernels, and llama-server with --deterministic: the same meaning on every build.

LLAMA_SERVER_PREEMPT_VERIFY=1 compares every swap park with upstream's own serializer, byte for byte.
"""
from __future__ import annotations

import re
import socket
import subprocess
from pathlib import Path
from typing import Any

import pytest
import requests

from conftest import BATCH_INVARIANT_RPC, RpcFactory
from helpers import (ALL_DECODE, assert_every_swap_verified, assert_forced_swaps_give_the_unparked_answer,
                     assert_restored_ahead_exactly, build_devices, cli_command, complete, complete_all, logged,
                     long_prompt, on_rpc, open_raw_stream, rpc_devices, streams_held_parked, swap_parks,
                     wait_for_parked, wait_until, wait_until_nothing_held)
from llama_preempt.binary import rpc_server_binary, server_binary
from llama_preempt.server import free_port

FORCED = {"LLAMA_SERVER_PREEMPT_EVERY": "8"}
VERIFY = {"LLAMA_SERVER_PREEMPT_VERIFY": "1"}


def assert_parked_on_the_device(srv: Any, n_parks: float) -> None:
    """Every one of the n_parks swap parks gathered by device graphs: the cells were on a device
    (host tensors are copied by memcpy), and on_rpc() leaves the RPC devices the only ones."""
    parks = swap_parks(srv)
    assert len(parks) == n_parks
    assert all(how == "device graphs" for _, how in parks), parks


def test_the_package_installs_the_rpc_server_beside_llama_server() -> None:
    rpc = rpc_server_binary()
    assert rpc.parent == server_binary().parent
    # upstream's own usage text: it is llama.cpp's rpc-server, not a wrapper
    out = subprocess.run([str(rpc), "--help"], capture_output=True, text=True, timeout=30)
    assert "--port PORT" in out.stderr + out.stdout


def test_llama_preempt_rpc_server_runs_upstreams_rpc_server(tmp_path: Path) -> None:
    port = free_port()
    log = (tmp_path / "rpc.log").open("wb")
    proc = subprocess.Popen(cli_command("rpc-server", "-H", "127.0.0.1", "-p", str(port), "-t", "1"), stdout=log,
                            stderr=subprocess.STDOUT)

    def listening() -> bool:
        assert proc.poll() is None, (tmp_path / "rpc.log").read_text()
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return True
        except OSError:
            return False

    try:
        wait_until(listening, 30, "llama-preempt rpc-server to listen", interval_s=0.05)
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_on_rpc_puts_every_layer_and_kv_cell_on_the_rpc_devices_alone(
        start_server, start_rpc: RpcFactory, stories_model: Path) -> None:
    # what every test here stands on, on any build and under LLAMA_PREEMPT_TEST_GPU_LAYERS: a GPU
    # build offloads to its own GPU as well unless -dev names the RPC devices alone
    rpcs = [start_rpc(), start_rpc()]
    names = rpc_devices(*rpcs)
    assert len(names) >= 2 and names[:2] == ["RPC0", "RPC1"]
    srv = start_server(stories_model, n_ctx=512, n_parallel=2, extra_args=[*on_rpc(*rpcs), "-lv", "4"])
    log = logged(srv, "listening on")
    assert re.findall(r"llama_prepare_model_devices: using device (\S+) ", log) == names
    assert re.search(r"load_tensors: offloaded (\d+)/\1 layers to GPU", log), "not every layer offloaded"
    # each server's device holds the cells of its own layers, and nothing else holds any
    kv = re.findall(r"llama_kv_cache: +(\S+) KV buffer size", log)
    assert {re.sub(r"^RPC\d+\[(.+)\]$", r"\1", buf) for buf in kv} == {r.endpoint for r in rpcs}, kv
    # the weights too, but the token embeddings, which llama.cpp keeps in host memory
    weights = re.findall(r"load_tensors: +(\S+) model buffer size", log)
    assert all(re.fullmatch(r"RPC\d+\[.+\]|CPU\w*|\w+_Host", w) for w in weights), weights
    assert complete(srv, "Once upon a time", 8).json()["tokens_predicted"] == 8


@pytest.mark.parametrize("flash", ["on", "off"], ids=["fa-on", "fa-off"])
def test_forced_swap_parks_over_rpc_copy_upstreams_bytes_and_give_the_unparked_output(
        start_server, start_rpc: RpcFactory, stories_model: Path, flash: str) -> None:
    # the RPC servers serve their build's device (a GPU build's GPU, whose flash attention may not
    # take stories260K's 8-wide heads: the RPC client asks the device and runs such an op locally)
    ref_srv = start_server(stories_model, n_ctx=512, n_parallel=2, preempt=False,
                           extra_args=on_rpc(start_rpc()) + ["-fa", flash])
    srv = start_server(stories_model, n_ctx=512, n_parallel=2, env={**FORCED, **VERIFY},
                       extra_args=on_rpc(start_rpc()) + ["-fa", flash, "--preempt-mode", "swap"])
    m = assert_forced_swaps_give_the_unparked_answer(ref_srv, srv)
    # through the device: gathered by graphs on the RPC server, nothing copied one slice at a time
    assert_parked_on_the_device(srv, m["n_preempt_swap_total"])


# upstream's placement, which hands a decode batch's tokens consecutive cells and so interleaves the
# decoding sequences cell by cell: the fragmented parks these tests are about (with flash attention,
# --attn-own-cells keeps each sequence's cells in blocks of 16, and a park moves a few ranges)
UPSTREAM_PLACEMENT = ["--no-attn-own-cells"]

@pytest.mark.parametrize("verify", [True, False], ids=["verified", "in-flight"])
@pytest.mark.parametrize("flash", ["on", "off"], ids=["fa-on", "fa-off"])
def test_an_overloaded_pool_over_rpc_parks_fragmented_sequences_and_every_request_finishes(
        start_server, start_rpc, stories_model: Path, flash: str, verify: bool) -> None:
    # the crash, scaled to stories260K: four requests decoding together interleave their
    # cells one token at a time, so the first natural park copies a sequence scattered over a
    # hundred and more cell ranges, then the others keep decoding while it is parked.
    # in-flight: no verification, so a park's transfer runs on across the next decode and its
    # staging buffer is freed a step later, between two runs of the same decode graph; the RPC
    # server drops its stored graph on every free, and before patch 0007-rpc-graph-reuse-after-free the client still asked it
    # to rerun that graph: the server dropped the connection and llama-server aborted.
    srv = start_server(stories_model, n_ctx=512, n_parallel=4, env=VERIFY if verify else {},
                       extra_args=on_rpc(start_rpc()) + ["-fa", flash, "--preempt-mode", "swap", *ALL_DECODE,
                                                         *UPSTREAM_PLACEMENT])
    complete_all(srv, [long_prompt(12, shift=i) for i in range(4)], 200)
    m = srv.metrics()
    assert m["n_preempt_total"] >= 1
    assert m["n_preempt_swap_total"] == m["n_preempt_total"] == m["n_resume_total"]
    assert m["preempt_ram_bytes"] == 0 and m["preempt_copies_in_flight"] == 0
    if verify:
        assert_every_swap_verified(m)
    ranges = [n for n, _ in swap_parks(srv)]
    assert max(ranges) >= 100, f"the parked sequences were not fragmented: {ranges}"
    assert srv.proc is not None and srv.proc.poll() is None


def test_restore_ahead_over_rpc_uploads_the_next_parked_slot_and_its_restore_scatters_exactly(
        start_server, start_rpc: RpcFactory, stories_model: Path) -> None:
    ref_srv = start_server(stories_model, n_ctx=1024, n_parallel=3, preempt=False, deterministic=True,
                           extra_args=on_rpc(start_rpc(**BATCH_INVARIANT_RPC)))
    srv = start_server(stories_model, n_ctx=1024, n_parallel=3, deterministic=True,
                       extra_args=on_rpc(start_rpc(**BATCH_INVARIANT_RPC)) + ["--preempt-mode", "swap"],
                       env={**FORCED, **VERIFY, "LLAMA_SERVER_PREEMPT_HOLD_MS": "20"})
    m = assert_restored_ahead_exactly(ref_srv, srv)
    assert_parked_on_the_device(srv, m["n_preempt_swap_total"])


def test_two_rpc_servers_with_a_layer_split_park_restore_and_upload_ahead_exactly(
        start_server, start_rpc: RpcFactory, stories_model: Path) -> None:
    # the multi-GPU case: each device holds the KV cells of its own layers; a park gathers on both,
    # and restore ahead uploads to each device the bytes of its own layers. Three requests decode
    # together and are parked in turn; each answer is the one it gives alone (--deterministic, and
    # the RPC servers' batch-invariant CPU kernels)
    ref_srv = start_server(stories_model, n_ctx=1024, n_parallel=3, preempt=False, deterministic=True,
                           extra_args=on_rpc(start_rpc(**BATCH_INVARIANT_RPC), start_rpc(**BATCH_INVARIANT_RPC)))
    rpcs = [start_rpc(**BATCH_INVARIANT_RPC), start_rpc(**BATCH_INVARIANT_RPC)]
    srv = start_server(stories_model, n_ctx=1024, n_parallel=3, deterministic=True,
                       extra_args=on_rpc(*rpcs) + ["--preempt-mode", "swap"],
                       env={**FORCED, **VERIFY, "LLAMA_SERVER_PREEMPT_HOLD_MS": "20"})
    m = assert_restored_ahead_exactly(ref_srv, srv)
    assert m["n_preempt_total"] >= 6
    assert_parked_on_the_device(srv, m["n_preempt_swap_total"])


@pytest.mark.parametrize("verify", [True, False], ids=["verified", "in-flight"])
def test_two_rpc_servers_under_overload_park_fragmented_sequences_and_every_request_finishes(
        start_server, start_rpc, stories_model: Path, verify: bool) -> None:
    srv = start_server(stories_model, n_ctx=512, n_parallel=4, env=VERIFY if verify else {},
                       extra_args=on_rpc(start_rpc(), start_rpc()) + ["--preempt-mode", "swap", *ALL_DECODE,
                                                                      *UPSTREAM_PLACEMENT])
    complete_all(srv, [long_prompt(12, shift=i) for i in range(4)], 200)
    m = srv.metrics()
    assert m["n_preempt_total"] >= 1
    assert m["n_preempt_swap_total"] == m["n_preempt_total"] == m["n_resume_total"]
    if verify:
        assert_every_swap_verified(m)
    # four sequences decoded together interleave their cells: a park moves many ranges, not one
    # (about 100 when all four start together; fewer when the machine is loaded and they start apart)
    assert max(n for n, _ in swap_parks(srv)) >= 50


def test_a_request_cancelled_while_its_rpc_copy_is_in_flight_frees_everything(
        start_server, start_rpc, stories_model: Path) -> None:
    # over RPC a park's transfer to host RAM really runs on after the park; the copy hold keeps it
    # counted in flight long enough for the client to go away first
    srv = start_server(stories_model, n_ctx=512, n_parallel=2, extra_args=on_rpc(start_rpc()) + ["--preempt-mode", "swap"],
                       env={**FORCED, "LLAMA_SERVER_PREEMPT_HOLD_MS": "60000", "LLAMA_SERVER_PREEMPT_COPY_HOLD_MS": "60000"})
    sock = open_raw_stream(srv, "Once upon a time", 400)
    parked = wait_for_parked(srv)
    assert parked["preempt_mode"] == "swap"
    assert parked["preempt_copy_in_flight"] is True
    assert srv.metrics()["preempt_copies_in_flight"] == 1

    sock.close()  # the client goes away while its copy is in flight

    m = wait_until_nothing_held(srv)
    assert m["preempt_ram_bytes"] == 0
    assert m["preempt_copies_in_flight"] == 0
    assert m["requests_preempted"] == 0
    # the device and the server are fine: the next request runs over the same link
    assert complete(srv, "Once", 8).json()["tokens_predicted"] == 8


def test_losing_the_rpc_server_with_slots_parked_ends_llama_server_with_a_clear_line(
        start_rpc, start_server, stories_model: Path) -> None:
    # llama.cpp cannot carry on without a device it lost; the server must not hang, and must say
    # what it means (the requests are lost) in one line, not just an assert
    rpc = start_rpc()
    # three slots: two parked (held), one free for a request that needs the device
    srv = start_server(stories_model, n_ctx=512, n_parallel=3, extra_args=on_rpc(rpc) + ["--preempt-mode", "swap"],
                       env={**FORCED, "LLAMA_SERVER_PREEMPT_HOLD_MS": "600000"})
    streams: list[Any] = []
    try:
        streams = streams_held_parked(srv)
        assert srv.metrics()["preempt_ram_bytes"] > 0

        rpc.kill()  # the machine holding the KV cache goes away
        # nothing runs while both are held: a new request in the free slot needs the device
        proc = srv.proc
        assert proc is not None

        def ended() -> bool:
            if proc.poll() is None:
                try:
                    srv.post("/completion", {"prompt": "hi", "n_predict": 1}, timeout=5)
                except requests.RequestException:
                    pass
            return proc.poll() is not None

        wait_until(ended, 60, "llama-server to end after losing its RPC device (it hung)")
        assert proc.returncode != 0
        log = srv.log_text()
        assert "lost an RPC device" in log, srv.log_tail()
        assert "the requests running and parked in it are lost" in log
    finally:
        for s in streams:
            s.close()


def _vulkan_device() -> str | None:
    return next((d for d in build_devices() if d.startswith("Vulkan")), None)


def test_forced_swap_parks_on_vulkan_copy_upstreams_bytes(start_server, stories_model: Path) -> None:
    dev = _vulkan_device()
    if dev is None:
        pytest.skip("this build has no Vulkan device (ggml-vulkan at our upstream commit does not compile against "
                    "Debian 12's Vulkan headers; build with CMAKE_ARGS=-DGGML_VULKAN=ON where newer headers exist)")
    ref_srv = start_server(stories_model, n_ctx=512, n_parallel=2, preempt=False, extra_args=["-dev", dev, "-ngl", "99"])
    ref = complete(ref_srv, "Once upon a time", 64).json()
    srv = start_server(stories_model, n_ctx=512, n_parallel=2, env={**FORCED, **VERIFY},
                       extra_args=["-dev", dev, "-ngl", "99", "--preempt-mode", "swap"])
    got = complete(srv, "Once upon a time", 64).json()
    assert got["content"] == ref["content"]
    assert_every_swap_verified(srv.metrics())


@pytest.mark.parametrize("background", [False, True], ids=["written-at-the-park", "written-in-the-background"])
def test_disk_parks_of_cells_on_an_rpc_device_give_the_unparked_answer(
        start_server, start_rpc, stories_model: Path, tmp_path: Path, background: bool) -> None:
    # the park gathers on the device; a background write waits for the transfer to host RAM to
    # settle before it starts (the disk tier, tests/test_disk.py)
    ref = complete(start_server(stories_model, n_ctx=512, n_parallel=2, preempt=False, extra_args=on_rpc(start_rpc())),
                   "Once upon a time", 64).json()
    rpc = start_rpc()  # an RPC server serves one client at a time
    env = {**FORCED, **VERIFY}
    args = [*on_rpc(rpc), "--preempt-mode", "swap", "--preempt-disk", str(tmp_path)]
    if background:
        env.update({"LLAMA_SERVER_PREEMPT_DISK_ALWAYS": "1", "LLAMA_SERVER_PREEMPT_HOLD_MS": "30"})
    else:
        args += ["--preempt-ram", "0"]
    srv = start_server(stories_model, n_ctx=512, n_parallel=2, env=env, extra_args=args)
    got = complete(srv, "Once upon a time", 64).json()
    assert got["content"] == ref["content"]
    m = srv.metrics()
    assert m["n_preempt_total"] >= 6
    assert m["n_preempt_swap_total"] == m["n_preempt_total"]
    assert m["n_disk_write_bytes_total"] > 0
    assert m["n_swap_verify_total"] >= m["n_preempt_total"] and m["n_swap_verify_mismatch_total"] == 0
    assert m["n_swap_restore_fail_total"] == 0
    assert m["preempt_disk_bytes"] == 0 and m["preempt_ram_bytes"] == 0
    logged(srv, "parked by swap to disk")
    parks = swap_parks(srv)
    assert len(parks) == m["n_preempt_swap_total"]
    # in the background: gathered on the device into RAM, then written; at the park (no RAM for a
    # host copy): read from the device into the file a chunk at a time
    assert {how for _, how in parks} == {"device graphs" if background else "a stream to its file"}, parks
