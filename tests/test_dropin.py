"""The library as a drop-in for llama-cpp-python's `Llama` and vLLM's `LLM`/`AsyncLLM` (issue 42):
each row of the issue's table, the argument check of every entry point, and the anchors' own
first examples run with their imports changed."""
from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
import requests
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers import ON_THE_CPU, new_server
from llama_preempt import (LLM, AsyncEngineArgs, AsyncLLM, Engine, Llama, RequestError, RequestOutputKind,
                           SamplingParams)
from llama_preempt.server import LlamaServer

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
HI = [{"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, stories_model: Path) -> Iterator[LlamaServer]:
    srv = new_server(stories_model, tmp_path_factory.mktemp("dropin"), n_ctx=256, n_parallel=2).start()
    yield srv
    srv.stop()


# tests here compare answers of one prompt asked again (its prompt then partly from the cache, so
# its first token from another batch): --deterministic, on the CPU (whose kernels it makes
# batch-invariant; a GPU build's Engine would offload), as the Engine's own keywords
SAME_ANSWERS = {"args": ON_THE_CPU, "deterministic": True}


@pytest.fixture(scope="module")
def llm(stories_model: Path) -> Iterator[LLM]:
    with LLM(model=str(stories_model), max_model_len=512, max_num_seqs=2, **SAME_ANSWERS) as eng:
        yield eng


# --- llama-cpp-python's Llama ---

def test_tokenize_takes_bytes_and_detokenize_gives_them_back(llm: LLM) -> None:
    ids = llm.tokenize(b"Hello world")
    assert ids[0] == llm.token_bos() and llm.tokenize(b"Hello world", add_bos=False) == ids[1:]
    assert llm.detokenize(ids) == b"Hello world"  # the start token's space dropped, as llama_cpp
    assert llm.detokenize(ids[2:], prev_tokens=ids[:2]) == llm.detokenize(ids)[len(llm.detokenize(ids[:2])):]
    assert llm.tokenize("Hello world") == ids
    assert llm.token_eos() != llm.token_bos() and llm.n_vocab() > max(ids) and llm.n_ctx() == 512
    assert llm.metadata["general.architecture"] == "llama"
    with pytest.raises(ValueError, match=r"tokens\[0\]"):
        llm.detokenize([llm.n_vocab()])


def test_echo_puts_the_prompt_before_the_answer_and_logprobs_are_openais_completion_shape(llm: LLM) -> None:
    out = llm("Once upon", max_tokens=4, temperature=0, echo=True)
    plain = llm("Once upon", max_tokens=4, temperature=0)
    assert out["choices"][0]["text"] == "Once upon" + plain["choices"][0]["text"]
    lp = llm.create_completion("Once upon", max_tokens=3, temperature=0, logprobs=2)["choices"][0]["logprobs"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(lp["text_offset"]) == 3
    assert all(len(t) <= 2 for t in lp["top_logprobs"]) and lp["text_offset"][0] == 0
    with pytest.raises(ValueError, match="echo"):
        llm("Once", echo=True, logprobs=1)


def test_chat_format_chooses_the_servers_template_and_an_unknown_one_names_the_supported(stories_model: Path) -> None:
    with Engine(stories_model, n_ctx=256, n_parallel=2, chat_format="chatml") as eng:
        assert "<|im_start|>user" in eng.render_chat(HI)
    with Engine(stories_model, n_ctx=256, n_parallel=2, chat_format="llama-2") as eng:
        assert "[INST]" in eng.render_chat(HI) and "Hi" in eng.render_chat(HI)  # the template, not its name
    with Engine(stories_model, n_ctx=256, n_parallel=2, chat_format="llama-3") as eng:
        assert "<|start_header_id|>user<|end_header_id|>" in eng.render_chat(HI)
    with pytest.raises(ValueError, match="chatml"):
        Engine(stories_model, n_ctx=256, chat_format="alpaca-9000")


def test_embeddings_come_from_an_engine_started_for_them(stories_model: Path) -> None:
    with Llama(model_path=str(stories_model), n_ctx=256, n_parallel=2, embedding=True) as eng:
        out = eng.create_embedding(["Hello, world!", "Goodbye"])
        assert [d["index"] for d in out["data"]] == [0, 1] and out["usage"]["prompt_tokens"] > 0
        per_token = eng.embed("Hello, world!")  # no pooling in a text model: one vector per token
        assert len(per_token) == len(eng.tokenize(b"Hello, world!")) and len(per_token[0]) == eng.n_embd()
    with Llama(model_path=str(stories_model), n_ctx=256, n_parallel=2, embedding=True, args=["--pooling", "mean"]) as eng:
        vec = eng.embed("Hello", normalize=True)
        assert len(vec) == eng.n_embd() and abs(sum(x * x for x in vec) - 1) < 1e-3
        out = eng.create_embedding(["Hello, world!"])
        assert out["usage"]["prompt_tokens"] == len(eng.tokenize(b"Hello, world!"))


def test_llama_takes_llama_cpps_constructor_keywords_as_server_flags(stories_model: Path) -> None:
    with Llama(model_path=str(stories_model), n_ctx=256, n_parallel=2, use_mmap=False, use_mlock=False,
               flash_attn=False, type_k=1, last_n_tokens_size=32, seed=7, verbose=False, logits_all=True) as llm:
        for flags in (["--load-mode", "none"], ["-fa", "off"], ["-ctk", "f16"], ["--repeat-last-n", "32"], ["--seed", "7"]):
            at = llm.args.index(flags[0])
            assert llm.args[at:at + len(flags)] == flags, llm.args
        assert llm("Once", max_tokens=2)["choices"][0]["text"]
    with pytest.raises(TypeError, match="did you mean 'use_mmap'"):
        Llama(model_path=str(stories_model), use_mmapp=False)
    with pytest.raises(NotImplementedError, match="chat_format"):
        Llama(model_path=str(stories_model), chat_handler=object())


def test_what_one_context_could_do_is_refused_saying_what_to_use(llm: LLM) -> None:
    # llama-cpp-python's one stateful context is the Llama's (tests/test_llama_context.py), not an LLM's
    for call in (lambda: llm.eval([1]), llm.reset, llm.sample):
        with pytest.raises(NotImplementedError, match="llama_preempt.Llama"):
            call()
    # a state goes through the server's slot files: an Engine started without a directory for them
    # (Llama() makes one) says which flag it needs
    for call in (llm.save_state, lambda: llm.load_state(None)):
        with pytest.raises(RuntimeError, match="--slot-save-path"):
            call()
    with pytest.raises(NotImplementedError, match="logit_bias"):
        llm.create_completion("Once", logits_processor=[lambda ids, logits: logits])


# --- mistakes caught at the call ---

@pytest.mark.parametrize("call", [
    lambda e: e.create_chat_completion(messages=HI, frobnicate=3),
    lambda e: e.generate(["a"], max_token=4),
    lambda e: e.submit("a", max_token=4),
    lambda e: SamplingParams(max_token=4),
])
def test_an_unknown_keyword_is_a_type_error_naming_it(llm: LLM, call: Callable[[LLM], Any]) -> None:
    with pytest.raises(TypeError, match=r"unexpected keyword argument '(frobnicate|max_token)'") as e:
        call(llm)
    assert "frobnicate" in str(e.value) or "did you mean 'max_tokens'" in str(e.value)


@pytest.mark.parametrize("kw, field", [({"max_tokens": "16"}, "max_tokens"), ({"stop": 5}, "stop"),
                                       ({"logit_bias": {"hello": "x"}}, "logit_bias"),
                                       ({"temperature": [1]}, "temperature"), ({"seed": 2**40}, "seed")])
def test_a_wrong_type_or_range_names_the_field(llm: LLM, kw: dict[str, Any], field: str) -> None:
    with pytest.raises((TypeError, ValueError), match=field):
        llm.create_chat_completion(messages=HI, **kw)
    with pytest.raises(RequestError) as e:  # also the 400 the server would answer
        llm.create_chat_completion(messages=HI, **kw)
    assert e.value.status == 400


def test_text_logit_bias_is_taken_as_the_server_takes_it(llm: LLM) -> None:
    out = llm.create_chat_completion(messages=HI, max_tokens=2, logit_bias={"hello": 5})
    assert out["choices"][0]["message"]["content"] is not None


@pytest.mark.parametrize("messages, why", [([{"content": "Hi"}], "no 'role'"),
                                           ([{"role": "wizard", "content": "Hi"}], "'wizard' is not one of"),
                                           ([], "empty")])
def test_malformed_messages_are_a_value_error_here_and_a_400_over_http(llm: LLM, server: LlamaServer,
                                                                       messages: Any, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        llm.create_chat_completion(messages=messages)
    r = requests.post(server.url + "/v1/chat/completions", json={"messages": messages, "max_tokens": 2}, timeout=30)
    if messages:
        assert r.status_code == 400 and why in r.json()["error"]["message"], r.text
    else:  # upstream renders an empty list with its defaults (its own Anthropic tests ask for that)
        assert r.status_code == 200, r.text
    assert requests.post(server.url + "/v1/chat/completions", json={"messages": HI, "max_tokens": 2},
                         timeout=30).status_code == 200


ENTRY_POINTS: dict[str, Callable[[LLM, str, Any], Any]] = {
    "submit": lambda e, k, v: e.submit("Once", **{k: v}),
    "create_completion": lambda e, k, v: e.create_completion("Once", **{k: v}),
    "create_chat_completion": lambda e, k, v: e.create_chat_completion(messages=HI, **{k: v}),
    "generate": lambda e, k, v: e.generate(["Once"], **{k: v}),
    "SamplingParams": lambda e, k, v: SamplingParams(**{k: v}),
}
FIELDS = ["max_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "stop", "presence_penalty",
          "frequency_penalty", "logit_bias", "logprobs"]
WRONG = st.one_of(st.text(max_size=3).filter(lambda s: not s.lstrip("-").isdigit()), st.dictionaries(st.text(max_size=2), st.integers(), min_size=1),
                  st.lists(st.lists(st.floats(), max_size=1), min_size=1, max_size=2), st.just(object()))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(entry=st.sampled_from(sorted(ENTRY_POINTS)), name=st.sampled_from(FIELDS), value=WRONG)
def test_every_entry_point_refuses_a_wrong_type_for_each_field_naming_it(llm: LLM, entry: str, name: str,
                                                                         value: Any) -> None:
    if name == "stop" and isinstance(value, str):
        value = 5  # a string is a stop word
    if name == "logit_bias" and isinstance(value, dict):
        value = "x"
    with pytest.raises((TypeError, ValueError)) as e:
        ENTRY_POINTS[entry](llm, name, value)
    assert name in str(e.value), (entry, name, value, str(e.value))
    assert llm.request_rules() is not None  # nothing was submitted: the Engine still answers
    assert not any(s["is_processing"] for s in llm.slots())


# --- vLLM's shapes ---

def test_generate_returns_request_outputs_with_n_sequences(llm: LLM) -> None:
    outs = llm.generate(["Once upon", "The dog"], SamplingParams(max_tokens=4, temperature=0))
    o = outs[0]
    assert o.prompt == "Once upon" and o.prompt_token_ids == llm.tokenize("Once upon", special=True)
    assert o.outputs[0].text == o.text and len(o.outputs[0].token_ids) == 4 and o.finish_reason == "length"
    assert llm.detokenize(o.outputs[0].token_ids).decode() == o.outputs[0].text and o.finished
    two = llm.generate("Once upon", SamplingParams(max_tokens=3, n=2))
    assert [c.index for c in two[0].outputs] == [0, 1] and all(len(c.token_ids) == 3 for c in two[0].outputs)
    with pytest.raises(ValueError, match="max_tokens must be at least 1"):
        SamplingParams(max_tokens=0)
    with pytest.raises(ValueError, match="n"):
        llm.generate(["Once"], SamplingParams(n=5))  # more than the Engine's 2 slots


def test_chat_renders_the_template_and_returns_token_ids(llm: LLM) -> None:
    out = llm.chat(HI, SamplingParams(max_tokens=3, temperature=0))[0]
    assert out.prompt == llm.request("POST", "/apply-template", {"messages": HI})["prompt"]
    assert len(out.outputs[0].token_ids) == 3


def test_async_generate_streams_cumulative_or_delta_outputs_and_abort_stops_it(stories_model: Path) -> None:
    async def main() -> None:
        eng = AsyncLLM.from_engine_args(AsyncEngineArgs(model=str(stories_model), max_model_len=512, max_num_seqs=2,
                                                        engine_kwargs=SAME_ANSWERS))
        try:
            texts = [o.outputs[0].text async for o in eng.generate("Once upon", SamplingParams(max_tokens=6, temperature=0), "a")]
            assert all(texts[-1].startswith(t) for t in texts) and len(texts) >= 6
            deltas = [o async for o in eng.generate("Once upon", SamplingParams(
                max_tokens=6, temperature=0, output_kind=RequestOutputKind.DELTA), "b")]
            assert "".join(o.outputs[0].text for o in deltas) == texts[-1] and deltas[-1].finished
            seen = []
            async for o in eng.generate("Once", SamplingParams(max_tokens=500, ignore_eos=True, temperature=0), "c"):
                seen.append(o)
                if len(seen) == 2:
                    await eng.abort("c")
            assert seen[-1].finished and seen[-1].finish_reason == "abort" and len(seen) < 50
            chat = [o async for o in eng.generate(HI, SamplingParams(max_tokens=4, temperature=0), "d")]
            assert chat[-1].finished and chat[-1].prompt == eng.engine.render_chat(HI)
            assert len(chat[-1].outputs[0].token_ids) == 4 and chat[-1].outputs[0].text
            with pytest.raises(ValueError, match="already running"):
                agen = eng.generate("Once", SamplingParams(max_tokens=200, ignore_eos=True), "e")
                await agen.__anext__()
                await eng.generate("Once", SamplingParams(max_tokens=2), "e").__anext__()
            await agen.aclose()
            assert not eng._by_id and not eng._aborted  # nothing kept once the streams end
            assert eng.tokenize(b"Hi") == eng.engine.tokenize(b"Hi") and isinstance(eng.slots(), list)
            assert eng.metrics() is not None and "n_vocab" in eng.model_info()
            with warnings.catch_warnings(record=True) as w:
                warnings.simplefilter("always")
                outs = await eng.generate(["Once", "The dog"], SamplingParams(max_tokens=2))
            assert len(outs) == 2 and any(issubclass(x.category, DeprecationWarning) for x in w)
        finally:
            eng.shutdown()

    asyncio.run(main())


def test_request_done_is_a_method_and_the_property_form_warns(llm: LLM) -> None:
    req = llm.submit("Once", n_predict=2)
    llm.run(req.done)  # a predicate that reads the request each time
    assert req.done() is True and req.cancelled() is False
    with pytest.warns(DeprecationWarning, match=r"done\(\)"):
        assert req.done
    with pytest.warns(DeprecationWarning):
        assert sum(r.done for r in [req, req]) == 2 and req.done == True  # noqa: E712


# --- the anchors' own examples ---

@pytest.mark.parametrize("example, expect", [("llama_cpp_readme.py", "text_completion"),
                                             ("vllm_quickstart.py", "Generated Outputs"),
                                             ("vllm_async_streaming.py", "All streaming requests completed")])
def test_the_anchors_first_examples_run_with_their_imports_changed(stories_model: Path, example: str,
                                                                   expect: str) -> None:
    p = subprocess.run([sys.executable, str(EXAMPLES / example), str(stories_model)], capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert expect in p.stdout, p.stdout[-2000:]
