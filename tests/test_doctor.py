"""The self-check of every park route (llama-preempt doctor, llama-server --preempt-selftest) and
the copy guard that checks the first swap copies of a serving server (--preempt-verify).

The doctor runs on this machine's device (the CPU, or with LLAMA_PREEMPT_TEST_GPU_LAYERS=N the
build's GPU, where the bulk route moves the KV by device graphs and restore ahead has a device to
upload to), on one and two RPC servers (a real device backend: its own buffers, asynchronous
transfers and graphs), with flash attention on and off, with a disk tier; the fault knobs
LLAMA_SERVER_PREEMPT_CORRUPT (one byte flipped in a copy of one route, by whatever means that
route takes on the device) and LLAMA_SERVER_PREEMPT_REFUSE_GATHER (every device lacks the gather's
ops) prove that a wrong copy is reported, caught in production, and that a device without the
gather falls back and says so. Its control (the unparked answer in other batches) tells a backend
whose answers follow the batch from a wrong copy.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import RpcFactory
from helpers import complete, logged, on_rpc, run_cli
from llama_preempt import DoctorReport, DoctorRoute, run_doctor
from llama_preempt.binary import server_binary

SWAP_ROUTES = ("bulk", "graphs", "slices", "disk")
FORCED = {"LLAMA_SERVER_PREEMPT_EVERY": "8"}
GPU_LAYERS = os.environ.get("LLAMA_PREEMPT_TEST_GPU_LAYERS")


@dataclass(frozen=True)
class KvDevice:
    """Where this run keeps the KV: the CPU, or under LLAMA_PREEMPT_TEST_GPU_LAYERS the build's first GPU."""
    flags: tuple[str, ...]  # llama-server flags that put every layer and its KV there
    name: str               # ggml's device name
    bulk_by: str            # how the bulk route moves its tensors: memcpy on the host, device graphs on a device
    n_routes: int           # the routes the doctor can try (restore ahead needs a device to upload to)

    @property
    def on_gpu(self) -> bool:
        return self.name != "CPU"


def kv_device() -> KvDevice:
    if not GPU_LAYERS:
        return KvDevice(("-dev", "none"), "CPU", "memcpy", 6)
    listed = subprocess.run([str(server_binary()), "--list-devices"], capture_output=True, text=True, timeout=60).stdout
    gpus = [m for m in re.findall(r"^\s+([A-Za-z]+\d+): ", listed, re.M) if not m.startswith("RPC")]
    if not gpus:
        pytest.skip(f"LLAMA_PREEMPT_TEST_GPU_LAYERS={GPU_LAYERS} but this build lists no GPU device:\n{listed}")
    return KvDevice(("-dev", gpus[0], "-ngl", GPU_LAYERS), gpus[0], "device graphs", 7)


def doctor(model: Path, *args: str, env: dict[str, str] | None = None) -> DoctorReport:
    return run_doctor(["-m", str(model), "-c", "512", *args], env=env, timeout=300)


def assert_answer_right(rep: DoctorReport, r: DoctorRoute) -> None:
    """The parked answer equals the unparked one; or every copy was exact and the control showed that
    this backend's answers follow the batch (the self-test then says so instead of failing)."""
    if not r.same_answer:
        assert r.answer_explained and not rep.control.batch_invariant and r.verified == 1, rep.text
        assert "copies exact; this backend's answers depend on the batch" in rep.text


def assert_swap_routes_right(rep: DoctorReport, devices: set[str], moved_by: str) -> None:
    for name in SWAP_ROUTES:
        r = rep.route(name)
        assert r.tried and r.ok, rep.text
        assert r.verified == 1 and r.mismatch == "", rep.text
        assert_answer_right(rep, r)
        assert {d.device for d in r.devices} == devices, rep.text
        assert r.n_bytes > 0 and r.park_gbps > 0 and r.restore_gbps > 0
    assert {d.moved_by for d in rep.route("bulk").devices} == {moved_by}
    assert {d.moved_by for d in rep.route("graphs").devices} == {"device graphs"}
    assert {d.moved_by for d in rep.route("slices").devices} == {"single slices"}
    # recompute has no bytes to check; its answer is compared, a difference is allowed (batch shapes)
    rc = rep.route("recompute")
    assert rc.tried and rc.verified == -1 and not rc.answer_must_match and rc.ok
    # the compressed tier's route: its copies checked against the unpacked bytes, its answer compared
    # but allowed to differ (q8_0 is not byte-exact)
    q8 = rep.route("ram_q8")
    assert q8.tried and q8.ok and q8.verified == 1 and not q8.answer_must_match, rep.text
    assert re.fullmatch(r"[\d.]+ MiB held as [\d.]+ MiB", q8.note) and q8.n_bytes > 0, q8.note


