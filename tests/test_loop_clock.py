"""The server loop's clock (issue 50): where a step's time goes (preempt_loop_us_total{part}), on
the CPU and on a device whose decode returns before its work is done (an RPC server on loopback:
the graph is sent and llama_decode returns; the wait comes when the logits are read), and the
step cost fitted from a step's whole period."""
from __future__ import annotations

from pathlib import Path

from helpers import ALL_DECODE, complete_all, long_prompt, on_rpc
from llama_preempt.rpc import RpcServer

PARTS = ("plan", "decode", "post", "other")


def loop_parts(srv) -> tuple[int, dict[str, float]]:
    m = srv.metrics()
    return int(m["n_loop_steps_total"]), dict(m.labeled["preempt_loop_us_total"])


def test_the_loop_clock_says_where_each_step_went_with_preemption_on_or_off(start_server, stories_model: Path) -> None:
    prompts = [long_prompt(30 + 10 * i, shift=i) for i in range(4)]
    for preempt in (None, False):
        srv = start_server(stories_model, n_ctx=1024, n_parallel=4, preempt=preempt, extra_args=["-dev", "none"])
        complete_all(srv, prompts, 48)
        n_steps, parts = loop_parts(srv)
        assert set(parts) == set(PARTS)
        # at least one step per generated token of the longest request, each with a decode and a post-decode
        assert n_steps >= 48 and parts["decode"] > 0 and parts["post"] > 0
        m = srv.metrics()
        # the step cost is fitted from the steps' periods, preemption on or off
        assert m["preempt_step_cost_samples"] >= 32


def test_on_a_device_whose_decode_returns_early_the_wait_counts_as_the_decode(start_server, stories_model: Path,
                                                                               tmp_path: Path) -> None:
    # over RPC llama_decode only sends the graph; the step waits for the device when it reads the
    # logits, which the loop clock counts in the decode (not in sampling and sending, the post part)
    with RpcServer(log_dir=tmp_path, threads=1) as rpc:
        srv = start_server(stories_model, n_ctx=1024, n_parallel=4, extra_args=[*on_rpc(rpc), *ALL_DECODE])
        complete_all(srv, [long_prompt(40, shift=i) for i in range(4)], 48)
        n_steps, parts = loop_parts(srv)
    assert n_steps >= 48
    assert parts["decode"] > parts["post"], parts
