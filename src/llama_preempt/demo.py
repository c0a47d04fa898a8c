"""The scenario this project exists for, run twice on the same load: concurrent chats that each fit
the unified KV pool alone but overflow it together, first as upstream llama-server handles it
(--no-preempt: every running chat ends with "Context size has been exceeded."), then with
preemption (nothing is lost).

`run_scenario()` runs one pass through the in-process Engine (default) or the drop-in binary over
HTTP and reports each chat's progress through a callback; the CLI (`llama-preempt demo`) draws it.
"""
from __future__ import annotations

import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from . import _core
from .engine import stream_text

TOPICS = ["the history of bread", "how rivers form", "a day in the life of a lighthouse keeper",
          "why the sky is blue", "the rules of chess", "how bees make honey", "the first trains",
          "a walk through a rainforest"]


class DemoError(ValueError):
    pass


@dataclass(frozen=True)
class DemoConfig:
    model: Path
    n_ctx: int = 1024
    n_parallel: int = 4
    n_chats: int = 4
    n_tokens: int = 400
    preempt_ram_mib: int = 8192
    preempt_mode: str = "auto"    # SWAP or RECOMPUTE per victim: auto (by measured cost), swap, recompute
    engine: str = "engine"        # "engine" (in process) or "server" (the drop-in binary over HTTP)
    threads: int | None = None
    seed: int = 1234
    deterministic: bool = False   # --deterministic: and compare each answer with the chat run alone
    verbose: bool = False

    def chats(self) -> list[list[dict[str, str]]]:
        return [[{"role": "user", "content": f"Write a long essay about {TOPICS[i % len(TOPICS)]}."}]
                for i in range(self.n_chats)]


@dataclass
class ChatState:
    index: int
    topic: str
    tokens: int = 0
    state: str = "waiting"        # waiting, prompt, generating, paused, parked, done, lost
    slot: int | None = None
    parks: int = 0
    parked_mode: str | None = None  # while parked: swap or recompute
    modes: list[str] = field(default_factory=list)  # how each park was done
    error: str | None = None
    id_cmpl: str | None = None  # the "id" of its responses: finds its slot in /slots
    text: str = ""              # the answer so far


@dataclass
class RunSummary:
    label: str
    preempt: bool
    engine: str
    chats: int
    completed: int
    lost: int
    tokens: int
    wall_s: float
    tok_s: float
    parks_swap: int
    parks_recompute: int
    resumes: int
    recomputed_tokens: int
    peak_ram_bytes: int
    pauses: int = 0               # times a chat was paused (beyond the decode width: it kept its cells)
    errors: list[str] = field(default_factory=list)
    answers: list[str] = field(default_factory=list, repr=False)  # each chat's text, in order

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


Update = Callable[[str, list[ChatState]], None]


def _bodies(cfg: DemoConfig) -> list[dict[str, Any]]:
    return [{"messages": m, "max_tokens": cfg.n_tokens, "temperature": 0, "ignore_eos": True, "stream": True,
             "timings_per_token": True} for m in cfg.chats()]


def check_config(cfg: DemoConfig, prompt_tokens: Iterable[int]) -> None:
    """The load must be the demo's point: each chat fits the pool alone, all of them do not."""
    sizes = [p + cfg.n_tokens for p in prompt_tokens]
    if max(sizes) + _core.PREEMPT_MARGIN > cfg.n_ctx:  # the planner keeps this many cells free
        raise DemoError(f"--tokens {cfg.n_tokens}: one chat needs {max(sizes)} cells, more than --ctx {cfg.n_ctx} "
                        f"holds; lower --tokens or raise --ctx")
    concurrent = sorted(sizes, reverse=True)[: min(cfg.n_parallel, cfg.n_chats)]
    if sum(concurrent) <= cfg.n_ctx:
        raise DemoError(f"the chats fit the pool together ({sum(concurrent)} of {cfg.n_ctx} cells): nothing would "
                        f"overflow; raise --chats, --parallel or --tokens, or lower --ctx")


def _on_chunk(chat: ChatState, chunk: dict[str, Any], n_tokens: int) -> None:
    """One /v1/chat/completions stream chunk (with timings_per_token) for this chat."""
    chat.id_cmpl = chunk.get("id", chat.id_cmpl)
    chat.text += stream_text(chunk)
    timings = chunk.get("timings") or {}
    if "predicted_n" in timings:
        chat.tokens = max(chat.tokens, int(timings["predicted_n"]))
    usage = chunk.get("usage") or {}
    if "completion_tokens" in usage:
        chat.tokens = max(chat.tokens, int(usage["completion_tokens"]))
    choices = chunk.get("choices") or [{}]
    finish = choices[0].get("finish_reason")
    if finish:
        chat.state = "done" if finish in ("length", "stop") else "lost"
    elif chat.state in ("waiting", "prompt") and chat.tokens > 0:
        chat.state = "generating"