@pytest.mark.parametrize("flash", ["on", "off"])
def test_the_doctor_on_this_machines_device_verifies_every_route_and_prints_its_table_and_report(
        stories_model: Path, flash: str) -> None:
    dev = kv_device()
    rep = doctor(stories_model, *dev.flags, "-fa", flash)
    assert rep.ok and rep.returncode == 0, rep.text
    assert_swap_routes_right(rep, {dev.name}, dev.bulk_by)
    ahead = rep.route("restore ahead")
    if dev.on_gpu:  # the parked bytes uploaded to the device before the restore
        assert ahead.tried and ahead.verified == 1 and ahead.note == "", rep.text
        assert_answer_right(rep, ahead)
        assert {l["what"] for l in rep.links if l["device"] == dev.name} == {"device_to_host", "host_to_device"}
    else:
        assert not ahead.tried and "host memory" in ahead.why_not
        assert any(l["what"] == "memcpy" and l["gbps"] > 0 for l in rep.links)
    # the printed table: a row per route, the link column, the control, the result and the report to paste
    for words in ("route", "moved by", "park GB/s", "link GB/s", "numerics: ", "result: OK",
                  "--- report (paste this into a bug report) ---", "build: llama-preempt", f"device: {dev.name}", f"-fa {flash}"):
        assert words in rep.text, rep.text
    assert rep.control.tried
    if not dev.on_gpu:
        assert "not tried: every KV tensor is in host memory" in rep.text
    # the disk route, with no --preempt-disk, used a temporary directory and says so
    assert "temporary directory" in rep.route("disk").note


def test_llama_preempt_doctor_prints_the_table_and_exits_0_and_json_on_request(stories_model: Path) -> None:
    p = run_cli("doctor", "-m", str(stories_model), "-c", "512")
    assert p.returncode == 0, p.stderr[-2000:]
    assert "result: OK" in p.stdout and "--- end of report ---" in p.stdout
    j = run_cli("doctor", "-m", str(stories_model), "-c", "512", "--json")
    assert j.returncode == 0, j.stderr[-2000:]
    d = json.loads(j.stdout)
    assert d["ok"] is True and [r["route"] for r in d["routes"]] == ["bulk", "graphs", "slices", "restore ahead", "disk",
                                                                     "ram_q8", "recompute"]
    # a model that does not load: a clear error, exit 2
    bad = run_cli("doctor", "-m", str(stories_model.parent / "no-such-model.gguf"))
    assert bad.returncode == 2 and "llama-preempt doctor: error:" in bad.stderr


def test_llama_server_preempt_selftest_exits_1_when_a_route_is_wrong(stories_model: Path) -> None:
    dev = kv_device()
    env = {"LLAMA_SERVER_PREEMPT_CORRUPT": "slices"}
    p = subprocess.run([str(server_binary()), "-m", str(stories_model), "-c", "512", *dev.flags, "--preempt-selftest"],
                       capture_output=True, text=True, timeout=300, env={**os.environ, **env})
    assert p.returncode == 1, p.stdout
    assert f"result: FAILED, 1 of {dev.n_routes} routes wrong" in p.stdout
    assert "slices" in p.stdout and "MISMATCH at park" in p.stdout
    assert "LLAMA_SERVER_PREEMPT_CORRUPT flips a byte of every park by the slice route (single slices)" in p.stderr


@pytest.mark.skipif(bool(GPU_LAYERS), reason="--deterministic's batch-invariant kernels are the CPU's (none on a GPU yet)")
def test_the_doctors_control_tells_a_batch_dependent_backend_from_a_batch_invariant_one(stories_model: Path) -> None:
    # the CPU's tiled kernels give other bits in other batches: the unparked answer recomputed in another
    # layout and other batches has other logits (the greedy tokens may still agree)
    plain = doctor(stories_model, "-dev", "none")
    assert plain.ok and plain.control.tried and not plain.control.batch_invariant, plain.text
    assert plain.control.first_logits_diff >= 0
    assert "numerics: this backend's answers depend on the batch" in plain.text
    # --deterministic: the same logits bit for bit, so any other parked answer would be a wrong copy
    det = doctor(stories_model, "-dev", "none", "--deterministic")
    assert det.ok and det.control.tried and det.control.batch_invariant, det.text
    assert det.control.first_logits_diff == -1 and det.control.first_token_diff == -1
    assert "numerics: batch-invariant: the unparked answer recomputed in another layout and other batches has the same logits, bit for bit" in det.text
    assert all(r.same_answer for r in det.routes if r.tried and r.answer_must_match), det.text


