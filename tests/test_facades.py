"""The library's shape: the Engine is its own class, and llama-cpp-python's `Llama`, vLLM's `LLM`
and `AsyncLLM` are facades that hold it (an Engine, or for AsyncLLM an AsyncEngine), forward the
Engine's own calls, and build their requests through the one llama-cpp-python call module."""
from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, Iterator

import pytest

from llama_preempt import LLM, AsyncEngine, AsyncLLM, Engine, Llama, SamplingParams

# answers compared across calls: --deterministic, on the CPU (see tests/test_dropin.py)
SAME_ANSWERS: dict[str, Any] = {"args": ["-dev", "none"], "deterministic": True}
LLAMA_CPP_ONLY = ("token_bos", "token_eos", "token_nl", "n_vocab", "n_embd", "metadata", "embed", "create_embedding",
                  "save_state", "load_state", "set_cache", "eval", "sample", "reset", "set_seed", "from_pretrained")
VLLM_ONLY = ("chat", "get_tokenizer", "beam_search", "encode", "score", "sleep", "shutdown", "prompt_fields")


@pytest.fixture(scope="module")
def eng(stories_model: Path) -> Iterator[Engine]:
    with Engine(stories_model, n_ctx=256, n_parallel=2, **SAME_ANSWERS) as e:
        yield e


def test_the_engine_is_its_own_class_with_its_documented_calls_only() -> None:
    assert Engine.__mro__ == (Engine, object)
    for name in LLAMA_CPP_ONLY + VLLM_ONLY:
        assert not hasattr(Engine, name), name
    # docs/python.md's own calls of the Engine, llama-cpp-python's completions among them
    for name in ("submit", "request", "generate", "render_chat", "tokenize", "detokenize", "create_completion",
                 "create_chat_completion", "__call__", "stats", "slots", "metrics", "park", "unpark", "model_info"):
        assert callable(getattr(Engine, name)), name


def test_llama_holds_an_engine_forwards_its_calls_and_closes_it(stories_model: Path, eng: Engine) -> None:
    llm = Llama(model_path=str(stories_model), n_ctx=256, n_parallel=2, verbose=False, **SAME_ANSWERS)
    try:
        assert isinstance(llm.engine, Engine) and not isinstance(llm, Engine)
        assert llm.args is llm.engine.args and llm.stats().n_preempt_total == 0  # the Engine's own, forwarded
        assert llm.submit("Once", n_predict=3).completion().n_generated == 3
        assert "submit" in dir(llm) and "token_bos" in dir(llm)
        # the same request built in one place: the Engine's call and Llama's give the same answer
        kw: dict[str, Any] = {"max_tokens": 8, "temperature": 0, "stop": ["."]}
        assert llm("Once upon", **kw)["choices"][0]["text"] == eng("Once upon", **kw)["choices"][0]["text"]
        chat = [{"role": "user", "content": "Hi"}]
        assert llm.create_chat_completion(chat, max_tokens=6, temperature=0)["choices"][0]["message"] == \
            eng.create_chat_completion(chat, max_tokens=6, temperature=0)["choices"][0]["message"]
        with pytest.raises(AttributeError, match="no attribute 'nope'"):
            llm.nope  # noqa: B018
    finally:
        llm.close()
    assert llm.engine.closed and llm.closed
    llm.close()  # a second close does nothing


def test_llm_holds_an_engine_and_generates_what_the_engine_generates(stories_model: Path, eng: Engine) -> None:
    params = SamplingParams(max_tokens=6, temperature=0)
    with LLM(model=str(stories_model), max_model_len=256, max_num_seqs=2, **SAME_ANSWERS) as llm:
        assert isinstance(llm.engine, Engine) and not isinstance(llm, Engine)
        outs = llm.generate([{"prompt": "Once upon"}, "The dog"], params)
        mine = eng.generate(["Once upon", "The dog"], params)
        assert [o.outputs[0].text for o in outs] == [o.outputs[0].text for o in mine]
        assert [o.prompt_token_ids for o in outs] == [o.prompt_token_ids for o in mine]
        assert llm.token_bos() == outs[0].prompt_token_ids[0]  # llama-cpp-python's calls answer on it too
    assert llm.engine.closed


def test_async_llm_holds_an_async_engine(stories_model: Path) -> None:
    async def main() -> None:
        eng = AsyncLLM(stories_model, n_ctx=256, n_parallel=2)
        try:
            assert isinstance(eng.async_engine, AsyncEngine) and isinstance(eng.engine, Engine)
            assert not isinstance(eng, AsyncEngine)
            outs = [o async for o in eng.generate("Once", SamplingParams(max_tokens=3, temperature=0), "a")]
            assert outs[-1].finished and len(outs[-1].outputs[0].token_ids) == 3
            assert (await eng.complete("Once", n_predict=2)).n_generated == 2  # the AsyncEngine's own, forwarded
        finally:
            eng.shutdown()
        assert eng.closed

    asyncio.run(main())
