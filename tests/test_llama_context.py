"""llama-cpp-python's one stateful context on the Llama facade (llama_context.py): eval() and
sample() a token at a time, generate() with its prefix reuse, tokens sent into it and its end when
the caller stops, reset(), n_tokens and input_ids, save_state()/load_state() of the context (save,
reset, load, continue; in a new Engine too), a request of the context parked and resumed like any
other, the context re-evaluated when its slot was taken, and llama_cpp's other attributes. The
tests are shaped like llama-cpp-python's own (its tests/test_llama.py) and, where llama_cpp is
installed, compared with it token for token."""
from __future__ import annotations

import importlib.util
import itertools
import json
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest

from llama_preempt import Llama, LlamaGrammar, SamplingParams
from llama_preempt.metrics import parse_prometheus

# answers compared across Engines and calls: --deterministic, on the CPU (see tests/test_dropin.py)
SAME_ANSWERS: dict[str, Any] = {"args": ["-dev", "none"], "deterministic": True, "verbose": False}
STORY = b"Once upon a time, there was a little girl"


def new_llama(model: Path, **kw: Any) -> Llama:
    return Llama(model_path=str(model), **{"n_ctx": 512, "n_parallel": 2, **SAME_ANSWERS, **kw})


@pytest.fixture(scope="module")
def llm(stories_model: Path) -> Iterator[Llama]:
    with new_llama(stories_model) as m:
        yield m


@pytest.fixture(scope="module")
def prompt(llm: Llama) -> list[int]:
    return llm.tokenize(STORY, add_bos=True, special=True)


@pytest.fixture(scope="module")
def expected(llm: Llama, prompt: list[int]) -> list[int]:
    """The first 8 greedy tokens after the prompt, as a plain request of the Engine samples them."""
    answer = llm.submit(prompt, n_predict=8, temperature=0, return_tokens=True).result()
    return [int(t) for t in answer["tokens"]]


def take(gen: Iterator[int], n: int) -> list[int]:
    return list(itertools.islice(gen, n))


def prompt_tokens_total(llm: Llama) -> float:
    """The prompt tokens the server has evaluated so far (its /metrics, asked of the loop itself)."""
    return parse_prometheus(llm.request("GET", "/metrics"))["prompt_tokens_total"]


def busy(llm: Llama) -> bool:
    return any(s["is_processing"] for s in llm.slots())


def test_eval_and_sample_a_token_at_a_time_give_the_greedy_answer(llm: Llama, prompt: list[int],
                                                                 expected: list[int]) -> None:
    llm.reset()
    assert llm.n_tokens == 0
    llm.eval(prompt)
    assert llm.n_tokens == len(prompt)
    assert isinstance(llm.input_ids, np.ndarray) and llm.input_ids.dtype == np.intc
    assert len(llm.input_ids) == llm.n_ctx() and llm.input_ids[:llm.n_tokens].tolist() == prompt
    got = []
    for _ in range(8):
        token = llm.sample(temp=0.0)
        assert llm.n_tokens == len(prompt) + len(got)  # sample() does not add the token
        got.append(token)
        llm.eval([token])
    assert got == expected
    assert llm.input_ids[:llm.n_tokens].tolist() == prompt + expected
    assert list(llm.eval_tokens) == prompt + expected


def test_eval_evaluates_its_tokens_and_only_those_the_slot_lacks(llm: Llama, prompt: list[int]) -> None:
    llm.reset()
    llm.eval(prompt[:1])  # the context's slot holds just the first token now
    before = prompt_tokens_total(llm)
    llm.eval(prompt[1:])
    assert prompt_tokens_total(llm) - before == len(prompt) - 1  # evaluated, each once
    before = prompt_tokens_total(llm)
    llm.eval([prompt[1]])
    assert prompt_tokens_total(llm) - before == 1  # one more: the rest is the slot's already
    assert llm.n_tokens == len(prompt) + 1


def test_generate_yields_the_greedy_tokens_and_reuses_the_context(llm: Llama, prompt: list[int],
                                                                  expected: list[int]) -> None:
    llm.reset()
    assert take(llm.generate(prompt, temp=0.0), 3) == expected[:3]
    # as llama_cpp: the tokens it yielded but the last are the context's
    assert llm.n_tokens == len(prompt) + 3 - 1
    # the same prompt again: the context's start is reused, not reset
    resets = []
    llm.reset = lambda: resets.append(1)  # type: ignore[method-assign]
    try:
        before = prompt_tokens_total(llm)
        assert take(llm.generate(prompt, temp=0.0), 3) == expected[:3]
        assert resets == []
        assert prompt_tokens_total(llm) - before == 1  # the last prompt token again, for its logits
    finally:
        del llm.reset
    # a longer context whose start is the prompt (llama_cpp's shorter-prompt prefix reuse)
    llm.reset()
    llm.eval(prompt + llm.tokenize(b" who liked to play", add_bos=False))
    assert take(llm.generate(prompt, temp=0.0), 3) == expected[:3]
    # reset=False goes on from the context as it is
    llm.reset()
    llm.eval(prompt)
    assert take(llm.generate([], temp=0.0, reset=False), 2) == expected[:2]


