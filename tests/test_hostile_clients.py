"""Slow, stuck or hostile clients cannot take the server down: every connection is bounded, with
real sockets against the real server. A request's line, headers and body arrive within
--read-deadline or the connection is closed; an idle keep-alive connection closes after
--keep-alive-timeout; beyond --max-connections a connection is answered 503 at once; a client that
reads nothing for --stall-timeout has its request ended and its cells freed; /health answers while
every request thread is held; and a well-behaved client, a slow reader or a parked stream, loses
nothing. Each limit is in /props and counted in /metrics."""
from __future__ import annotations

import json
import socket
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
import requests

from conftest import ServerFactory
from helpers import wait_for_slot, wait_until
from llama_preempt.server import LlamaServer


def half_open(srv: LlamaServer, n: int, head: bytes = b"POST /completion HTTP/1.1\r\nHost: x\r\n") -> list[socket.socket]:
    """n connections that send the start of a request and then nothing."""
    out = []
    for _ in range(n):
        s = socket.create_connection((srv.host, srv.port), timeout=30)
        s.sendall(head)
        out.append(s)
    return out


def closed_within(s: socket.socket, seconds: float) -> tuple[bool, bytes]:
    """Whether the server closed `s` within `seconds` (what it sent before, if anything)."""
    s.settimeout(seconds)
    got = b""
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline:
            chunk = s.recv(65536)
            if not chunk:
                return True, got
            got += chunk
    except ConnectionResetError:
        return True, got
    except socket.timeout:
        pass
    return False, got


def health_ms(srv: LlamaServer) -> float:
    t = time.perf_counter()
    r = requests.get(srv.url + "/health", timeout=10)
    assert r.status_code == 200, r.text
    return (time.perf_counter() - t) * 1000


@pytest.fixture
def sockets() -> Iterator[list[socket.socket]]:
    held: list[socket.socket] = []
    yield held
    for s in held:
        s.close()


def test_every_limit_is_stated_in_props_and_the_start_log(start_server: ServerFactory, stories_model: Path) -> None:
    srv = start_server(stories_model, n_ctx=256, n_parallel=2)
    props = srv.props()["llama_preempt"]
    assert (props["read_deadline_s"], props["keep_alive_timeout_s"], props["max_connections"], props["stall_timeout_s"]) == \
        (30, 5, 2048, 60)
    log = srv.log_text()
    assert "HTTP: 6 threads always, up to 2112" in log and "--read-deadline" in log and "--stall-timeout" in log
    env = start_server(stories_model, n_ctx=256, n_parallel=2, env={"LLAMA_ARG_MAX_CONNECTIONS": "64",
                                                                   "LLAMA_ARG_READ_DEADLINE": "7"})
    assert env.props()["llama_preempt"]["max_connections"] == 64 and env.props()["llama_preempt"]["read_deadline_s"] == 7


@pytest.mark.parametrize("flag,value,says", [
    ("--read-deadline", "-1", "--read-deadline expects seconds from 0"),
    ("--max-connections", "many", "--max-connections expects a count"),
    ("--keep-alive-timeout", "0", "--keep-alive-timeout expects seconds from 1"),
])
def test_a_bad_limit_is_refused_naming_its_flag(flag: str, value: str, says: str) -> None:
    import subprocess

    from llama_preempt.binary import server_binary

    p = subprocess.run([str(server_binary()), flag, value], capture_output=True, text=True, timeout=60)
    assert p.returncode != 0 and says in p.stderr + p.stdout


def test_a_half_open_connection_is_closed_at_its_read_deadline(start_server: ServerFactory, stories_model: Path,
                                                              sockets: list[socket.socket]) -> None:
    srv = start_server(stories_model, n_ctx=256, n_parallel=2, extra_args=["--read-deadline", "1"])
    t0 = time.monotonic()
    sockets += half_open(srv, 3)
    for s in sockets:
        closed, _ = closed_within(s, 15)
        assert closed
    assert 0.9 <= time.monotonic() - t0 < 15
    # a body dribbled a byte at a time: each read is quick, the whole is not in by the deadline
    slow = socket.create_connection((srv.host, srv.port), timeout=30)
    sockets.append(slow)
    slow.sendall(b"POST /completion HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n")
    t1 = time.monotonic()
    cut = False
    for _ in range(40):
        try:
            slow.sendall(b" ")
        except OSError:
            cut = True
            break
        if closed_within(slow, 0.1)[0]:
            cut = True
            break
    assert cut and time.monotonic() - t1 < 4
    m = wait_until(lambda: (lambda m: m if m["n_http_read_timeouts_total"] >= 4 else None)(srv.metrics()), 10,
                   "the deadlines counted")
    assert m["http_connections_open"] >= 1  # the metrics request's own
    assert health_ms(srv) < 2000


def test_an_idle_keep_alive_connection_is_closed_after_its_timeout(start_server: ServerFactory, stories_model: Path,
                                                                   sockets: list[socket.socket]) -> None:
    srv = start_server(stories_model, n_ctx=256, n_parallel=2, extra_args=["--keep-alive-timeout", "1"])
    s = socket.create_connection((srv.host, srv.port), timeout=30)
    sockets.append(s)
    s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: keep-alive\r\n\r\n")
    s.settimeout(10)
    first = s.recv(65536)
    assert first.startswith(b"HTTP/1.1 200")
    t0 = time.monotonic()
    closed, _ = closed_within(s, 15)
    assert closed and 0.5 <= time.monotonic() - t0 < 10
    wait_until(lambda: srv.metrics()["n_http_idle_closed_total"] >= 1, 10, "the idle close counted")


