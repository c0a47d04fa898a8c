"""Slow, stuck or hostile clients against a server under load: /health and a normal request's latency
while half-open connections, slow bodies and stuck readers are held, before and after (issue 59).

    python bench/hostile.py                        # stories260K: 1,000 half-open, 100 slow bodies, 10 stuck readers
    python bench/hostile.py --stock                # the same against the stock server too (bench/stock.py builds it)
    python bench/hostile.py --half-open 300 --quick

Per server (`-np` the streams + 8, 32,768 cells): an 8-token completion's latency on the idle
server; then 64 clients stream 200-token answers one after another, read as they come, and /health
and the 8-token completion are measured beside them for half of `--seconds`; then held against
them: `--half-open` connections that send the start of a request and then nothing, `--slow-body`
connections that send their headers and then one body byte a second, and `--stuck` streamed
requests (2,000 tokens, 20 alternatives each) whose client never reads; /health (p50, p99,
failures within 5 s) and the 8-token completion are measured again for `--seconds`. Also: when the
server had closed every half-open connection, when it had ended every stuck reader (its
n_http_stalled_total), and how many streams completed in full. Written to bench/results/NAME.{json,md}.
"""
from __future__ import annotations

import argparse
import json
import socket
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import requests
from rich.console import Console

from llama_preempt.server import LlamaServer, ServerConfig
from results_io import md_table, stories_model, write_results

HALF = b"POST /completion HTTP/1.1\r\nHost: bench\r\n"


def percentile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))] if s else float("nan")


def completion_s(url: str, timeout: float = 60) -> float | None:
    t = time.monotonic()
    try:
        r = requests.post(url + "/completion", json={"prompt": "Once upon a time", "n_predict": 8, "temperature": 0},
                          timeout=timeout)
        return time.monotonic() - t if r.status_code == 200 else None
    except requests.RequestException:
        return None


def health_s(url: str) -> float | None:
    t = time.monotonic()
    try:
        r = requests.get(url + "/health", timeout=5)
        return time.monotonic() - t if r.status_code == 200 else None
    except requests.RequestException:
        return None


def streams_until(url: str, n_predict: int, i: int, stop: threading.Event, done: list[tuple[int, int]]) -> None:
    """Streamed requests one after another until `stop`, each read as it comes: (tokens asked,
    tokens the final event reports) each time."""
    k = 0
    while not stop.is_set():
        body = {"prompt": f"Once upon a time {i} {k}", "n_predict": n_predict, "stream": True, "ignore_eos": True,
                "temperature": 0}
        k += 1
        n = 0
        try:
            with requests.post(url + "/completion", json=body, stream=True, timeout=600) as r:
                for line in r.iter_lines():
                    if line.startswith(b"data: "):
                        ev = json.loads(line[6:])
                        if ev.get("stop"):
                            n = ev.get("tokens_predicted", 0)
        except requests.RequestException:
            pass
        done.append((n_predict, n))


def connect(host: str, port: int, first: bytes) -> socket.socket | None:
    try:
        s = socket.create_connection((host, port), timeout=10)
        s.sendall(first)
        return s
    except OSError:
        return None


def closed(s: socket.socket) -> bool:
    """Whether the server has closed `s` (without waiting)."""
    s.setblocking(False)
    try:
        while True:
            chunk = s.recv(65536)
            if not chunk:
                return True
    except BlockingIOError:
        return False
    except OSError:
        return True


def slow_body(host: str, port: int, stop: threading.Event) -> None:
    s = connect(host, port, b"POST /completion HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
                            b"Content-Length: 1000000\r\n\r\n")
    if s is None:
        return
    try:
        while not stop.wait(1.0):
            s.sendall(b" ")
    except OSError:
        pass
    finally:
        s.close()


def stuck(host: str, port: int) -> socket.socket | None:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.settimeout(10)
    try:
        s.connect((host, port))
        data = json.dumps({"prompt": "There was a dog", "n_predict": 2000, "stream": True, "ignore_eos": True,
                           "n_probs": 20, "temperature": 0}).encode()
        s.sendall(b"POST /completion HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\nContent-Length: " +
                  str(len(data)).encode() + b"\r\n\r\n" + data)
        return s
    except OSError:
        s.close()
        return None


