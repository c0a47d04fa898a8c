"""The Python library as an application embeds it: one import, the llama-cpp-python and vLLM
calls people know, caller mistakes as caller errors, stats that never wait for the loop, and
asyncio (tests/test_async.py) -- all against the real Engine on stories260K."""
from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Iterator

import pytest

import llama_preempt
from helpers import ON_THE_CPU, long_prompt
from llama_preempt import (AsyncEngine, Completion, Engine, EngineError, GenerateError, PreemptStats, RequestError,
                           SamplingParams, stream_text)

CHAT = [{"role": "user", "content": "Tell me a story"}]


@pytest.fixture(scope="module")
def eng(stories_model: Path) -> Iterator[Engine]:
    # tests here compare answers of one prompt asked again (its prompt then partly from the cache, so
    # its first token from another batch) and asked twice together: --deterministic, on the CPU
    # (whose kernels it makes batch-invariant; a GPU build's Engine would offload)
    with Engine(stories_model, ON_THE_CPU, n_ctx=1024, n_parallel=4, deterministic=True) as e:
        yield e


# --- one import ---

def test_the_public_api_is_importable_from_the_top_level() -> None:
    for name in llama_preempt.__all__:
        assert getattr(llama_preempt, name) is not None, name
    assert llama_preempt.Engine is Engine and llama_preempt.AsyncEngine is AsyncEngine
    assert issubclass(llama_preempt.RequestError, EngineError)
    assert (Path(llama_preempt.__file__).parent / "py.typed").is_file()
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        llama_preempt.Nope  # noqa: B018


# --- llama-cpp-python's calls ---

def test_create_completion_answers_as_llama_cpp_python_does(eng: Engine) -> None:
    out = eng.create_completion("Once upon a time", max_tokens=12, temperature=0)
    assert isinstance(out, dict) and out["object"] == "text_completion"
    assert out["choices"][0]["text"] and out["choices"][0]["finish_reason"] == "length"
    assert out["usage"]["completion_tokens"] == 12
    chunks = list(eng.create_completion("Once upon a time", max_tokens=12, temperature=0, stream=True))
    assert all(c["object"] == "text_completion" for c in chunks)
    assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"]) == out["choices"][0]["text"]
    assert eng("Once upon a time", max_tokens=12, temperature=0)["choices"][0]["text"] == out["choices"][0]["text"]


def test_create_chat_completion_answers_as_llama_cpp_python_does(eng: Engine) -> None:
    out = eng.create_chat_completion(messages=CHAT, max_tokens=10, temperature=0)
    assert out["object"] == "chat.completion"
    text = out["choices"][0]["message"]["content"]
    assert out["choices"][0]["message"]["role"] == "assistant" and text
    chunks = list(eng.create_chat_completion(messages=CHAT, max_tokens=10, temperature=0, stream=True))
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert "".join(stream_text(c) for c in chunks) == text


@pytest.mark.parametrize("call, error, needle", [
    (lambda e: e.create_completion("x", stopping_criteria=lambda *a: False), NotImplementedError, "stopping_criteria"),
    (lambda e: e.create_completion("x", logits_processor=lambda *a: None), NotImplementedError, "logits_processor"),
    (lambda e: e.create_completion("x", tfs_z=0.5), ValueError, "tfs_z"),
    (lambda e: e.create_completion("x", suffix="y"), ValueError, "/infill"),
    (lambda e: e.create_completion(42), TypeError, "prompt"),
    (lambda e: e.create_chat_completion("hi"), TypeError, "messages"),
    (lambda e: e.create_chat_completion(CHAT, functions=[{}]), ValueError, "tools="),
], ids=["stopping-criteria", "logits-processor", "tfs", "suffix", "prompt-type", "messages-str", "functions"])
def test_what_the_engine_cannot_do_of_llama_cpp_python_says_so(eng: Engine, call: Any, error: type, needle: str) -> None:
    with pytest.raises(error, match=needle):
        call(eng)


# --- vLLM's generate(prompts, params) ---

def test_generate_takes_one_sampling_params_per_prompt(eng: Engine) -> None:
    outs = eng.generate(["Once upon a time", "The dog", CHAT],
                        [SamplingParams(max_tokens=3, temperature=0), SamplingParams(max_tokens=5, temperature=0),
                         SamplingParams(max_tokens=7, temperature=0)])
    assert [o.n_generated for o in outs] == [3, 5, 7]
    same = eng.generate(["Once upon a time"] * 2, SamplingParams(max_tokens=6, temperature=0))
    assert same[0].text == same[1].text and same[0].n_generated == 6
    assert eng.generate(["Once"], SamplingParams(max_tokens=4), n_predict=2)[0].n_generated == 2  # keywords win


@pytest.mark.parametrize("make, error, needle", [
    (lambda: SamplingParams(max_tokens=2.5), TypeError, "max_tokens must be an int"),
    (lambda: SamplingParams(temperature=-1), ValueError, "temperature must be >= 0"),
    (lambda: SamplingParams(top_p=2), ValueError, "top_p"),
    (lambda: SamplingParams(stop=[1]), TypeError, "stop"),
    (lambda: SamplingParams(ignore_eos="yes"), TypeError, "ignore_eos"),
], ids=["int", "temperature", "top-p", "stop", "bool"])
def test_sampling_params_refuse_bad_values_naming_them(make: Any, error: type, needle: str) -> None:
    with pytest.raises(error, match=needle):
        make()


