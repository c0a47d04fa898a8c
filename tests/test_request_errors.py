"""What an operator meets at the edges (issue 51): a body over the server's limit gets the error shape
with the limit in words, bytes that are not UTF-8 are named as such and located, and the start log
says where the disk tier's limit came from. Each time the other requests keep running."""
from __future__ import annotations

from pathlib import Path

import requests

from helpers import complete


def test_a_body_over_the_limit_gets_413_with_the_limit_in_words(start_server, stories_model: Path) -> None:
    srv = start_server(stories_model, n_ctx=256, n_parallel=2)
    body = b'{"prompt": "' + b"a" * (101 << 20) + b'"}'  # cpp-httplib's limit is 100 MiB
    r = requests.post(srv.url + "/completion", data=body, headers={"Content-Type": "application/json"}, timeout=120)
    assert r.status_code == 413
    err = r.json()["error"]
    assert err["code"] == 413 and err["type"] == "invalid_request_error"
    assert "larger than this server takes (100 MiB)" in err["message"]
    assert complete(srv, "Once upon a time", 4).json()["tokens_predicted"] == 4  # nothing else lost


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