def measure(url: str, seconds: float) -> tuple[list[float | None], list[float | None]]:
    """/health every 0.1 s for `seconds`, and an 8-token completion every fifth time."""
    healths: list[float | None] = []
    loaded: list[float | None] = []
    t_end = time.monotonic() + seconds
    while time.monotonic() < t_end:
        healths.append(health_s(url))
        if len(healths) % 5 == 0:
            loaded.append(completion_s(url, timeout=30))
        time.sleep(0.1)
    return healths, loaded


def summary(healths: list[float | None], loaded: list[float | None]) -> dict[str, Any]:
    ok_h = [h for h in healths if h is not None]
    ok_l = [x for x in loaded if x is not None]
    return {"health_p50_ms": round(1000 * statistics.median(ok_h), 1) if ok_h else None,
            "health_p99_ms": round(1000 * percentile(ok_h, 0.99), 1) if ok_h else None,
            "health_failed": len(healths) - len(ok_h), "health_asked": len(healths),
            "completion_s": round(statistics.median(ok_l), 3) if ok_l else None,
            "completion_failed": len(loaded) - len(ok_l)}


def stalled(url: str) -> int:
    try:
        text = requests.get(url + "/metrics", timeout=5).text
    except requests.RequestException:
        return -1
    for line in text.splitlines():
        if line.startswith("llamacpp:n_http_stalled_total "):
            return int(float(line.split()[1]))
    return -1  # a server without the series (stock)


