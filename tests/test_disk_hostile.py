"""The disk tier in a directory other users can write in (--preempt-disk on a shared, sticky
directory such as /var/tmp): links and directories planted there, named like this server's stores,
its store being made, its lock or its park files, never turn the server against files outside its
store, and never stop it from serving; a directory others could turn against it is refused.

Each test plants "victim" files outside the store (as a service user's models, configs and logs)
and checks that every one of them is still there, unchanged, when the server has run.

Test knobs: LLAMA_SERVER_PREEMPT_DISK_NAME=NAME is the first name the store tries for its own
directory (so a test can plant something there first); the others as in test_disk.py.
"""
from __future__ import annotations

import os
import re
import shutil
import stat
import time
from pathlib import Path
from typing import Callable

import pytest

from helpers import ON_THE_CPU, BackgroundStream, complete, logged, wait_for_slot, wait_until
from llama_preempt.engine import Completion, Engine, EngineArgumentError
from llama_preempt.server import LlamaServer, ServerStartError

FORCED = {"LLAMA_SERVER_PREEMPT_EVERY": "8"}
ON_LOOP = ["--preempt-mode", "swap", "--preempt-ram", "0"]  # every park to disk, written before it returns
AN_HOUR_AGO = time.time() - 3600
NOBODY = 65534


def disk_args(d: Path) -> list[str]:
    return ["--preempt-disk", str(d)]


@pytest.fixture
def shared(tmp_path: Path) -> Path:
    """A directory like /tmp: everybody may write in it, and the sticky bit protects each one's entries."""
    d = tmp_path / "shared"
    d.mkdir()
    d.chmod(0o1777)
    return d


