"""What an operator meets at the edges (issue 51): a body over the server's limit gets the error shape
with the limit in words, bytes that are not UTF-8 are named as such and located, and the start log
says where the disk tier's limit came from. Each time the other requests keep running."""
from __future__ import annotations

from pathlib import Path

import requests

from helpers import complete


def post_raw(srv, body: bytes) -> requests.Response:
    return requests.post(srv.url + "/completion", data=body, headers={"Content-Type": "application/json"}, timeout=120)


def test_a_body_over_the_limit_gets_413_with_the_limit_in_words(start_server, stories_model: Path) -> None:
    srv = start_server(stories_model, n_ctx=256, n_parallel=2)
    assert srv.props()["llama_preempt"]["max_body_mib"] == 32  # the default, stated
    assert "bodies up to 32 MiB (--max-body-mib" in srv.log_text()
    r = post_raw(srv, b'{"prompt": "' + b"a" * (33 << 20) + b'"}')
    assert r.status_code == 413
    err = r.json()["error"]
    assert err["code"] == 413 and err["type"] == "invalid_request_error"
    assert "larger than this server takes (32 MiB, its --max-body-mib)" in err["message"]
    assert complete(srv, "Once upon a time", 4).json()["tokens_predicted"] == 4  # nothing else lost


def test_the_body_limit_is_a_flag_and_an_env_var(start_server, stories_model: Path) -> None:
    srv = start_server(stories_model, n_ctx=256, n_parallel=2, extra_args=["--max-body-mib", "1"])
    assert srv.props()["llama_preempt"]["max_body_mib"] == 1
    r = post_raw(srv, b'{"prompt": "' + b"a" * (2 << 20) + b'"}')
    assert r.status_code == 413 and "(1 MiB, its --max-body-mib)" in r.json()["error"]["message"]
    env = start_server(stories_model, n_ctx=256, n_parallel=2, env={"LLAMA_ARG_MAX_BODY_MIB": "64"})
    assert env.props()["llama_preempt"]["max_body_mib"] == 64


def test_a_prompt_that_cannot_fit_the_context_is_refused_before_it_is_tokenized(start_server, stories_model: Path) -> None:
    # 8 MB of prompt into 256 cells: the bound from its bytes refuses it (the message says how many
    # tokens at least); the same request after tokenizing would name its exact count instead
    srv = start_server(stories_model, n_ctx=256, n_parallel=2)
    for body in (b'{"prompt": "' + b"Once upon a time " * 500_000 + b'"}',
                 b'{"prompt": ["short", "' + b"x" * 8_000_000 + b'"]}',
                 b'{"prompt": [' + b",".join([b"1"] * 300) + b']}'):
        r = post_raw(srv, body)
        assert r.status_code == 400, r.text[:300]
        err = r.json()["error"]
        assert "more than the context holds (256 tokens): refused before tokenizing it" in err["message"], err
        # upstream's shape for a prompt over the context: its type, the slot's n_ctx and (here the
        # lower bound of) the prompt's tokens, so clients that read them need no second case
        assert err["type"] == "exceed_context_size_error" and err["n_ctx"] == 256 and err["n_prompt_tokens"] >= 256, err
    chat = requests.post(srv.url + "/v1/chat/completions", timeout=120,
                         json={"messages": [{"role": "user", "content": "Once upon a time " * 500_000}]})
    assert chat.status_code == 400 and "refused before tokenizing it" in chat.json()["error"]["message"]
    # a prompt that fits is not refused by the bound, and one over the context by a little still gets
    # upstream's exact count after tokenizing
    assert complete(srv, "Once upon a time " * 4, 4).json()["tokens_predicted"] == 4
    r = post_raw(srv, b'{"prompt": "' + b"Once upon a time " * 80 + b'", "n_predict": 4}')
    assert r.status_code == 400 and "refused before tokenizing" not in r.json()["error"]["message"]


def test_bytes_that_are_not_utf8_are_named_and_located(start_server, stories_model: Path) -> None:
    srv = start_server(stories_model, n_ctx=256, n_parallel=2)
    r = requests.post(srv.url + "/completion", data=b'{"prompt": "Once \xff\xfe upon", "n_predict": 4}',
                      headers={"Content-Type": "application/json"}, timeout=60)
    assert r.status_code == 400
    msg = r.json()["error"]["message"]
    assert msg.startswith("the request body is not valid UTF-8: a byte at line 1, column 18 is not UTF-8"), msg
    assert complete(srv, "Once upon a time", 4).json()["tokens_predicted"] == 4


def test_the_start_log_says_where_the_disk_tiers_limit_came_from(start_server, stories_model: Path,
                                                                  tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    default = start_server(stories_model, n_ctx=256, n_parallel=2, preempt_disk=tmp_path / "a")
    assert "MiB, default: a tenth of the filesystem" in default.log_text()
    assert default.props()["llama_preempt"]["preempt_disk_mib_from"].startswith("default: a tenth of the filesystem")
    given = start_server(stories_model, n_ctx=256, n_parallel=2, preempt_disk=tmp_path / "b", preempt_disk_mib=64)
    assert "disk (64 MiB, --preempt-disk-mib) above it" in given.log_text()
