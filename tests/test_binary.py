"""Which llama-server the package runs: its own build first; one found only on PATH must name
llama-preempt, so an upstream build (no preemption) is refused, saying what to do."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from llama_preempt import binary

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="the stand-in binaries are shell scripts")

UPSTREAM_VERSION = "version: 4567 (0c1e570)"
OURS_VERSION = "llama-preempt 0.1.0 (KV preemption for llama-server, upstream llama.cpp 0c1e570)"


def fake_server(folder: Path, first_line: str) -> Path:
    """A `llama-server` whose --version prints first_line, then what upstream prints, on stderr."""
    folder.mkdir(parents=True, exist_ok=True)
    exe = folder / "llama-server"
    exe.write_text(f"#!/bin/sh\necho '{first_line}' >&2\necho 'built with GNU 12.2.0 for Linux x86_64' >&2\n")
    exe.chmod(0o755)
    return exe


@pytest.fixture
def path_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """No $LLAMA_PREEMPT_SERVER and no packaged binary: only PATH is left to look on."""
    monkeypatch.delenv("LLAMA_PREEMPT_SERVER", raising=False)
    monkeypatch.setattr(binary, "_packaged", lambda exe: [])


def test_an_upstream_llama_server_on_path_is_refused_saying_what_to_do(
        path_only: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = fake_server(tmp_path / "bin", UPSTREAM_VERSION)
    monkeypatch.setenv("PATH", str(fake.parent))
    with pytest.raises(binary.ServerBinaryNotFound) as e:
        binary.server_binary()
    msg = str(e.value)
    assert str(fake) in msg and "not llama-preempt's" in msg and UPSTREAM_VERSION in msg, msg
    assert "pip install llama-preempt" in msg and "LLAMA_PREEMPT_SERVER" in msg, msg


def test_llama_preempts_build_on_path_is_taken(path_only: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = fake_server(tmp_path / "bin", OURS_VERSION)
    monkeypatch.setenv("PATH", str(fake.parent))
    assert binary.server_binary() == fake


def test_the_packaged_binary_comes_first_and_names_llama_preempt(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LLAMA_PREEMPT_SERVER", raising=False)
    upstream = fake_server(tmp_path / "bin", UPSTREAM_VERSION)
    monkeypatch.setenv("PATH", f"{upstream.parent}:{Path(sys.executable).parent}")
    found = binary.server_binary()
    assert found != upstream and found in binary._packaged("llama-server")
    assert binary.identity(found).startswith(binary.IDENTITY_PREFIX)