def test_health_and_metrics_answer_while_every_request_thread_is_held(start_server: ServerFactory,
                                                                      stories_model: Path,
                                                                      sockets: list[socket.socket]) -> None:
    # 6 threads always (2 slots + 4): 40 half-open connections hold them and more; each gets a thread
    # of its own, and /health one more, at once, every time (a connection queued behind busy threads
    # waited for one of them: --timeout, an hour)
    srv = start_server(stories_model, n_ctx=256, n_parallel=2)
    for round_ in range(3):
        sockets += half_open(srv, 20 if round_ == 0 else 10)
        worst = max(health_ms(srv) for _ in range(5))
        assert worst < 2000, worst
    m = srv.metrics()
    assert m["http_connections_open"] >= 40
    r = srv.post("/completion", {"prompt": "Once upon a time", "n_predict": 8, "temperature": 0})
    assert r.status_code == 200 and r.json()["tokens_predicted"] == 8


def test_connections_beyond_the_cap_are_refused_at_once(start_server: ServerFactory, stories_model: Path,
                                                        sockets: list[socket.socket]) -> None:
    srv = start_server(stories_model, n_ctx=256, n_parallel=2, extra_args=["--max-connections", "8"])
    sockets += half_open(srv, 8)

    def refused() -> Any:
        # until the listener has taken all 8, one more is admitted; then it is refused at once
        t0 = time.monotonic()
        try:
            r = requests.get(srv.url + "/health", timeout=10)
        except requests.ConnectionError as e:  # the refusal must arrive: a reset would lose it
            pytest.fail(f"the refusal was lost: {e}")
        return (r, time.monotonic() - t0) if r.status_code == 503 else None

    r, took = wait_until(refused, 10, "a connection beyond the cap refused")
    assert took < 2
    body = r.json()
    assert body["error"]["type"] == "unavailable_error" and r.headers.get("Retry-After") == "1"
    assert "--max-connections" in body["error"]["message"] and "at most 8" in body["error"]["message"]
    for s in sockets:
        s.close()
    sockets.clear()
    m = wait_until(lambda: (lambda m: m if m["http_connections_open"] <= 1 else None)(srv.metrics()), 15,
                   "the held connections closed")
    assert m["n_http_refused_total"] >= 1
    assert health_ms(srv) < 2000


def stuck_stream(srv: LlamaServer, body: dict[str, Any]) -> socket.socket:
    """A streamed request from a client that never reads its answer (a small receive buffer)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect((srv.host, srv.port))
    data = json.dumps(body).encode()
    s.sendall(b"POST /completion HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
              str(len(data)).encode() + b"\r\n\r\n" + data)
    return s


def test_a_stuck_reader_is_ended_and_its_slot_freed(start_server: ServerFactory, stories_model: Path,
                                                    sockets: list[socket.socket]) -> None:
    srv = start_server(stories_model, n_ctx=16384, n_parallel=2, extra_args=["--stall-timeout", "1"])
    n_predict = 15000  # at this model's pace, long after the stall bound (the answer fills any socket buffer first)
    sockets.append(stuck_stream(srv, {"prompt": "Once upon a time", "n_predict": n_predict, "stream": True,
                                      "ignore_eos": True, "n_probs": 20, "temperature": 0}))
    slot = wait_for_slot(srv, "is_processing", 30)
    freed = wait_until(lambda: next((s for s in srv.slots() if s["id"] == slot["id"] and not s["is_processing"]), None),
                       60, "the stuck reader's slot freed")
    decoded = freed["next_token"][0]["n_decoded"]
    assert decoded < n_predict, decoded  # ended, not finished
    m = srv.metrics()
    assert m["n_http_stalled_total"] >= 1
    # the server goes on
    r = srv.post("/completion", {"prompt": "Once upon a time", "n_predict": 8, "temperature": 0})
    assert r.status_code == 200 and r.json()["tokens_predicted"] == 8


def test_a_slow_reader_and_a_parked_stream_lose_nothing(start_server: ServerFactory, stories_model: Path) -> None:
    srv = start_server(stories_model, n_ctx=2048, n_parallel=2,
                       extra_args=["--stall-timeout", "1", "--read-deadline", "1", "--preempt-keepalive", "1"])
    body = {"prompt": "Once upon a time", "n_predict": 200, "stream": True, "ignore_eos": True, "temperature": 0}
    # parked through the API for three stall bounds while its client reads: the notices keep it open
    got: list[str] = []

    def read() -> None:
        for line in srv.stream("/completion", body, timeout=60):
            got.append(line)
            time.sleep(0.002)  # a slow reader, reading

    t = threading.Thread(target=read)
    t.start()
    sid = wait_for_slot(srv, "is_processing", 30)["id"]
    assert srv.post(f"/slots/{sid}?action=park", {}).status_code == 200
    time.sleep(3)
    assert srv.post(f"/slots/{sid}?action=unpark", {}).status_code == 200
    t.join(120)
    data = [json.loads(line[6:]) for line in got if line.startswith("data: ")]
    assert data and data[-1]["stop"] and data[-1]["tokens_predicted"] == 200
    assert any(line.startswith(": preempt-keepalive") for line in got)
    assert srv.metrics()["n_http_stalled_total"] == 0
