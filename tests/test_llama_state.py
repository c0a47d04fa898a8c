"""llama-cpp-python's save_state()/load_state() on the Llama facade: a LlamaState with its fields
(n_tokens, input_ids, llama_state, llama_state_size, seed) that pickles; loading it, in the same
Engine after other work or in a new one, continues the same answer as never having saved, and the
state's tokens are not computed again."""
from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from llama_preempt import Llama, LlamaState
from llama_preempt.errors import RequestError

# answers compared across Engines: --deterministic, on the CPU (see tests/test_dropin.py)
SAME_ANSWERS: dict[str, Any] = {"args": ["-dev", "none"], "deterministic": True, "verbose": False}
STORY = "Once upon a time"


def text(out: dict[str, Any]) -> str:
    return out["choices"][0]["text"]


def cached(out: dict[str, Any]) -> int:
    return out["usage"]["prompt_tokens_details"]["cached_tokens"]


def test_a_loaded_state_continues_the_same_answer_in_this_engine_and_a_new_one(stories_model: Path) -> None:
    llm = Llama(model_path=str(stories_model), n_ctx=512, n_parallel=2, **SAME_ANSWERS)
    try:
        llm.set_seed(7)  # the calls draw their seeds from it: the state carries where the draw is
        first = llm(STORY, max_tokens=12, temperature=0.8)
        state = llm.save_state()
        assert isinstance(state, LlamaState)
        # its fields: the tokens it holds (the prompt's, then the answer's but the last) and the bytes
        prompt_ids = llm.tokenize(STORY.encode())
        assert state.n_tokens == len(prompt_ids) + 12 - 1 == len(state.input_ids)
        assert state.input_ids.dtype == np.intc and list(state.input_ids[:len(prompt_ids)]) == list(prompt_ids)
        assert state.llama_state_size == len(state.llama_state) > 0 and state.scores.shape[0] == 0
        assert isinstance(state.seed, int)  # where the draw from set_seed(7) is now
        story = STORY + text(first)
        never_saved = llm(story, max_tokens=12, temperature=0.8)

        # other work takes the slots, then the state comes back: the same continuation, its cells reused
        llm("The dog ran", max_tokens=40, temperature=0.8)
        llm.load_state(state)
        again = llm(story, max_tokens=12, temperature=0.8)
        assert text(again) == text(never_saved)
        blob = pickle.dumps(state)
        state_dir = llm._state_dir
        assert state_dir is not None and os.listdir(state_dir) == []  # the slot files are read and gone
    finally:
        llm.close()
    assert not os.path.exists(state_dir)  # Llama's own directory goes with it

    # a new Engine, another server seed: the pickled state continues the same answer from its cells
    fresh = Llama(model_path=str(stories_model), n_ctx=512, n_parallel=2, seed=1, **SAME_ANSWERS)
    try:
        fresh.load_state(pickle.loads(blob))
        resumed = fresh(story, max_tokens=12, temperature=0.8)
        assert text(resumed) == text(never_saved)
        assert cached(resumed) == state.n_tokens  # nothing it held was computed again
    finally:
        fresh.close()


def test_a_state_before_any_call_is_empty_and_loads_as_nothing(stories_model: Path) -> None:
    with Llama(model_path=str(stories_model), n_ctx=256, n_parallel=2, **SAME_ANSWERS) as llm:
        state = llm.save_state()
        assert state.n_tokens == 0 and state.llama_state == b"" and len(state.input_ids) == 0
        llm.load_state(state)
        assert text(llm(STORY, max_tokens=4, temperature=0))


def test_a_state_that_is_not_one_is_refused_clearly(stories_model: Path, tmp_path: Path) -> None:
    with Llama(model_path=str(stories_model), n_ctx=256, n_parallel=2, **SAME_ANSWERS) as llm:
        llm(STORY, max_tokens=4, temperature=0)
        good = llm.save_state()
        with pytest.raises(TypeError, match="LlamaState"):
            llm.load_state({"n_tokens": 3})
        bad = LlamaState(good.input_ids, good.scores, good.n_tokens, b"not a state at all", 18, None)
        with pytest.raises(ValueError, match="not a llama.cpp sequence state"):
            llm.load_state(bad)
        short = LlamaState(good.input_ids, good.scores, good.n_tokens, good.llama_state[:-1], good.llama_state_size, None)
        with pytest.raises(ValueError, match="llama_state_size"):
            llm.load_state(short)
        other_model = LlamaState(good.input_ids, good.scores, good.n_tokens, good.llama_state, good.llama_state_size,
                                 None, n_vocab=32000)
        with pytest.raises(ValueError, match="same model"):
            llm.load_state(other_model)
        # bytes changed after the save: the server's check trailer refuses them before they reach a slot
        flipped = bytearray(good.llama_state)
        flipped[len(flipped) // 2] ^= 0x10
        damaged = LlamaState(good.input_ids, good.scores, good.n_tokens, bytes(flipped), good.llama_state_size, None)
        with pytest.raises(RequestError, match="checksum"):
            llm.load_state(damaged)
        # nothing was lost: the good state still loads and the Engine still answers
        llm.load_state(good)
        assert text(llm(STORY, max_tokens=4, temperature=0))


def test_a_directory_the_caller_names_is_used_and_kept(stories_model: Path, tmp_path: Path) -> None:
    mine = tmp_path / "states"
    mine.mkdir()
    llm = Llama(model_path=str(stories_model), n_ctx=256, n_parallel=2, verbose=False,
                args=["--slot-save-path", str(mine)])
    try:
        llm(STORY, max_tokens=4, temperature=0)
        assert llm.save_state().n_tokens > 0 and llm._state_dir is None
    finally:
        llm.close()
    assert mine.is_dir()
