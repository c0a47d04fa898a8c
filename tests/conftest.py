"""Fixtures: the stories260K test model (real or generated) and real llama-server processes."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Iterator

import pytest

from helpers import new_server
from llama_preempt.models import sha256_of
from llama_preempt.rpc import RpcServer
from llama_preempt.server import LlamaServer

ROOT = Path(__file__).resolve().parent.parent
SHARED_STORIES = ROOT.parent / "shared" / "models" / "stories260K.gguf"
STORIES_SHA256 = "270cba1bd5109f42d03350f60406024560464db173c0e387d91f0426d3bd256d"
SHARED_QWEN35_MTP = ROOT.parent / "shared" / "models" / "tiny-qwen35-mtp.gguf"
QWEN35_MTP_SHA256 = "a33facccf53b76082c7e520f85a70f7235d3ed68e2a4e0abdf0ffbbf431831bb"




def _real_stories() -> Path | None:
    if SHARED_STORIES.is_file() and sha256_of(SHARED_STORIES) == STORIES_SHA256:
        return SHARED_STORIES
    return None


@pytest.fixture(scope="session")
def generated_stories(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A stories260K-shaped model made with the gguf package, once per test session."""
    from llama_preempt.testmodel import generate_stories260k

    out = tmp_path_factory.mktemp("models") / "stories260K-generated.gguf"
    return generate_stories260k(out)


@pytest.fixture(scope="session")
def stories_model(generated_stories: Path) -> Path:
    """The test model: $LLAMA_PREEMPT_TEST_MODEL, else the real stories260K from ../shared
    (verified by sha256), else the generated stand-in."""
    explicit = os.environ.get("LLAMA_PREEMPT_TEST_MODEL")
    if explicit:
        p = Path(explicit)
        if not p.is_file():
            pytest.fail(f"LLAMA_PREEMPT_TEST_MODEL={explicit} is not a file")
        return p
    return _real_stories() or generated_stories


@pytest.fixture(scope="session", params=["real", "generated"])
def each_stories_model(request: pytest.FixtureRequest, generated_stories: Path) -> Path:
    """Both flavours of stories260K: the real one when ../shared has it, and the generated one."""
    if request.param == "real":
        real = _real_stories()
        if real is None:
            pytest.skip(f"the real stories260K is not at {SHARED_STORIES} (or its sha256 differs)")
        return real
    return generated_stories


@pytest.fixture(scope="session")
def qwen35_mtp_model() -> Path:
    if not SHARED_QWEN35_MTP.is_file():
        pytest.skip(f"the hybrid MTP test model is not at {SHARED_QWEN35_MTP}")
    if sha256_of(SHARED_QWEN35_MTP) != QWEN35_MTP_SHA256:
        pytest.skip(f"{SHARED_QWEN35_MTP} has an unexpected sha256")
    return SHARED_QWEN35_MTP


ServerFactory = Callable[..., LlamaServer]


@pytest.fixture
def start_server(tmp_path: Path) -> Iterator[ServerFactory]:
    """Start real llama-server processes (helpers.new_server) on free loopback ports, or on
    `port`; all are stopped afterwards.

        srv = start_server(model, n_ctx=256, n_parallel=2, env={...})
    """
    started: list[LlamaServer] = []

    def start(model: Path, *, port: int | None = None, **kw: object) -> LlamaServer:
        srv = new_server(model, tmp_path, port=port, **kw)
        started.append(srv)
        return srv.start()

    yield start
    for srv in started:
        srv.stop()


RpcFactory = Callable[..., RpcServer]


class RpcServerOn(RpcServer):
    """A ggml-rpc-server serving the one device named (its -d), or its default when None: the
    build's accelerators (CUDA0, ...) where it has any, else its CPU."""

    def __init__(self, *, device: str | None = None, **kw: object) -> None:
        super().__init__(**kw)  # type: ignore[arg-type]
        self.device = device

    def command(self) -> list[str]:
        return [*super().command(), *(["-d", self.device] if self.device else [])]


# an RPC server whose answers do not depend on the batch: its CPU (on every build) with the
# batch-invariant kernels, for a llama-server run with --deterministic (docs/design.md)
BATCH_INVARIANT_RPC = {"device": "CPU", "env": {"GGML_CPU_BATCH_INVARIANT": "1"}}


@pytest.fixture
def start_rpc(tmp_path: Path) -> Iterator[RpcFactory]:
    """Start ggml-rpc-server children (llama.cpp's RPC device) on free loopback ports; all are
    stopped afterwards. `device`: the one device it serves (default: its own choice, a GPU build's
    accelerator, else the CPU); `env`: its environment's additions.

        rpc = start_rpc()                          # the build's device behind RPC
        rpc = start_rpc(**BATCH_INVARIANT_RPC)     # the CPU, batch-invariant, on every build
    """
    started: list[RpcServer] = []

    def start(threads: int = 1, device: str | None = None, env: dict[str, str] | None = None) -> RpcServer:
        rpc = RpcServerOn(threads=threads, log_dir=tmp_path, device=device, env=env)
        started.append(rpc)
        return rpc.start()

    yield start
    for rpc in started:
        rpc.stop()
