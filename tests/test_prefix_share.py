"""--prefix-share: a new prompt links the longest prefix another slot holds in the unified pool
(seq_cp within one stream: the cells gain a sequence) instead of evaluating it again. Under
--deterministic a linked prefix gives the token ids its evaluation gives, byte for byte, also when
the sharer is parked (swap, recompute, disk) and when the prefix's first holder ends or is erased;
a park frees only what no one else holds. Models whose memory cannot share a prefix of cells (the
hybrid Qwen3.5 with its MTP head) decline, and answer as without the flag."""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from helpers import ON_THE_CPU, BackgroundStream, logged, n_tokens, new_server, park_lines, run_cli, wait_until
from llama_preempt.exactness import Ask, first_difference, one_at_a_time, staggered, together
from llama_preempt.server import LlamaServer

from conftest import ServerFactory

PREFIX = ("Once upon a time there was a little girl named Lily. She loved to play in the park with her dog Max. "
          "One day the sun was bright and the birds were singing in the tall green trees. ") * 3
ASKS = [Ask(PREFIX + "Then Lily saw", 300), Ask(PREFIX + "The dog ran to", 200), Ask(PREFIX + "Her mother said", 150)]
LONG = Ask(PREFIX + "The dog ran to", 1500)


def serve(start_server: ServerFactory, model: Path, *extra: str, n_ctx: int = 4096, n_parallel: int = 4,
          env: dict[str, str] | None = None) -> LlamaServer:
    """A --deterministic server on the CPU (batch-invariant kernels), without the RAM prompt cache, so
    that a prefix comes from another slot's cells or from evaluation, nowhere else."""
    return start_server(model, n_ctx=n_ctx, n_parallel=n_parallel, kv_unified=True, deterministic=True, seed=1234,
                        extra_args=[*ON_THE_CPU, "--cache-ram", "0", *extra], env=env or {})