def test_sample_at_an_earlier_position_and_n_tokens_set_lower(llm: Llama, prompt: list[int],
                                                              expected: list[int]) -> None:
    llm.reset()
    llm.eval(prompt + expected[:4])
    assert llm.sample(temp=0.0, idx=len(prompt) - 1) == expected[0]
    assert llm.sample(temp=0.0) == expected[4]
    llm.n_tokens = len(prompt)  # back to the prompt, as llama_cpp's callers do
    assert llm.sample(temp=0.0) == expected[0]


def test_generate_goes_on_past_the_end_of_sequence_as_llama_cpp(llm: Llama, prompt: list[int]) -> None:
    eos = llm.token_eos()
    gen = llm.generate(prompt, temp=0.0, logit_bias={eos: 100.0})
    # the server ends a request at the end of sequence; llama_cpp's generate yields it and goes on
    assert take(gen, 3) == [eos, eos, eos]
    assert llm.n_tokens == len(prompt) + 2
    gen.close()


def test_tokens_sent_into_generate_are_checked_against_the_model(llm: Llama, prompt: list[int],
                                                                 expected: list[int]) -> None:
    llm.reset()
    gen = llm.generate(prompt, temp=0.0)
    assert next(gen) == expected[0]
    # llama_cpp evaluates what is sent after the token and yields the model's own token at each place
    assert gen.send([expected[1]]) == expected[1]
    assert llm.n_tokens == len(prompt) + 2
    assert next(gen) == expected[2]
    # a token the model would not have chosen: it yields its own, and the context drops the sent one
    assert gen.send([expected[3] + 1]) == expected[3]
    assert next(gen) == expected[4]
    assert llm.input_ids[:llm.n_tokens].tolist() == prompt + expected[:4]
    gen.close()


def test_a_generator_the_caller_stops_frees_the_slot(llm: Llama, prompt: list[int]) -> None:
    gen = llm.generate(prompt, temp=0.8)
    take(gen, 2)
    assert busy(llm)  # its request runs on
    gen.close()  # as when the generator is dropped
    llm.engine.run(until=lambda: not busy(llm), timeout=30)
    assert not busy(llm)


def test_dropping_an_older_generator_leaves_the_newer_ones_request(llm: Llama, prompt: list[int],
                                                                  expected: list[int]) -> None:
    older = llm.generate(llm.tokenize(b"The dog ran", add_bos=True), temp=0.0)
    next(older)
    newer = llm.generate(prompt, temp=0.0)
    assert take(newer, 2) == expected[:2]
    before = prompt_tokens_total(llm)
    older.close()
    assert take(newer, 3) == expected[2:5]
    assert prompt_tokens_total(llm) == before  # the same request sampled on: nothing evaluated again
    newer.close()


def test_a_grammar_holds_across_the_generated_tokens(llm: Llama) -> None:
    grammar = LlamaGrammar.from_string('root ::= " the dog ran"')
    gen = llm.generate(llm.tokenize(b"Once upon a time"), temp=0.0, grammar=grammar)
    out: list[int] = []
    for token in gen:
        if token == llm.token_eos():
            break
        out.append(token)
    gen.close()
    assert llm.detokenize(out) == b" the dog ran"
    assert llm.detokenize([llm.sample(temp=0.0, grammar=grammar)]).startswith(b" ")


def test_save_reset_load_continue(stories_model: Path, llm: Llama, prompt: list[int], expected: list[int]) -> None:
    llm.reset()
    llm.eval(prompt)
    state = llm.save_state()
    assert state.n_tokens == len(prompt) and state.input_ids.tolist() == prompt
    assert state.llama_state_size == len(state.llama_state) > 0
    llm.reset()
    llm.eval(llm.tokenize(b"The dog ran to the park", add_bos=True))  # other work in the context's slot
    llm.load_state(state)
    assert llm.n_tokens == len(prompt) and llm.input_ids[:llm.n_tokens].tolist() == prompt
    before = prompt_tokens_total(llm)
    assert take(llm.generate(prompt, temp=0.0), 3) == expected[:3]
    assert prompt_tokens_total(llm) - before == 1  # continued from the loaded cells
    assert llm.n_tokens == len(prompt) + 3 - 1

    # pickled, into a new Engine: the same continuation
    blob = pickle.dumps(state)
    with new_llama(stories_model, seed=3) as fresh:
        fresh.eval(fresh.tokenize(b"The cat sat", add_bos=True))
        fresh.load_state(pickle.loads(blob))
        assert fresh.n_tokens == len(prompt)
        assert take(fresh.generate(prompt, temp=0.0), 3) == expected[:3]


