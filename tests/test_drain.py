"""The graceful drain: SIGTERM (or SIGINT) lets the requests in flight finish, refuses new ones,
answers the rest with an error when --drain-timeout runs out, and exits 0."""
from __future__ import annotations

import json
import signal
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict

import pytest
import requests

from llama_preempt.engine import Engine, EngineError, RequestCancelled
from llama_preempt.server import LlamaServer, ServerStartError

from helpers import logged, new_server, open_raw_stream, wait_until

FORCED = {"LLAMA_SERVER_PREEMPT_EVERY": "8"}  # parks every generating slot every 8 tokens
HELD = {**FORCED, "LLAMA_SERVER_PREEMPT_HOLD_MS": "600000"}  # ... and keeps it parked


class Client:
    """One request on its own thread: a non-streamed /completion, or a stream read to its end."""

    def __init__(self, srv: LlamaServer, prompt: str, n_predict: int, stream: bool) -> None:
        self.status = 0
        self.retry_after: str | None = None  # a 503's Retry-After
        self.t_end = 0.0  # when its answer ended (time.monotonic())
        self.body: Any = None
        self.events: list[dict[str, Any]] = []
        self.error: dict[str, Any] | None = None
        self.ended = False  # a stream that reached its end (the server closed it properly)
        body = {"prompt": prompt, "n_predict": n_predict, "temperature": 0, "ignore_eos": True}
        self._thread = threading.Thread(target=self._run, args=(srv, body, stream), daemon=True)
        self._thread.start()

    def _run(self, srv: LlamaServer, body: dict[str, Any], stream: bool) -> None:
        try:
            self._ask(srv, body, stream)
        finally:
            self.t_end = time.monotonic()

    def _ask(self, srv: LlamaServer, body: dict[str, Any], stream: bool) -> None:
        if not stream:
            r = requests.post(srv.url + "/completion", json=body, timeout=300)
            self.status, self.body = r.status_code, r.json()
            self.retry_after = r.headers.get("Retry-After")
            return
        with requests.post(srv.url + "/completion", json={**body, "stream": True}, stream=True, timeout=300) as r:
            self.status = r.status_code
            self.retry_after = r.headers.get("Retry-After")
            if r.status_code != 200:  # answered before its stream began
                self.body = r.json()
                return
            for raw in r.iter_lines():
                line = raw.decode()
                if line.startswith("data: ") and line != "data: [DONE]":
                    event = json.loads(line[6:])
                    if "error" in event:
                        self.error = event["error"]  # the stream's error event
                    else:
                        self.events.append(event)
            self.ended = True

    def join(self, timeout: float) -> "Client":
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "the request never ended"
        return self

    @property
    def n_generated(self) -> int:
        if self.body is not None:
            return int(self.body.get("tokens_predicted", 0))
        return sum(1 for e in self.events if e.get("content") is not None and not e.get("stop"))


Serve = Callable[[int, Dict[str, str]], LlamaServer]


@pytest.fixture
def serve(start_server, stories_model: Path) -> Serve:
    """serve(drain_timeout_s, env): a llama-server with 4 slots over 512 cells; stopped afterwards."""
    def make(drain: int, env: dict[str, str]) -> LlamaServer:
        return start_server(stories_model, n_ctx=512, n_parallel=4, extra_args=["--drain-timeout", str(drain)], env=env)

    return make


def plain_and_stream(srv: LlamaServer, n_predict: int) -> list[Client]:
    """A non-streamed and a streamed request, started on their threads."""
    return [Client(srv, "Once upon a time", n_predict, stream=False), Client(srv, "There was a dog", n_predict, stream=True)]


def sigterm(srv: LlamaServer) -> float:
    """SIGTERM the server; when it was sent."""
    assert srv.proc is not None
    srv.proc.send_signal(signal.SIGTERM)
    return time.monotonic()


def running(srv: LlamaServer, n: int, parked: int = 0) -> None:
    wait_until(lambda: sum(s["is_processing"] for s in srv.slots()) >= n
               and sum(s["is_preempted"] for s in srv.slots()) >= parked, 60, f"{n} requests running, {parked} parked")


