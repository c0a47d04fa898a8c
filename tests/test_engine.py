"""The in-process Engine: the patched server in this process, its loop driven from Python."""
from __future__ import annotations

import dataclasses
import json
import os
import re
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from helpers import ALL_DECODE, ON_THE_CPU, complete, long_prompt, rss_mib
from llama_preempt import ParkChoice, ParkReason, ParkTier, PreemptMode, SlotStats, StopType
from llama_preempt.engine import (
    Completion,
    Engine,
    EngineArgumentError,
    EngineBusyError,
    EngineClosedError,
    ModelLoadError,
    RequestCancelled,
    RequestError,
    StepReport,
    stream_text,
)

ROOT = Path(__file__).resolve().parent.parent
RECOMPUTE = ["--preempt-ram", "0"]
MODES = {"recompute": RECOMPUTE + ALL_DECODE, "swap": ALL_DECODE}  # overflow by the slots' growth (helpers.ALL_DECODE)
MTP_ARGS = ["--spec-type", "draft-mtp", "--spec-draft-n-max", "2"]

EngineFactory = Callable[..., Engine]


@pytest.fixture
def make_engine() -> Iterator[EngineFactory]:
    """Engines that are always closed afterwards."""
    made: list[Engine] = []

    def make(model: Path, *args: str, **kw: Any) -> Engine:
        kw.setdefault("seed", 42)
        kw.setdefault("n_threads", 2)
        eng = Engine(model, list(args), **kw)
        made.append(eng)
        return eng

    yield make
    for eng in made:
        eng.close()


def overflow_prompts() -> list[str]:
    # four chats that each fit a 256-cell pool alone but not together
    return [long_prompt(6, shift=3 * i) for i in range(4)]


# --- overload, in process ---

@pytest.mark.parametrize("mode", MODES)
def test_four_requests_that_overflow_the_pool_all_finish_through_generate(
        make_engine: EngineFactory, stories_model: Path, mode: str) -> None:
    eng = make_engine(stories_model, *MODES[mode], n_ctx=256, n_parallel=4, n_batch=32, kv_unified=True)
    steps: list[StepReport] = []
    outs = eng.generate(overflow_prompts(), n_predict=100, temperature=0, ignore_eos=True,
                        progress=lambda done, total, rep: steps.append(rep))
    assert [o.n_generated for o in outs] == [100] * 4
    assert all(o.stop == "limit" and o.text for o in outs)
    st = eng.stats()
    assert st.n_preempt_total >= 1
    assert st.n_resume_total == st.n_preempt_total
    assert getattr(st, f"n_preempt_{mode}_total") == st.n_preempt_total
    assert st.requests_preempted == 0 and st.preempt_ram_bytes == 0
    # the step reports saw the same parks the counters did
    assert sum(len(r.parked) for r in steps) == st.n_preempt_total
    assert {p.mode for r in steps for p in r.parked} == {mode}
    # and why: the same reasons, by the same names, as /metrics' preempt_parks_by_choice_total
    choices = [p.choice for r in steps for p in r.parked]
    assert {c: choices.count(c) for c in set(choices)} == {k: v for k, v in st.parks_by_choice.items() if v}
    assert st.prefill_tokens_per_second > 0 and st.park_bytes_per_second > 0


def test_the_same_overflow_without_preemption_loses_requests(make_engine: EngineFactory, stories_model: Path) -> None:
    eng = make_engine(stories_model, n_ctx=256, n_parallel=4, n_batch=32, kv_unified=True, preempt=False)
    with pytest.raises(RequestError, match="Context size has been exceeded"):
        eng.generate(overflow_prompts(), n_predict=100, temperature=0, ignore_eos=True)
    assert eng.stats().n_preempt_total == 0


# --- parity with the drop-in binary over HTTP ---

PARITY_CASES = {
    "/completion": {"prompt": "Once upon a time", "n_predict": 64, "temperature": 0, "ignore_eos": True},
    "/v1/chat/completions": {"messages": [{"role": "user", "content": "Tell me a story about a red ball"}],
                             "max_tokens": 64, "temperature": 0},
}


