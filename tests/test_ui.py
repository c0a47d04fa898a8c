"""The web UI: the assets this repository ships (vendor/ui-assets.tar.gz, built by vendor/ui.py from
upstream's tools/ui with npm) or built with npm, and served at GET / as upstream's release binaries
do."""
from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _ui_module():  # type: ignore[no-untyped-def]
    import importlib.util

    spec = importlib.util.spec_from_file_location("vendor_ui", ROOT / "vendor" / "ui.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_shipped_ui_assets_are_built_from_this_trees_tools_ui() -> None:
    # a patch or a new pin that changes tools/ui without `python vendor/ui.py --write-assets` would
    # leave a first install without npm serving an older UI than the tree's, or none: caught here
    ui = _ui_module()
    if not ui.UI.is_dir():
        pytest.skip("vendor/llama.cpp is not fetched here (pip install . fetches it)")
    assert ui.shipped_fits(), ("vendor/ui-assets.tar.gz was not built from this tree's tools/ui: "
                               "run python vendor/ui.py --write-assets")
    with tempfile.TemporaryDirectory() as tmp:
        ui.unpack_shipped(Path(tmp) / "dist")
        assert ui.complete(Path(tmp) / "dist")


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
