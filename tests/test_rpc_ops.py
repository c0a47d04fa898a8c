"""The RPC client asks the remote device which ops it runs (patch rpc-supports-op).

Upstream's RPC client said yes to every op, so the scheduler handed a remote device ops it has no
kernel for, and the rpc-server aborted (on a CUDA build: flash attention for stories260K's head
size 8, the H200 run of 2026-12-04). The client now asks the server (RPC_CMD_SUPPORTS_OP, protocol
7.1) once per op shape; the server answers from its own backend. On this CPU build every op is
supported, so what is proven here is that the question is asked, cached and answered, and that a
model served through it still generates; a device that says no is proven on a GPU machine
(bench/gpu_check.sh's rpc phase).
"""
from __future__ import annotations

import re
from pathlib import Path

from helpers import complete
from llama_preempt.rpc import RpcServer


def test_the_rpc_client_asks_the_remote_device_which_ops_it_runs_once_per_shape(start_server, stories_model: Path,
                                                                                 tmp_path: Path) -> None:
    with RpcServer(log_dir=tmp_path, env={"GGML_RPC_DEBUG": "1"}) as rpc:
        srv = start_server(stories_model, n_ctx=512, n_parallel=2,
                           extra_args=["--rpc", rpc.endpoint, "-ngl", "99", "-dev", "RPC0"])
        first = complete(srv, "Once upon a time", 16).json()
        asked = re.findall(r"\[supports_op\] device: 0, op: (\S+), supported: (\d)", rpc.log_text())
        assert asked, rpc.log_tail()
        assert {op for op, _ in asked} >= {"MUL_MAT", "GET_ROWS"}, asked
        assert all(ok == "1" for _, ok in asked)  # the CPU runs every op
        # the answers are cached per shape: the same request again meets mostly shapes already asked
        # about (only those that grew with the pool, such as the KV views, are new)
        n_asked = len(asked)
        again = complete(srv, "Once upon a time", 16).json()
        n_again = len(re.findall(r"\[supports_op\]", rpc.log_text())) - n_asked
        assert 0 <= n_again < n_asked / 2, (n_asked, n_again)
        assert first["tokens_predicted"] == again["tokens_predicted"] == 16


def test_deterministic_says_which_devices_keep_their_own_kernels(start_server, stories_model: Path, tmp_path: Path) -> None:
    # the batch-invariant kernels are the CPU's: layers on another device are named at start
    with RpcServer(log_dir=tmp_path) as rpc:
        srv = start_server(stories_model, n_ctx=512, n_parallel=2, deterministic=True,
                           extra_args=["--rpc", rpc.endpoint, "-ngl", "99", "-dev", "RPC0"])
        log = srv.log_text()
    assert "deterministic: the batch-invariant kernels are the CPU's; the layers on RPC0 run that device's own kernels" in log
    # on the CPU alone nothing is said
    cpu = start_server(stories_model, n_ctx=512, n_parallel=2, deterministic=True, extra_args=["-dev", "none"])
    assert "the batch-invariant kernels are the CPU's" not in cpu.log_text()
