"""The compressed host tier (--preempt-compress q8_0): a parked state held in host RAM packed to
q8_0, within the RAM budget, and restored unpacked (stories260K; issue 52's proof that a tier is
data: docs/contributing.md "Adding a tier")."""
from __future__ import annotations

import re
import threading
from pathlib import Path
from typing import Any

import pytest

from helpers import complete, logged, long_prompt, n_tokens, wait_for_slot, wait_until
from llama_preempt import _core, statsview

# f32 cells: 5 layers x 2 x 32 values x 4 bytes = 1,280 bytes per token, so ~900 tokens held make
# a state a little over a 1 MiB RAM budget, which q8_0 packs to about a quarter
F32_CELLS = ["-ctk", "f32", "-ctv", "f32"]
MIB = 1 << 20


def _slot(srv: Any, sid: int) -> dict[str, Any]:
    return next(s for s in srv.slots() if s["id"] == sid)


def _park_one(srv: Any, prompt: str, n_predict: int) -> tuple[dict[str, Any], dict[str, Any], threading.Thread]:
    """A request parked through the slot API while it generates: its /slots entry while parked, and
    the thread whose result dict fills once it is unparked and done."""
    got: dict[str, Any] = {}
    t = threading.Thread(target=lambda: got.update(complete(srv, prompt, n_predict).json()))
    t.start()
    sid = wait_until(lambda: next((s for s in srv.slots() if s["state"] == "generating"), None), 60,
                     "a slot generating")["id"]
    r = srv.post(f"/slots/{sid}?action=park", {})
    assert r.status_code == 200, r.text
    return _slot(srv, sid), got, t


def test_a_state_over_the_ram_left_parks_packed_within_it_and_the_request_completes(
        start_server, stories_model: Path) -> None:
    prompt = long_prompt(700)
    srv = start_server(stories_model, n_ctx=2048, n_parallel=2, n_batch=256,
                       extra_args=["--preempt-ram", "1", "--preempt-mode", "swap", "--preempt-compress", "q8_0",
                                   *F32_CELLS])
    logged(srv, "a compressed host tier (--preempt-compress q8_0)")
    assert srv.get("/props").json()["llama_preempt"]["preempt_compress"] == "q8_0"
    n_prompt = n_tokens(srv, prompt)
    assert n_prompt * 1280 > MIB  # the state does not fit the RAM budget unpacked
    parked, got, t = _park_one(srv, prompt, 64)
    assert parked["is_preempted"] and parked["preempt_tier"] == "ram_q8"
    # packed: f32 values to q8_0 blocks (34 bytes per 32 values, 128 unpacked), the records as they were
    held = parked["preempt_ram_bytes"]
    assert 0 < held <= 0.3 * n_prompt * 1280, held
    m = srv.metrics()
    assert m["preempt_ram_bytes"] == held <= MIB
    assert srv.post(f"/slots/{parked['id']}?action=unpark", {}).status_code == 200
    t.join(60)
    assert got["tokens_predicted"] == 64 and got["content"]
    by = srv.metrics().labeled
    assert by["preempt_parks_by_tier_total"]["ram_q8"] == 1
    assert by["preempt_restores_by_tier_total"]["ram_q8"] == 1
    assert by["preempt_parks_by_choice_total"]["ram_full"] == 1  # RAM had no room; the packed copy did
    assert srv.metrics()["preempt_ram_bytes"] == 0
    logged(srv, "restored by swap")
    # reported as itself: its log line names it and its quote beside the others', /metrics carries
    # its measured rates and packed share (the one park moved them off their defaults), stats shows them
    logged(srv, "parked by swap to ram_q8 (")
    line = next(x for x in srv.log_text().splitlines() if "parked by swap to ram_q8" in x)
    assert re.search(r"\(predicted ram [\d.]+ ms, ram_q8 [\d.]+ ms, recompute [\d.]+ ms\)", line), line
    m = srv.metrics()
    assert m["preempt_ram_q8_packed_percent"] < 53  # q8_0 of f32 cells: about 27 %, one sample in
    assert m["preempt_ram_q8_pack_bytes_per_second"] > 0
    view = statsview.to_json(statsview.fetch(srv.url), None)
    assert view["ram_q8"]["packed_percent"] == m["preempt_ram_q8_packed_percent"]
    assert view["tiers"]["parks"]["ram_q8"] == 1


def test_where_the_plain_copy_fits_auto_keeps_it_unpacked_and_byte_exact(
        start_server, stories_model: Path) -> None:
    # the reference alone on a server of its own; the parked run alone on the other: same batches
    want = complete(start_server(stories_model, n_ctx=512, n_parallel=2), "Once upon a time", 120).json()["content"]
    srv = start_server(stories_model, n_ctx=512, n_parallel=2, extra_args=["--preempt-compress", "q8_0"])
    parked, got, t = _park_one(srv, "Once upon a time", 120)
    assert parked["preempt_tier"] == "ram"  # packing costs time that a plain copy with room does not
    assert srv.post(f"/slots/{parked['id']}?action=unpark", {}).status_code == 200
    t.join(60)
    assert got["content"] == want
    by = srv.metrics().labeled
    assert by["preempt_parks_by_tier_total"]["ram"] == 1 and by["preempt_parks_by_tier_total"]["ram_q8"] == 0


