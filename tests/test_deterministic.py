"""--deterministic: a request's generated token ids are the ones it gets alone on an idle server,
whatever runs beside it, however it is parked, wherever its prompt comes from, over HTTP and in the
Engine. Each test compares token ids exactly, on stories260K, the hybrid MTP model and SmolLM2
(the last two where present).

The batch-invariant kernels are the CPU's (a GPU's choose their path by the batch's shape): every
server and Engine here keeps its layers on the CPU (helpers.ON_THE_CPU, on every build and under
LLAMA_PREEMPT_TEST_GPU_LAYERS), or on an RPC device whose ggml-rpc-server runs the batch-invariant
CPU (conftest.BATCH_INVARIANT_RPC)."""
from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from helpers import ON_THE_CPU, logged, new_server, on_rpc
from llama_preempt import models
from llama_preempt.binary import server_binary
from llama_preempt.exactness import Ask, first_difference, one_at_a_time, staggered, together
from llama_preempt.server import LlamaServer, free_port

from conftest import BATCH_INVARIANT_RPC, RpcFactory, ServerFactory

TARGET = "Once upon a time, in a small village by the sea, there lived"
NEIGHBOURS = ["The quick brown fox jumps over the lazy dog and then", "Tell me a story about a dragon who",
              "In the year 3000, humans had finally"]
LATECOMER = "Lily and Ben went to the park"


