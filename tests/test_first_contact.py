"""Where people first meet the server: the common `-np N` launch gets preemption (one unified pool
unless --no-kv-unified asks for upstream's split), and /props and `llama-preempt stats` say whether
preemption is active, and why not."""
from __future__ import annotations

from pathlib import Path

from rich.console import Console

from helpers import complete, long_prompt, run_concurrently
from llama_preempt.statsview import fetch, render


def stats_text(url: str) -> str:
    con = Console(width=120, record=True)
    con.print(render(fetch(url), None))
    return con.export_text()


def test_np_4_without_kv_flags_shares_one_pool_and_overflowing_requests_finish(start_server, stories_model: Path) -> None:
    # the launch most people use: -c and -np, no --kv-unified. Upstream would split 512 cells into
    # 4 x 128, and 4 requests of ~200 tokens would all stop at the slot's limit
    srv = start_server(stories_model, n_ctx=512, n_parallel=4, kv_unified=None)
    assert "the 4 slots share one unified KV pool" in srv.log_text()
    props = srv.props()["llama_preempt"]
    assert props["preempt"] is True and props["preempt_active"] is True
    assert props["preempt_inactive_reason"] is None and props["kv_unified"] is True
    res = run_concurrently([lambda i=i: complete(srv, long_prompt(12, shift=i), 200) for i in range(4)])
    for r in res:
        assert r.status_code == 200, r.text
        assert r.json()["tokens_predicted"] == 200 and r.json()["stop_type"] == "limit"
    assert srv.metrics()["n_preempt_total"] >= 1
    assert "INACTIVE" not in stats_text(srv.url)


def test_no_kv_unified_keeps_upstreams_split_and_props_and_stats_say_preemption_is_inactive(
        start_server, stories_model: Path) -> None:
    srv = start_server(stories_model, n_ctx=512, n_parallel=4, kv_unified=False)
    props = srv.props()["llama_preempt"]
    assert props["preempt"] is True  # configured ...
    assert props["preempt_active"] is False  # ... but it cannot work
    assert "--no-kv-unified" in props["preempt_inactive_reason"]
    assert props["kv_unified"] is False
    assert "preemption INACTIVE: needs one unified KV pool" in stats_text(srv.url)
    r = complete(srv, long_prompt(12), 8)
    assert r.json()["tokens_predicted"] == 8  # it still serves, as upstream does


def test_no_preempt_keeps_upstreams_split_pool(start_server, stories_model: Path) -> None:
    srv = start_server(stories_model, n_ctx=512, n_parallel=4, kv_unified=None, preempt=False)
    props = srv.props()["llama_preempt"]
    assert props["preempt"] is False and props["preempt_active"] is False
    assert props["preempt_inactive_reason"] == "disabled by --no-preempt"
    assert props["kv_unified"] is False  # upstream's behaviour with -np: one share per slot
    assert "share one unified KV pool" not in srv.log_text()
    assert "disabled by --no-preempt" in stats_text(srv.url)
