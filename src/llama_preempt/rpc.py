"""Run llama.cpp's RPC server (`ggml-rpc-server`, built with this package) as a child process.

An RPC server is a ggml device served over TCP: `llama-server --rpc HOST:PORT -ngl 99` keeps the
model's layers and its KV cache there, so preemption's SWAP copies go over that link. Several of
them split one model by layers, across machines (upstream's distributed setup); on one machine,
over loopback, they stand in for device backends:

    with RpcServer() as a, RpcServer() as b:
        cfg = ServerConfig(model=path, extra_args=["--rpc", f"{a.endpoint},{b.endpoint}", "-ngl", "99"])
"""
from __future__ import annotations

import socket
import subprocess
import tempfile
from pathlib import Path

from .binary import rpc_server_binary
from .server import LoggedChild, free_port


class RpcServer(LoggedChild):
    """One ggml-rpc-server child on a loopback port. Always stop() it (or use it as a context manager)."""

    name = "ggml-rpc-server"
    ready_when = "listening"

    def __init__(self, *, host: str = "127.0.0.1", port: int | None = None, threads: int = 1,
                 binary: Path | None = None, log_dir: Path | None = None,
                 env: dict[str, str] | None = None) -> None:
        self.binary = Path(binary) if binary else rpc_server_binary()
        self.host = host
        self.port = port or free_port(host)
        self.threads = threads
        self.child_env = dict(env or {})
        self._log_dir = Path(log_dir) if log_dir else Path(tempfile.mkdtemp(prefix="llama-preempt-rpc-"))
        self.log_path = self._log_dir / f"ggml-rpc-server-{self.port}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        """HOST:PORT, as llama-server's --rpc takes it."""
        return f"{self.host}:{self.port}"

    def command(self) -> list[str]:
        return [str(self.binary), "-H", self.host, "-p", str(self.port), "-t", str(self.threads)]

    def start(self, timeout: float = 30.0) -> "RpcServer":
        super().start(timeout)
        return self

    def _ready(self) -> bool:
        # the RPC server takes one client at a time and closes a connection that sends no HELLO, so
        # a plain connect is a safe probe; it answers as soon as it listens
        try:
            with socket.create_connection((self.host, self.port), timeout=1):
                return True
        except OSError:
            return False

    def kill(self) -> None:
        """End it at once, as a machine that goes away would (SIGKILL)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def __enter__(self) -> "RpcServer":
        return self.start()