@dataclass(frozen=True)
class Det:
    """A model and how to serve it for these tests."""
    path: Path
    args: tuple[str, ...]
    n_predict: int

    def target(self, **kw: Any) -> Ask:
        return Ask(TARGET, self.n_predict, **kw)

    def neighbours(self) -> list[Ask]:
        n = self.n_predict
        return [Ask(NEIGHBOURS[0], max(8, n // 4)), Ask(NEIGHBOURS[1], n + n // 4), Ask(NEIGHBOURS[2], n // 2)]

    def staggered(self) -> list[Ask]:
        """A long one, the target while it decodes, a short one that ends at once, then two more:
        the last takes the short one's slot and frees its cells, which the running requests then
        fill out of position order (the sort in the visiting order runs)."""
        n = self.n_predict
        return [Ask(NEIGHBOURS[1], n + n // 4), self.target(), Ask(NEIGHBOURS[0], 8), Ask(NEIGHBOURS[2], n // 2),
                Ask(LATECOMER, n // 2)]


@pytest.fixture(scope="module", params=["stories260K", "qwen35-mtp", "smollm2"])
def det(request: pytest.FixtureRequest, stories_model: Path) -> Det:
    if request.param == "stories260K":
        return Det(stories_model, (), 400)  # long enough that, without the flag, four of these tests fail
    if request.param == "qwen35-mtp":
        mtp = request.getfixturevalue("qwen35_mtp_model")
        return Det(mtp, ("--spec-type", "draft-mtp", "--spec-draft-n-max", "2"), 120)
    try:
        smol = models.local_smollm2(lambda msg: None).path
    except models.ModelNotInstalled as e:
        pytest.skip(f"SmolLM2 is not here ({e})")
    return Det(smol, (), 160)


def serve(start_server: ServerFactory, det: Det, *extra: str, n_ctx: int = 2048, n_parallel: int = 4,
          kv_unified: bool = True, env: dict[str, str] | None = None, cache_ram: bool = False,
          placement: list[str] = ON_THE_CPU) -> LlamaServer:
    """A --deterministic server for det's model, its layers where `placement` puts them (the CPU)."""
    args = [*placement, *det.args, *([] if cache_ram else ["--cache-ram", "0"]), *extra]
    return start_server(det.path, n_ctx=n_ctx, n_parallel=n_parallel, kv_unified=kv_unified, deterministic=True,
                        extra_args=args, env=env or {}, seed=1234)


@pytest.fixture(scope="module")
def alone(det: Det, tmp_path_factory: pytest.TempPathFactory) -> dict[Ask, list[int]]:
    """The reference, once per model: each ask of these tests run one at a time on an idle server."""
    asks = [det.target(), det.target(temperature=0.8, seed=7), *det.neighbours(), *det.staggered(),
            *[Ask(p, det.n_predict) for p in NEIGHBOURS]]
    asks = list(dict.fromkeys(asks))
    with new_server(det.path, tmp_path_factory.mktemp("alone"), n_ctx=2048, n_parallel=4, kv_unified=True,
                    deterministic=True, seed=1234, extra_args=[*ON_THE_CPU, *det.args, "--cache-ram", "0"]) as srv:
        return dict(zip(asks, one_at_a_time(srv, asks)))


def assert_same(ref: list[int], got: list[int], what: str) -> None:
    at = first_difference(ref, got)
    assert at is None, f"{what}: token {at} differs ({ref[max(0, at - 3):at + 3]} alone, {got[max(0, at - 3):at + 3]} here)"


def test_deterministic_is_off_by_default_and_shows_in_props(start_server: ServerFactory, stories_model: Path) -> None:
    default = start_server(stories_model, n_ctx=256, n_parallel=2)
    assert default.props()["llama_preempt"]["deterministic"] is False
    flag = start_server(stories_model, n_ctx=256, n_parallel=2, deterministic=True)
    assert flag.props()["llama_preempt"]["deterministic"] is True
    env = start_server(stories_model, n_ctx=256, n_parallel=2, env={"LLAMA_ARG_DETERMINISTIC": "1"})
    assert env.props()["llama_preempt"]["deterministic"] is True
    logged(flag, "deterministic: batch-invariant kernels")
    assert "deterministic:" not in default.log_text()


def test_deterministic_with_flash_attention_off_is_refused_naming_the_flags(stories_model: Path) -> None:
    p = subprocess.run([str(server_binary()), "-m", str(stories_model), "--deterministic", "-fa", "off",
                        "--port", str(free_port())], capture_output=True, text=True, timeout=60)
    assert p.returncode == 1, p.stderr[-2000:]
    assert "error: --deterministic needs flash attention: drop -fa/--flash-attn off" in p.stderr
    code = ("import sys\nfrom llama_preempt.engine import Engine, EngineArgumentError\n"
            "try:\n    Engine(sys.argv[1], '-fa off', deterministic=True)\nexcept EngineArgumentError as e:\n"
            "    print('refused:', e)\nprint('alive')\n")
    p = subprocess.run([sys.executable, "-c", code, str(stories_model)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "refused:" in p.stdout and "--deterministic needs flash attention" in p.stdout, p.stdout


def test_a_request_beside_three_others_gives_its_alone_tokens(start_server: ServerFactory, det: Det,
                                                              alone: dict[Ask, list[int]]) -> None:
    srv = serve(start_server, det)
    target, neighbours = det.target(), det.neighbours()
    got = together(srv, [target, *neighbours])
    for ask, ids in zip([target, *neighbours], got):
        assert_same(alone[ask], ids, f"started together: {ask.prompt[:20]!r}")
    order = det.staggered()
    got = staggered(srv, order)
    for ask, ids in zip(order, got):
        assert_same(alone[ask], ids, f"staggered: {ask.prompt[:20]!r}")


def test_a_sampled_request_with_a_seed_gives_its_alone_tokens_beside_others(
        start_server: ServerFactory, det: Det, alone: dict[Ask, list[int]]) -> None:
    srv = serve(start_server, det)
    sampled = det.target(temperature=0.8, seed=7)
    got = together(srv, [sampled, *det.neighbours()])[0]
    assert_same(alone[sampled], got, "temperature 0.8, seed 7, beside three others")


@pytest.mark.parametrize("every", [3, 17, 40])
def test_forced_recompute_parks_give_the_unparked_tokens(start_server: ServerFactory, det: Det,
                                                         alone: dict[Ask, list[int]], every: int) -> None:
    srv = serve(start_server, det, "--preempt-mode", "recompute", env={"LLAMA_SERVER_PREEMPT_EVERY": str(every)})
    got = one_at_a_time(srv, [det.target()])[0]
    m = srv.metrics()
    assert m["n_preempt_recompute_total"] >= det.n_predict // every - 1 and m["n_preempt_swap_total"] == 0
    assert_same(alone[det.target()], got, f"RECOMPUTE park every {every} tokens")


def test_forced_swap_parks_give_the_unparked_tokens(start_server: ServerFactory, det: Det,
                                                    alone: dict[Ask, list[int]]) -> None:
    srv = serve(start_server, det, "--preempt-mode", "swap", env={"LLAMA_SERVER_PREEMPT_EVERY": "11"})
    got = one_at_a_time(srv, [det.target()])[0]
    assert srv.metrics()["n_preempt_swap_total"] >= det.n_predict // 11 - 1
    assert_same(alone[det.target()], got, "SWAP park every 11 tokens")


@pytest.mark.parametrize("mode", ["auto", "recompute"])
def test_an_overloaded_pool_gives_every_request_its_alone_tokens(start_server: ServerFactory, det: Det,
                                                                 alone: dict[Ask, list[int]], mode: str) -> None:
    asks = [Ask(p, det.n_predict) for p in NEIGHBOURS] + [det.target()]
    pool = 256 * -(-(det.n_predict + 64) // 256)  # one fits alone, four overflow it
    srv = serve(start_server, det, "--preempt-mode", mode, n_ctx=pool)
    got = together(srv, asks)
    assert srv.metrics()["n_preempt_total"] > 0, "the pool never filled: nothing was parked"
    for ask, ids in zip(asks, got):
        assert_same(alone[ask], ids, f"overloaded pool ({mode}): {ask.prompt[:20]!r}")


def test_a_prompt_cache_hit_gives_the_tokens_of_a_miss(start_server: ServerFactory, det: Det,
                                                       alone: dict[Ask, list[int]]) -> None:
    cached = det.target(cache_prompt=True)
    srv = serve(start_server, det)
    one_at_a_time(srv, [Ask(TARGET + " a baker", 8, cache_prompt=True)])  # leaves the shared prefix in a slot
    got = one_at_a_time(srv, [cached])[0]
    assert_same(alone[det.target()], got, "a prompt partly from the slot's cache")
    # --cache-ram: the slot's state goes to host RAM when another prompt takes the only slot, and
    # comes back from there for the same prompt
    host = serve(start_server, det, "--cache-ram", "64", "--no-preempt", n_parallel=1, cache_ram=True)
    first = one_at_a_time(host, [cached])[0]
    one_at_a_time(host, [Ask(NEIGHBOURS[1], 8, cache_prompt=True)])
    again = one_at_a_time(host, [cached])[0]
    assert_same(alone[det.target()], first, "--cache-ram, a miss")
    assert_same(alone[det.target()], again, "--cache-ram, restored from host RAM")


def test_small_batches_give_the_tokens_of_large_ones(start_server: ServerFactory, det: Det,
                                                     alone: dict[Ask, list[int]]) -> None:
    srv = serve(start_server, det, "-ub", "7")
    got = together(srv, [det.target(), *det.neighbours()])[0]
    assert_same(alone[det.target()], got, "-ub 7 (the reference: -ub 512)")


def test_a_split_pool_gives_the_tokens_of_a_unified_one(start_server: ServerFactory, det: Det,
                                                        alone: dict[Ask, list[int]]) -> None:
    srv = serve(start_server, det, n_ctx=4096, kv_unified=False)
    got = together(srv, [det.target(), *det.neighbours()])[0]
    assert_same(alone[det.target()], got, "--no-kv-unified, beside three others")


def test_the_engine_gives_the_tokens_of_http(det: Det, alone: dict[Ask, list[int]]) -> None:
    from llama_preempt.engine import Engine

    asks = [det.target(), *det.neighbours()]
    with Engine(det.path, [*ON_THE_CPU, *det.args, "--cache-ram", "0"], n_ctx=2048, n_parallel=4, kv_unified=True,
                seed=1234, deterministic=True) as eng:
        assert eng.request("GET", "/props")["llama_preempt"]["deterministic"] is True
        reqs = [eng.submit(path="/completion", body=a.body()) for a in asks]
        got = [[int(t) for t in r.completion().response["tokens"]] for r in reqs]
    for ask, ids in zip(asks, got):
        assert_same(alone[ask], ids, f"the Engine, four together: {ask.prompt[:20]!r}")


def test_one_thread_gives_the_tokens_of_two(start_server: ServerFactory, det: Det,
                                            alone: dict[Ask, list[int]]) -> None:
    srv = serve(start_server, det, "-t", "1", "-tb", "1")  # the reference runs on two
    got = together(srv, [det.target(), *det.neighbours()])[0]
    assert_same(alone[det.target()], got, "one thread, beside three others")


def test_on_an_rpc_device_a_request_beside_others_gives_its_alone_tokens(
        start_server: ServerFactory, start_rpc: RpcFactory, stories_model: Path) -> None:
    # the layers and the KV cache on a ggml-rpc-server's CPU and on no other device (on_rpc(); a GPU
    # build's rpc-server would serve its GPU): its CPU backend takes the switch from its environment,
    # and the visiting order travels in the graph
    det = Det(stories_model, (), 200)
    srv = serve(start_server, det, placement=on_rpc(start_rpc(threads=2, **BATCH_INVARIANT_RPC)))
    logged(srv, "the layers on RPC0 run")  # --deterministic names the device the layers are on
    alone_ids = one_at_a_time(srv, [det.target()])[0]
    got = together(srv, [det.target(), *det.neighbours()])[0]
    assert_same(alone_ids, got, "on an RPC device, beside three others")
    srv.stop()


def test_on_the_cpu_keeps_every_layer_and_cell_on_the_cpu_where_a_device_would_take_them(
        start_server: ServerFactory, start_rpc: RpcFactory, stories_model: Path) -> None:
    # what the tests here stand on, on any build: llama-server offloads to every device it has (a
    # GPU build's GPU; here an RPC device in its place), and --deterministic then names them
    # (their kernels are their own); ON_THE_CPU leaves every device out
    rpc = start_rpc(device="CPU")
    offloaded = start_server(stories_model, n_ctx=256, n_parallel=2, deterministic=True,
                             extra_args=["--rpc", rpc.endpoint, "-ngl", "99", "-lv", "4"])
    log = logged(offloaded, "listening on")
    assert re.search(r"deterministic: the batch-invariant kernels are the CPU's; the layers on (\S+, )*RPC0 run", log)
    assert any(kv.startswith("RPC0[") for kv in re.findall(r"llama_kv_cache: +(\S+) KV buffer size", log))
    offloaded.stop()  # an rpc-server serves one client at a time

    pinned = start_server(stories_model, n_ctx=256, n_parallel=2, deterministic=True,
                          extra_args=["--rpc", rpc.endpoint, *ON_THE_CPU, "-ngl", "99", "-lv", "4"])
    log = logged(pinned, "listening on")
    assert "using device" not in log and "the layers on" not in log
    assert re.findall(r"llama_kv_cache: +(\S+) KV buffer size", log) == ["CPU"]
    weights = re.findall(r"load_tensors: +(\S+) model buffer size", log)
    assert weights and all(w.startswith("CPU") for w in weights), weights
    assert len(one_at_a_time(pinned, [Ask(TARGET, 8)])[0]) == 8
