"""Upstream's slot API (POST /slots/{id}?action=save|restore|erase) on files that are cut short,
damaged, of another model or never written whole, and on ids and slots it cannot act on: a clear
4xx, nothing written under the requested name, and every other request on the server finishes.

Real servers, real files: a truncated file once aborted the server (libllama's
GGML_ASSERT(nread <= state_size)), and a full disk left a partial file under the name."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any, Iterator

import pytest
import requests

from helpers import complete, run_concurrently, wait_for_parked, wait_until

TRAILER = 64  # csrc/server/preempt-slot-file.h: the check trailer after upstream's sequence state
N_RUNNING = 300  # tokens each of the two requests beside the restores generates


def _slot_server(start_server: Any, model: Path, save_dir: Path, **kw: Any) -> Any:
    """A server whose idle slots keep their cells while other requests start: upstream's default
    (--cache-idle-slots) hands an idle slot's prompt to the RAM cache and clears the slot when a new
    request arrives, which would race with the saves these tests make of an idle slot."""
    save_dir.mkdir(parents=True, exist_ok=True)
    kw.setdefault("n_ctx", 2048)
    kw.setdefault("n_parallel", 4)
    return start_server(model, extra_args=["--slot-save-path", str(save_dir), "--no-cache-idle-slots"], **kw)


def _fill_slot(srv: Any, slot: int, n_predict: int = 64) -> int:
    """A request on `slot` whose prompt and answer stay in the slot; returns its prompt and answer tokens."""
    r = complete(srv, "Once upon a time there was a little girl", n_predict, id_slot=slot, cache_prompt=True)
    assert r.status_code == 200, r.text
    return int(r.json()["tokens_evaluated"]) + n_predict


def _save(srv: Any, slot: int, name: str) -> requests.Response:
    return srv.post(f"/slots/{slot}?action=save", {"filename": name}, timeout=60)


def _restore(srv: Any, slot: int, name: str) -> requests.Response:
    return srv.post(f"/slots/{slot}?action=restore", {"filename": name}, timeout=60)


def _two_running(srv: Any, slots: tuple[int, int] | None = None) -> list[Any]:
    """Two long requests to run beside the slot actions; call the returned thunks' results later.
    `slots`: the slots they take (else upstream's choice, which may be the slot a test saves: its
    save then waits for that request)."""
    prompts = ("The dog ran to", "A small bird sang")
    if slots is None:
        return [lambda p=p: complete(srv, p, N_RUNNING) for p in prompts]
    return [lambda p=p, k=k: complete(srv, p, N_RUNNING, id_slot=k) for p, k in zip(prompts, slots)]


def _assert_whole(responses: list[requests.Response]) -> None:
    for r in responses:
        assert r.status_code == 200, r.text
        assert r.json()["tokens_predicted"] == N_RUNNING


@pytest.fixture
def saved(start_server: Any, stories_model: Path, tmp_path: Path) -> tuple[Any, Path, bytes]:
    """A server with a slot file of its own slot 0 ("good.bin") and its bytes."""
    srv = _slot_server(start_server, stories_model, tmp_path / "slots")
    n = _fill_slot(srv, 0)
    r = _save(srv, 0, "good.bin")
    assert r.status_code == 200, r.text
    assert r.json()["n_saved"] == n - 1  # the last token sampled is not evaluated yet
    path = tmp_path / "slots" / "good.bin"
    return srv, path, path.read_bytes()


def _write_beside(good: Path, name: str, data: bytes) -> str:
    (good.parent / name).write_bytes(data)
    return name


def test_a_saved_file_restores_and_carries_its_check_trailer(saved: tuple[Any, Path, bytes]) -> None:
    srv, path, data = saved
    assert data[:4] == b"qsgg"  # upstream's sequence state first (LLAMA_STATE_SEQ_MAGIC, little-endian)
    assert data[-TRAILER:][:6] == b"LPSLOT"
    assert r_ok(_restore(srv, 1, path.name))["n_restored"] > 0
    # nothing but the file itself in the directory: no temporary name left behind
    assert sorted(os.listdir(path.parent)) == ["good.bin"]


def _failures(srv: Any) -> dict[str, float]:
    """llamacpp:preempt_slot_file_failures_total by kind."""
    return srv.metrics().labeled["preempt_slot_file_failures_total"]


def r_ok(r: requests.Response) -> dict[str, Any]:
    assert r.status_code == 200, r.text
    return r.json()


@pytest.mark.parametrize("damage", ["half", "one_byte_short", "no_trailer", "bit_flipped", "appended", "empty"])
def test_a_damaged_slot_file_is_a_400_and_two_running_requests_finish_whole(saved: tuple[Any, Path, bytes],
                                                                            damage: str) -> None:
    srv, path, data = saved
    bad = {
        "half": data[:len(data) // 2],
        "one_byte_short": data[:-1],
        "no_trailer": data[:-TRAILER],  # upstream's own file, which its reader would take unchecked
        "bit_flipped": data[:len(data) // 2] + bytes([data[len(data) // 2] ^ 0x10]) + data[len(data) // 2 + 1:],
        "appended": data + b"\0" * 16,
        "empty": b"",
    }[damage]
    name = _write_beside(path, f"bad-{damage}.bin", bad)
    running = _two_running(srv)
    results = run_concurrently([*running, lambda: _restore(srv, 2, name)])
    r = results[-1]
    assert r.status_code == 400, r.text
    msg = r.json()["error"]["message"]
    assert name in msg and ("checksum" in msg or "cut" in msg or "trailer" in msg), msg
    _assert_whole(results[:-1])
    assert "GGML_ASSERT" not in srv.log_text()
    kind = "corrupt" if damage == "bit_flipped" else "truncated"
    assert _failures(srv) == {**{k: 0 for k in _failures(srv)}, kind: 1}
    logged = [line for line in srv.log_text().splitlines() if "refused to restore" in line]
    assert len(logged) == 1 and name in logged[0] and f"({kind})" in logged[0], logged
    # the slot it was meant for still works, and the good file still restores
    assert r_ok(_restore(srv, 2, path.name))["n_restored"] > 0
    assert complete(srv, "Once", 8, id_slot=2).status_code == 200


def test_a_file_of_another_model_is_refused_before_it_is_read(start_server: Any, stories_model: Path,
                                                             generated_stories: Path, tmp_path: Path) -> None:
    if stories_model.resolve() == generated_stories.resolve():
        pytest.skip("needs the real stories260K beside the generated one (a model of the same shapes)")
    slots = tmp_path / "slots"
    other = _slot_server(start_server, generated_stories, slots, n_parallel=2)
    _fill_slot(other, 0)
    r_ok(_save(other, 0, "other-model.bin"))
    other.stop()
    srv = _slot_server(start_server, stories_model, slots)
    results = run_concurrently([*_two_running(srv), lambda: _restore(srv, 1, "other-model.bin")])
    r = results[-1]
    assert r.status_code == 400, r.text
    assert "another model" in r.json()["error"]["message"]
    _assert_whole(results[:-1])
    assert _failures(srv)["foreign"] == 1


def test_a_failed_save_leaves_nothing_under_the_name_and_says_why(saved: tuple[Any, Path, bytes]) -> None:
    """The server's file-size limit (ulimit -f, set on the running server) below the file: a 507 naming
    the limit, the old file under the name untouched, no temporary file left, the server running."""
    import resource

    srv, path, data = saved
    limit = len(data) // 2
    resource.prlimit(srv.proc.pid, resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
    try:
        _fill_slot(srv, 0, 96)  # more tokens, a larger file
        r = _save(srv, 0, path.name)
        assert r.status_code == 507, r.text
        assert "file-size limit" in r.json()["error"]["message"]
        assert r.json()["error"]["type"] == "insufficient_storage_error"
        assert path.read_bytes() == data
        assert sorted(os.listdir(path.parent)) == [path.name]
    finally:
        resource.prlimit(srv.proc.pid, resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    assert complete(srv, "Once", 8).status_code == 200


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A 2 MiB tmpfs (root only): a filesystem that really fills."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a small tmpfs needs root")
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_a_save_into_a_full_filesystem_is_a_507_and_leaves_no_file(start_server: Any, stories_model: Path,
                                                                  small_fs: Path) -> None:
    srv = _slot_server(start_server, stories_model, small_fs)
    _fill_slot(srv, 0, 128)
    r_ok(_save(srv, 0, "first.bin"))
    first = (small_fs / "first.bin").read_bytes()
    st = os.statvfs(small_fs)
    free = st.f_bavail * st.f_frsize
    (small_fs / "filler").write_bytes(b"\0" * max(0, free - len(first) // 2))
    running = _two_running(srv, slots=(2, 3))
    results = run_concurrently([*running, lambda: _save(srv, 0, "second.bin"), lambda: _save(srv, 0, "first.bin")])
    for r in results[2:]:
        assert r.status_code == 507, r.text
        assert "no space left" in r.json()["error"]["message"]
    assert sorted(os.listdir(small_fs)) == ["filler", "first.bin"]
    assert _failures(srv)["no_space"] == 2
    assert (small_fs / "first.bin").read_bytes() == first
    _assert_whole(results[:2])
    # room again: the same save works
    (small_fs / "filler").unlink()
    r_ok(_save(srv, 0, "second.bin"))
    assert r_ok(_restore(srv, 1, "second.bin"))["n_restored"] > 0


@pytest.mark.parametrize("slot_id", ["1.5", "0x1", "0%00", "-1", "+1", "%201", "1e0", "99999999999", "one"])
@pytest.mark.parametrize("action", ["save", "restore", "erase", "park"])
def test_a_slot_id_that_is_not_a_whole_number_is_a_400_naming_it(start_server: Any, stories_model: Path,
                                                                 tmp_path: Path, slot_id: str, action: str) -> None:
    srv = _slot_server(start_server, stories_model, tmp_path / "slots", n_parallel=2)
    r = srv.post(f"/slots/{slot_id}?action={action}", {"filename": "x.bin"}, timeout=30)
    assert r.status_code == 400, r.text
    msg = r.json()["error"]["message"]
    shown = requests.utils.unquote(slot_id).replace("\0", "\\x00")
    assert f"'{shown}'" in msg and "whole number" in msg, msg


@pytest.mark.parametrize("action", ["save", "restore", "erase"])
def test_a_slot_id_beyond_the_slots_is_a_400_not_another_slot(start_server: Any, stories_model: Path,
                                                             tmp_path: Path, action: str) -> None:
    srv = _slot_server(start_server, stories_model, tmp_path / "slots", n_parallel=2)
    _fill_slot(srv, 1)
    r = srv.post(f"/slots/5?action={action}", {"filename": "x.bin"}, timeout=30)  # upstream took it as slot 1
    assert r.status_code == 400, r.text
    assert "no slot 5" in r.json()["error"]["message"]
    assert not (tmp_path / "slots" / "x.bin").exists()
    assert r_ok(_save(srv, 1, "one.bin"))["n_saved"] > 0  # slot 1 kept its tokens (not erased)


def test_slot_file_actions_on_a_slot_parked_through_the_api_are_a_409_at_once(start_server: Any, stories_model: Path,
                                                                             tmp_path: Path) -> None:
    srv = _slot_server(start_server, stories_model, tmp_path / "slots", n_parallel=2)
    r_ok(_save(srv, 1, "idle.bin"))
    outcome: dict[str, Any] = {}

    def long_request() -> None:
        outcome["r"] = complete(srv, "Once upon a time", 400, id_slot=0)

    runner = run_in_thread(long_request)
    wait_until(lambda: next((s for s in srv.slots() if s["id"] == 0 and s["is_processing"]), None), 30, "slot 0 to run")
    r_ok(srv.post("/slots/0?action=park", {}, timeout=30))
    wait_for_parked(srv)
    for action, body in (("save", {"filename": "p.bin"}), ("restore", {"filename": "idle.bin"}), ("erase", {})):
        r = srv.post(f"/slots/0?action={action}", body, timeout=10)  # upstream waited until the slot was free
        assert r.status_code == 409, r.text
        err = r.json()["error"]
        assert err["type"] == "conflict_error" and "parked through the API" in err["message"] and "unpark" in err["message"]
    assert not (tmp_path / "slots" / "p.bin").exists()
    r_ok(srv.post("/slots/0?action=unpark", {}, timeout=30))
    runner.join(120)
    assert outcome["r"].status_code == 200 and outcome["r"].json()["tokens_predicted"] == 400
    r_ok(_save(srv, 0, "p.bin"))  # free again: the actions work


def run_in_thread(fn: Any) -> Any:
    import threading

    t = threading.Thread(target=fn, daemon=True)
    t.start()
    return t


def test_the_hybrid_mtp_model_saves_and_restores_whole_files_and_refuses_a_cut_one(start_server: Any,
                                                                                  qwen35_mtp_model: Path,
                                                                                  tmp_path: Path) -> None:
    """Recurrent state, attention cells and the MTP head's context: the same trailer and checks."""
    slots = tmp_path / "slots"
    slots.mkdir()
    srv = start_server(qwen35_mtp_model, n_ctx=1024, n_parallel=2,
                       extra_args=["--slot-save-path", str(slots), "--spec-type", "draft-mtp", "--spec-draft-n-max", "2"])
    assert complete(srv, "Once upon a time", 32, id_slot=0, cache_prompt=True).status_code == 200
    saved = r_ok(_save(srv, 0, "hybrid.bin"))
    data = (slots / "hybrid.bin").read_bytes()
    assert saved["n_written"] == len(data) and data[-TRAILER:][:6] == b"LPSLOT"
    (slots / "cut.bin").write_bytes(data[:len(data) - TRAILER - 100])
    results = run_concurrently([lambda: complete(srv, "The dog ran to", 64), lambda: _restore(srv, 1, "cut.bin")])
    assert results[0].status_code == 200 and results[0].json()["tokens_predicted"] == 64
    assert results[1].status_code == 400 and "cut short" in results[1].json()["error"]["message"]
    assert r_ok(_restore(srv, 1, "hybrid.bin"))["n_restored"] == saved["n_saved"]
