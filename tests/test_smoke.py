"""The foundation works end to end: the patched server runs, answers and reports."""
from __future__ import annotations

import subprocess
from pathlib import Path

import llama_preempt
from helpers import run_cli
from llama_preempt.binary import server_binary


def test_core_extension_imports_and_matches_the_package_version() -> None:
    from llama_preempt import _core

    assert _core.version() == llama_preempt.__version__
    assert llama_preempt.__version__ in _core.version_line()


def test_server_version_names_llama_preempt() -> None:
    out = subprocess.run([str(server_binary()), "--version"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    text = out.stdout + out.stderr
    assert f"llama-preempt {llama_preempt.__version__}" in text
    assert "version:" in text  # upstream's build info still follows


def test_health_props_and_slots_answer(start_server, each_stories_model: Path) -> None:
    srv = start_server(each_stories_model, n_ctx=256, n_parallel=2)
    assert srv.get("/health").json()["status"] == "ok"
    props = srv.props()
    assert props["llama_preempt"]["version"] == llama_preempt.__version__
    slots = srv.slots()
    assert [s["id"] for s in slots] == [0, 1]
    for s in slots:
        assert s["is_processing"] is False
        assert s["is_preempted"] is False
        assert s["n_preempt"] == 0


def test_completion_at_temperature_zero_is_deterministic(start_server, each_stories_model: Path) -> None:
    srv = start_server(each_stories_model, n_ctx=256, n_parallel=2)
    body = {"prompt": "Once upon a time", "n_predict": 32, "temperature": 0, "cache_prompt": False}
    a = srv.post("/completion", body)
    b = srv.post("/completion", body)
    assert a.status_code == 200, a.text
    assert b.status_code == 200, b.text
    ja, jb = a.json(), b.json()
    assert ja["tokens_predicted"] == 32
    assert ja["content"] == jb["content"]
    assert len(ja["content"]) > 0


def test_metrics_endpoint_reports_upstream_and_preemption_series(start_server, stories_model: Path) -> None:
    srv = start_server(stories_model, n_ctx=256, n_parallel=2)
    r = srv.post("/completion", {"prompt": "Once", "n_predict": 8, "temperature": 0})
    assert r.status_code == 200, r.text
    m = srv.metrics()  # parse_prometheus requires HELP and TYPE for every series
    assert m["tokens_predicted_total"] >= 8
    for name in ("n_preempt_total", "n_resume_total", "n_recompute_tokens_total", "requests_preempted"):
        assert name in m, name
    assert m.metrics["n_preempt_total"].type == "counter"
    assert m.metrics["requests_preempted"].type == "gauge"
    assert m["n_preempt_total"] == 0


def test_metrics_endpoint_is_off_without_the_flag(start_server, stories_model: Path) -> None:
    srv = start_server(stories_model, n_ctx=256, n_parallel=2, metrics=False)
    assert srv.get("/metrics").status_code == 501


def test_cli_reports_its_version_and_the_server_it_installed() -> None:
    out = run_cli("--version", timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == f"llama-preempt {llama_preempt.__version__}"
    out = run_cli("server-path", timeout=60)
    assert out.returncode == 0
    assert Path(out.stdout.strip()) == server_binary()


def test_cli_rejects_an_unknown_command_naming_it() -> None:
    out = run_cli("frobnicate", timeout=60)
    assert out.returncode == 2
    assert "frobnicate" in out.stderr