def _slot_states(chats: list[ChatState], slots: list[Any]) -> None:
    """Each running chat's state from its slot (is it parked, and how)."""
    by_cmpl = {s.id_cmpl: s for s in slots if s.id_cmpl and s.is_processing}
    for c in chats:
        s = by_cmpl.get(c.id_cmpl)
        if s is None or c.state in ("done", "lost"):
            continue
        c.slot = s.id
        if s.n_preempt > c.parks:  # parks not seen as events (the HTTP path polls /slots)
            c.modes.extend([s.preempt_mode or "?"] * (s.n_preempt - c.parks))
            c.parks = s.n_preempt
        if s.is_preempted:
            c.state, c.parked_mode = "parked", s.preempt_mode
        elif s.is_paused:
            c.state, c.parked_mode = "paused", None
        elif c.state in ("parked", "paused"):
            c.state, c.parked_mode = "generating", None


def run_scenario(cfg: DemoConfig, preempt: bool, update: Update, *, interval: float = 0.1) -> RunSummary:
    label = "llama-preempt" if preempt else "upstream (--no-preempt)"
    chats = [ChatState(i, TOPICS[i % len(TOPICS)]) for i in range(cfg.n_chats)]
    if cfg.engine == "engine":
        return _run_engine(cfg, preempt, label, chats, update, interval)
    if cfg.engine == "server":
        return _run_server(cfg, preempt, label, chats, update, interval)
    raise DemoError(f"--engine: expected 'engine' or 'server', got {cfg.engine!r}")


def _summary(cfg: DemoConfig, preempt: bool, label: str, chats: list[ChatState], wall: float,
             counters: Any, peak_ram: int) -> RunSummary:
    tokens = sum(c.tokens for c in chats)
    return RunSummary(
        label=label, preempt=preempt, engine=cfg.engine, chats=len(chats),
        completed=sum(c.state == "done" for c in chats), lost=sum(c.state != "done" for c in chats),
        tokens=tokens, wall_s=round(wall, 3), tok_s=round(tokens / wall, 1) if wall > 0 else 0.0,
        parks_swap=int(counters["n_preempt_swap_total"]), parks_recompute=int(counters["n_preempt_recompute_total"]),
        resumes=int(counters["n_resume_total"]), recomputed_tokens=int(counters["n_recompute_tokens_total"]),
        peak_ram_bytes=int(peak_ram), pauses=int(counters.get("n_paused_total") or 0),
        errors=sorted({c.error for c in chats if c.error}),
        answers=[c.text for c in chats])


def answers_alone(cfg: DemoConfig) -> list[str]:
    """The same chats run one at a time on the same pool, so none is ever under pressure: the
    answers a --deterministic run must give under load."""
    bodies = [{k: v for k, v in b.items() if k not in ("stream", "timings_per_token")} for b in _bodies(cfg)]
    if cfg.engine == "engine":
        from .engine import Engine

        args = [] if cfg.verbose else ["--log-disable"]
        with Engine(cfg.model, args, n_ctx=cfg.n_ctx, n_parallel=cfg.n_parallel, kv_unified=True,
                    n_threads=cfg.threads, seed=cfg.seed, deterministic=cfg.deterministic, verbose=cfg.verbose) as eng:
            return [eng.submit(path="/v1/chat/completions", body=b).completion().text for b in bodies]
    from .engine import Completion
    from .server import LlamaServer, ServerConfig

    sc = ServerConfig(model=cfg.model, n_ctx=cfg.n_ctx, n_parallel=cfg.n_parallel, kv_unified=True, seed=cfg.seed,
                      threads=cfg.threads, deterministic=cfg.deterministic)
    with LlamaServer(sc) as srv:
        out = []
        for b in bodies:
            r = srv.post("/v1/chat/completions", b, timeout=3600)
            r.raise_for_status()
            out.append(Completion.from_response(r.json()).text)
        return out


def n_identical(run: RunSummary, alone: list[str]) -> int:
    """How many of a run's answers are the ones the chats give alone."""
    return sum(a == b for a, b in zip(run.answers, alone))


