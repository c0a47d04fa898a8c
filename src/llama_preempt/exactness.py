"""Answers compared token by token: what --deterministic promises, checked the same way by the tests,
`bench/deterministic.py` and `llama-preempt demo --deterministic`.

An `Ask` is one /completion request whose generated token ids come back (`return_tokens`). The
runners send asks to a running llama-server (a `LlamaServer`): one at a time, all together, or
staggered (each next one once the ones before it are generating), and give back each ask's ids.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

if TYPE_CHECKING:
    from .server import LlamaServer


@dataclass(frozen=True)
class Ask:
    prompt: str
    n_predict: int
    temperature: float = 0.0
    seed: int | None = None        # fixes the sampler's draws at temperature > 0
    cache_prompt: bool = False     # True: the prompt may come from the prompt cache

    def body(self) -> dict[str, Any]:
        body: dict[str, Any] = {"prompt": self.prompt, "n_predict": self.n_predict, "temperature": self.temperature,
                                "ignore_eos": True, "cache_prompt": self.cache_prompt, "return_tokens": True}
        if self.seed is not None:
            body["seed"] = self.seed
        return body


class AskFailed(RuntimeError):
    """A request of a comparison did not come back with its answer."""


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    """The index of the first token where a and b differ (the shorter one's length if one is a
    prefix of the other), None when they are identical."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def token_ids(srv: "LlamaServer", ask: Ask, timeout: float = 600) -> list[int]:
    """The ids of the tokens one request generated."""
    r = srv.post("/completion", ask.body(), timeout=timeout)
    if r.status_code != 200:
        raise AskFailed(f"/completion answered {r.status_code}: {r.text[:300]}")
    return [int(t) for t in r.json()["tokens"]]


def one_at_a_time(srv: "LlamaServer", asks: Sequence[Ask]) -> list[list[int]]:
    return [token_ids(srv, a) for a in asks]


def _sender(srv: "LlamaServer", asks: Sequence[Ask], out: list[Any], i: int) -> threading.Thread:
    """A started thread that puts ask i's ids, or the exception it met, in out[i]."""
    def send() -> None:
        try:
            out[i] = token_ids(srv, asks[i])
        except Exception as e:  # noqa: BLE001 - handed to the caller by _collect()
            out[i] = e

    t = threading.Thread(target=send)
    t.start()
    return t


def _collect(threads: list[threading.Thread], out: list[Any], how: str) -> list[list[int]]:
    for t in threads:
        t.join()
    for x in out:
        if isinstance(x, Exception):
            raise AskFailed(f"a request sent {how} failed: {x}") from x
    return out


def together(srv: "LlamaServer", asks: Sequence[Ask]) -> list[list[int]]:
    """Every ask sent at once, each from its own thread; the ids in the asks' order."""
    out: list[Any] = [None] * len(asks)
    threads = [_sender(srv, asks, out, i) for i in range(len(asks))]
    return _collect(threads, out, "together with others")


def _generating(srv: "LlamaServer", at_least: int) -> int:
    """How many slots are generating with at least `at_least` tokens out."""
    n = 0
    for s in srv.slots():
        nxt = s.get("next_token") or [{}]
        if s.get("is_processing") and int(nxt[0].get("n_decoded", 0)) >= at_least:
            n += 1
    return n


def staggered(srv: "LlamaServer", asks: Sequence[Ask], after_tokens: int = 8, timeout: float = 300) -> list[list[int]]:
    """The asks sent one by one: each next one once every one before it has generated
    `after_tokens` tokens (or finished), so prompts are processed beside running decodes and cells
    freed by short answers are reused by the others."""
    out: list[Any] = [None] * len(asks)
    threads: list[threading.Thread] = []
    for i in range(len(asks)):
        threads.append(_sender(srv, asks, out, i))
        if i + 1 == len(asks):
            break
        deadline = time.monotonic() + timeout
        while True:
            running = sum(th.is_alive() for th in threads)
            if running == 0 or _generating(srv, after_tokens) >= running:
                break
            if time.monotonic() > deadline:
                raise AskFailed(f"staggered: request {i} did not generate {after_tokens} tokens in {timeout} s")
            time.sleep(0.005)
    return _collect(threads, out, "staggered")