def test_a_state_saved_after_a_completion_call_is_that_calls_slot(llm: Llama, prompt: list[int]) -> None:
    llm.reset()
    llm.eval(prompt)
    out = llm.create_completion(prompt[1:], max_tokens=4, temperature=0)  # its own slot, as before
    assert llm.n_tokens == len(prompt)  # the context is as it was
    state = llm.save_state()
    n_completion = out["usage"]["prompt_tokens"] + out["usage"]["completion_tokens"] - 1
    assert state.n_tokens == n_completion
    llm.eval([prompt[0]])
    assert llm.save_state().n_tokens == len(prompt) + 1  # the context again, once it was used since


def test_a_context_slot_taken_by_other_work_is_evaluated_again(stories_model: Path, prompt: list[int],
                                                              expected: list[int]) -> None:
    with new_llama(stories_model, n_parallel=1) as one:  # one slot: the completions take the context's
        one.eval(prompt)
        one.create_completion("The dog ran", max_tokens=8, temperature=0)
        assert one.sample(temp=0.0) == expected[0]
        one.create_completion("The cat sat", max_tokens=8, temperature=0)
        assert take(one.generate(prompt, temp=0.0), 4) == expected[:4]
        state = one.save_state()
        assert state.input_ids.tolist() == prompt + expected[:3]
        # a generator still open holds the one slot: loading a state ends its request and takes the slot
        gen = one.generate(one.tokenize(b"The cat sat", add_bos=True), temp=0.0)
        take(gen, 2)
        one.load_state(state)
        assert one.n_tokens == len(prompt) + 3
        assert one.sample(temp=0.0) == expected[3]
        gen.close()


