"""Run the drop-in llama-server as a child process on a loopback port.

Used by the test suite and by anyone who wants the patched server from Python:

    with LlamaServer(ServerConfig(model=path, n_ctx=512, n_parallel=2)) as srv:
        srv.post("/completion", {"prompt": "Once upon a time", "n_predict": 16})
        print(srv.metrics()["n_preempt_total"])
"""
from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import requests

from .binary import server_binary
from .flags import server_flags
from .metrics import MetricsSnapshot, parse_preempt_stats, parse_prometheus
from .stats import PreemptStats


class ServerStartError(RuntimeError):
    pass


@contextlib.contextmanager
def _sigint_deferred() -> Iterator[None]:
    """Hold a Ctrl-C back until the block is done: one that lands inside Popen, after the child
    exists but before Popen returns it, would otherwise leave a server nobody can stop. (Only the
    main thread receives signals; the child starts with default handlers after exec.)"""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: caught.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if caught:
            raise KeyboardInterrupt


class LoggedChild:
    """A child process whose output goes to a log file: started until ready, always stoppable.
    Subclasses set `name`, `ready_when` and `log_path`, and give `command()` and `_ready()`."""

    proc: "subprocess.Popen[bytes] | None" = None
    name: str = "the child"
    ready_when: str = "ready"  # what _ready() checks, for the error message
    log_path: Path
    child_env: dict[str, str]

    def command(self) -> list[str]:
        raise NotImplementedError

    def _ready(self) -> bool:
        """One probe: True once the child serves."""
        raise NotImplementedError

    def _wait_ready(self, timeout: float) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while not self._ready():
            if self.proc.poll() is not None:
                raise ServerStartError(
                    f"{self.name} exited with {self.proc.returncode} before it was {self.ready_when}:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                raise ServerStartError(f"{self.name} not {self.ready_when} after {timeout:.0f} s:\n{self.log_tail()}")
            time.sleep(0.05)

    def start(self, timeout: float = 60.0) -> "LoggedChild":
        try:
            # the assignment inside the deferred block: a Ctrl-C during Popen is raised only once
            # self.proc names the child, so stop() below can end it
            with self.log_path.open("wb") as log, _sigint_deferred():
                self.proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT,
                                             stdin=subprocess.DEVNULL, env={**os.environ, **self.child_env})
            self._wait_ready(timeout)
        except BaseException:  # Ctrl-C or a failed start: never leave the child behind
            self.stop()
            raise
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM, then wait: llama-server drains (its requests finish, within --drain-timeout).
        Past `timeout`, a second SIGTERM ends the drain (the requests left get an error), and a
        child still there 5 s later is killed."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.terminate()
                self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        except BaseException:  # Ctrl-C while waiting: the child must not outlive us
            self.proc.kill()
            self.proc.wait()
            raise

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def log_tail(self, n: int = 60) -> str:
        return "\n".join(self.log_text().splitlines()[-n:])

    def __enter__(self) -> "LoggedChild":
        return self.start()

    def __exit__(self, exc_type: object, *exc: object) -> None:
        # a Ctrl-C means "now": a short grace, then SIGKILL (llama-server with requests in flight
        # may not end on SIGTERM alone)
        self.stop(timeout=1.0 if exc_type is KeyboardInterrupt else 10.0)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on host right now (the kernel picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


@dataclass
class ServerConfig:
    """llama-server flags, by name. `extra_args` and `env` pass anything else through."""

    model: Path
    n_ctx: int = 512
    n_parallel: int = 2
    kv_unified: bool | None = True       # None: neither flag (llama-server's default: one pool while preemption is on)
    n_batch: int | None = None
    n_ubatch: int | None = None
    preempt: bool | None = None          # None: the server's default (on)
    preempt_ram_mib: int | None = None   # --preempt-ram (None: the server's default, 8192)
    preempt_mode: str | None = None      # --preempt-mode auto|swap|recompute
    preempt_disk: str | os.PathLike[str] | None = None  # --preempt-disk DIR: the disk tier for parked slots
    preempt_disk_mib: int | None = None  # --preempt-disk-mib (None: the default, a tenth of the filesystem at most)
    n_predict: int | None = None
    seed: int | None = 42
    threads: int | None = 2
    metrics: bool = True
    slots: bool = True
    cache_ram_mib: int | None = None
    deterministic: bool = False          # --deterministic: the same tokens whatever runs beside a request
    extra_args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)

    def to_args(self) -> list[str]:
        args = server_flags(self.model, n_ctx=self.n_ctx, n_parallel=self.n_parallel, kv_unified=self.kv_unified,
                            n_batch=self.n_batch, n_ubatch=self.n_ubatch, preempt=self.preempt, n_predict=self.n_predict,
                            preempt_ram_mib=self.preempt_ram_mib, preempt_mode=self.preempt_mode,
                            preempt_disk=self.preempt_disk, preempt_disk_mib=self.preempt_disk_mib,
                            seed=self.seed, threads=self.threads, metrics=self.metrics, slots=self.slots,
                            cache_ram_mib=self.cache_ram_mib, deterministic=self.deterministic)
        return args + list(self.extra_args)


