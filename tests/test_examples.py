"""The examples in examples/ run, as a reader would run them, against stories260K."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest
import requests

from helpers import ON_THE_CPU, ON_THE_CPU_ENV, http_ok, wait_until
from llama_preempt.server import free_port

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
# for an example that asks the same question twice (whole, then streamed: the second takes its
# prompt from the cache, so its first token comes from another batch) and compares the answers: the
# Engine it starts on the CPU with --deterministic, through the flags' environment twins (a GPU
# build's Engine would offload, and a GPU's kernels follow the batch)
SAME_ANSWERS_ENV = {**ON_THE_CPU_ENV, "LLAMA_ARG_DETERMINISTIC": "1"}


def run(*args: str, timeout: float = 300, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    p = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=timeout,
                       env={**os.environ, **(env or {})})
    assert p.returncode == 0, p.stderr[-2000:]
    return p


@pytest.fixture
def chat_server(stories_model: Path) -> Iterator[str]:
    pytest.importorskip("aiohttp", reason="the chat server example needs aiohttp: pip install '.[test]'")
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(EXAMPLES / "chat_server.py"), str(stories_model), "--port", str(port),
                             "--ctx", "1024", "--parallel", "2"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env={**os.environ, **SAME_ANSWERS_ENV})
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
        return http_ok(url + "/stats")

    try:
        wait_until(up, 120, "the example chat server to answer", interval_s=0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(30)


def test_the_async_chat_server_streams_answers_and_frees_a_disconnected_clients_slot(chat_server: str) -> None:
    msgs = [{"role": "user", "content": "Tell me a story"}]
    whole = requests.post(chat_server + "/v1/chat/completions", json={"messages": msgs, "max_tokens": 12,
                                                                      "temperature": 0}, timeout=60)
    assert whole.status_code == 200, whole.text
    text = whole.json()["choices"][0]["message"]["content"]
    with requests.post(chat_server + "/v1/chat/completions", json={"messages": msgs, "max_tokens": 12, "temperature": 0,
                                                                   "stream": True}, stream=True, timeout=60) as r:
        lines = [line for line in r.iter_lines(decode_unicode=True) if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    chunks: list[dict[str, Any]] = [json.loads(line[6:]) for line in lines[:-1]]
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]) == text
    bad = requests.post(chat_server + "/v1/chat/completions", json={"messages": msgs, "max_tokens": 2**40}, timeout=60)
    assert bad.status_code == 400 and ("max_tokens" in bad.text or "n_predict" in bad.text), bad.text

    # a client that disconnects mid-stream: its request is cancelled and its slot freed
    body = json.dumps({"messages": msgs, "max_tokens": 900, "stream": True}).encode()
    host, port = chat_server.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=60)
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    assert sock.recv(4096).startswith(b"HTTP/1.1 200")
    wait_until(lambda: requests.get(chat_server + "/stats", timeout=5).json()["busy_slots"] == 1, 30, "the stream to run")
    sock.close()
    wait_until(lambda: requests.get(chat_server + "/stats", timeout=5).json()["busy_slots"] == 0, 30,
               "the disconnected client's slot to be freed")


def test_the_batch_script_answers_every_line_in_order(stories_model: Path, tmp_path: Path) -> None:
    rows = [{"prompt": "Once upon a time", "max_tokens": 5}, {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4},
            {"prompt": "The dog", "max_tokens": 7}, {"prompt": "A cat", "max_tokens": 3}]
    src, dst = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    p = run(str(EXAMPLES / "batch_jsonl.py"), str(stories_model), str(src), str(dst), "--ctx", "512", "--parallel", "2")
    assert f"4 answers in {dst}" in p.stdout
    out = [json.loads(line) for line in dst.read_text().splitlines()]
    assert [o.get("prompt") for o in out] == [r.get("prompt") for r in rows]
    assert all(0 < o["tokens"] <= r["max_tokens"] and o["answer"] for o, r in zip(out, rows)), out


def test_the_openai_client_example_talks_to_the_drop_in_server(start_server, stories_model: Path) -> None:
    pytest.importorskip("openai", reason="the example needs the openai package: pip install '.[test]'")
    # whole, then streamed, compared: --deterministic on the CPU (see SAME_ANSWERS_ENV)
    srv = start_server(stories_model, n_ctx=512, n_parallel=2, deterministic=True, extra_args=ON_THE_CPU)
    p = run(str(EXAMPLES / "openai_client.py"), "--base-url", srv.url + "/v1", "--max-tokens", "12")
    whole = next(line for line in p.stdout.splitlines() if line.startswith("whole:"))
    streamed = next(line for line in p.stdout.splitlines() if line.startswith("streamed:"))
    assert whole.split(":", 1)[1].strip() == streamed.split(":", 1)[1].strip() != ""


def test_the_llama_cpp_python_script_runs_with_one_line_changed(stories_model: Path) -> None:
    src = (EXAMPLES / "llama_cpp_python.py").read_text()
    assert "# from llama_cpp import Llama\nfrom llama_preempt import Engine as Llama" in src
    p = run(str(EXAMPLES / "llama_cpp_python.py"), str(stories_model), env=SAME_ANSWERS_ENV)
    got = dict(line.split(":", 1) for line in p.stdout.splitlines() if ":" in line)
    assert got["completion"].strip() and got["chat"].strip() == got["stream"].strip() != ""
