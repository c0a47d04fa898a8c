"""Helpers shared by the tests, one per concept: servers, prompts, requests, concurrency, SSE, waiters,
the CLI, the stats view, fake HTTP servers and RSS."""
from __future__ import annotations

import contextlib
import functools
import http.server
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Iterator, TypeVar

import requests

from llama_preempt.binary import server_binary
from llama_preempt.server import LlamaServer, ServerConfig

T = TypeVar("T")

# Word salad that tokenizes to roughly one token per word with the stories260K vocabulary.
WORDS = ("once upon a time there was a little girl named lily she loved to play outside in the "
         "park one day she saw a big red ball and her mom said be careful ").split()


# Every generating slot decodes every step, as upstream's loop does. The decode width (on by default)
# lets only the oldest slots decode on a CPU, so slots that each fit alone seldom overflow the pool
# together; the tests of the park mechanics need that overflow, and run with this.
ALL_DECODE = ["--preempt-sched", "width-loss=0"]


GPU_LAYERS_KNOB = "LLAMA_PREEMPT_TEST_GPU_LAYERS"
# flags with which a test places the layers (or the KV) itself; the knob then leaves it alone
PLACEMENT_FLAGS = ("-ngl", "--gpu-layers", "--n-gpu-layers", "-dev", "--device")


def gpu_layers() -> str | None:
    """LLAMA_PREEMPT_TEST_GPU_LAYERS: the -ngl that new_server() gives the tests' servers; None when unset."""
    return os.environ.get(GPU_LAYERS_KNOB) or None


@functools.lru_cache(maxsize=1)
def build_devices() -> tuple[str, ...]:
    """The devices this build's llama-server can offload to, as `llama-server --list-devices` names
    them (CUDA0, Vulkan0, ...); none on a CPU build. RPC devices appear only with --rpc."""
    out = subprocess.run([str(server_binary()), "--list-devices"], capture_output=True, text=True, timeout=60)
    listed = out.stdout.split("Available devices:", 1)[-1]
    return tuple(d for d in re.findall(r"^\s+([A-Za-z][\w.-]*): ", listed, re.M) if not d.startswith("RPC"))


def offload_devices() -> tuple[str, ...]:
    """Where the knob puts the layers of new_server()'s servers, and so their KV cells: the build's
    devices when LLAMA_PREEMPT_TEST_GPU_LAYERS is a positive N (llama.cpp offloads to all of them),
    none when it is unset or 0, or the build has no device (the CPU: cells in host memory)."""
    ngl = gpu_layers()
    if ngl is None or ngl.strip() == "0":
        return ()
    return build_devices()


# llama-server flags (the Engine's args too) that keep every layer, and so every KV cell, on the CPU
# on every build: -dev none offloads to no device. A GPU build offloads by default (-ngl is "auto")
# and the knob adds -ngl N; -dev is a placement flag, so new_server() leaves such a server alone. For
# tests whose point needs the CPU's kernels: --deterministic's batch invariance (the CPU's kernels
# only, docs/design.md), or answers compared across requests whose batches or cells differ (a GPU's
# kernels choose their path by the batch's shape, and may group a row's cells otherwise when they
# lie elsewhere in the pool)
ON_THE_CPU = ["-dev", "none"]
# the same for a child that starts its own Engine or llama-server (the demo, the examples): the
# flag's environment twin, which both read
ON_THE_CPU_ENV = {"LLAMA_ARG_DEVICE": "none"}


def layers_on_the_cpu() -> bool:
    """new_server()'s layers and cells stay on the CPU (the knob unset, or no device to offload to):
    its kernels are the CPU's, which --deterministic makes batch-invariant, so a request's answer
    does not depend on the batches it ran in. Not so on a GPU, whose kernels (cuBLAS, CUDA flash
    attention) choose by the batch's shape (docs/design.md, --deterministic, its limits)."""
    return not offload_devices()


def new_server(model: Path, log_dir: Path, *, port: int | None = None, **config: Any) -> LlamaServer:
    """A llama-server for the tests, not started yet: ServerConfig(model=model, **config) on `port`
    (a free one by default), its log in log_dir. LLAMA_PREEMPT_TEST_GPU_LAYERS=N offloads it (-ngl N):
    on a GPU build this runs the SWAP tests through the device copy path (CI has no GPU and leaves
    it unset); a test that places the layers itself (-ngl, -dev: on_rpc(), -ngl 0) keeps its
    placement. The `start_server` fixture starts these and stops them after the test."""
    ngl = gpu_layers()
    extra = list(config.get("extra_args", []))
    if ngl and not any(a in PLACEMENT_FLAGS for a in extra):
        config["extra_args"] = ["-ngl", ngl, *extra]
    return LlamaServer(ServerConfig(model=model, **config), port=port, log_dir=log_dir)


