"""The README's balancer recipe (examples/haproxy.cfg): two servers behind HAProxy, a rolling
restart of both with the drain, and not one request lost."""
from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import threading
from pathlib import Path

import pytest
import requests

from llama_preempt.server import LlamaServer, free_port

from helpers import http_ok, logged, new_server, wait_until

CFG = Path(__file__).resolve().parent.parent / "examples" / "haproxy.cfg"

pytestmark = pytest.mark.skipif(shutil.which("haproxy") is None,
                                reason="haproxy is not installed (Debian: apt install haproxy)")


def server(model: Path, port: int, log_dir: Path) -> LlamaServer:
    return new_server(model, log_dir, port=port, n_ctx=512, n_parallel=4, extra_args=["--drain-timeout", "60"],
                      env={"LLAMA_SERVER_PREEMPT_EVERY": "8"}).start()  # parks too, so drains meet parked slots


def test_a_rolling_restart_behind_haproxy_loses_no_request(tmp_path: Path, stories_model: Path) -> None:
    front, port_a, port_b = free_port(), free_port(), free_port()
    text = CFG.read_text().replace("127.0.0.1:8080", f"127.0.0.1:{front}")
    text = text.replace("127.0.0.1:8081", f"127.0.0.1:{port_a}").replace("127.0.0.1:8082", f"127.0.0.1:{port_b}")
    sock = tmp_path / "haproxy.sock"
    text = text.replace("/tmp/haproxy-llm.sock", str(sock))
    (tmp_path / "haproxy.cfg").write_text(text)
    servers = {"a": server(stories_model, port_a, tmp_path), "b": server(stories_model, port_b, tmp_path)}
    proxy = subprocess.Popen(["haproxy", "-db", "-f", str(tmp_path / "haproxy.cfg")],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{front}"
    results: list[tuple[int, int]] = []
    errors: list[str] = []
    stop = threading.Event()

    def client(i: int) -> None:
        n = 0
        while not stop.is_set():
            try:
                r = requests.post(url + "/completion", json={"prompt": f"Once upon a time {i} {n}", "n_predict": 48,
                                                              "temperature": 0, "ignore_eos": True}, timeout=300)
                results.append((r.status_code, r.json().get("tokens_predicted", 0) if r.status_code == 200 else 0))
                if r.status_code != 200:
                    errors.append(r.text[:300])
            except requests.RequestException as e:  # a lost request: recorded, and the test fails on it
                results.append((-1, 0))
                errors.append(repr(e))
            n += 1

    try:
        wait_until(lambda: http_ok(url + "/health"), 30, "HAProxy to answer")
        clients = [threading.Thread(target=client, args=(i,)) for i in range(6)]
        for t in clients:
            t.start()
        for name in ("a", "b"):  # one at a time, as a rolling restart does
            wait_until(lambda: len(results) >= 8, 120, "requests to flow")
            before = len(results)
            srv = servers[name]
            assert srv.proc is not None
            admin(sock, f"set server llama_preempt/{name} state drain")  # step 1 of the recipe
            srv.proc.send_signal(signal.SIGTERM)
            assert srv.proc.wait(timeout=90) == 0, srv.log_tail()
            logged(srv, "drained in")
            servers[name] = server(stories_model, srv.port, tmp_path / name)
            admin(sock, f"set server llama_preempt/{name} state ready")
            wait_until(lambda: up(sock, name), 60, f"HAProxy to see server {name} up again")
            wait_until(lambda: len(results) >= before + 8, 120, "requests to flow after the restart")
        stop.set()
        for t in clients:
            t.join(300)
        assert results and all(code == 200 and n == 48 for code, n in results), \
            ([r for r in results if r != (200, 48)][:5], errors[:3], proxy_log(proxy))
    finally:
        stop.set()
        proxy.terminate()
        proxy.wait(10)
        for srv in servers.values():
            srv.stop()


def admin(sock: Path, command: str) -> str:
    """A command on HAProxy's runtime API (what `socat stdio SOCKET` does in the README)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(str(sock))
        s.sendall(command.encode() + b"\n")
        out = b""
        while chunk := s.recv(4096):
            out += chunk
    return out.decode()


def up(sock: Path, name: str) -> bool:
    """HAProxy's own view: the server passes its checks and takes traffic."""
    for line in admin(sock, "show stat").splitlines():
        f = line.split(",")
        if len(f) > 17 and f[0] == "llama_preempt" and f[1] == name:
            return f[17] == "UP"
    return False


def proxy_log(proxy: subprocess.Popen[bytes]) -> str:
    proxy.terminate()
    _, err = proxy.communicate(timeout=10)
    return err.decode(errors="replace")[-2000:]