# --- caller mistakes ---

@pytest.mark.parametrize("call, error, needle", [
    (lambda e: e.submit("Once", messages=CHAT), TypeError, "either prompt"),
    (lambda e: e.submit(messages="hi"), TypeError, "messages must be a list"),
    (lambda e: e.submit(123), TypeError, "prompt must be a string"),
    (lambda e: e.submit("Once", stream="yes"), TypeError, "stream must be True or False"),
    (lambda e: e.submit(), ValueError, "needs a prompt"),
    (lambda e: e.generate(["Hello"], n_predict=5, stream=True), ValueError, "stream=True"),
    (lambda e: e.generate("Hello"), TypeError, "pass \\[prompt\\]"),
    (lambda e: e.generate(["a", "b"], [SamplingParams()]), ValueError, "1 SamplingParams for 2 prompts"),
    (lambda e: e.generate(["a"], {"max_tokens": 3}), TypeError, "SamplingParams"),
], ids=["prompt-and-messages", "messages-str", "prompt-int", "stream-str", "nothing", "generate-stream",
        "generate-str", "params-count", "params-dict"])
def test_a_wrong_combination_of_arguments_is_a_caller_error_before_anything_is_sent(
        eng: Engine, call: Any, error: type, needle: str) -> None:
    before = eng.stats().n_preempt_total, len(eng._pending())
    with pytest.raises(error, match=needle):
        call(eng)
    assert (eng.stats().n_preempt_total, len(eng._pending())) == before


def test_a_stream_read_as_a_completion_and_the_reverse_both_work(eng: Engine) -> None:
    whole = eng.submit(messages=CHAT, max_tokens=8, temperature=0).completion()
    streamed = eng.submit(messages=CHAT, max_tokens=8, temperature=0, stream=True).completion()
    assert isinstance(streamed, Completion)
    assert (streamed.text, streamed.n_generated, streamed.stop) == (whole.text, 8, "length")
    [one] = list(eng.submit(messages=CHAT, max_tokens=8, temperature=0).stream())
    assert one["choices"][0]["message"]["content"] == whole.text
    plain = eng.submit("Once upon a time", n_predict=5, temperature=0, stream=True).completion()
    assert plain.n_generated == 5 and plain.stop == "limit"


def test_a_generate_timeout_cancels_what_it_started_and_says_how_many(eng: Engine) -> None:
    with pytest.raises(TimeoutError, match=r"cancelled the [1-3] of its 3 requests still running"):
        eng.generate(["Once", "The dog", "A cat"], n_predict=900, ignore_eos=True, timeout=0.05)
    eng.run(timeout=60)  # the loop frees the cancelled requests' slots
    assert not any(s.is_processing for s in eng.stats().slots)
    assert eng.generate(["Once"], n_predict=3)[0].n_generated == 3


def test_a_failed_request_keeps_the_others_answers(eng: Engine) -> None:
    with pytest.raises(ValueError, match="n_keep"):  # beyond the server's limit: refused at the call
        eng.generate(["Once", "The dog"], n_keep=-7)
    with pytest.raises(GenerateError) as e:  # token ids the model does not have: the server's 400, each
        eng.generate([[10**6], [10**6 + 1]], [SamplingParams(max_tokens=3), SamplingParams(max_tokens=3)])
    assert all(isinstance(x, RequestError) for x in e.value.results)
    outs = eng.generate(["Once", long_prompt(2000)], n_predict=3, return_exceptions=True)
    assert isinstance(outs[0], Completion) and isinstance(outs[1], RequestError) and outs[1].status == 400


# --- stats never wait for the loop ---

def test_stats_answer_while_a_long_prefill_runs_without_waiting_for_it(stories_model: Path) -> None:
    # one step prefills a 1,900-token prompt whole (1.5 s here) (-b and -ub that large, one thread): stats()
    # called meanwhile answer with the snapshot of the step boundary before it, and say so
    with Engine(stories_model, ["-b", "4096", "-ub", "4096"], n_ctx=4096, n_parallel=2, n_threads=1) as eng:
        eng.start()
        seen: list[Any] = []
        stop = threading.Event()

        views: list[dict[str, Any]] = []

        def reader() -> None:
            while not stop.is_set() and not (any(d.while_stepping for d in seen) and
                                              any(v["while_stepping"] for v in views)):
                seen.append(eng._core.stats())
                views.append(eng._core.views())  # what slots() and metrics() read

        t = threading.Thread(target=reader)
        t.start()
        req = eng.submit(long_prompt(1200), n_predict=4)
        req.wait(120)
        stop.set()
        t.join(30)
        during = [d for d in seen if d.while_stepping]
        assert during, f"no stats() call landed inside a step ({len(seen)} calls)"
        assert any(v["while_stepping"] for v in views), "no slots()/metrics() call landed inside a step"
        assert len(eng.slots()) == 2 and eng.metrics()["prompt_tokens_total"] > 1800
        assert eng.metrics().age_ms >= 0.0
        st = eng.stats()
        assert isinstance(st, PreemptStats) and st.age_ms >= 0.0
        assert req.completion().n_generated == 4
