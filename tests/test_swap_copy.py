"""SWAP copies in bulk, and the cost-aware choice between SWAP and RECOMPUTE (--preempt-mode).

LLAMA_SERVER_PREEMPT_VERIFY=1 makes the server compare every swap park's buffer with the one
upstream's own serializer writes for the same sequence, byte for byte, while the cells are still in
place; LLAMA_SERVER_PREEMPT_COPY=graph sends host tensors through the device path (gather and
scatter graphs), so that path runs on a CPU too. With LLAMA_PREEMPT_TEST_GPU_LAYERS the cells live
on the GPU and every test here runs there as well.

Where answers computed in other batches are compared (several requests decoding together and
parked in turn, against each alone), both servers run --deterministic, and the answers must be
equal where the layers are on the CPU, whose kernels it makes batch-invariant; a GPU's kernels
choose by the batch's shape, and there, as with flash attention off (which --deterministic needs
on), the copy guard's byte checks of every park and restore are the proof.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import requests

from helpers import (assert_every_swap_verified, assert_forced_swaps_give_the_unparked_answer,
                     assert_restored_ahead_exactly, complete, complete_all, layers_on_the_cpu, logged, long_prompt,
                     run_concurrently, swap_parks, wait_for_parked)

FORCED = {"LLAMA_SERVER_PREEMPT_EVERY": "8"}
ROUTES = ["bulk", "graph"]
FLASH = ["on", "off"]
MTP_ARGS = ["--spec-type", "draft-mtp", "--spec-draft-n-max", "2"]


def swap_env(route: str) -> dict[str, str]:
    return {**FORCED, "LLAMA_SERVER_PREEMPT_VERIFY": "1", "LLAMA_SERVER_PREEMPT_COPY": route}


def flash_args(flash: str) -> list[str]:
    """-fa FLASH, and with it on --deterministic (which needs it), so that answers computed in other
    batches can be compared where the kernels are the CPU's."""
    return ["-fa", flash, *(["--deterministic"] if flash == "on" else [])]


def answers_comparable(flash: str) -> bool:
    """Whether an answer computed beside others and parked must equal the one computed alone:
    --deterministic on (flash_args) and the layers on the CPU."""
    return flash == "on" and layers_on_the_cpu()


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("flash", FLASH, ids=["fa-on", "fa-off"])
def test_swap_parks_copy_upstreams_bytes_and_give_the_unparked_output(
        start_server, stories_model: Path, flash: str, route: str) -> None:
    # fa off stores V transposed: one slice per V element row, moved by transpose + gather
    ref_srv = start_server(stories_model, n_ctx=512, n_parallel=2, preempt=False, extra_args=["-fa", flash])
    srv = start_server(stories_model, n_ctx=512, n_parallel=2, env=swap_env(route),
                       extra_args=["-fa", flash, "--preempt-mode", "swap"])
    m = assert_forced_swaps_give_the_unparked_answer(ref_srv, srv)
    assert srv.metrics().labeled["preempt_parks_by_choice_total"]["swap_mode"] == m["n_preempt_total"]


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("flash", FLASH, ids=["fa-on", "fa-off"])
def test_a_fragmented_sequence_parks_and_restores_exactly(start_server, stories_model: Path, flash: str,
                                                          route: str) -> None:
    # three requests decoding together interleave their cells in the shared pool, and every park
    # and restore puts them somewhere else again: each park copies many cell ranges (fa off stores
    # V transposed: one slice per V element row of every range). Upstream's placement
    # (--no-attn-own-cells), which interleaves them cell by cell: with flash attention the default
    # keeps each sequence in blocks of 16, and a park then copies a few ranges
    prompts = ["Once upon a time", "The little dog", "A girl named Lily"]
    srv = start_server(stories_model, n_ctx=1024, n_parallel=3, env=swap_env(route),
                       extra_args=[*flash_args(flash), "--preempt-mode", "swap", "--no-attn-own-cells"])
    got = [r.json()["content"] for r in complete_all(srv, prompts, 80)]
    if answers_comparable(flash):
        ref_srv = start_server(stories_model, n_ctx=1024, n_parallel=3, preempt=False, extra_args=flash_args(flash))
        assert got == [complete(ref_srv, p, 80).json()["content"] for p in prompts]
    m = srv.metrics()
    assert m["n_preempt_total"] >= 15
    assert_every_swap_verified(m)
    ranges = [n for n, _ in swap_parks(srv)]
    assert len(ranges) == m["n_preempt_swap_total"]
    assert max(ranges) >= 4, f"the sequences never fragmented: {ranges}"