class LlamaServer(LoggedChild):
    """One llama-server child process. Always stop() it (or use it as a context manager)."""

    name = "llama-server"
    ready_when = "healthy"

    def __init__(self, config: ServerConfig, *, binary: Path | None = None,
                 host: str = "127.0.0.1", port: int | None = None,
                 log_dir: Path | None = None) -> None:
        self.config = config
        self.binary = Path(binary) if binary else server_binary()
        self.host = host
        self.port = port or free_port(host)
        self._log_dir = Path(log_dir) if log_dir else Path(tempfile.mkdtemp(prefix="llama-preempt-"))
        self._log_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = self._log_dir / f"llama-server-{self.port}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.session = requests.Session()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def command(self) -> list[str]:
        return [str(self.binary), *self.config.to_args(), "--host", self.host, "--port", str(self.port)]

    def start(self, timeout: float = 60.0) -> "LlamaServer":
        self.child_env = self.config.env
        super().start(timeout)
        return self

    def _ready(self) -> bool:
        try:
            return self.session.get(self.url + "/health", timeout=2).status_code == 200
        except requests.ConnectionError:
            return False

    def stop(self, timeout: float = 10.0) -> None:
        super().stop(timeout)
        self.session.close()

    def __enter__(self) -> "LlamaServer":
        return self.start()

    # --- HTTP ---

    def get(self, path: str, **kw: Any) -> requests.Response:
        kw.setdefault("timeout", 120)
        return self.session.get(self.url + path, **kw)

    def post(self, path: str, body: dict[str, Any], **kw: Any) -> requests.Response:
        kw.setdefault("timeout", 300)
        return requests.post(self.url + path, json=body, **kw)

    def stream(self, path: str, body: dict[str, Any], **kw: Any) -> Iterator[str]:
        """POST with stream=true and yield the raw SSE lines (comments included)."""
        kw.setdefault("timeout", 300)
        with requests.post(self.url + path, json={**body, "stream": True}, stream=True, **kw) as r:
            r.raise_for_status()
            for raw in r.iter_lines(decode_unicode=False):
                yield raw.decode("utf-8")

    def metrics(self) -> MetricsSnapshot:
        r = self.get("/metrics")
        r.raise_for_status()
        return parse_prometheus(r.text)

    def preempt_stats(self) -> PreemptStats:
        """The same PreemptStats the in-process Engine returns, from /metrics and /slots."""
        r = self.get("/metrics")
        r.raise_for_status()
        return parse_preempt_stats(r.text, self.slots())

    def slots(self) -> list[dict[str, Any]]:
        r = self.get("/slots")
        r.raise_for_status()
        return list(r.json())

    def props(self) -> dict[str, Any]:
        r = self.get("/props")
        r.raise_for_status()
        return dict(r.json())
