"""Attention in a shared pool visits only each request's own cells (--attn-own-cells, on by default):
flash attention on the CPU is handed, once per batch, the runs of cells each row's sequence holds, and
walks those instead of every cell up to the pool's highest used one (patches/0011-attn-own-cells);
without flash attention, or with the KV on a GPU, libllama gathers each sequence's cells into a stream
of its own (patches/0012-attn-own-cells-gather).

What is proved here:
- the CPU kernel, against the same attention over every cell and against the attention in double
  (tests/native/fa-kv-runs.cpp, built in this clone's build folder): byte for byte on the one-chunk
  loop (what --deterministic runs) and the split-KV decode, to rounding on the tiled path;
- upstream's op tests (test-backend-ops) build with the case the patch adds;
- the server: under --deterministic, many requests sharing one pool, and a parked-and-resumed one,
  get exactly the tokens of the dense path (--no-attn-own-cells), on stories260K, the hybrid MTP
  model and SmolLM2 (the last two where present); without it, a request alone gets the dense path's
  tokens; the flag, its environment twin and /props;
- the gathered path (forced on the CPU by LLAMA_ATTN_OWN_CELLS_GATHER=1): under --deterministic the
  dense path's tokens byte for byte, together, staggered and parked; with -fa off, the dense path's
  tokens and log-probabilities to rounding.
"""
from __future__ import annotations

import re
import shutil
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path

import pytest

from helpers import ON_THE_CPU
from llama_preempt import models
from llama_preempt.exactness import Ask, first_difference, one_at_a_time, staggered, together
from llama_preempt.server import LlamaServer

from conftest import ServerFactory

ROOT = Path(__file__).resolve().parents[1]

# libllama's switch to the gathered path where flash attention on the CPU would walk the runs
GATHER = {"LLAMA_ATTN_OWN_CELLS_GATHER": "1"}

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
    # without flash attention each sequence's cells are gathered into a stream of their own
    fa_off = start_server(stories_model, n_ctx=512, n_parallel=4, extra_args=["-fa", "off"])
    assert fa_off.props()["llama_preempt"]["attn_own_cells"] is True


def test_many_requests_in_one_pool_get_the_dense_paths_tokens_byte_for_byte(start_server: ServerFactory,
                                                                            model: Model) -> None:
    dense = serve(start_server, model, "--no-attn-own-cells")
    own = serve(start_server, model)
    work = asks(model)
    for how, run in (("together", together), ("staggered", staggered)):
        ref, got = run(dense, work), run(own, work)
        for ask, r, g in zip(work, ref, got):
            assert_same(r, g, f"{how}: {ask.prompt[:24]!r}")


def test_gathered_cells_get_the_dense_paths_tokens_byte_for_byte(start_server: ServerFactory, model: Model) -> None:
    # where no kernel walks the runs (-fa off, or the KV on a GPU), each sequence's cells are gathered
    # into a stream of their own; forced here with flash attention on the CPU, so that under
    # --deterministic the gathered path must give exactly what attention over every cell gives
    dense = serve(start_server, model, "--no-attn-own-cells")
    gathered = serve(start_server, model, env=GATHER)
    work = asks(model)
    for how, run in (("together", together), ("staggered", staggered)):
        ref, got = run(dense, work), run(gathered, work)
        for ask, r, g in zip(work, ref, got):
            assert_same(r, g, f"gathered, {how}: {ask.prompt[:24]!r}")


def test_gathered_cells_of_a_long_request_beside_short_ones_get_the_dense_paths_tokens(
        start_server: ServerFactory, stories_model: Path) -> None:
    # a prompt of over a thousand tokens decoding beside 31 short ones: padding every sequence to the
    # longest would gather more than eight pools' worth of cells, so those batches attend all their
    # sequences' cells as one set (llama_kv_cache::build_gather); each row must still see only its own
    m = Model(stories_model, (), 40)
    work = [Ask(" ".join(PROMPTS * 13), m.n_predict), *[Ask(PROMPTS[i % 8], m.n_predict) for i in range(1, 32)]]
    dense = serve(start_server, m, "--no-attn-own-cells", n_parallel=32)
    gathered = serve(start_server, m, n_parallel=32, env=GATHER)
    for ask, r, g in zip(work, together(dense, work), together(gathered, work)):
        assert_same(r, g, f"gathered beside a long one: {ask.prompt[:24]!r}")


@pytest.mark.parametrize("mode", ["swap", "recompute"])
@pytest.mark.parametrize("how", ["runs", "gathered"])
def test_a_parked_and_resumed_answer_is_the_dense_paths(start_server: ServerFactory, model: Model, mode: str,
                                                        how: str) -> None:
    target = Ask(PROMPTS[0], model.n_predict)
    dense = serve(start_server, model, "--no-attn-own-cells")
    ref = one_at_a_time(dense, [target])[0]
    parked = serve(start_server, model, "--preempt-mode", mode,
                   env={"LLAMA_SERVER_PREEMPT_EVERY": "13", **(GATHER if how == "gathered" else {})})
    got = together(parked, [target, *asks(model)[1:4]])[0]
    assert parked.metrics()["n_preempt_total"] > 0, "nothing was parked"
    assert_same(ref, got, f"{how}: parked by {mode} every 13 tokens beside three others")


def completion_logprobs(srv: LlamaServer, prompt: str, n_predict: int) -> list[tuple[int, float]]:
    r = srv.post("/completion", {"prompt": prompt, "n_predict": n_predict, "temperature": 0, "n_probs": 1,
                                 "cache_prompt": False}, timeout=600)
    assert r.status_code == 200, r.text[:300]
    return [(int(c["id"]), float(c["logprob"])) for c in r.json()["completion_probabilities"]]


def test_without_flash_attention_requests_in_one_pool_attend_their_gathered_cells(
        start_server: ServerFactory, stories_model: Path) -> None:
    # -fa off multiplies and softmaxes the gathered cells where the dense path does every cell: the same
    # attention up to rounding (the dense path rounds the queries and the probabilities to F16; the
    # gathered cells are multiplied in F32). Eight requests at once, so that their cells interleave
    n = 160
    results: dict[str, list[list[tuple[int, float]]]] = {}
    for name, extra in (("dense", ("--no-attn-own-cells",)), ("gathered", ())):
        srv = serve(start_server, Model(stories_model, (), n), "-fa", "off", *extra, deterministic=False)
        out: list[list[tuple[int, float]] | None] = [None] * len(PROMPTS)

        def ask(i: int, srv: LlamaServer = srv, out: list = out) -> None:
            out[i] = completion_logprobs(srv, PROMPTS[i], n)

        threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(PROMPTS))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert all(o is not None for o in out), f"{name}: a request failed"
        results[name] = out  # type: ignore[assignment]
    for prompt, ref, got in zip(PROMPTS, results["dense"], results["gathered"]):
        same = first_difference([t for t, _ in ref], [t for t, _ in got])
        same = len(ref) if same is None else same
        assert same >= n // 2, f"{prompt[:24]!r}: the tokens part at {same} of {len(ref)}"
        worst = max(abs(a - b) for (_, a), (_, b) in zip(ref[:same], got[:same]))
        assert worst < 0.05, f"{prompt[:24]!r}: a token's log-probability differs by {worst:.3g} from the dense path's"


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