def run_cell(label: str, srv: LlamaServer, args: argparse.Namespace, console: Console) -> dict[str, Any]:
    url, host, port = srv.url, srv.host, srv.port
    for _ in range(3):
        completion_s(url)
    idle = [x for x in (completion_s(url) for _ in range(5)) if x is not None]
    done: list[tuple[int, int]] = []
    streaming = threading.Event()
    streams = [threading.Thread(target=streams_until, args=(url, args.stream_tokens, i, streaming, done))
               for i in range(args.streams)]
    for t in streams:
        t.start()
    time.sleep(0.5)
    calm = summary(*measure(url, args.seconds / 2))  # the well-behaved load alone
    t_open = time.monotonic()
    halves = [s for s in (connect(host, port, HALF) for _ in range(args.half_open)) if s is not None]
    stop = threading.Event()
    slows = [threading.Thread(target=slow_body, args=(host, port, stop)) for _ in range(args.slow_body)]
    for t in slows:
        t.start()
    stucks = [s for s in (stuck(host, port) for _ in range(args.stuck)) if s is not None]
    console.print(f"{label}: {len(halves)} half-open, {args.slow_body} slow bodies, {len(stucks)} stuck readers held")
    # watched while /health is measured: when the server has closed every half-open connection, and
    # when it has ended every stuck reader (its own series; the stock server has none)
    seen: dict[str, float] = {}

    def watch() -> None:
        while not stop.is_set() and len(seen) < 2:
            now = time.monotonic() - t_open
            if "closed" not in seen and all(closed(s) for s in halves):
                seen["closed"] = now
            if "stuck" not in seen and stalled(url) >= len(stucks) > 0:
                seen["stuck"] = now
            time.sleep(0.25)

    watcher = threading.Thread(target=watch)
    watcher.start()
    hostile = summary(*measure(url, args.seconds))
    wait_end = time.monotonic() + args.stall_timeout + 60
    while len(seen) < (2 if stucks else 1) and time.monotonic() < wait_end and stalled(url) >= 0:
        time.sleep(0.25)
    n_closed = sum(closed(s) for s in halves)
    t_closed = seen.get("closed", time.monotonic() - t_open)
    t_stuck = seen.get("stuck")
    streaming.set()
    for t in streams:
        t.join(timeout=600)
    stop.set()
    watcher.join(timeout=10)
    for t in slows:
        t.join(timeout=10)
    for s in halves + stucks:
        s.close()
    cell = {
        "completion_idle_s": round(statistics.median(idle), 4) if idle else None,
        "streams_alone": calm, "hostile": hostile,
        "half_open": len(halves), "half_open_closed": n_closed, "half_open_closed_s": round(t_closed, 1),
        "stuck": len(stucks), "stuck_ended_s": round(t_stuck, 1) if t_stuck is not None else None,
        "streams": len(done), "streams_complete": sum(1 for asked, n in done if n == asked),
    }
    console.print(f"{label}: {cell}")
    return cell


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument("--half-open", type=int, default=1000)
    ap.add_argument("--slow-body", type=int, default=100)
    ap.add_argument("--stuck", type=int, default=10)
    ap.add_argument("--streams", type=int, default=64)
    ap.add_argument("--stream-tokens", type=int, default=200, help="tokens each well-behaved stream asks, one after "
                    "another (default 200)")
    ap.add_argument("--seconds", type=float, default=20, help="how long /health is measured under the load")
    ap.add_argument("--read-deadline", type=int, default=10, help="--read-deadline of the server (default 10)")
    ap.add_argument("--stall-timeout", type=int, default=10, help="--stall-timeout of the server (default 10)")
    ap.add_argument("--stock", action="store_true", help="also the stock server (bench/stock.py builds it)")
    ap.add_argument("--quick", action="store_true", help="300 half-open, 30 slow bodies, 16 streams, 10 s")
    ap.add_argument("--name", default="hostile")
    args = ap.parse_args(argv)
    if args.quick:
        args.half_open, args.slow_body, args.streams, args.seconds = 300, 30, 16, 10
    console = Console()
    model = stories_model(args.model)
    # a slot for every stream and room for the requests measured beside them
    base = dict(model=model, n_ctx=32768, n_parallel=args.streams + 8, kv_unified=True, threads=2, seed=1234)
    cells: list[tuple[str, ServerConfig, Path | None]] = [
        ("llama-preempt", ServerConfig(**base, extra_args=["--read-deadline", str(args.read_deadline),
                                                           "--stall-timeout", str(args.stall_timeout)]), None)]
    if args.stock:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from stock import stock_server

        cells.append(("stock llama-server", ServerConfig(**base, preempt=None), stock_server()))
    record: dict[str, Any] = {"model": model.name, "args": vars(args) | {"model": str(args.model)}, "cells": {}}
    rows = []
    for label, cfg, binary in cells:
        with LlamaServer(cfg, binary=binary) if binary else LlamaServer(cfg) as srv:
            cell = run_cell(label, srv, args, console)
        record["cells"][label] = cell
        calm, hostile = cell["streams_alone"], cell["hostile"]
        rows.append([label, cell["completion_idle_s"], calm["completion_s"], hostile["completion_s"],
                     f"{calm['health_p50_ms']} / {calm['health_p99_ms']}", f"{hostile['health_p50_ms']} / {hostile['health_p99_ms']}",
                     f"{hostile['health_failed']}/{hostile['health_asked']}", hostile["completion_failed"],
                     f"{cell['half_open_closed']}/{cell['half_open']} in {cell['half_open_closed_s']} s",
                     cell["stuck_ended_s"], f"{cell['streams_complete']}/{cell['streams']}"])
    md = [f"# {args.name}", "", f"`python bench/hostile.py {' '.join(argv if argv is not None else sys.argv[1:])}`", "",
          f"{model.name}, 32,768 cells, {args.streams + 8} slots, {args.streams} clients streaming {args.stream_tokens}-token "
          f"answers one after another (the streams column: how many completed in full); held against it: "
          f"{args.half_open} half-open connections, {args.slow_body} slow bodies (a byte a second), {args.stuck} stuck "
          f"readers; --read-deadline {args.read_deadline}, --stall-timeout {args.stall_timeout}.", ""]
    md += md_table(["server", "8-token idle s", "beside the streams s", "and the hostile s", "/health p50 / p99 ms, streams",
                    "/health p50 / p99 ms, hostile", "/health failed (5 s)", "8-token failed", "half-open closed",
                    "stuck readers ended s", "streams complete"], rows)
    write_results(args.name, record, md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