@pytest.mark.parametrize("flash", FLASH, ids=["fa-on", "fa-off"])
def test_a_restore_uploaded_ahead_scatters_exactly(start_server, stories_model: Path, flash: str) -> None:
    # parked slots stay parked 20 ms, so the next one to come back has its buffer uploaded to the
    # device (the GPU under LLAMA_PREEMPT_TEST_GPU_LAYERS; else the CPU backend, through the device
    # path) while others decode, and its restore scatters those bytes
    srv = start_server(stories_model, n_ctx=1024, n_parallel=3,
                       extra_args=[*flash_args(flash), "--preempt-mode", "swap"],
                       env={**swap_env("graph"), "LLAMA_SERVER_PREEMPT_HOLD_MS": "20"})
    ref_srv = (start_server(stories_model, n_ctx=1024, n_parallel=3, preempt=False, extra_args=flash_args(flash))
               if answers_comparable(flash) else None)
    assert_restored_ahead_exactly(ref_srv, srv)


def test_nothing_is_uploaded_ahead_where_the_cells_live_in_host_memory(start_server, stories_model: Path) -> None:
    # --no-kv-offload keeps the cells in host memory whatever the layers' device (the GPU under
    # LLAMA_PREEMPT_TEST_GPU_LAYERS): there is no device to upload a parked slot's bytes to ahead
    srv = start_server(stories_model, n_ctx=1024, n_parallel=2,
                       extra_args=["--no-kv-offload", "--preempt-mode", "swap"],
                       env={**FORCED, "LLAMA_SERVER_PREEMPT_HOLD_MS": "20"})
    complete_all(srv, ["Once upon a time", "The little dog"], 32)
    m = srv.metrics()
    assert m["n_preempt_swap_total"] >= 4
    parks = swap_parks(srv)
    assert len(parks) == m["n_preempt_swap_total"]
    assert all(how == "memcpy" for _, how in parks), parks  # the premise: host tensors, copied by memcpy
    assert m["n_restore_ahead_total"] == 0


@pytest.mark.parametrize("flash", FLASH, ids=["fa-on", "fa-off"])
def test_swap_parks_on_the_hybrid_mtp_model_copy_upstreams_bytes(
        start_server, qwen35_mtp_model: Path, flash: str) -> None:
    # recurrent state, attention cells and the MTP context: all through the bulk copy
    ref_srv = start_server(qwen35_mtp_model, n_ctx=1024, n_parallel=2, extra_args=MTP_ARGS + ["-fa", flash])
    ref = complete(ref_srv, "Once upon a time", 64).json()
    srv = start_server(qwen35_mtp_model, n_ctx=1024, n_parallel=2, env=swap_env("graph"),
                       extra_args=MTP_ARGS + ["-fa", flash, "--preempt-mode", "swap"])
    got = complete(srv, "Once upon a time", 64).json()
    assert got["tokens_predicted"] == 64
    assert got["content"] == ref["content"]
    m = srv.metrics()
    assert m["n_preempt_total"] >= 4
    assert_every_swap_verified(m)


def test_auto_recomputes_when_the_swap_is_predicted_dearer(start_server, stories_model: Path) -> None:
    # 1 kB/s of copy bandwidth against a million tokens/s of prefill: every swap is dearer
    srv = start_server(stories_model, n_ctx=512, n_parallel=2,
                       env={**FORCED, "LLAMA_SERVER_PREEMPT_RATES": "0.000001,0.000001,1000000"})
    logged(srv, "SWAP or RECOMPUTE by measured cost")
    r = complete(srv, "Once upon a time", 64)
    assert r.json()["tokens_predicted"] == 64
    m = srv.metrics()
    assert m["n_preempt_total"] >= 6
    assert m["n_preempt_recompute_total"] == m["n_preempt_total"]
    assert m["n_preempt_swap_total"] == 0
    assert m["preempt_park_bytes_per_second"] == 1000
    assert m["preempt_prefill_tokens_per_second"] == 1_000_000
    by = srv.metrics().labeled["preempt_parks_by_choice_total"]
    assert by["recompute_cheaper"] == m["n_preempt_total"]
    assert by["swap_cheaper"] == 0
    logged(srv, "recompute_cheaper (predicted ram")


