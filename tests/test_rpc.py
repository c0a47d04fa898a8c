"""Preemption on a real device backend: llama.cpp's RPC backend over loopback.

`ggml-rpc-server` (built and installed with this package) is a ggml device with its own buffers,
asynchronous transfers, events and graph compute. With `llama-server --rpc HOST:PORT -ngl 99` the
model's layers and the KV cache live there, so every SWAP park gathers on that device and comes to
host RAM over the link, and every restore goes back the same way: the device copy path, for real.
Two RPC servers with the layers split between them are the multi-GPU case.

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

from conftest import RpcFactory
from helpers import (ALL_DECODE, assert_every_swap_verified, assert_forced_swaps_give_the_unparked_answer,
                     assert_restored_ahead_exactly, cli_command, complete, complete_all, logged, long_prompt, on_rpc,
                     open_raw_stream, park_lines, streams_held_parked, wait_for_parked, wait_until, wait_until_nothing_held)
from llama_preempt.binary import rpc_server_binary, server_binary
from llama_preempt.rpc import RpcServer
from llama_preempt.server import LlamaServer, free_port

FORCED = {"LLAMA_SERVER_PREEMPT_EVERY": "8"}
VERIFY = {"LLAMA_SERVER_PREEMPT_VERIFY": "1"}


def assert_connected(*servers: RpcServer) -> None:
    # each RPC server took llama-server as its client (the parks' "by device graphs" then shows the
    # cells live on a device: host tensors are copied by memcpy)
    for rpc in servers:
        logged(rpc, "Accepted client connection")


def swap_parks(srv: LlamaServer) -> list[tuple[int, str]]:
    """(cell ranges, how it was copied) of every swap park in the log."""
    return [(int(n), how) for n, how in
            re.findall(r"parked by swap \([^)]* in (\d+) cell ranges\) in [\d.]+ ms by ([a-z ,]+), reason",
                       "\n".join(park_lines(srv)))]


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


@pytest.mark.parametrize("flash", ["on", "off"], ids=["fa-on", "fa-off"])
def test_forced_swap_parks_over_rpc_copy_upstreams_bytes_and_give_the_unparked_output(
        start_server, start_rpc, stories_model: Path, flash: str) -> None:
    ref_srv = start_server(stories_model, n_ctx=512, n_parallel=2, preempt=False,
                           extra_args=on_rpc(start_rpc()) + ["-fa", flash])
    rpc = start_rpc()
    srv = start_server(stories_model, n_ctx=512, n_parallel=2, env={**FORCED, **VERIFY},
                       extra_args=on_rpc(rpc) + ["-fa", flash, "--preempt-mode", "swap"])
    assert_connected(rpc)
    m = assert_forced_swaps_give_the_unparked_answer(ref_srv, srv)
    parks = swap_parks(srv)
    assert len(parks) == m["n_preempt_swap_total"]
    # through the device: gathered by graphs on the RPC server, nothing copied one slice at a time
    assert all(how == "device graphs" for _, how in parks), parks


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
                       extra_args=on_rpc(start_rpc()) + ["-fa", flash, "--preempt-mode", "swap", *ALL_DECODE])
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
        start_server, start_rpc, stories_model: Path) -> None:
    ref_srv = start_server(stories_model, n_ctx=1024, n_parallel=3, preempt=False, extra_args=on_rpc(start_rpc()))
    srv = start_server(stories_model, n_ctx=1024, n_parallel=3, extra_args=on_rpc(start_rpc()) + ["--preempt-mode", "swap"],
                       env={**FORCED, **VERIFY, "LLAMA_SERVER_PREEMPT_HOLD_MS": "20"})
    assert_restored_ahead_exactly(ref_srv, srv)


def test_two_rpc_servers_with_a_layer_split_park_restore_and_upload_ahead_exactly(
        start_server, start_rpc, stories_model: Path) -> None:
    # the multi-GPU case: each device holds the KV cells of its own layers; a park gathers on both,
    # and restore ahead uploads to each device the bytes of its own layers
    ref_srv = start_server(stories_model, n_ctx=1024, n_parallel=3, preempt=False,
                           extra_args=on_rpc(start_rpc(), start_rpc()))
    rpcs = [start_rpc(), start_rpc()]
    srv = start_server(stories_model, n_ctx=1024, n_parallel=3, extra_args=on_rpc(*rpcs) + ["--preempt-mode", "swap"],
                       env={**FORCED, **VERIFY, "LLAMA_SERVER_PREEMPT_HOLD_MS": "20"})
    assert_connected(*rpcs)
    m = assert_restored_ahead_exactly(ref_srv, srv)
    assert m["n_preempt_total"] >= 6
    assert all(how == "device graphs" for _, how in swap_parks(srv))


@pytest.mark.parametrize("verify", [True, False], ids=["verified", "in-flight"])
def test_two_rpc_servers_under_overload_park_fragmented_sequences_and_every_request_finishes(
        start_server, start_rpc, stories_model: Path, verify: bool) -> None:
    srv = start_server(stories_model, n_ctx=512, n_parallel=4, env=VERIFY if verify else {},
                       extra_args=on_rpc(start_rpc(), start_rpc()) + ["--preempt-mode", "swap", *ALL_DECODE])
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
    try:
        out = subprocess.run([str(server_binary()), "--list-devices"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    m = re.search(r"^\s*(Vulkan\d+):", out.stdout + out.stderr, re.M)
    return m.group(1) if m else None


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
    assert_connected(rpc)
