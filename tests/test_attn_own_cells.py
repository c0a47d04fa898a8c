"""Attention in a shared pool visits only each request's own cells (--attn-own-cells, on by default;
patches/0011-attn-own-cells): flash attention is handed, once per batch, the runs of cells each row's
sequence holds, and walks those instead of every cell up to the pool's highest used one.

What is proved here:
- the CPU kernel, against the same attention over every cell and against the attention in double
  (tests/native/fa-kv-runs.cpp, built in this clone's build folder): byte for byte on the one-chunk
  loop (what --deterministic runs) and the split-KV decode, to rounding on the tiled path;
- upstream's op tests (test-backend-ops) build with the case the patch adds;
- the server: under --deterministic, many requests sharing one pool, and a parked-and-resumed one,
  get exactly the tokens of the dense path (--no-attn-own-cells), on stories260K, the hybrid MTP
  model and SmolLM2 (the last two where present); without it, a request alone gets the dense path's
  tokens; the flag, its environment twin, /props and -fa off's warning.
"""
from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from helpers import ON_THE_CPU, logged
from llama_preempt import models
from llama_preempt.exactness import Ask, first_difference, one_at_a_time, staggered, together
from llama_preempt.server import LlamaServer

from conftest import ServerFactory

ROOT = Path(__file__).resolve().parents[1]

PROMPTS = ["Once upon a time, in a small village by the sea, there lived", "The quick brown fox jumps over the lazy dog",
           "Tell me a story about a dragon who", "In the year 3000, humans had finally", "Lily and Ben went to the park",
           "One sunny day a little bird", "Tom had a red ball and", "The cat sat on the mat and looked at"]


def cache_value(text: str, key: str) -> str | None:
    m = re.search(rf"^{key}:[A-Z]+=(.*)$", text, re.M)
    return m.group(1) if m else None


def build_folder() -> tuple[Path, str]:
    """This clone's build folder (pip install . builds there: pyproject's build-dir), configured from
    this source tree, and the cmake that configured it; the kernel checks are targets of it that the
    wheel leaves out. A build whose cmake or ninja lived in pip's throwaway build environment cannot
    build more targets: skipped, naming what is missing."""
    for cache in sorted((ROOT / "build").glob("*/CMakeCache.txt")):
        text = cache.read_text()
        if cache_value(text, "CMAKE_HOME_DIRECTORY") != str(ROOT):
            continue
        cmake = cache_value(text, "CMAKE_COMMAND") or shutil.which("cmake") or "cmake"
        tool = cache_value(text, "CMAKE_MAKE_PROGRAM") or ""
        for need in (cmake, tool):
            if not Path(need).is_file():
                pytest.skip(f"{cache.parent} was configured with {need}, which is gone (pip's build environment): "
                            "install cmake and ninja on the machine and pip install . again")
        return cache.parent, cmake
    pytest.skip(f"no build folder of this clone under {ROOT / 'build'} (pip install . from the clone makes one)")


def built(target: str) -> Path:
    b, cmake = build_folder()
    p = subprocess.run([cmake, "--build", str(b), "--target", target], capture_output=True, text=True, timeout=1800)
    assert p.returncode == 0, f"building {target} failed:\n{(p.stdout + p.stderr)[-4000:]}"
    return b / target