def test_auto_swaps_when_the_swap_is_predicted_cheaper(start_server, stories_model: Path) -> None:
    # 100 GB/s of copy bandwidth against one token/s of prefill: every swap is cheaper
    srv = start_server(stories_model, n_ctx=512, n_parallel=2,
                       env={**FORCED, "LLAMA_SERVER_PREEMPT_HOLD_MS": "300",
                            "LLAMA_SERVER_PREEMPT_RATES": "100,100,1"})
    with_slots = run_concurrently([lambda: complete(srv, "Once upon a time", 64),
                                   lambda: wait_for_parked(srv)])
    assert with_slots[0].json()["tokens_predicted"] == 64
    parked = with_slots[1]
    assert parked["preempt_mode"] == "swap"
    assert parked["preempt_choice"] == "swap_cheaper"
    m = srv.metrics()
    assert m["n_preempt_total"] >= 6
    assert m["n_preempt_swap_total"] == m["n_preempt_total"]
    by = srv.metrics().labeled["preempt_parks_by_choice_total"]
    assert by["swap_cheaper"] == m["n_preempt_total"]
    assert by["recompute_cheaper"] == 0


def test_auto_measures_its_rates_from_the_servers_own_parks_and_prompts(start_server, stories_model: Path) -> None:
    srv = start_server(stories_model, n_ctx=2048, n_parallel=2, extra_args=["-ctk", "f32", "-ctv", "f32"], env=FORCED)
    before = srv.metrics()
    assert before["preempt_prefill_tokens_per_second"] == 1000      # the defaults, before any measurement
    assert before["preempt_park_bytes_per_second"] == 2_000_000_000
    # 400 prompt tokens at 1280 bytes a cell: each park copies more than the 64 KiB a sample needs
    r = complete(srv, long_prompt(300), 40)
    assert r.json()["tokens_predicted"] == 40
    m = srv.metrics()
    assert m["n_preempt_swap_total"] >= 3
    assert m["preempt_prefill_tokens_per_second"] != 1000
    assert m["preempt_park_bytes_per_second"] != 2_000_000_000
    assert m["preempt_restore_bytes_per_second"] != 4_000_000_000
    by = srv.metrics().labeled["preempt_parks_by_choice_total"]
    assert by["swap_cheaper"] + by["recompute_cheaper"] == m["n_preempt_total"]


def test_preempt_mode_recompute_never_swaps(start_server, stories_model: Path) -> None:
    srv = start_server(stories_model, n_ctx=512, n_parallel=2, extra_args=["--preempt-mode", "recompute"], env=FORCED)
    logged(srv, "RECOMPUTE only (--preempt-mode recompute)")
    assert complete(srv, "Once upon a time", 48).json()["tokens_predicted"] == 48
    m = srv.metrics()
    assert m["n_preempt_total"] >= 4
    assert m["n_preempt_recompute_total"] == m["n_preempt_total"]
    assert srv.metrics().labeled["preempt_parks_by_choice_total"]["recompute_mode"] == m["n_preempt_total"]


@pytest.mark.parametrize("value", ["fast", "", "SWAP"])
def test_an_invalid_preempt_mode_is_a_startup_error_naming_the_flag(start_server, stories_model: Path,
                                                                   value: str) -> None:
    from llama_preempt.server import ServerStartError

    with pytest.raises(ServerStartError, match="--preempt-mode"):
        start_server(stories_model, n_ctx=256, n_parallel=2, extra_args=["--preempt-mode", value])


def test_preempt_mode_comes_from_the_environment(start_server, stories_model: Path) -> None:
    srv = start_server(stories_model, n_ctx=256, n_parallel=2, env={"LLAMA_ARG_PREEMPT_MODE": "recompute"})
    logged(srv, "RECOMPUTE only (--preempt-mode recompute)")
    assert requests.get(f"{srv.url}/props", timeout=30).json()["llama_preempt"]["preempt_mode"] == "recompute"


def test_freed_swap_buffers_stay_warm_for_the_next_park_within_a_quarter_of_the_budget(
        start_server, stories_model: Path) -> None:
    # f32 cells, 1280 bytes a token: parks of a 300-token prompt take about 400 KiB
    big = start_server(stories_model, n_ctx=1024, n_parallel=2, env=FORCED,
                       extra_args=["--preempt-mode", "swap", "-ctk", "f32", "-ctv", "f32"])
    assert complete(big, long_prompt(250), 40).json()["tokens_predicted"] == 40
    m = big.metrics()
    assert m["n_preempt_swap_total"] >= 3
    assert m["preempt_ram_bytes"] == 0
    assert m["preempt_ram_pool_bytes"] > 0  # kept for the next park
    # a 1 MiB budget keeps at most 256 KiB idle: these buffers are too large to keep
    small = start_server(stories_model, n_ctx=1024, n_parallel=2, env=FORCED,
                         extra_args=["--preempt-mode", "swap", "--preempt-ram", "1", "-ctk", "f32", "-ctv", "f32"])
    assert complete(small, long_prompt(250), 40).json()["tokens_predicted"] == 40
    m = small.metrics()
    assert m["n_preempt_swap_total"] >= 3
    assert m["preempt_ram_pool_bytes"] <= 256 << 10