def long_prompt(n_words: int, shift: int = 0) -> str:
    return " ".join(WORDS[(i + shift) % len(WORDS)] for i in range(n_words))


def n_tokens(srv: LlamaServer, text: str) -> int:
    r = srv.post("/tokenize", {"content": text, "add_special": True})
    r.raise_for_status()
    return len(r.json()["tokens"])


def complete(srv: LlamaServer, prompt: str, n_predict: int, **extra: Any) -> requests.Response:
    body = {"prompt": prompt, "n_predict": n_predict, "temperature": 0, "cache_prompt": False,
            "ignore_eos": True, **extra}
    return srv.post("/completion", body)


def run_concurrently(fns: list[Any]) -> list[Any]:
    with ThreadPoolExecutor(max_workers=len(fns)) as ex:
        futures = [ex.submit(fn) for fn in fns]
        return [f.result() for f in futures]


def complete_all(srv: LlamaServer, prompts: list[str], n_predict: int, **extra: Any) -> list[requests.Response]:
    """Send the prompts at once; assert that every one finishes with exactly n_predict tokens."""
    res = run_concurrently([lambda p=p: complete(srv, p, n_predict, **extra) for p in prompts])
    for r in res:
        assert r.status_code == 200, r.text
        assert r.json()["tokens_predicted"] == n_predict
    return res


def sse_events(lines: list[str]) -> list[dict[str, Any] | str]:
    """The data: payloads of an SSE stream, JSON-decoded ("[DONE]" kept as a string)."""
    out: list[dict[str, Any] | str] = []
    for line in lines:
        if line.startswith("data: "):
            payload = line[len("data: "):]
            out.append(payload if payload == "[DONE]" else json.loads(payload))
    return out


class BackgroundStream:
    """A streamed /completion read on a thread; `started` is set at its first chunk."""

    def __init__(self, srv: LlamaServer, body: dict[str, Any]) -> None:
        self.chunks: list[dict[str, Any]] = []
        self.started = threading.Event()
        self._thread = threading.Thread(target=self._read, args=(srv, body))
        self._thread.start()

    def _read(self, srv: LlamaServer, body: dict[str, Any]) -> None:
        for line in srv.stream("/completion", body):
            if line.startswith("data: "):
                self.chunks.append(json.loads(line[6:]))
                self.started.set()

    def join(self, timeout: float = 120) -> list[dict[str, Any]]:
        self._thread.join(timeout)
        return self.chunks


def assert_every_swap_verified(m: Any) -> None:
    """Every park was a swap, and every park and restore byte-checked by the copy guard
    (LLAMA_SERVER_PREEMPT_VERIFY: all of them), and nothing is held any more."""
    assert m["n_preempt_swap_total"] == m["n_preempt_total"]
    assert m["n_swap_verify_total"] == m["n_preempt_swap_total"] + m["n_resume_total"]
    assert m["n_swap_verify_mismatch_total"] == 0
    assert m["preempt_ram_bytes"] == 0
    assert m["preempt_copies_in_flight"] == 0


def wait_until(predicate: Callable[[], T], timeout_s: float, what: str, interval_s: float = 0.005) -> T:
    """Poll predicate() until it returns something truthy, which is returned; AssertionError naming
    `what` (what was waited for) if it has not after timeout_s seconds."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = predicate()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {timeout_s:g} s for {what}; last seen: {got!r}")
        time.sleep(interval_s)


def logged(srv: Any, *needles: str, timeout: float = 15) -> str:
    """The server's log once it holds every needle. Its log thread writes a line a moment after the
    event, so the answer that followed the event can reach a test before the line does."""
    return wait_until(lambda: (lambda t: t if all(n in t for n in needles) else "")(srv.log_text()), timeout,
                      f"{', '.join(map(repr, needles))} in the log")


def park_lines(srv: Any, timeout: float = 15) -> list[str]:
    """The log's "parked by" line of every park /metrics has counted so far (waited for, as in logged())."""
    n = srv.metrics()["n_preempt_total"]
    if n == 0:
        return []
    return wait_until(lambda: (lambda got: got if len(got) >= n else None)(
        [x for x in srv.log_text().splitlines() if "parked by " in x]), timeout, f"{n} park lines in the log")