def test_sigterm_lets_the_requests_in_flight_finish_refuses_new_ones_and_exits_0(serve: Serve) -> None:
    srv = serve(120, FORCED)
    clients = [Client(srv, "Once upon a time", 400, stream=False), Client(srv, "There was a dog", 400, stream=False),
               Client(srv, "Lily went to", 400, stream=True), Client(srv, "The sun was", 400, stream=True)]
    running(srv, 4, parked=1)
    assert srv.proc is not None
    srv.proc.send_signal(signal.SIGTERM)
    wait_until(lambda: "draining:" in srv.log_text(), 30, "the drain to begin")
    # while it drains: a balancer sees 503 on /health, new work is refused, reads still answer
    h = requests.get(srv.url + "/health", timeout=10)
    assert h.status_code == 503 and h.json()["status"] == "draining"
    r = requests.post(srv.url + "/completion", json={"prompt": "late", "n_predict": 4}, timeout=10)
    assert r.status_code == 503 and "shutting down" in r.json()["error"]["message"]
    assert h.headers["Retry-After"] == r.headers["Retry-After"] == "1"
    m = requests.get(srv.url + "/metrics", timeout=10)
    assert m.status_code == 200 and "llamacpp:server_draining 1" in m.text
    for c in clients:
        c.join(120)
    rc = srv.proc.wait(timeout=60)
    assert rc == 0, srv.log_tail()
    for c in clients:  # every answer whole
        assert c.status == 200 and c.error is None
        assert c.n_generated == 400, (c.body, len(c.events))
    assert all(c.ended and c.events[-1].get("stop") for c in clients if c.events)
    logged(srv, "drained in", "4 requests finished with their answer, 0 ended")


def test_sigterm_hands_back_the_requests_that_never_started_at_once_and_lets_the_running_ones_finish(
        serve: Serve) -> None:
    srv = serve(120, {})
    runners = [Client(srv, p, 400, stream=i % 2 == 1)
               for i, p in enumerate(["Once upon a time", "There was a dog", "Lily went to", "The sun was"])]
    # every slot busy and each request begun (a token sent), then two more wait for a slot
    wait_until(lambda: sum(s["is_processing"] and s["next_token"][0]["n_decoded"] > 0 for s in srv.slots()) == 4, 60,
               "four requests generating")
    waiting = [Client(srv, "A cat sat", 300, stream=False), Client(srv, "A bird flew", 300, stream=True)]
    wait_until(lambda: srv.metrics()["requests_deferred"] >= 2, 30, "two requests queued")
    sigterm(srv)
    for c in waiting:
        c.join(30)
        assert c.status == 503 and c.retry_after is not None and int(c.retry_after) >= 1
        assert "had not started" in c.body["error"]["message"]
    for c in runners:
        c.join(120)
        assert c.status == 200 and c.error is None and c.n_generated == 400
    # handed back while the others still ran
    assert max(c.t_end for c in waiting) < min(c.t_end for c in runners)
    assert srv.proc is not None and srv.proc.wait(timeout=60) == 0
    logged(srv, "2 that had not started were handed back (503 with Retry-After",
           "4 requests finished with their answer, 0 ended with an error, 2 handed back before they started")


def test_a_drain_that_runs_out_ends_each_request_with_an_error_and_exits_0(serve: Serve) -> None:
    srv = serve(1, HELD)  # parked until the drain runs out
    clients = plain_and_stream(srv, 300)
    running(srv, 2, parked=2)
    t0 = sigterm(srv)
    assert srv.proc is not None
    rc = srv.proc.wait(timeout=30)
    assert rc == 0, srv.log_tail()
    assert time.monotonic() - t0 < 15
    plain, stream = (c.join(30) for c in clients)
    assert plain.status == 503 and "did not finish within --drain-timeout 1 s" in plain.body["error"]["message"]
    assert stream.status == 200 and stream.ended  # the stream's error event, then its end
    assert stream.error is not None and "--drain-timeout" in stream.error["message"]
    logged(srv, "0 requests finished with their answer, 2 ended with an error")


def test_a_second_signal_ends_the_drain_at_once_with_the_requests_answered(serve: Serve) -> None:
    srv = serve(600, HELD)
    clients = plain_and_stream(srv, 300)
    running(srv, 2, parked=2)
    sigterm(srv)
    wait_until(lambda: requests.get(srv.url + "/health", timeout=10).status_code == 503, 30, "/health to say draining")
    t0 = time.monotonic()
    srv.proc.send_signal(signal.SIGINT)
    rc = srv.proc.wait(timeout=30)
    assert rc == 0 and time.monotonic() - t0 < 15, srv.log_tail()
    plain, stream = (c.join(30) for c in clients)
    assert plain.status == 503 and "a second signal ended the drain" in plain.body["error"]["message"]
    assert stream.ended and stream.error is not None and "second signal" in stream.error["message"]


def test_sigterm_after_a_parked_streams_client_went_away_exits_at_once(serve: Serve) -> None:
    srv = serve(60, HELD)
    sock = open_raw_stream(srv, "Once upon a time", 300)
    running(srv, 1, parked=1)
    sock.close()  # the client goes away while its request is parked
    assert srv.proc is not None
    t0 = time.monotonic()
    srv.proc.send_signal(signal.SIGTERM)
    rc = srv.proc.wait(timeout=90)
    # the gone client's request was cancelled, so nothing was left to wait for
    assert rc == 0 and time.monotonic() - t0 < 20, srv.log_tail()