def test_the_cpu_kernel_walks_the_runs_and_computes_what_every_cell_gives() -> None:
    p = subprocess.run([str(built("test-fa-kv-runs"))], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "byte for byte" in p.stdout and "to rounding" in p.stdout, p.stdout
    assert p.stdout.strip().splitlines()[-1].endswith("passed, 0 failed"), p.stdout


def test_upstreams_op_tests_build_with_the_runs_case() -> None:
    exe = built("test-backend-ops")
    # test mode compares a device with the CPU and skips the CPU itself: here it must at least find the
    # CPU and name the op, and the case's name must be in the binary's op list
    p = subprocess.run([str(exe), "test", "-o", "FLASH_ATTN_EXT", "-p", "n_seq"], capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, (p.stdout + p.stderr)[-3000:]
    assert b"kv_runs" in exe.read_bytes()


@dataclass(frozen=True)
class Model:
    path: Path
    args: tuple[str, ...]
    n_predict: int


@pytest.fixture(scope="module", params=["stories260K", "qwen35-mtp", "smollm2"])
def model(request: pytest.FixtureRequest, stories_model: Path) -> Model:
    if request.param == "stories260K":
        return Model(stories_model, (), 200)
    if request.param == "qwen35-mtp":
        return Model(request.getfixturevalue("qwen35_mtp_model"), ("--spec-type", "draft-mtp", "--spec-draft-n-max", "2"), 80)
    try:
        return Model(models.local_smollm2(lambda msg: None).path, (), 96)
    except models.ModelNotInstalled as e:
        pytest.skip(f"SmolLM2 is not here ({e})")


def serve(start_server: ServerFactory, m: Model, *extra: str, n_parallel: int = 8, n_ctx: int = 4096,
          deterministic: bool = True, env: dict[str, str] | None = None) -> LlamaServer:
    return start_server(m.path, n_ctx=n_ctx, n_parallel=n_parallel, kv_unified=True, deterministic=deterministic,
                        extra_args=[*ON_THE_CPU, *m.args, "--cache-ram", "0", *extra], env=env or {}, seed=1234)


def asks(m: Model) -> list[Ask]:
    # lengths that differ, so that requests end and others take their cells out of order
    return [Ask(p, m.n_predict // (1 + i % 3)) for i, p in enumerate(PROMPTS)]


def assert_same(ref: list[int], got: list[int], what: str) -> None:
    at = first_difference(ref, got)
    assert at is None, f"{what}: token {at} differs ({ref[max(0, at - 3):at + 3]} dense, {got[max(0, at - 3):at + 3]} own cells)"


def test_own_cells_is_on_by_default_and_the_flag_and_its_env_twin_turn_it_off(
        start_server: ServerFactory, stories_model: Path) -> None:
    on = start_server(stories_model, n_ctx=512, n_parallel=4)
    assert on.props()["llama_preempt"]["attn_own_cells"] is True
    off = start_server(stories_model, n_ctx=512, n_parallel=4, extra_args=["--no-attn-own-cells"])
    assert off.props()["llama_preempt"]["attn_own_cells"] is False
    env = start_server(stories_model, n_ctx=512, n_parallel=4, env={"LLAMA_ARG_ATTN_OWN_CELLS": "0"})
    assert env.props()["llama_preempt"]["attn_own_cells"] is False
    fa_off = start_server(stories_model, n_ctx=512, n_parallel=4, extra_args=["-fa", "off"])
    assert fa_off.props()["llama_preempt"]["attn_own_cells"] is False
    logged(fa_off, "-fa off has no own-cells path")
    assert "own-cells path" not in on.log_text()


def test_many_requests_in_one_pool_get_the_dense_paths_tokens_byte_for_byte(start_server: ServerFactory,
                                                                            model: Model) -> None:
    dense = serve(start_server, model, "--no-attn-own-cells")
    own = serve(start_server, model)
    work = asks(model)
    for how, run in (("together", together), ("staggered", staggered)):
        ref, got = run(dense, work), run(own, work)
        for ask, r, g in zip(work, ref, got):
            assert_same(r, g, f"{how}: {ask.prompt[:24]!r}")


@pytest.mark.parametrize("mode", ["swap", "recompute"])
def test_a_parked_and_resumed_answer_is_the_dense_paths(start_server: ServerFactory, model: Model, mode: str) -> None:
    target = Ask(PROMPTS[0], model.n_predict)
    dense = serve(start_server, model, "--no-attn-own-cells")
    ref = one_at_a_time(dense, [target])[0]
    parked = serve(start_server, model, "--preempt-mode", mode, env={"LLAMA_SERVER_PREEMPT_EVERY": "13"})
    got = together(parked, [target, *asks(model)[1:4]])[0]
    assert parked.metrics()["n_preempt_total"] > 0, "nothing was parked"
    assert_same(ref, got, f"parked by {mode} every 13 tokens beside three others")


def test_without_deterministic_a_request_alone_gets_the_dense_paths_tokens(start_server: ServerFactory,
                                                                           stories_model: Path) -> None:
    # alone in the pool its cells are one run from cell 0: the tiled prompt path's windows and the
    # decode paths then visit what the dense path visits, in the same tiles
    m = Model(stories_model, (), 160)
    long_prompt = " ".join(PROMPTS * 4)  # over the kernel's 64-row tile, so the prompt takes the tiled path
    work = [Ask(long_prompt, m.n_predict), Ask(PROMPTS[1], m.n_predict)]
    dense = serve(start_server, m, "--no-attn-own-cells", deterministic=False)
    own = serve(start_server, m, deterministic=False)
    for ask, r, g in zip(work, one_at_a_time(dense, work), one_at_a_time(own, work)):
        assert_same(r, g, f"alone: {ask.prompt[:24]!r}")