def test_a_context_request_is_parked_and_resumed_like_any_other(stories_model: Path, prompt: list[int],
                                                                expected: list[int],
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLAMA_SERVER_PREEMPT_EVERY", "3")  # every generating slot parks every 3 tokens
    with new_llama(stories_model) as parked:
        assert take(parked.generate(prompt, temp=0.0), 8) == expected
        assert parked.stats().n_preempt_total > 0


def test_what_the_context_cannot_do_says_what_to_use(llm: Llama, prompt: list[int]) -> None:
    llm.reset()
    with pytest.raises(ValueError, match="eval"):
        llm.sample()
    llm.eval(prompt)
    for attr in ("scores", "eval_logits"):
        with pytest.raises(NotImplementedError, match="logprobs"):
            getattr(llm, attr)
    with pytest.raises(NotImplementedError, match="logit_bias"):
        llm.sample(logits_processor=[lambda ids, logits: logits])
    with pytest.raises(NotImplementedError, match="stop iterating"):
        llm.generate(prompt, stopping_criteria=[lambda ids, logits: True])
    with pytest.raises(ValueError, match="vocabulary"):
        llm.eval([llm.n_vocab()])
    with pytest.raises(TypeError, match="token ids"):
        llm.eval("Once")
    with pytest.raises(ValueError, match="tfs_z"):
        llm.sample(tfs_z=0.5)
    with pytest.raises(TypeError, match="temp must be a number"):
        llm.sample(temp="hot")  # type: ignore[arg-type]
    assert llm.n_tokens == len(prompt)  # nothing refused changed the context


def test_generate_given_prompts_is_still_the_engines(llm: Llama) -> None:
    outs = llm.generate(["Once upon", "The dog"], SamplingParams(max_tokens=3, temperature=0))
    assert [len(o.outputs[0].token_ids) for o in outs] == [3, 3]


# llama_cpp.Llama's public attributes (0.3.36): each works here, or raises saying what to use
LLAMA_CPP_PUBLIC = (
    "cache", "chat_format", "chat_handler", "context_params", "create_chat_completion",
    "create_chat_completion_openai_v1", "create_completion", "create_embedding", "ctx", "detokenize", "draft_model",
    "embed", "eval", "eval_logits", "eval_tokens", "from_pretrained", "generate", "input_ids", "kv_overrides",
    "last_n_tokens_size", "load_state", "logits_to_logprobs", "longest_token_prefix", "lora_base", "lora_path",
    "lora_scale", "metadata", "model", "model_params", "model_path", "n_batch", "n_ctx", "n_embd", "n_threads",
    "n_threads_batch", "n_tokens", "n_vocab", "numa", "pooling_type", "reset", "sample", "save_state", "scores",
    "set_cache", "set_seed", "spm_infill", "tensor_split", "token_bos", "token_eos", "token_nl", "tokenize",
    "tokenizer", "tokenizer_", "verbose", "close",
)
REFUSED = {"ctx", "model", "context_params", "model_params", "scores", "eval_logits"}


def test_every_public_attribute_of_llama_cpp_works_or_says_what_to_use(llm: Llama, stories_model: Path) -> None:
    for name in LLAMA_CPP_PUBLIC:
        if name in REFUSED:
            with pytest.raises(NotImplementedError, match=r"; use |sample\(\)"):
                getattr(llm, name)
        else:
            getattr(llm, name)
    tok = llm.tokenizer()
    ids = tok.encode("Once upon")
    assert ids == llm.tokenize(b"Once upon", special=True) and tok.decode(ids) == "Once upon"
    assert llm.tokenizer_.tokenize(b"Once") == tok.tokenize(b"Once")
    assert llm.pooling_type() == 0 and llm.cache is None
    llm.set_cache(None)
    with pytest.raises(NotImplementedError, match="cache-ram"):
        llm.set_cache(object())
    assert llm.longest_token_prefix([1, 2, 3], [1, 2, 4]) == 2
    lp = llm.logits_to_logprobs(np.array([0.0, 0.0], dtype=np.single))
    assert np.allclose(lp, np.log([0.5, 0.5]))
    assert llm.model_path == str(stories_model) and llm.n_batch == 2048 and llm.verbose is False
    assert llm.last_n_tokens_size == 64 and llm.lora_path is None and llm.chat_handler is None
    with pickle.loads(pickle.dumps(llm)) as copy:  # llama_cpp pickles a Llama as its keywords
        assert copy.model_path == llm.model_path and copy.n_ctx() == llm.n_ctx()
        assert copy("Once", max_tokens=3, temperature=0)["choices"][0]["text"] == \
            llm("Once", max_tokens=3, temperature=0)["choices"][0]["text"]


@pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None,
                    reason="llama-cpp-python is not installed (pip install llama-cpp-python==0.3.36 runs this; "
                           "CI does)")
def test_the_context_calls_give_what_llama_cpp_gives(stories_model: Path) -> None:
    # the same program with each library: eval and sample a token at a time, generate(), and save,
    # reset, load, continue (llama_cpp in a child process, so a crash of either fails only this test)
    program = r"""
import itertools, json, sys
from {module} import Llama
llm = Llama(model_path=sys.argv[1], n_ctx=512, verbose=False, {extra})
prompt = llm.tokenize(b"Once upon a time, there was a little girl", add_bos=True, special=True)
out = {{"prompt": prompt}}
llm.reset(); llm.eval(prompt); stepped = []
for _ in range(8):
    t = llm.sample(temp=0.0); stepped.append(t); llm.eval([t])
out["stepped"] = stepped; out["n_after_steps"] = llm.n_tokens
out["generated"] = list(itertools.islice(llm.generate(prompt, temp=0.0), 8)); out["n_after_generate"] = llm.n_tokens
llm.reset(); llm.eval(prompt); state = llm.save_state(); llm.reset()
llm.eval(llm.tokenize(b"The dog ran to the park", add_bos=True)); llm.load_state(state)
out["n_loaded"] = llm.n_tokens
out["continued"] = list(itertools.islice(llm.generate(prompt, temp=0.0), 6))
out["public"] = sorted(n for n in dir(llm) if not n.startswith("_"))
print(json.dumps(out))
"""
    def run(module: str, extra: str) -> dict[str, Any]:
        p = subprocess.run([sys.executable, "-c", program.format(module=module, extra=extra), str(stories_model)],
                           capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stderr[-2000:]
        return dict(json.loads(p.stdout.strip().splitlines()[-1]))

    theirs = run("llama_cpp", "")
    ours = run("llama_preempt", "n_parallel=2, args=['-dev', 'none'], deterministic=True")
    # every public attribute of theirs is one the test above walks
    public = set(theirs.pop("public"))
    assert public <= set(LLAMA_CPP_PUBLIC), public - set(LLAMA_CPP_PUBLIC)
    ours.pop("public")
    assert ours == theirs