def test_a_slot_parked_through_the_api_finishes_in_the_drain(serve: Serve) -> None:
    srv = serve(120, {})
    client = Client(srv, "Once upon a time", 300, stream=False)
    running(srv, 1)
    slot = next(s["id"] for s in srv.slots() if s["is_processing"])
    assert srv.post(f"/slots/{slot}?action=park", {}).status_code == 200  # waits for an unpark
    running(srv, 1, parked=1)
    assert srv.proc is not None
    srv.proc.send_signal(signal.SIGTERM)
    # the slot API still answers while draining (an unpark starts no new work)
    wait_until(lambda: requests.get(srv.url + "/health", timeout=10).status_code == 503, 30, "the drain")
    r = requests.post(srv.url + f"/slots/{slot}?action=unpark", json={}, timeout=10)
    assert r.status_code in (200, 400), r.text  # 400: the drain had already resumed it
    assert srv.proc.wait(timeout=60) == 0, srv.log_tail()
    client.join(30)
    assert client.status == 200 and client.n_generated == 300


def test_a_scrape_at_the_end_of_a_drain_is_answered_and_the_server_exits(serve: Serve) -> None:
    srv = serve(60, FORCED)
    clients = plain_and_stream(srv, 200)
    running(srv, 2)
    sigterm(srv)
    assert srv.proc is not None
    answered = 0
    while srv.proc.poll() is None:  # scrape as fast as a busy Prometheus would, until it exits
        try:
            answered += requests.get(srv.url + "/metrics", timeout=10).status_code == 200
        except requests.RequestException:
            break  # the listener closed
    assert srv.proc.wait(timeout=60) == 0 and answered > 0, srv.log_tail()
    assert all(c.join(30).status == 200 for c in clients)


def test_sigterm_on_an_idle_server_exits_at_once(serve: Serve) -> None:
    srv = serve(60, {})
    assert srv.proc is not None
    t0 = time.monotonic()
    srv.proc.send_signal(signal.SIGTERM)
    assert srv.proc.wait(timeout=30) == 0 and time.monotonic() - t0 < 10


def test_sigterm_on_a_sleeping_server_exits_at_once(start_server, stories_model: Path) -> None:
    srv = start_server(stories_model, n_ctx=512, n_parallel=2, extra_args=["--sleep-idle-seconds", "1"])
    wait_until(lambda: srv.props().get("is_sleeping"), 30, "the server to fall asleep", interval_s=0.1)
    assert srv.proc is not None
    t0 = time.monotonic()
    srv.proc.send_signal(signal.SIGTERM)
    assert srv.proc.wait(timeout=30) == 0 and time.monotonic() - t0 < 10, srv.log_tail()


@pytest.mark.parametrize("value", ["-1", "soon"])
def test_a_bad_drain_timeout_names_the_flag(tmp_path: Path, stories_model: Path, value: str) -> None:
    srv = new_server(stories_model, tmp_path, extra_args=["--drain-timeout", value])
    with pytest.raises(ServerStartError) as e:
        srv.start(timeout=30)
    assert "--drain-timeout" in str(e.value) + srv.log_text()


# --- the Engine: drain or cancel ---

def test_the_engine_drains_its_requests_and_takes_no_new_ones(stories_model: Path) -> None:
    with Engine(stories_model, n_ctx=512, n_parallel=2, kv_unified=True) as eng:
        eng.start()
        reqs = [eng.submit("Once upon a time", n_predict=400, temperature=0, ignore_eos=True),
                eng.submit("There was a dog", n_predict=400, temperature=0, ignore_eos=True)]
        refused: list[BaseException] = []

        def late() -> None:
            wait_until(lambda: eng._draining, 30, "the drain to begin", interval_s=0.001)
            try:
                eng.submit("late", n_predict=4)
            except EngineError as e:
                refused.append(e)

        t = threading.Thread(target=late)
        t.start()
        eng.stop(drain=120)
        t.join(30)
        assert [r.completion().n_generated for r in reqs] == [400, 400]
        assert refused and "draining" in str(refused[0])


def test_the_engine_stop_without_drain_cancels_what_is_pending(stories_model: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    for k, v in HELD.items():  # parked until cancelled
        monkeypatch.setenv(k, v)
    with Engine(stories_model, n_ctx=512, n_parallel=2, kv_unified=True) as eng:
        eng.start()
        req = eng.submit("Once upon a time", n_predict=300, temperature=0, ignore_eos=True)
        wait_until(lambda: eng.stats().parked(), 30, "the request to be parked")
        eng.stop()
        with pytest.raises(RequestCancelled):
            req.completion()


def test_the_engine_close_with_drain_steps_its_requests_to_the_end(stories_model: Path) -> None:
    eng = Engine(stories_model, n_ctx=512, n_parallel=2, kv_unified=True)
    req = eng.submit("Once upon a time", n_predict=64, temperature=0, ignore_eos=True)
    eng.close(drain=60)
    assert req.done() and req.completion().n_generated == 64