def test_without_the_flag_there_is_no_compressed_tier(start_server, stories_model: Path) -> None:
    prompt = long_prompt(700)
    srv = start_server(stories_model, n_ctx=2048, n_parallel=2, n_batch=256,
                       extra_args=["--preempt-ram", "1", "--preempt-mode", "swap", *F32_CELLS])
    assert srv.get("/props").json()["llama_preempt"]["preempt_compress"] == "none"
    parked, got, t = _park_one(srv, prompt, 16)
    assert parked["preempt_tier"] == "recompute"  # over the RAM budget, no disk: re-prefilled
    assert srv.post(f"/slots/{parked['id']}?action=unpark", {}).status_code == 200
    t.join(60)
    assert got["tokens_predicted"] == 16
    assert srv.metrics().labeled["preempt_parks_by_tier_total"]["ram_q8"] == 0
    assert statsview.to_json(statsview.fetch(srv.url), None)["ram_q8"] is None


def test_a_bad_compress_value_is_a_cli_error_naming_the_flag(start_server, stories_model: Path) -> None:
    from helpers import new_server  # noqa: PLC0415
    import tempfile  # noqa: PLC0415
    with tempfile.TemporaryDirectory() as d:
        srv = new_server(stories_model, Path(d), extra_args=["--preempt-compress", "q4"])
        with pytest.raises(Exception):
            srv.start()
        assert "--preempt-compress expects none or q8_0, got 'q4'" in srv.log_text()


def test_the_policy_offers_the_packed_copy_only_where_the_executor_has_it() -> None:
    rates = _core.CostRates()
    plain = {t["tier"] for t in _core.tier_offers(4 * MIB, 100, 1 * MIB, rates)}
    assert "ram_q8" not in plain
    offers = {t["tier"]: t for t in _core.tier_offers(4 * MIB, 100, 3 * MIB, rates, extra_tiers=["ram_q8"])}
    assert offers["ram_q8"]["fits"] and not offers["ram"]["fits"]  # 4 MiB packs to about 2.1 MiB
    assert offers["ram_q8"]["ms"] > offers["ram"]["ms"]  # the same copies, plus packing and unpacking
    d = _core.choose_park("swap", 4 * MIB, 100, 3 * MIB, rates, extra_tiers=[_core.ParkTier.RAM_Q8])
    assert d.tier is _core.ParkTier.RAM_Q8 and d.reason == "room"
    d = _core.choose_park("swap", 2 * MIB, 100, 3 * MIB, rates, extra_tiers=[_core.ParkTier.RAM_Q8])
    assert d.tier is _core.ParkTier.RAM  # the plain copy fits: first in tier order


def test_the_simulator_models_the_compressed_tier_with_the_servers_choice() -> None:
    import llama_preempt  # noqa: PLC0415
    from llama_preempt.simulator import Costs, Workload, WorkloadError  # noqa: PLC0415

    # 300 tokens of SmolLM2 cells: a 6.6 MiB state, over a 5 MiB RAM budget unpacked, within it packed
    wl = Workload((0.0,) * 4, (300, 300, 300, 300), (300, 300, 300, 300))
    slow_prefill = Costs(prefill_token_ms=50.0)  # a recompute of 300 tokens: 15 s
    plain = llama_preempt.simulate(wl, n_ctx=1024, n_parallel=4, preempt_ram_mib=5, costs=slow_prefill)
    assert plain.parks_ram_q8 == 0 and plain.parks_recompute > 0
    packed = llama_preempt.simulate(wl, n_ctx=1024, n_parallel=4, preempt_ram_mib=5, costs=slow_prefill,
                                    preempt_compress="q8_0")
    assert packed.completed == 4 and packed.parks_ram_q8 > 0 and packed.parks_recompute < plain.parks_recompute
    assert packed.peak_parked_mib <= 5.0
    assert packed.makespan_s < plain.makespan_s  # packing and unpacking cost less than a 15 s re-prefill
    # the choice is the server's: each victim priced by the same tier models
    first = _core.choose_park("auto", 300 * 23040, 300, 5 * MIB, _core.CostRates(), extra_tiers=["ram_q8"])
    assert first.tier is _core.ParkTier.RAM_Q8 and first.reason == "room" and first.why == "ram_full"
    with pytest.raises(WorkloadError, match="--preempt-compress expects none or q8_0"):
        llama_preempt.simulate(wl, n_ctx=1024, n_parallel=4, preempt_compress="q4")