class Victims:
    """Files of the server's user outside the store; `intact()` says whether each is as it was."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.files: dict[Path, bytes] = {}

    def dir(self, name: str) -> Path:
        d = self.root / name
        d.mkdir(parents=True)
        for f in ("model.gguf", "server.conf", "lock", "park-1.kv"):
            self.file(d / f)
        os.utime(d, (AN_HOUR_AGO, AN_HOUR_AGO))  # older than any age rule
        return d

    def file(self, path: Path) -> Path:
        data = f"{path.name}: precious, not the server's to delete\n".encode()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        self.files[path] = data
        return path

    def intact(self) -> bool:
        return all(p.is_file() and not p.is_symlink() and p.read_bytes() == b for p, b in self.files.items())


@pytest.fixture
def victims(tmp_path: Path) -> Victims:
    return Victims(tmp_path / "victims")


def our_dirs(d: Path, srv: LlamaServer) -> list[Path]:
    assert srv.proc is not None
    return sorted(p for p in d.iterdir() if p.name.startswith(f"llama-preempt-{srv.proc.pid}-"))


def serves_with_disk_parks(srv: LlamaServer) -> None:
    """A request that is parked to disk and read back several times finishes whole."""
    got = complete(srv, "Once upon a time", 48).json()
    assert got["tokens_predicted"] == 48
    assert srv.metrics().labeled["preempt_parks_by_tier_total"]["disk"] >= 4
    assert sum(srv.metrics().labeled["preempt_disk_failures_total"].values()) == 0


def old_dir(path: Path, mode: int = 0o700) -> Path:
    path.mkdir()
    path.chmod(mode)
    return path


def age(path: Path) -> None:
    os.utime(path, (AN_HOUR_AGO, AN_HOUR_AGO), follow_symlinks=False)


# --- plantings named like the stores of servers that are gone ---

def test_links_named_like_stale_stores_never_lead_the_clean_up_outside(
        start_server, stories_model: Path, shared: Path, victims: Victims) -> None:
    planted: list[Path] = []

    def link(name: str, target: Path) -> None:
        (shared / name).symlink_to(target, target_is_directory=target.is_dir())
        age(shared / name)
        planted.append(shared / name)

    link("llama-preempt-99999-0", victims.dir("configs"))         # like a stale store
    link(".new-llama-preempt-99999-1", victims.dir("models"))     # like a store being made (earlier versions)
    link("llama-preempt-99999-2", victims.file(victims.root / "loose.log"))  # a link to a file
    # a real directory of ours whose lock and park file are links: not a store this server made
    fake = old_dir(shared / "llama-preempt-99999-3")
    (fake / "lock").symlink_to(victims.file(victims.root / "lock-target"))
    (fake / "park-1.kv").symlink_to(victims.file(victims.root / "park-target"))
    age(fake)
    # a store of ours whose lock nobody holds, as a killed server leaves it: still cleaned up
    stale = old_dir(shared / "llama-preempt-99999-4")
    (stale / "lock").write_bytes(b"")
    (stale / "park-7.kv").write_bytes(b"x" * 4096)
    age(stale)

    srv = start_server(stories_model, n_ctx=512, n_parallel=2, env=FORCED, extra_args=[*ON_LOOP, *disk_args(shared)])
    serves_with_disk_parks(srv)
    assert victims.intact()
    assert all(p.is_symlink() for p in planted)  # left alone: not ours to remove
    assert (fake / "lock").is_symlink() and (fake / "park-1.kv").is_symlink()
    assert not stale.exists()
    logged(srv, "removed 1 left by servers that are gone")
    assert len(our_dirs(shared, srv)) == 1


@pytest.mark.skipif(os.geteuid() != 0, reason="making a directory of another user needs root")
def test_another_users_directory_named_like_a_stale_store_is_left_alone(
        start_server, stories_model: Path, shared: Path, victims: Victims) -> None:
    theirs = old_dir(shared / "llama-preempt-99999-0")
    files = [victims.file(theirs / "lock"), victims.file(theirs / "park-1.kv")]
    for p in (*files, theirs):
        os.chown(p, NOBODY, NOBODY)
    age(theirs)
    srv = start_server(stories_model, n_ctx=512, n_parallel=2, env=FORCED, extra_args=[*ON_LOOP, *disk_args(shared)])
    serves_with_disk_parks(srv)
    assert victims.intact()
    assert "left by servers that are gone" not in srv.log_text()


# --- plantings at the store's own name ---

@pytest.mark.parametrize("kind", ["link", "directory", "file"])
def test_something_planted_at_the_stores_name_is_skipped_never_used(
        start_server, stories_model: Path, shared: Path, victims: Victims, kind: str) -> None:
    name = "llama-preempt-1-0123456789abcdef"  # as if the attacker had guessed it
    at = shared / name
    if kind == "link":
        at.symlink_to(victims.dir("configs"), target_is_directory=True)
    elif kind == "directory":  # another user's: one of ours with a free lock would be a dead server's
        if os.geteuid() != 0:
            pytest.skip("making a directory of another user needs root")
        old_dir(at, 0o755)
        for f in (victims.file(at / "park-1.kv"), victims.file(at / "lock"), at):
            os.chown(f, NOBODY, NOBODY)
        age(at)
    else:
        victims.file(at)
    srv = start_server(stories_model, n_ctx=512, n_parallel=2, env={**FORCED, "LLAMA_SERVER_PREEMPT_DISK_NAME": name},
                       extra_args=[*ON_LOOP, *disk_args(shared)])
    [ours] = our_dirs(shared, srv)
    assert ours != at and re.fullmatch(r"llama-preempt-\d+-[0-9a-f]{16}", ours.name)
    assert stat.S_IMODE(ours.lstat().st_mode) == 0o700 and not ours.is_symlink()
    serves_with_disk_parks(srv)
    srv.stop()
    assert not ours.exists()
    assert victims.intact()
    assert at.is_symlink() if kind == "link" else at.exists()


def test_store_names_are_not_predictable(start_server, stories_model: Path, shared: Path) -> None:
    a = start_server(stories_model, n_ctx=256, n_parallel=2, extra_args=disk_args(shared))
    b = start_server(stories_model, n_ctx=256, n_parallel=2, extra_args=disk_args(shared))
    names = [our_dirs(shared, s)[0].name for s in (a, b)]
    suffixes = [n.rsplit("-", 1)[1] for n in names]
    assert all(re.fullmatch(r"[0-9a-f]{16}", s) for s in suffixes) and suffixes[0] != suffixes[1]


# --- a park file replaced while the slot is parked on disk ---

def replace_with_link(f: Path, victims: Victims) -> None:
    f.unlink()
    f.symlink_to(victims.file(victims.root / "config.yaml"))


def replace_with_copy(f: Path, victims: Victims) -> None:
    # the same bytes, but another file: only the inode tells (the checksum would pass)
    copy = f.with_name("copy")
    shutil.copyfile(f, copy)
    os.replace(copy, f)


@pytest.mark.parametrize("replace", [replace_with_link, replace_with_copy], ids=["link", "other-file"])
def test_a_park_file_replaced_on_disk_is_not_read_and_the_slot_recomputes(
        start_server, stories_model: Path, tmp_path: Path, victims: Victims,
        replace: Callable[[Path, Victims], None]) -> None:
    # the recompute (the tokens re-prefilled in one batch) gives the uninterrupted answer: --deterministic,
    # with the CPU's kernels, on every build (a GPU's follow the batch)
    det = ["--deterministic", *ON_THE_CPU]
    ref = complete(start_server(stories_model, n_ctx=512, n_parallel=2, preempt=False, extra_args=det),
                   "Once upon a time", 400).json()["content"]
    disk = tmp_path / "disk"
    disk.mkdir()
    srv = start_server(stories_model, n_ctx=512, n_parallel=2, extra_args=[*det, *ON_LOOP, *disk_args(disk)])
    stream = BackgroundStream(srv, {"prompt": "Once upon a time", "n_predict": 400, "temperature": 0,
                                    "ignore_eos": True, "cache_prompt": False, "stream": True})
    sid = wait_for_slot(srv, "is_processing", 30)["id"]
    assert srv.post(f"/slots/{sid}?action=park", {}).status_code == 200
    [f] = wait_until(lambda: list(disk.glob("llama-preempt-*/park-*.kv")), 30, "the park's file")
    wait_until(lambda: srv.metrics()["preempt_disk_writes_in_flight"] == 0, 30, "the write to end")
    replace(f, victims)
    assert srv.post(f"/slots/{sid}?action=unpark", {}).status_code == 200
    got = Completion.from_stream(stream.join()).text
    assert got == ref
    assert srv.metrics().labeled["preempt_disk_failures_total"]["checksum"] == 1
    assert srv.metrics().labeled["preempt_restores_by_tier_total"]["recompute"] == 1
    wait_until(lambda: "not the file this park wrote" in srv.log_text() or "a link in its place" in srv.log_text(), 15,
               "the replaced file named in the log")
    wait_until(lambda: not f.exists() and not f.is_symlink(), 30, "the replaced file to be removed")
    assert victims.intact()


def test_a_link_planted_at_the_next_park_files_name_is_not_written_through(
        start_server, stories_model: Path, tmp_path: Path, victims: Victims) -> None:
    disk = tmp_path / "disk"
    disk.mkdir()
    srv = start_server(stories_model, n_ctx=512, n_parallel=2, extra_args=[*ON_LOOP, *disk_args(disk)])
    [store] = our_dirs(disk, srv)
    (store / "park-1.kv").symlink_to(victims.file(victims.root / "model.gguf"))
    stream = BackgroundStream(srv, {"prompt": "Once upon a time", "n_predict": 400, "temperature": 0,
                                    "ignore_eos": True, "cache_prompt": False, "stream": True})
    sid = wait_for_slot(srv, "is_processing", 30)["id"]
    assert srv.post(f"/slots/{sid}?action=park", {}).status_code == 200
    assert srv.post(f"/slots/{sid}?action=unpark", {}).status_code == 200
    chunks = stream.join()
    assert chunks[-1]["stop"] and chunks[-1]["tokens_predicted"] == 400
    assert srv.metrics().labeled["preempt_disk_failures_total"]["write"] == 1
    assert victims.intact()


# --- directories others could turn against the server ---

@pytest.mark.parametrize("mode,why", [
    (0o777, "other users may write in it (mode 0777) and it has no sticky bit"),
    (0o775, "other users may write in it (mode 0775) and it has no sticky bit"),
], ids=["world-writable", "group-writable"])
def test_a_directory_others_may_write_without_the_sticky_bit_is_refused(
        start_server, stories_model: Path, tmp_path: Path, mode: int, why: str) -> None:
    d = old_dir(tmp_path / "open", mode)
    with pytest.raises(ServerStartError, match=re.escape(why)):
        start_server(stories_model, n_ctx=256, n_parallel=2, extra_args=disk_args(d))
    with pytest.raises(EngineArgumentError, match=re.escape("--preempt-disk: '" + str(d) + "' is not safe")):
        Engine(stories_model, n_ctx=256, n_parallel=2, preempt_disk=str(d))
    assert list(d.iterdir()) == []
    d.chmod(mode | stat.S_ISVTX)  # with the sticky bit, as /tmp: nobody can move our entries
    srv = start_server(stories_model, n_ctx=256, n_parallel=2, extra_args=disk_args(d))
    assert len(our_dirs(d, srv)) == 1


@pytest.mark.skipif(os.geteuid() != 0, reason="making a directory of another user needs root")
def test_a_directory_of_another_user_is_refused(start_server, stories_model: Path, tmp_path: Path) -> None:
    d = old_dir(tmp_path / "theirs", 0o755)
    os.chown(d, NOBODY, NOBODY)
    with pytest.raises(ServerStartError, match=re.escape(f"it belongs to another user (uid {NOBODY})")):
        start_server(stories_model, n_ctx=256, n_parallel=2, extra_args=disk_args(d))