@pytest.fixture(scope="module")
def evaluated(stories_model: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[Ask, list[int]]:
    """The reference: each ask alone on a server that never links a prefix."""
    asks = list(dict.fromkeys([*ASKS, LONG, *[Ask(a.prompt, a.n_predict, cache_prompt=True) for a in ASKS]]))
    with new_server(stories_model, tmp_path_factory.mktemp("evaluated"), n_ctx=4096, n_parallel=4, kv_unified=True,
                    deterministic=True, seed=1234, extra_args=[*ON_THE_CPU, "--cache-ram", "0", "--no-prefix-share"]) as srv:
        return dict(zip(asks, one_at_a_time(srv, asks)))


def assert_same(ref: list[int], got: list[int], what: str) -> None:
    at = first_difference(ref, got)
    assert at is None, f"{what}: token {at} differs ({ref[max(0, at - 3):at + 3]} evaluated, {got[max(0, at - 3):at + 3]} linked)"


def n_prefix(srv: LlamaServer) -> int:
    return n_tokens(srv, PREFIX)


def test_prefix_share_is_on_by_default_and_shows_in_props(start_server: ServerFactory, stories_model: Path) -> None:
    srv = serve(start_server, stories_model)
    assert srv.props()["llama_preempt"]["prefix_share"] is True
    assert logged(srv, "prefix sharing: on")
    off = serve(start_server, stories_model, "--no-prefix-share")
    assert off.props()["llama_preempt"]["prefix_share"] is False
    assert logged(off, "prefix sharing: off: --no-prefix-share")


@pytest.mark.parametrize("cache_prompt", [False, True])
def test_prompts_link_the_prefix_a_running_request_holds_and_give_the_evaluated_tokens(
        start_server: ServerFactory, stories_model: Path, evaluated: dict[Ask, list[int]], cache_prompt: bool) -> None:
    asks = [Ask(a.prompt, a.n_predict, cache_prompt=cache_prompt) for a in ASKS]
    srv = serve(start_server, stories_model)
    got = staggered(srv, asks)
    for ask, ids in zip(asks, got):
        assert_same(evaluated[ask], ids, f"cache_prompt={cache_prompt}: {ask.prompt[-15:]!r}")
    m = srv.metrics()
    n = n_prefix(srv)
    # the second prompt links the text the first one holds, whatever cache_prompt says; so does the
    # third, unless cache_prompt lets it reuse the text its own slot kept (the first's, finished by then)
    assert m["n_prefix_links_total"] == 2 or (cache_prompt and m["n_prefix_links_total"] == 1), m.get("n_prefix_links_total")
    assert m["n_prompt_tokens_linked_total"] >= m["n_prefix_links_total"] * (n - 1)
    n_all = sum(n_tokens(srv, a.prompt) for a in asks)
    assert m["prompt_tokens_total"] <= n_all - 2 * (n - 1)


def test_no_prefix_share_evaluates_every_prompt(start_server: ServerFactory, stories_model: Path,
                                               evaluated: dict[Ask, list[int]]) -> None:
    srv = serve(start_server, stories_model, "--no-prefix-share")
    got = staggered(srv, ASKS)
    for ask, ids in zip(ASKS, got):
        assert_same(evaluated[ask], ids, "sharing off")
    m = srv.metrics()
    assert m["n_prefix_links_total"] == 0 and m["n_prompt_tokens_linked_total"] == 0
    assert m["prompt_tokens_total"] >= sum(n_tokens(srv, a.prompt) for a in ASKS) - 3


def stream_ids(stream: BackgroundStream, timeout: float = 120) -> list[int]:
    return [int(t) for c in stream.join(timeout) for t in c.get("tokens", [])]


def processing_slots(srv: LlamaServer) -> list[int]:
    return [s["id"] for s in srv.slots() if s["is_processing"]]


def test_slots_and_metrics_show_the_cells_two_requests_share(start_server: ServerFactory, stories_model: Path) -> None:
    srv = serve(start_server, stories_model)
    n = n_prefix(srv)
    first = BackgroundStream(srv, {**ASKS[0].body(), "n_predict": 600, "stream": True})
    assert first.started.wait(60)
    second = BackgroundStream(srv, {**ASKS[1].body(), "n_predict": 600, "stream": True})
    assert second.started.wait(60)

    def two_sharing() -> list[dict[str, Any]] | None:
        rows = [s for s in srv.slots() if s["is_processing"] and s["n_cells_shared"] >= n - 1]
        return rows if len(rows) == 2 else None

    rows = wait_until(two_sharing, 60, "two slots sharing the common text's cells")
    assert all(s["n_cells"] > s["n_cells_shared"] for s in rows), rows  # and each its own answer's
    assert srv.metrics()["kv_pool_cells_saved"] >= n - 1
    p = run_cli("stats", srv.url, "--once", "--json")
    assert p.returncode == 0, p.stderr
    prefix = json.loads(p.stdout)["prefix"]
    assert prefix["links"] == 1 and prefix["tokens_linked"] >= n - 1 and prefix["cells_saved"] >= n - 1, prefix
    assert len(stream_ids(first)) == 600 and len(stream_ids(second)) == 600


def test_the_prefix_stays_while_a_sharer_runs_after_its_first_holder_is_erased(
        start_server: ServerFactory, stories_model: Path, evaluated: dict[Ask, list[int]], tmp_path: Path) -> None:
    """The first holder ends and its cells are erased through the slot API while the second request,
    which linked them, still generates: the cells the second holds stay (a cell is freed when its last
    sequence leaves), and its answer is the evaluated one."""
    srv = serve(start_server, stories_model, "--slot-save-path", str(tmp_path))
    first = BackgroundStream(srv, {**ASKS[0].body(), "n_predict": 40, "stream": True})
    assert first.started.wait(60)
    (holder,) = wait_until(lambda: processing_slots(srv), 60, "the first request's slot")
    second = BackgroundStream(srv, {**LONG.body(), "stream": True})
    assert second.started.wait(60)
    assert srv.metrics()["n_prefix_links_total"] == 1  # linked from the first, which still runs
    assert len(stream_ids(first)) == 40
    wait_until(lambda: holder not in processing_slots(srv), 60, "the first request's slot to be idle")
    erased = srv.post(f"/slots/{holder}?action=erase", {})
    assert erased.status_code == 200, erased.text
    assert processing_slots(srv), "the second request ended before the erase: nothing was checked"
    assert_same(evaluated[LONG], stream_ids(second), "after its first holder was erased")


@pytest.mark.parametrize("mode", ["swap", "recompute"])
def test_a_sharer_parked_gives_its_evaluated_tokens(start_server: ServerFactory, stories_model: Path,
                                                   evaluated: dict[Ask, list[int]], mode: str) -> None:
    srv = serve(start_server, stories_model, "--preempt-mode", mode, env={"LLAMA_SERVER_PREEMPT_EVERY": "23"})
    got = staggered(srv, ASKS)
    m = srv.metrics()
    assert m["n_prefix_links_total"] >= 1 and m["n_preempt_total"] >= 3
    # a sharer's park frees its own cells only: the text it shares stays with the other holders
    freed = [(int(x.group(1)), int(x.group(2))) for x in
             (re.search(r"(\d+) tokens held(?: in \d+ cell ranges)?, (\d+) cells freed", line) for line in park_lines(srv)) if x]
    assert any(f < held - 100 for held, f in freed), freed
    if mode == "recompute":
        # a slot coming back links the text another one still holds and replays only its own tokens
        # (two links are the admissions; the log says how few tokens each resume replays)
        assert m["n_prefix_links_total"] > 2, m["n_prefix_links_total"]
        replays = [int(x.split(" tokens to replay")[0].rsplit(" ", 1)[1])
                   for x in logged(srv, "tokens to replay").splitlines() if "resumed by recompute" in x]
        assert replays and min(replays) < n_prefix(srv), replays  # its tail only, not the text again
    for ask, ids in zip(ASKS, got):
        assert_same(evaluated[ask], ids, f"parked by {mode} every 23 tokens")


def test_a_sharer_parked_to_disk_gives_its_evaluated_tokens(start_server: ServerFactory, stories_model: Path,
                                                           evaluated: dict[Ask, list[int]], tmp_path: Path) -> None:
    (tmp_path / "kv").mkdir()
    # --preempt-ram 0: no RAM for a park, so each is streamed from the pool to its file and back
    srv = serve(start_server, stories_model, "--preempt-mode", "swap", "--preempt-ram", "0",
                "--preempt-disk", str(tmp_path / "kv"), env={"LLAMA_SERVER_PREEMPT_EVERY": "75"})
    got = staggered(srv, ASKS)
    m = srv.metrics()
    assert m["n_prefix_links_total"] >= 1
    assert m.labeled["preempt_parks_by_tier_total"]["disk"] == m["n_preempt_total"] >= 3
    for ask, ids in zip(ASKS, got):
        assert_same(evaluated[ask], ids, "parked to disk every 75 tokens")


@pytest.mark.parametrize("mode", ["auto", "recompute"])
def test_sharers_in_an_overloaded_pool_give_every_request_its_evaluated_tokens(
        start_server: ServerFactory, stories_model: Path, evaluated: dict[Ask, list[int]], mode: str) -> None:
    """Four requests on one text into a pool that holds the text and the longest answer: parks, purges
    and links together; no request loses a token, and none gets another one."""
    srv = serve(start_server, stories_model, "--preempt-mode", mode, n_ctx=512)
    asks = [*ASKS, ASKS[0]]
    got = together(srv, asks)
    m = srv.metrics()
    assert m["n_preempt_total"] > 0, "the pool never filled: nothing was parked"
    for ask, ids in zip(asks, got):
        assert_same(evaluated[ask], ids, f"overloaded pool ({mode})")


def test_a_hybrid_model_declines_and_answers_as_without_sharing(start_server: ServerFactory,
                                                                qwen35_mtp_model: Path) -> None:
    """The hybrid Qwen3.5 (its recurrent state is one cell per sequence, and its MTP head a context of
    its own) never links a prefix: the start log says why, and the answers are those of a server
    with sharing off."""
    spec = ["--spec-type", "draft-mtp", "--spec-draft-n-max", "2"]
    asks = [Ask(PREFIX + "Then Lily saw", 60), Ask(PREFIX + "The dog ran to", 40)]
    srv = serve(start_server, qwen35_mtp_model, *spec, n_ctx=2048)
    assert logged(srv, "prefix sharing: off: a hybrid model")
    got = staggered(srv, asks)
    assert srv.metrics()["n_prefix_links_total"] == 0
    ref = serve(start_server, qwen35_mtp_model, *spec, "--no-prefix-share", n_ctx=2048)
    for ask, ids, want in zip(asks, got, one_at_a_time(ref, asks)):
        assert_same(want, ids, "hybrid model")


def test_the_engine_links_a_prefix_and_gives_the_evaluated_tokens(stories_model: Path,
                                                                  evaluated: dict[Ask, list[int]]) -> None:
    """The in-process Engine drives the same update_slots(): the second prompt links the text the
    first holds, and both answers are the evaluated ones."""
    from llama_preempt.engine import Engine

    with Engine(stories_model, [*ON_THE_CPU, "--cache-ram", "0"], n_ctx=4096, n_parallel=4, kv_unified=True,
                seed=1234, deterministic=True) as eng:
        first = eng.submit(path="/completion", body=ASKS[0].body())
        while not any(s.n_decoded >= 8 for s in eng.stats().slots if s.is_processing):
            eng.step()
        second = eng.submit(path="/completion", body=ASKS[1].body())
        got = [[int(t) for t in r.completion().response["tokens"]] for r in (first, second)]
        st = eng.stats()
    assert st.n_prefix_links_total == 1 and st.n_prompt_tokens_linked_total > 100
    for ask, ids in zip(ASKS[:2], got):
        assert_same(evaluated[ask], ids, "the Engine")
