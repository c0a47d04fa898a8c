"""Where people first meet the server: the common `-np N` launch gets preemption (one unified pool
unless --no-kv-unified asks for upstream's split), and /props and `llama-preempt stats` say whether
preemption is active, and why not."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import (complete, logged, long_prompt, open_raw_stream, run_cli, run_concurrently, stats_text,
                     wait_for_parked)
from llama_preempt.binary import server_binary
from llama_preempt.server import free_port


def test_np_4_without_kv_flags_shares_one_pool_and_overflowing_requests_finish(start_server, stories_model: Path) -> None:
    # the launch most people use: -c and -np, no --kv-unified. Upstream would split 512 cells into
    # 4 x 128, and 4 requests of ~200 tokens would all stop at the slot's limit
    srv = start_server(stories_model, n_ctx=512, n_parallel=4, kv_unified=None)
    logged(srv, "the 4 slots share one unified KV pool")
    props = srv.props()["llama_preempt"]
    assert props["preempt"] is True and props["preempt_active"] is True
    assert props["preempt_inactive_reason"] is None and props["kv_unified"] is True
    res = run_concurrently([lambda i=i: complete(srv, long_prompt(12, shift=i), 200) for i in range(4)])
    for r in res:
        assert r.status_code == 200, r.text
        assert r.json()["tokens_predicted"] == 200 and r.json()["stop_type"] == "limit"
    # the slots beyond what a wider batch pays for waited: paused (the decode width), or parked
    m = srv.metrics()
    assert m["n_preempt_total"] + m["n_paused_total"] >= 1
    assert "INACTIVE" not in stats_text(srv.url)


def test_no_kv_unified_keeps_upstreams_split_and_props_and_stats_say_preemption_is_inactive(
        start_server, stories_model: Path) -> None:
    srv = start_server(stories_model, n_ctx=512, n_parallel=4, kv_unified=False)
    props = srv.props()["llama_preempt"]
    assert props["preempt"] is True  # configured ...
    assert props["preempt_active"] is False  # ... but it cannot work
    assert "--no-kv-unified" in props["preempt_inactive_reason"]
    assert props["kv_unified"] is False
    assert "preemption INACTIVE: needs one unified KV pool" in stats_text(srv.url)
    r = complete(srv, long_prompt(12), 8)
    assert r.json()["tokens_predicted"] == 8  # it still serves, as upstream does


def test_no_preempt_keeps_upstreams_split_pool(start_server, stories_model: Path) -> None:
    srv = start_server(stories_model, n_ctx=512, n_parallel=4, kv_unified=None, preempt=False)
    props = srv.props()["llama_preempt"]
    assert props["preempt"] is False and props["preempt_active"] is False
    assert props["preempt_inactive_reason"] == "disabled by --no-preempt"
    assert props["kv_unified"] is False  # upstream's behaviour with -np: one share per slot
    assert "share one unified KV pool" not in srv.log_text()
    assert "disabled by --no-preempt" in stats_text(srv.url)


# --- sizes llama.cpp would assert on: refused with the flag named, never an abort ---

BAD_SIZES = [
    (["-c", "-5"], "-c/--ctx-size must be 0 (the model's own context length) or at least 2 cells, got -5"),
    (["-c", "-1"], "-c/--ctx-size must be 0"),
    (["-c", "1"], "-c/--ctx-size must be 0"),
    (["-b", "0"], "-b/--batch-size must be at least 2 tokens, got 0"),
    (["-b", "3", "-np", "4"], "-b/--batch-size (3) must be at least -np/--parallel (4)"),
    (["-b", "10", "-np", "2", "--spec-type", "ngram-cache"],
     "-b/--batch-size (10) must be at least -np/--parallel (2) x (1 + 8 drafted tokens) = 18 with speculative decoding"),
]


@pytest.mark.parametrize("args,message", BAD_SIZES, ids=[" ".join(a) for a, _ in BAD_SIZES])
def test_the_binary_refuses_a_bad_size_with_one_line_naming_the_flag(stories_model: Path, args: list[str],
                                                                     message: str) -> None:
    p = subprocess.run([str(server_binary()), "-m", str(stories_model), *args, "--port", str(free_port())],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 1, p.stderr[-2000:]  # an error exit, not SIGABRT (-6) or a crash
    assert f"error: {message}" in p.stderr
    assert "GGML_ASSERT" not in p.stderr and "backtrace" not in p.stderr.lower()


@pytest.mark.parametrize("kwargs,message", [
    ({"n_ctx": -5}, "-c/--ctx-size must be 0"),
    ({"n_ctx": -1}, "-c/--ctx-size must be 0"),
    ({"n_ctx": 1}, "-c/--ctx-size must be 0"),
    ({"n_batch": 0}, "-b/--batch-size must be at least 2"),
    ({"n_ctx": 256, "n_parallel": 4, "n_batch": 3}, "must be at least -np/--parallel (4)"),
], ids=["n_ctx=-5", "n_ctx=-1", "n_ctx=1", "n_batch=0", "n_batch<n_parallel"])
def test_the_engine_refuses_a_bad_size_with_an_exception_and_the_interpreter_lives(
        stories_model: Path, kwargs: dict[str, int], message: str) -> None:
    # in a child interpreter: before this check, llama.cpp's assert ended the interpreter (status 134)
    code = ("import sys\nfrom llama_preempt.engine import Engine, EngineArgumentError\n"
            "try:\n    Engine(sys.argv[1], **eval(sys.argv[2]))\nexcept EngineArgumentError as e:\n"
            "    print('refused:', e)\nelse:\n    print('accepted')\nprint('alive')\n")
    p = subprocess.run([sys.executable, "-c", code, str(stories_model), repr(kwargs)],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "refused:" in p.stdout and message in p.stdout and p.stdout.rstrip().endswith("alive"), p.stdout


def test_the_engine_takes_args_as_a_shell_style_string(stories_model: Path) -> None:
    from llama_preempt.engine import Engine

    with Engine(stories_model, args="-c 256 -np 2 --preempt-mode 'swap'") as eng:
        assert eng.args[-6:] == ["-c", "256", "-np", "2", "--preempt-mode", "swap"]
        assert eng.submit("Once upon a time", n_predict=4).completion().n_generated == 4


# --- the Python API's edges ---

def test_generate_with_one_failing_request_keeps_the_answers_that_succeeded(stories_model: Path) -> None:
    from llama_preempt.engine import Engine, GenerateError, RequestError

    with Engine(stories_model, n_ctx=64, n_parallel=2) as eng:
        # the second prompt can never fit the 64-cell pool: that request fails, the first does not
        prompts = ["Once upon a time", long_prompt(400)]
        with pytest.raises(GenerateError) as caught:
            eng.generate(prompts, n_predict=8, temperature=0, ignore_eos=True)
        err = caught.value
        assert isinstance(err, RequestError) and err.status == 400
        assert err.message.startswith("1 of 2 requests failed; the first: ")
        assert err.results[0].n_generated == 8 and isinstance(err.results[1], RequestError)
        assert err.completions == [err.results[0], None]
        mixed = eng.generate(prompts, n_predict=8, temperature=0, ignore_eos=True, return_exceptions=True)
        assert mixed[0].n_generated == 8 and isinstance(mixed[1], RequestError)


def test_a_completion_prints_short(stories_model: Path) -> None:
    from llama_preempt.engine import Engine

    with Engine(stories_model, n_ctx=256, n_parallel=2) as eng:
        c = eng.generate(["Once upon a time"], n_predict=8, temperature=0)[0]
    text = repr(c)
    assert text.startswith("Completion(text=") and "n_generated=8" in text
    assert "timings" not in text and "response" not in text and len(text) < 300
    assert c.response["tokens_predicted"] == 8  # the whole answer is still there


def test_a_failed_request_is_the_exception_and_nothing_on_stderr(stories_model: Path) -> None:
    code = ("import sys\nfrom llama_preempt.engine import Engine, RequestError\n"
            "with Engine(sys.argv[1], n_ctx=64, n_parallel=2) as eng:\n"
            "    print('loaded', file=sys.stderr, flush=True)\n"
            "    try:\n        eng.submit('once ' * 200, n_predict=4).completion()\n"
            "    except RequestError as e:\n        print('raised', e.status)\n")
    p = subprocess.run([sys.executable, "-c", code, str(stories_model)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "raised 400" in p.stdout
    after_load = p.stderr.split("loaded", 1)[1]
    assert after_load.strip() == "", after_load  # before: "E srv send_error: ..." lines


def test_the_readme_python_example_runs_as_printed(tmp_path: Path) -> None:
    import os
    import re as _re

    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    block = next(b for b in _re.findall(r"```python\n(.*?)```", readme, _re.S) if "Engine(" in b)
    script = tmp_path / "example.py"
    script.write_text(block)
    # its own cache, so the example generates the stand-in model as a new user's first run does
    env = {**os.environ, "LLAMA_PREEMPT_CACHE": str(tmp_path / "cache")}
    p = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    lines = p.stdout.strip().splitlines()
    assert lines[-2] == "[100, 100, 100, 100]"  # nothing lost
    assert int(lines[-1]) >= 1                  # slots were parked to get there


# --- first errors: one line each ---

def test_a_bad_cli_flag_value_is_one_line_not_a_usage_block() -> None:
    p = run_cli("demo", "--preempt-ram", "abc", timeout=60)
    assert p.returncode == 2
    assert p.stderr.strip().splitlines() == [
        "llama-preempt demo: error: argument --preempt-ram: invalid int value: 'abc' (see llama-preempt demo --help)"]


def test_the_demo_help_shows_the_preempt_ram_default() -> None:
    p = run_cli("demo", "--help", columns="200", timeout=60)
    entry = p.stdout.split("  --preempt-ram PREEMPT_RAM", 1)[1].split("  --preempt-mode", 1)[0]
    assert "default 8192" in " ".join(entry.split())


def test_a_missing_model_file_is_one_clear_line(tmp_path: Path) -> None:
    missing = tmp_path / "nope.gguf"
    p = subprocess.run([str(server_binary()), "-m", str(missing), "--port", str(free_port())],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 1
    errors = [x for x in (p.stdout + p.stderr).splitlines() if "error" in x.lower()]
    assert errors == [f"error: -m/--model: no model file at '{missing}'"], p.stderr


# --- output that fits ---

def test_simulate_reads_whole_at_80_columns_and_its_default_load_parks() -> None:
    p = run_cli("simulate", columns="80", timeout=120)
    assert p.returncode == 0, p.stderr
    assert "…" not in p.stdout and max(len(x) for x in p.stdout.splitlines()) <= 80
    header = next(x for x in p.stdout.splitlines() if "done" in x)
    for col in ("-c", "RAM", "done", "failed", "parks", "TTFT p99", "makespan"):
        assert col in header
    assert "parks: by SWAP / by RECOMPUTE" in p.stdout  # what the column's two numbers are
    costs = next(x for x in p.stdout.splitlines() if x.startswith("costs:"))
    assert re.fullmatch(r"costs: step [\d.]+ ms, decode [\d.]+ ms/token, prefill [\d.]+ ms/token", costs.strip())
    row = next(x for x in p.stdout.splitlines() if "MiB" in x and "│" in x)
    swaps, recomputes = (int(n) for n in re.search(r"(\d+)/(\d+)", row).groups())
    assert swaps + recomputes > 0  # the default load shows what the tool is for


def test_simulate_without_preemption_shows_no_nan_and_no_ram_column() -> None:
    p = run_cli("simulate", "--no-preempt", "--requests", "20", columns="80", timeout=120)
    assert p.returncode == 0, p.stderr
    assert "nan" not in p.stdout and "RAM" not in p.stdout.split("costs:")[0]


def test_piped_simulate_output_is_not_cut_even_wide() -> None:
    p = run_cli("simulate", "--wide", columns=None, timeout=120)  # captured: not a terminal
    assert p.returncode == 0, p.stderr
    assert "…" not in p.stdout
    for col in ("recomputed tok", "peak parked", "TTFT p50", "queue p99", "longest park"):
        assert col in p.stdout


def test_stats_reads_whole_at_80_columns_while_slots_generate(start_server, stories_model: Path) -> None:
    srv = start_server(stories_model, n_ctx=512, n_parallel=2,
                       env={"LLAMA_SERVER_PREEMPT_EVERY": "8", "LLAMA_SERVER_PREEMPT_HOLD_MS": "600000"})
    sock = open_raw_stream(srv, "Once upon a time", 400)
    try:
        wait_for_parked(srv)
        out = stats_text(srv.url, width=80)
        assert "…" not in out and max(len(x) for x in out.splitlines()) <= 80
        assert "parked" in out and "swap" in out
    finally:
        sock.close()