def _run_engine(cfg: DemoConfig, preempt: bool, label: str, chats: list[ChatState], update: Update,
                interval: float) -> RunSummary:
    from .engine import Engine, RequestError

    args = [] if cfg.verbose else ["--log-disable"]
    with Engine(cfg.model, args, n_ctx=cfg.n_ctx, n_parallel=cfg.n_parallel, kv_unified=True, preempt=preempt,
                preempt_ram_mib=cfg.preempt_ram_mib, preempt_mode=cfg.preempt_mode, n_threads=cfg.threads, seed=cfg.seed,
                deterministic=cfg.deterministic, verbose=cfg.verbose) as eng:
        bodies = _bodies(cfg)
        check_config(cfg, (len(eng.tokenize(eng.request("POST", "/apply-template", {"messages": b["messages"]})["prompt"], special=True))
                           for b in bodies))
        t0 = time.perf_counter()
        reqs = [eng.submit(path="/v1/chat/completions", body=b) for b in bodies]  # each returns once queued
        for c in chats:
            c.state = "prompt"
        peak_ram = 0
        last_draw = 0.0
        while True:
            rep = eng.tick(0.02)
            for req, chat in zip(reqs, chats):
                if chat.state in ("done", "lost"):
                    continue
                try:
                    for chunk in req.poll():
                        _on_chunk(chat, chunk, cfg.n_tokens)
                    if req.done():
                        for chunk in req.poll():
                            _on_chunk(chat, chunk, cfg.n_tokens)
                        if chat.state not in ("done", "lost"):
                            chat.state = "lost"
                except RequestError as e:
                    chat.state, chat.error = "lost", e.message
            for p in rep.parked:
                chat = next((c for c in chats if c.slot == p.slot and c.state not in ("done", "lost")), None)
                if chat is not None:
                    chat.parks += 1
                    chat.modes.append(p.mode)
            st = eng.stats()
            peak_ram = max(peak_ram, st.preempt_ram_bytes)
            _slot_states(chats, list(st.slots))
            now = time.perf_counter()
            if now - last_draw >= interval:
                update(label, chats)
                last_draw = now
            if all(c.state in ("done", "lost") for c in chats):
                break
        wall = time.perf_counter() - t0
        update(label, chats)
        st = eng.stats()
        counters = {k: getattr(st, k) for k in ("n_preempt_swap_total", "n_preempt_recompute_total",
                                                  "n_resume_total", "n_recompute_tokens_total", "n_paused_total")}
        return _summary(cfg, preempt, label, chats, wall, counters, peak_ram)


def _run_server(cfg: DemoConfig, preempt: bool, label: str, chats: list[ChatState], update: Update,
                interval: float) -> RunSummary:
    import json

    import requests

    from .server import LlamaServer, ServerConfig
    from .stats import SlotStats

    sc = ServerConfig(model=cfg.model, n_ctx=cfg.n_ctx, n_parallel=cfg.n_parallel, kv_unified=True, preempt=preempt,
                      extra_args=["--preempt-ram", str(cfg.preempt_ram_mib), "--preempt-mode", cfg.preempt_mode],
                      seed=cfg.seed, threads=cfg.threads, deterministic=cfg.deterministic)
    with LlamaServer(sc) as srv:
        bodies = _bodies(cfg)
        check_config(cfg, (len(srv.post("/tokenize", {"content": srv.post("/apply-template", {"messages": b["messages"]})
                                                      .json()["prompt"], "add_special": True}).json()["tokens"])
                           for b in bodies))
        lock = threading.Lock()

        def client(chat: ChatState, body: dict[str, Any]) -> None:
            try:
                with requests.post(srv.url + "/v1/chat/completions", json=body, stream=True, timeout=3600) as r:
                    if r.status_code != 200:
                        err = r.json().get("error", {})
                        with lock:
                            chat.state, chat.error = "lost", str(err.get("message", r.text[:200]))
                        return
                    for raw in r.iter_lines():
                        line = raw.decode("utf-8")
                        if not line.startswith("data: ") or line == "data: [DONE]":
                            continue
                        data = json.loads(line[6:])
                        with lock:
                            if "error" in data:
                                chat.state, chat.error = "lost", str(data["error"].get("message"))
                                return
                            _on_chunk(chat, data, cfg.n_tokens)
            except requests.RequestException as e:
                with lock:
                    chat.state, chat.error = "lost", f"{e.__class__.__name__}: {e}"
            finally:
                with lock:
                    if chat.state not in ("done", "lost"):
                        chat.state = "lost"

        t0 = time.perf_counter()
        threads = [threading.Thread(target=client, args=(c, b), daemon=True) for c, b in zip(chats, bodies)]
        for c in chats:
            c.state = "prompt"
        for t in threads:
            t.start()
        peak_ram = 0
        while any(t.is_alive() for t in threads):
            m = srv.metrics()
            peak_ram = max(peak_ram, int(m.get("preempt_ram_bytes")))
            slots = [SlotStats.from_json(s) for s in srv.slots()]
            with lock:
                _slot_states(chats, slots)
                update(label, chats)
            for t in threads:
                t.join(interval / len(threads))
        wall = time.perf_counter() - t0
        m = srv.metrics()
        update(label, chats)
        counters = {k: m.get(k) for k in ("n_preempt_swap_total", "n_preempt_recompute_total",
                                          "n_resume_total", "n_recompute_tokens_total", "n_paused_total")}
        # parks per chat are not visible over HTTP once a request ended; the counters are exact
        return _summary(cfg, preempt, label, chats, wall, counters, peak_ram)