@pytest.mark.parametrize("forced", [False, True], ids=["unforced", "forced-parks"])
@pytest.mark.parametrize("path", list(PARITY_CASES))
def test_the_engine_answers_exactly_as_the_http_server(
        make_engine: EngineFactory, start_server, stories_model: Path, monkeypatch: pytest.MonkeyPatch,
        path: str, forced: bool) -> None:
    env = {"LLAMA_SERVER_PREEMPT_EVERY": "8"} if forced else {}
    for k, v in env.items():
        monkeypatch.setenv(k, v)  # the engine reads the knob when it loads, like the binary
    body = PARITY_CASES[path]
    # both on the CPU, on every build: the same kernels on both sides (under
    # LLAMA_PREEMPT_TEST_GPU_LAYERS the server would run a GPU's, and a GPU build's Engine offloads
    # too); --deterministic: the Engine's streamed run takes its prompt from the cache, so its first
    # token comes from another batch than the server's
    srv = start_server(stories_model, n_ctx=512, n_parallel=2, env=env, deterministic=True, extra_args=ON_THE_CPU)
    eng = make_engine(stories_model, *ON_THE_CPU, n_ctx=512, n_parallel=2, kv_unified=True, deterministic=True)

    http = srv.post(path, body)
    assert http.status_code == 200, http.text
    ours = eng.submit(path=path, body=body).result()
    want = Completion.from_response(http.json()).text
    assert want and Completion.from_response(ours).text == want
    assert ours.keys() == http.json().keys()  # the same response shape

    # the streamed chunks concatenate to the same text
    streamed = "".join(stream_text(c) for c in eng.submit(path=path, body=body, stream=True).stream())
    assert streamed == want

    if forced:
        assert eng.stats().n_preempt_total >= 2 * (64 // 8 - 1)
        assert srv.metrics()["n_preempt_total"] >= 64 // 8 - 1
    else:
        assert eng.stats().n_preempt_total == 0


def test_the_sse_chunks_are_the_ones_the_http_stream_carries(
        make_engine: EngineFactory, start_server, stories_model: Path) -> None:
    body = {"prompt": "Once upon a time", "n_predict": 24, "temperature": 0, "ignore_eos": True}
    # both on the CPU, on every build: the same kernels on both sides
    srv = start_server(stories_model, n_ctx=512, n_parallel=2, extra_args=ON_THE_CPU)
    eng = make_engine(stories_model, *ON_THE_CPU, n_ctx=512, n_parallel=2, kv_unified=True)
    strip = lambda d: {k: v for k, v in d.items() if k not in ("timings", "id_slot")}  # noqa: E731
    http = [json.loads(line[6:]) for line in srv.stream("/completion", body) if line.startswith("data: ")]
    ours = list(eng.submit(path="/completion", body=body, stream=True).stream())
    assert [strip(c) for c in ours] == [strip(c) for c in http]


# --- step() reports ---

@pytest.mark.parametrize("mode", MODES)
def test_a_forced_park_shows_up_in_the_step_reports_with_its_resume(
        make_engine: EngineFactory, stories_model: Path, monkeypatch: pytest.MonkeyPatch, mode: str) -> None:
    monkeypatch.setenv("LLAMA_SERVER_PREEMPT_EVERY", "8")
    eng = make_engine(stories_model, *MODES[mode], n_ctx=512, n_parallel=2, kv_unified=True)
    req = eng.submit("Once upon a time", n_predict=40, temperature=0, ignore_eos=True)
    reports = eng.run(req)
    assert req.completion().n_generated == 40

    parks = [(i, p) for i, r in enumerate(reports) for p in r.parked]
    resumes = [(i, p) for i, r in enumerate(reports) for p in r.resumed]
    assert len(parks) >= 40 // 8 - 1
    assert len(resumes) == len(parks)
    for (i_park, park), (i_resume, resume) in zip(parks, resumes):
        # the policy's enums, equal to the names the server writes (the strings they replaced)
        assert park.mode == mode and park.reason.startswith("forced")
        assert park.reason is ParkReason.FORCED and park.mode is PreemptMode(mode)
        assert park.tier is (ParkTier.RAM if mode == "swap" else ParkTier.RECOMPUTE) and park.tier == str(park.tier)
        assert isinstance(park.choice, ParkChoice) and json.loads(json.dumps(park._asdict()))["tier"] == park.tier
        assert park.n_tokens > 0
        assert (park.bytes > 0) == (mode == "swap")
        assert resume.slot == park.slot and resume.task == park.task and resume.mode == mode
        assert i_resume >= i_park  # a forced park with room to spare comes back in the same step
    if mode == "recompute":
        assert sum(r.n_replay for r in reports) == eng.stats().n_recompute_tokens_total > 0
    # per-step token counts add up to what was generated, and the end is reported once
    assert sum(r.n_generated for r in reports) == 40
    ends = [e for r in reports for e in r.finished]
    assert len(ends) == 1 and ends[0].n_generated == 40 and ends[0].stop == "limit" and ends[0].stop is StopType.LIMIT


def test_step_reports_count_every_token_of_concurrent_requests(make_engine: EngineFactory, stories_model: Path) -> None:
    eng = make_engine(stories_model, n_ctx=256, n_parallel=4, n_batch=32, kv_unified=True)
    reqs = [eng.submit(p, n_predict=50 + 10 * i, temperature=0, ignore_eos=True)
            for i, p in enumerate(overflow_prompts())]
    reports = eng.run(reqs)
    assert sum(r.n_generated for r in reports) == sum(50 + 10 * i for i in range(4))
    assert sum(len(r.finished) for r in reports) == 4
    assert sum(r.n_prompt for r in reports) == sum(q.completion().n_prompt for q in reqs)
    # run(None) with nothing left returns at once
    assert eng.run() == []


# --- background mode ---

def test_eight_threads_submitting_and_streaming_at_once_all_finish(make_engine: EngineFactory, stories_model: Path) -> None:
    eng = make_engine(stories_model, n_ctx=256, n_parallel=4, n_batch=32, kv_unified=True).start()
    texts: dict[int, str] = {}
    counts: dict[int, int] = {}
    errors: list[BaseException] = []

    def client(i: int) -> None:
        try:
            req = eng.submit(long_prompt(5, shift=i), n_predict=60, temperature=0, ignore_eos=True, stream=True)
            chunks = list(req.stream(timeout=120))
            texts[i] = "".join(stream_text(c) for c in chunks)
            counts[i] = sum(1 for c in chunks if c.get("content")) + 0
            assert chunks[-1]["stop"] and chunks[-1]["tokens_predicted"] == 60
        except BaseException as e:  # reported below, on the test's thread
            errors.append(e)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    assert not errors, errors
    assert len(texts) == 8 and all(texts.values())
    assert eng.stats().n_resume_total == eng.stats().n_preempt_total
    eng.stop()
    assert not eng.running
    # stepping by hand works again once the background loop stopped
    assert eng.submit("Once", n_predict=4).completion().n_generated == 4


def test_stop_with_a_request_still_parked_cancels_it_and_frees_its_ram(
        make_engine: EngineFactory, stories_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLAMA_SERVER_PREEMPT_EVERY", "8")
    monkeypatch.setenv("LLAMA_SERVER_PREEMPT_HOLD_MS", "600000")  # parked until cancelled
    eng = make_engine(stories_model, n_ctx=512, n_parallel=2, kv_unified=True).start()
    streamed = eng.submit("Once upon a time", n_predict=400, temperature=0, ignore_eos=True, stream=True)
    plain = eng.submit("There was a dog", n_predict=400, temperature=0, ignore_eos=True)

    deadline = time.monotonic() + 60
    st = eng.stats()
    while len(st.parked()) < 2 and time.monotonic() < deadline:
        st = eng.stats()
    assert len(st.parked()) == 2, st
    assert st.preempt_ram_bytes > 0 and all(s.preempt_mode == "swap" for s in st.parked())

    eng.stop()
    assert streamed.done() and plain.done()
    with pytest.raises(RequestCancelled):
        plain.result()
    with pytest.raises(RequestCancelled):
        list(streamed.stream())
    st = eng.stats()
    assert st.preempt_ram_bytes == 0 and st.requests_preempted == 0
    assert not any(s.is_processing for s in st.slots)


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs /proc to read RSS")
def test_fifty_open_close_cycles_do_not_leak(stories_model: Path) -> None:
    def cycle() -> None:
        with Engine(stories_model, n_ctx=256, n_parallel=2, n_threads=2, seed=1) as eng:
            assert eng.generate(["Once upon a time"], n_predict=8, temperature=0)[0].n_generated == 8

    for _ in range(5):  # warm up allocators and caches
        cycle()
    before = rss_mib(os.getpid())
    for _ in range(50):
        cycle()
    grown = rss_mib(os.getpid()) - before
    assert grown < 24, f"RSS grew {grown:.1f} MiB over 50 cycles"


# --- the hybrid Qwen3.5 model with an MTP head ---

def test_swap_parks_on_the_hybrid_mtp_model_give_the_unforced_output(
        make_engine: EngineFactory, qwen35_mtp_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ref = make_engine(qwen35_mtp_model, *MTP_ARGS, n_ctx=1024, n_parallel=2, kv_unified=True)
    want = ref.submit("Once upon a time", n_predict=96, temperature=0, ignore_eos=True).completion()
    ref.close()

    monkeypatch.setenv("LLAMA_SERVER_PREEMPT_EVERY", "8")
    eng = make_engine(qwen35_mtp_model, *MTP_ARGS, n_ctx=1024, n_parallel=2, kv_unified=True)
    req = eng.submit("Once upon a time", n_predict=96, temperature=0, ignore_eos=True)
    reports = eng.run(req)
    got = req.completion()
    assert got.n_generated == 96
    assert got.text == want.text
    st = eng.stats()
    assert st.n_preempt_swap_total == st.n_preempt_total >= 5
    assert all(p.mode == "swap" for r in reports for p in r.parked)
    assert eng.metrics()["spec_decode_num_drafts_total"] > 0  # MTP speculation ran across the parks


# --- errors ---

def test_a_missing_model_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="model file not found"):
        Engine(tmp_path / "nope.gguf")


def test_an_invalid_model_file_is_a_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf at all" * 100)
    with pytest.raises(ModelLoadError, match="failed to load the model"):
        Engine(bad)


@pytest.mark.parametrize("args, message", [
    (["--bogus"], "invalid argument: --bogus"),
    (["--preempt-ram", "lots"], "--preempt-ram expects"),
    (["-c"], "expected value for argument"),
    (["--help"], "not available in the Engine"),
    (["--version"], "not available in the Engine"),
])
def test_a_bad_flag_raises_upstreams_message_without_exiting(stories_model: Path, args: list[str], message: str) -> None:
    with pytest.raises(EngineArgumentError, match=re.escape(message)):
        Engine(stories_model, args)
    # the interpreter is still here, and a good engine still loads
    with Engine(stories_model, n_ctx=128, n_parallel=2) as eng:
        assert eng.tokenize("hello")


def test_using_a_closed_engine_raises_and_a_second_close_is_harmless(stories_model: Path) -> None:
    eng = Engine(stories_model, n_ctx=128, n_parallel=2)
    eng.close()
    eng.close()
    assert eng.closed
    for call in (eng.step, eng.stats, eng.start, lambda: eng.submit("hi"), lambda: eng.request("GET", "/slots")):
        with pytest.raises(EngineClosedError):
            call()


def test_stepping_from_two_threads_at_once_raises_and_the_engine_keeps_running(
        make_engine: EngineFactory, stories_model: Path) -> None:
    eng = make_engine(stories_model, n_ctx=512, n_parallel=2, kv_unified=True, n_batch=512)
    req = eng.submit(long_prompt(150), n_predict=250, temperature=0, ignore_eos=True)
    stop = threading.Event()
    deadline = time.monotonic() + 120

    def driver() -> None:
        while not stop.is_set() and not req.done() and time.monotonic() < deadline:
            eng._core.step()

    t = threading.Thread(target=driver)
    t.start()
    busy: EngineBusyError | None = None
    try:
        while busy is None and not req.done():
            assert time.monotonic() < deadline, "neither a busy error nor the answer within 120 s"
            try:
                eng._core.step()
            except EngineBusyError as e:
                busy = e
    finally:
        stop.set()
        t.join()
    assert busy is not None and "already running on another thread" in str(busy)
    assert req.completion().n_generated == 250
    # the background loop owns stepping while it runs
    eng.start()
    with pytest.raises(EngineBusyError, match="background loop"):
        eng.step()
    eng.stop()


def test_a_request_the_server_rejects_raises_its_error_and_the_engine_keeps_running(
        make_engine: EngineFactory, stories_model: Path) -> None:
    eng = make_engine(stories_model, n_ctx=128, n_parallel=2, kv_unified=True)
    with pytest.raises(RequestError) as e:
        eng.submit(long_prompt(300), n_predict=8).result()
    assert e.value.status == 400 and e.value.type == "exceed_context_size_error"
    with pytest.raises(TypeError, match="messages must be a list"):  # the caller's mistake, before anything is sent
        eng.submit(messages="not a list", n_predict=8)  # type: ignore[arg-type]
    with pytest.raises(RequestError) as e:  # the server's judgement of a well-formed request
        eng.submit(messages=[{"role": "nobody", "content": 5}], n_predict=8).result()
    assert e.value.status in (400, 500) and e.value.message
    with pytest.raises(RequestError) as e:
        list(eng.submit(long_prompt(300), n_predict=8, stream=True).stream())
    assert e.value.type == "exceed_context_size_error"
    with pytest.raises(RequestError) as e:
        eng.request("GET", "/no/such/route")
    assert e.value.status == 404
    assert eng.submit("Once upon a time", n_predict=8).completion().n_generated == 8


def test_slot_actions_and_metrics_go_through_the_servers_routes(
        make_engine: EngineFactory, stories_model: Path, tmp_path: Path) -> None:
    eng = make_engine(stories_model, "--slot-save-path", str(tmp_path), n_ctx=256, n_parallel=2, kv_unified=True)
    eng.generate(["Once upon a time"], n_predict=8, temperature=0)
    slots = eng.slots()
    assert len(slots) == 2 and {"state", "is_preempted", "n_preempt"} <= slots[0].keys()
    assert eng.metrics()["tokens_predicted_total"] == 8
    used = next(s["id"] for s in slots if s.get("n_prompt_tokens", 0) > 0)
    saved = eng.request("POST", f"/slots/{used}?action=save", {"filename": "slot.bin"})
    assert saved["n_saved"] > 0 and (tmp_path / "slot.bin").is_file()
    erased = eng.request("POST", f"/slots/{used}?action=erase")
    assert erased["id_slot"] == used and erased["n_erased"] == saved["n_saved"]
    with pytest.raises(RequestError) as e:
        eng.request("POST", "/slots/0?action=nonsense")
    assert e.value.status == 400
    # the HTTP parser turns the same sources into the same dataclass
    st = eng.stats()
    assert [s.id for s in st.slots] == [0, 1]


def test_engine_stats_and_http_stats_are_the_same_type(start_server, stories_model: Path) -> None:
    from llama_preempt.stats import PreemptStats
    srv = start_server(stories_model, n_ctx=256, n_parallel=2)
    complete(srv, "Once upon a time", 8)
    st = srv.preempt_stats()
    assert isinstance(st, PreemptStats) and len(st.slots) == 2
    assert all(s.state == "idle" for s in st.slots)
    assert set(st.parks_by_choice) == {"swap_cheaper", "recompute_cheaper", "swap_mode", "recompute_mode",
                                       "over_budget", "no_state", "swap_failed", "disk_cheaper", "ram_full"}
    assert set(st.parks_by_tier) == set(st.restores_by_tier) == {"ram", "disk", "recompute", "ram_q8"}
    assert st.restore_bytes_per_second > 0 and st.preempt_copies_in_flight == 0


def test_the_engine_stats_show_the_time_parked_while_it_runs(
        make_engine: EngineFactory, stories_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLAMA_SERVER_PREEMPT_EVERY", "8")
    monkeypatch.setenv("LLAMA_SERVER_PREEMPT_HOLD_MS", "600000")  # parked until stopped
    eng = make_engine(stories_model, n_ctx=512, n_parallel=2, kv_unified=True).start()
    eng.submit("Once upon a time", n_predict=400, temperature=0, ignore_eos=True)
    deadline = time.monotonic() + 60
    parked = eng.stats().parked()
    while not parked:
        assert time.monotonic() < deadline, "the request was never parked"
        parked = eng.stats().parked()
    first = parked[0].t_preempted_ms
    later = first
    while later <= first + 50:
        assert time.monotonic() < deadline, (first, later)
        later = next(s for s in eng.stats().slots if s.id == parked[0].id).t_preempted_ms
    eng.stop()


def test_the_engine_stats_of_a_parked_slot_say_what_its_slots_entry_says(
        make_engine: EngineFactory, stories_model: Path) -> None:
    """stats() reads typed fields (no JSON tree); /slots' JSON is written from the same fields: a
    slot parked through the API reads the same both ways, its kinds as the policy's enums."""
    eng = make_engine(stories_model, n_ctx=512, n_parallel=2, kv_unified=True)
    req = eng.submit("Once upon a time", n_predict=200, temperature=0, ignore_eos=True)
    eng.run(lambda: any(s.n_decoded >= 4 for s in eng.stats().slots))
    slot = next(s.id for s in eng.stats().slots if s.is_processing)
    eng.park(slot)
    typed = next(s for s in eng.stats().slots if s.id == slot)
    from_json = SlotStats.from_json(next(s for s in eng.slots() if s["id"] == slot))
    assert typed.is_preempted and typed.state == "preempted"
    assert typed.preempt_tier is ParkTier.RAM and typed.preempt_mode is PreemptMode.SWAP
    assert isinstance(typed.preempt_choice, ParkChoice) and typed.preempt_ram_bytes > 0
    assert dataclasses.replace(typed, t_preempted_ms=0.0) == dataclasses.replace(from_json, t_preempted_ms=0.0)
    eng.unpark(slot)
    eng.run(req)
    assert req.completion().n_generated == 200 and not eng.stats().parked()
