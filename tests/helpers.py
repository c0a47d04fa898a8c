"""Helpers shared by the server tests: prompts, requests, concurrency and SSE parsing."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, TypeVar

import requests

from llama_preempt.metrics import parse_prometheus
from llama_preempt.server import LlamaServer

T = TypeVar("T")

# Word salad that tokenizes to roughly one token per word with the stories260K vocabulary.
WORDS = ("once upon a time there was a little girl named lily she loved to play outside in the "
         "park one day she saw a big red ball and her mom said be careful ").split()


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
    """Every park was a swap, byte-compared with upstream's copy (LLAMA_SERVER_PREEMPT_VERIFY), and
    nothing is held any more."""
    assert m["n_preempt_swap_total"] == m["n_preempt_total"]
    assert m["n_swap_verify_total"] == m["n_preempt_swap_total"]
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


def assert_restored_ahead_exactly(ref_srv: LlamaServer, srv: LlamaServer) -> Any:
    """Three prompts decoding together on a server without preemption and on one whose parked
    slots are held a little (so the next to resume is uploaded ahead, every park byte-verified):
    the same answers, and at least one restore that only scattered; the parked server's metrics."""
    refs = [complete(ref_srv, p, 48).json()["content"] for p in THREE_PROMPTS]
    got = [r.json()["content"] for r in complete_all(srv, THREE_PROMPTS, 48)]
    assert got == refs
    m = srv.metrics()
    assert m["n_swap_restore_ahead_total"] >= 1
    assert m["n_swap_restore_ahead_total"] <= m["n_resume_total"] == m["n_preempt_total"]
    assert_every_swap_verified(m)
    assert "(uploaded ahead)" in srv.log_text()
    return m


def labeled(srv: LlamaServer) -> dict[str, dict[str, float]]:
    """The server's one-label series by name, then label value (preempt_parks_by_choice_total, ...)."""
    return parse_prometheus(requests.get(f"{srv.url}/metrics", timeout=30).text).labeled


def run_cli(*args: str, env: dict[str, str] | None = None, columns: str | None = "160",
            timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """`llama-preempt ARGS` as a child, its output captured; `columns` sets COLUMNS (None: unset, as
    a pipe has it)."""
    full = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    if columns:
        full["COLUMNS"] = columns
    full.update(env or {})
    return subprocess.run([sys.executable, "-m", "llama_preempt.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=full)