def test_the_doctor_with_a_disk_tier_writes_its_files_there_and_leaves_nothing(stories_model: Path, tmp_path: Path) -> None:
    disk = tmp_path / "disk"
    disk.mkdir()
    rep = doctor(stories_model, "--preempt-disk", str(disk))
    assert rep.ok, rep.text
    assert rep.route("disk").verified == 1 and rep.route("disk").note == ""
    assert f"--preempt-disk {disk}" in rep.text
    assert list(disk.iterdir()) == []  # the store's directory went with it


@pytest.mark.parametrize("n_devices", [1, 2], ids=["one-rpc", "two-rpc"])
@pytest.mark.parametrize("flash", ["on", "off"])
def test_the_doctor_on_rpc_devices_verifies_device_graphs_and_restore_ahead(
        stories_model: Path, start_rpc: RpcFactory, n_devices: int, flash: str) -> None:
    rpcs = [start_rpc() for _ in range(n_devices)]
    rep = doctor(stories_model, *on_rpc(*rpcs), "-fa", flash)
    assert rep.ok, rep.text
    devices = {f"RPC{i}" for i in range(n_devices)}
    assert_swap_routes_right(rep, devices, "device graphs")
    ahead = rep.route("restore ahead")
    assert ahead.tried and ahead.verified == 1 and ahead.note == "", rep.text
    assert_answer_right(rep, ahead)
    for dev in devices:  # each device's link measured both ways
        assert {l["what"] for l in rep.links if l["device"] == dev} == {"device_to_host", "host_to_device"}
    # the RPC backend offers no pinned host memory: said, and the copies go on in ordinary memory
    assert sorted(rep.device_notes) == sorted(f"{d}: no pinned host memory: swap buffers are ordinary host memory "
                                              "(transfers may be slower)" for d in devices)


@pytest.mark.parametrize("knob, route, where", [
    ("graphs", "graphs", "park"), ("bulk", "bulk", "park"), ("bulk:restore", "bulk", "restore"),
    ("slices:restore", "slices", "restore"),
])
def test_an_injected_corruption_is_reported_as_a_mismatch_naming_the_route(
        stories_model: Path, knob: str, route: str, where: str) -> None:
    # the knob names a route and flips a byte of whatever means that route takes on the device
    # (bulk: memcpy on the CPU, device graphs on a GPU), so every means the device uses is proven
    dev = kv_device()
    rep = doctor(stories_model, *dev.flags, env={"LLAMA_SERVER_PREEMPT_CORRUPT": knob})
    assert not rep.ok and rep.returncode == 1
    bad = rep.route(route)
    assert bad.verified == 0 and not bad.ok
    # the first differing byte, located: which copy, context, tensor, layer, cell and device
    assert bad.mismatch.startswith(f"{where}: target context, tensor cache_"), bad.mismatch
    assert " (layer " in bad.mismatch and ", cell " in bad.mismatch and f", on {dev.name}" in bad.mismatch
    assert f"MISMATCH at {where}" in rep.text
    # restore ahead, the disk park and the compressed one go through the bulk route's copier too
    shared = ("disk", "restore ahead", "ram_q8") if route == "bulk" else ()
    others = [r for r in rep.routes if r.route != route and r.route not in shared]
    assert all(r.ok for r in others), rep.text


def test_an_rpc_device_that_refuses_the_gather_graph_falls_back_to_slices_and_says_so(
        stories_model: Path, start_rpc: RpcFactory) -> None:
    rep = doctor(stories_model, *on_rpc(start_rpc()), env={"LLAMA_SERVER_PREEMPT_REFUSE_GATHER": "1"})
    assert rep.ok, rep.text  # no error: the next route, verified
    for name in ("bulk", "graphs", "restore ahead", "disk"):
        (d,) = rep.route(name).devices
        assert d.moved_by == "single slices" and "does not support" in d.why, rep.text
    assert "slices one at a time because of an op the device does not support" in rep.text


def test_the_doctor_on_the_hybrid_mtp_model_verifies_recurrent_and_attention_state(qwen35_mtp_model: Path) -> None:
    dev = kv_device()
    rep = run_doctor(["-m", str(qwen35_mtp_model), "-c", "1024", *dev.flags, "--spec-type", "draft-mtp", "--spec-draft-n-max", "2"],
                     timeout=300)
    assert rep.ok, rep.text
    assert_swap_routes_right(rep, {dev.name}, dev.bulk_by)
    assert any("draft/MTP context" in w for w in rep.not_tried)  # said, not hidden


