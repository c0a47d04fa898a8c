"""The web UI: built from upstream's tools/ui with npm (vendor/ui.py) and served at GET / as
upstream's release binaries do."""
from __future__ import annotations

from pathlib import Path

import pytest


def test_the_server_serves_the_web_ui_and_no_ui_turns_it_off(start_server, stories_model: Path) -> None:
    srv = start_server(stories_model, n_ctx=256, n_parallel=2)
    if not srv.props()["llama_preempt"]["ui"]:
        pytest.skip("this build has no web UI: npm was not there when it was built (the build log says so)")
    r = srv.get("/")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert "<!doctype html>" in r.text.lower()
    for asset in ("/manifest.webmanifest", "/_app/version.json"):
        assert srv.get(asset).status_code == 200, asset
    # the API is untouched by it
    assert srv.get("/health").status_code == 200
    off = start_server(stories_model, n_ctx=256, n_parallel=2, extra_args=["--no-ui"])
    assert off.get("/").status_code == 404
    assert off.props()["llama_preempt"]["ui"]  # built in, turned off at run time
    assert srv.props()["llama_preempt"]["ui_served"] and not off.props()["llama_preempt"]["ui_served"]


def test_the_engines_props_claim_no_web_ui(stories_model: Path) -> None:
    from llama_preempt import Engine

    with Engine(stories_model, n_ctx=256, n_parallel=2) as eng:
        props = eng.request("GET", "/props")
    assert props["ui"] is False and props["llama_preempt"]["ui_served"] is False