def swap_parks(srv: Any) -> list[tuple[int, str]]:
    """(cell ranges, how it was copied: "memcpy", "device graphs", ...) of every swap park in the log,
    to RAM or to disk."""
    line = r"parked by swap(?: to disk[a-z ,]*)? \([^)]* in (\d+) cell ranges(?:, \d+ cells freed)?\) in [\d.]+ ms by ([a-z ,]+), reason"
    return [(int(n), how) for n, how in re.findall(line, "\n".join(park_lines(srv)))]


def wait_for_slot(srv: LlamaServer, key: str, timeout: float = 60) -> dict[str, Any]:
    """The /slots entry of the first slot seen with `key` true ("is_processing", "is_preempted")."""
    return wait_until(lambda: next((s for s in srv.slots() if s[key]), None), timeout, f"a slot with {key}")


def wait_for_parked(srv: LlamaServer, timeout: float = 60) -> dict[str, Any]:
    """The /slots entry of the first slot seen parked."""
    return wait_for_slot(srv, "is_preempted", timeout)


def open_raw_stream(srv: LlamaServer, prompt: str, n_predict: int) -> socket.socket:
    """A streamed /completion on a raw socket, so that closing it really disconnects (a pooled HTTP
    client may keep the connection open); returns once the stream is live."""
    body = json.dumps({"prompt": prompt, "n_predict": n_predict, "temperature": 0,
                       "ignore_eos": True, "stream": True}).encode()
    sock = socket.create_connection((srv.host, srv.port), timeout=60)
    sock.sendall(b"POST /completion HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                 b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    first = sock.recv(4096)
    assert first.startswith(b"HTTP/1.1 200"), first
    return sock


def wait_until_nothing_held(srv: LlamaServer, timeout: float = 30) -> Any:
    """After a client left: wait until no host RAM is held and no request runs; the last metrics."""
    deadline = time.monotonic() + timeout
    while True:
        m = srv.metrics()
        if (m["preempt_ram_bytes"] == 0 and m["requests_processing"] == 0) or time.monotonic() > deadline:
            return m


def streams_held_parked(srv: LlamaServer, prompts: tuple[str, ...] = ("Once upon a time", "There was a dog"),
                        timeout: float = 30) -> list[requests.Response]:
    """Open one long stream per prompt and wait until every one is parked (the server runs with a
    long LLAMA_SERVER_PREEMPT_HOLD_MS); the caller closes the responses."""
    streams = [requests.post(srv.url + "/completion", json={"prompt": p, "n_predict": 300, "ignore_eos": True,
                                                             "stream": True}, stream=True, timeout=60)
               for p in prompts]
    wait_until(lambda: sum(s["is_preempted"] for s in srv.slots()) >= len(prompts), timeout,
               f"all {len(prompts)} requests to be parked")
    return streams


def assert_forced_swaps_give_the_unparked_answer(ref_srv: LlamaServer, srv: LlamaServer, n_predict: int = 96,
                                                 min_parks: int = 8) -> Any:
    """The same prompt on a server without preemption and on one forced to park by swap (every
    park byte-verified): the same answer, every park resumed; the parked server's metrics."""
    ref = complete(ref_srv, "Once upon a time", n_predict).json()
    got = complete(srv, "Once upon a time", n_predict).json()
    assert got["tokens_predicted"] == n_predict
    assert got["content"] == ref["content"]
    m = srv.metrics()
    assert m["n_preempt_total"] >= min_parks
    assert m["n_resume_total"] == m["n_preempt_total"]
    assert_every_swap_verified(m)
    return m


THREE_PROMPTS = ["Once upon a time", "The little dog", "A girl named Lily"]


def assert_restored_ahead_exactly(ref_srv: LlamaServer | None, srv: LlamaServer) -> Any:
    """Three prompts decoding together on a server whose parked slots are held a little (so the
    next to resume is uploaded ahead, every park byte-verified): at least one restore that only
    scattered, every copy byte-identical; the parked server's metrics.

    With ref_srv (a server without preemption), each answer must be the one its prompt gives alone
    there: pass it only where both run --deterministic on batch-invariant kernels (the CPU's, also
    behind RPC), since otherwise an answer depends on the batches it ran in (three together, parked
    in turn, against one alone) and the byte checks of every copy are the proof."""
    got = [r.json()["content"] for r in complete_all(srv, THREE_PROMPTS, 48)]
    if ref_srv is not None:
        assert ref_srv.props()["llama_preempt"]["deterministic"] and srv.props()["llama_preempt"]["deterministic"]
        assert got == [complete(ref_srv, p, 48).json()["content"] for p in THREE_PROMPTS]
    m = srv.metrics()
    assert m["n_restore_ahead_total"] >= 1
    assert m["n_swap_restore_ahead_total"] == m["n_restore_ahead_total"]  # the old name, kept one release
    assert m["n_restore_ahead_total"] <= m["n_resume_total"] == m["n_preempt_total"]
    assert_every_swap_verified(m)
    logged(srv, "(uploaded ahead)")
    return m


def cli_command(*args: str) -> list[str]:
    """The command line of `llama-preempt ARGS` as a child of this interpreter."""
    return [sys.executable, "-m", "llama_preempt.cli", *args]


def run_cli(*args: str, env: dict[str, str] | None = None, columns: str | None = "160",
            timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """`llama-preempt ARGS` as a child, its output captured; `columns` sets COLUMNS (None: unset, as
    a pipe has it)."""
    full = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    if columns:
        full["COLUMNS"] = columns
    full.update(env or {})
    return subprocess.run(cli_command(*args), capture_output=True, text=True, timeout=timeout, env=full)


def stats_text(url: str, width: int = 120) -> str:
    """What `llama-preempt stats URL` draws, once, on a terminal `width` columns wide."""
    from rich.console import Console

    from llama_preempt.statsview import fetch, render

    con = Console(width=width, record=True)
    con.print(render(fetch(url), None))
    return con.export_text()


def http_ok(url: str) -> bool:
    """One probe: GET url answers 200 (False while nothing answers there)."""
    try:
        return requests.get(url, timeout=2).status_code == 200
    except requests.RequestException:
        return False


@contextlib.contextmanager
def fake_http_server(answers: dict[str, bytes], other: bytes | None = None) -> Iterator[str]:
    """Something on loopback that answers HTTP but is not llama-server: GET of a path in `answers`
    gets 200 and that body, any other path 200 and `other`, or 404 when `other` is None; yields
    "127.0.0.1:PORT"."""
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            body = answers.get(self.path, other)
            if body is None:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a: Any) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    t = threading.Thread(target=httpd.serve_forever, daemon=True)
    t.start()
    try:
        yield f"127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


def rss_mib(pid: int) -> float:
    """The resident set size of process `pid` in MiB (Linux /proc)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"/proc/{pid}/status has no VmRSS line")


def rpc_served_devices(rpc: Any, timeout: float = 30) -> list[str]:
    """The devices one ggml-rpc-server serves, as it lists them in its log at start ("Devices:"):
    its CPU on a CPU build (or when started with -d CPU), else the build's accelerators (CUDA0, ...)."""
    def listed() -> list[str] | None:
        m = re.search(r"^Devices:\n((?:  .*\n)*?)  transport", rpc.log_text(), re.M)
        return re.findall(r"^  (\S+): ", m.group(1), re.M) if m else None
    return wait_until(listed, timeout, f"{rpc.endpoint} to list the devices it serves")


def rpc_devices(*servers: Any) -> list[str]:
    """The names llama-server gives the RPC servers' devices when --rpc lists the servers in this
    order: RPC0, RPC1, ..., numbered on across the servers, one per device each serves."""
    n = sum(len(rpc_served_devices(s)) for s in servers)
    return [f"RPC{i}" for i in range(n)]


def on_rpc(*servers: Any) -> list[str]:
    """llama-server flags that put every layer, and so every KV cell, on the RPC device(s) and on no
    other: --rpc registers them (before -dev, which names them), -dev makes them the only devices
    to offload to (on a GPU build the local GPU would take layers too, as would the
    LLAMA_PREEMPT_TEST_GPU_LAYERS knob), -ngl 99 offloads every layer. The same on every build."""
    return ["--rpc", ",".join(s.endpoint for s in servers), "-dev", ",".join(rpc_devices(*servers)), "-ngl", "99"]
