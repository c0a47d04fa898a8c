"""Helpers shared by the server tests: prompts, requests, concurrency and SSE parsing."""
from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import requests

from llama_preempt.server import LlamaServer

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