def test_the_copy_guard_catches_a_corrupt_park_switches_to_slices_and_the_request_gets_the_unparked_answer(
        start_server, stories_model: Path) -> None:
    dev = kv_device()
    args = ["--deterministic", "--preempt-mode", "swap"]
    ref = complete(start_server(stories_model, n_ctx=512, n_parallel=2, preempt=False, extra_args=args),
                   "Once upon a time", 64).json()
    srv = start_server(stories_model, n_ctx=512, n_parallel=2, extra_args=args,
                       env={**FORCED, "LLAMA_SERVER_PREEMPT_CORRUPT": "bulk"})
    got = complete(srv, "Once upon a time", 64).json()
    assert got["tokens_predicted"] == 64
    if not dev.on_gpu:  # --deterministic holds the answer to the bit on the CPU; a GPU's recompute may differ
        assert got["content"] == ref["content"]
    m = srv.metrics()
    assert m["n_swap_verify_mismatch_total"] == 1 and m["n_copy_route_changes_total"] == 1
    # the wrong park recomputed; every park after it went slice by slice, checked for the next 3
    assert m["n_preempt_recompute_total"] == 1 and m["n_preempt_swap_total"] == m["n_preempt_total"] - 1 >= 4
    assert m["n_swap_verify_total"] == 1 + 3 + 3
    log = logged(srv, "copy guard:", f"{dev.name} copies slice by slice from now on")
    assert log.count(f"copy guard: the swap park by {dev.bulk_by} on {dev.name} differs from upstream's copy at target context") == 1
    assert "by single slices" in log.split("copy guard:")[1]


def test_the_copy_guard_on_an_rpc_device_catches_a_corrupt_restore_and_moves_that_device_to_slices(
        start_server, start_rpc: RpcFactory, stories_model: Path) -> None:
    args = ["--deterministic", "--preempt-mode", "swap"]
    ref = complete(start_server(stories_model, n_ctx=512, n_parallel=2, preempt=False, extra_args=args),
                   "Once upon a time", 64).json()
    srv = start_server(stories_model, n_ctx=512, n_parallel=2, extra_args=args + on_rpc(start_rpc()),
                       env={**FORCED, "LLAMA_SERVER_PREEMPT_CORRUPT": "bulk:restore"})
    got = complete(srv, "Once upon a time", 64).json()
    assert got["content"] == ref["content"]
    m = srv.metrics()
    assert m["n_swap_verify_mismatch_total"] == 1 and m["n_copy_route_changes_total"] == 1
    assert m["n_swap_restore_fail_total"] == 1  # the restore on bad cells was refused: the request recomputed
    logged(srv, "copy guard: the swap restore by device graphs on RPC0 differs")


def test_when_single_slices_are_wrong_too_the_guard_turns_swap_off(start_server, stories_model: Path) -> None:
    srv = start_server(stories_model, n_ctx=512, n_parallel=2, extra_args=["--preempt-mode", "swap"],
                       env={**FORCED, "LLAMA_SERVER_PREEMPT_COPY": "slice", "LLAMA_SERVER_PREEMPT_CORRUPT": "slices"})
    got = complete(srv, "Once upon a time", 64).json()
    assert got["tokens_predicted"] == 64
    m = srv.metrics()
    assert m["n_preempt_total"] >= 4 and m["n_preempt_swap_total"] == 0  # every park recomputed
    assert m["n_swap_verify_mismatch_total"] == 1
    logged(srv, "SWAP is off from now on (every park recomputes)")


@pytest.mark.parametrize("flag, checked", [([], "first"), (["--preempt-verify", "never"], "none"),
                                           (["--preempt-verify", "always"], "all"), (["--preempt-verify", "1"], "one")])
def test_the_guard_checks_the_first_copies_per_device_as_preempt_verify_says(
        start_server, stories_model: Path, flag: list[str], checked: str) -> None:
    srv = start_server(stories_model, n_ctx=512, n_parallel=2, extra_args=["--preempt-mode", "swap", *flag], env=FORCED)
    complete(srv, "Once upon a time", 64)
    m = srv.metrics()
    n_parks, n_resumes = m["n_preempt_swap_total"], m["n_resume_total"]
    assert n_parks == m["n_preempt_total"] >= 4
    want = {"first": 3 + 3, "none": 0, "all": n_parks + n_resumes, "one": 1 + 1}[checked]
    assert m["n_swap_verify_total"] == want and m["n_swap_verify_mismatch_total"] == 0


@pytest.mark.parametrize("value", ["abc", "-2", "1.5"])
def test_a_bad_preempt_verify_is_refused_naming_the_flag(stories_model: Path, value: str) -> None:
    p = subprocess.run([str(server_binary()), "-m", str(stories_model), "--preempt-verify", value], capture_output=True,
                       text=True, timeout=60)
    assert p.returncode != 0
    assert "--preempt-verify expects a count of copies >= 0, 'always' or 'never'" in p.stderr


def test_the_engine_refuses_preempt_selftest_saying_what_to_run(stories_model: Path) -> None:
    from llama_preempt import Engine, EngineArgumentError

    with pytest.raises(EngineArgumentError, match="--preempt-selftest is not available in the Engine"):
        Engine(stories_model, ["--preempt-selftest"])
