"""vLLM's programs run with only the import changed: every SamplingParams field vLLM documents is
taken and does what vLLM says of it (or is refused naming what to use), RequestOutput carries
num_cached_tokens, prompt_logprobs and metrics, and `llama_preempt.inputs` /
`llama_preempt.sampling_params` stand for vllm.inputs and vllm.sampling_params. Each behaviour is
checked against the same model's own answer without the field (a greedy run), not against numbers
written here, so it holds on the real stories260K and on its generated stand-in."""
from __future__ import annotations

import asyncio
import math
from pathlib import Path
from typing import Any, Iterator

import pytest

from helpers import ON_THE_CPU
from llama_preempt import LLM, AsyncEngineArgs, AsyncLLM, Engine, RequestOutputKind, SamplingParams
from llama_preempt.inputs import TextPrompt, TokensPrompt
from llama_preempt.outputs import CompletionOutput, RequestStateStats

PROMPT = "Once upon a time"


@pytest.fixture(scope="module")
def llm(stories_model: Path) -> Iterator[LLM]:
    with LLM(model=str(stories_model), max_model_len=2048, max_num_seqs=4, args=ON_THE_CPU) as llm:
        yield llm


def greedy(llm: LLM, prompt: Any = PROMPT, **kw: Any) -> CompletionOutput:
    [out] = llm.generate([prompt], SamplingParams(temperature=0, **{"max_tokens": 12, **kw}))
    return out.outputs[0]


def info(llm: LLM) -> dict[str, Any]:
    return llm.engine.model_info()


def piece(llm: LLM, t: int, special: bool = False) -> str:
    return bytes(llm.engine._core.detokenize([t], special)).decode("utf-8", errors="replace")


def first_new_id(ids: list[int], at_least: int) -> tuple[int, int]:
    """An id of `ids` whose first place is at_least or later, and that place."""
    for k, t in enumerate(ids):
        if k >= at_least and t not in ids[:k]:
            return t, k
    pytest.skip(f"the greedy answer {ids} repeats every token after {at_least}")


# --- SamplingParams: the fields vLLM documents ---

def test_every_field_vllm_documents_is_taken_and_a_bad_value_names_its_field() -> None:
    SamplingParams(stop_token_ids=[2], min_tokens=1, skip_special_tokens=False, include_stop_str_in_output=True,
                   bad_words=["there"], allowed_token_ids=[1, 2], prompt_logprobs=1, truncate_prompt_tokens=8,
                   detokenize=True)
    for bad, field_name, kind in [
        ({"stop_token_ids": ["a"]}, "stop_token_ids", TypeError),
        ({"min_tokens": -1}, "min_tokens", ValueError),
        ({"min_tokens": 9, "max_tokens": 4}, "min_tokens", ValueError),
        ({"bad_words": "there"}, "bad_words", TypeError),
        ({"bad_words": [""]}, "bad_words", ValueError),
        ({"allowed_token_ids": []}, "allowed_token_ids", ValueError),
        ({"prompt_logprobs": -1}, "prompt_logprobs", ValueError),
        ({"truncate_prompt_tokens": 0}, "truncate_prompt_tokens", ValueError),
        ({"skip_special_tokens": "no"}, "skip_special_tokens", TypeError),
        ({"stop": ["."], "detokenize": False}, "detokenize", ValueError),
    ]:
        with pytest.raises(kind, match=field_name):
            SamplingParams(**bad)
    sp = SamplingParams(stop=["."], stop_token_ids=[2])
    copy = sp.clone()  # vLLM's clone: equal, its lists its own
    assert copy == sp and copy.stop is not sp.stop and copy.stop_token_ids is not sp.stop_token_ids


def test_stop_token_ids_end_the_sequence_at_the_id_kept_in_token_ids_and_left_out_of_the_text(llm: LLM) -> None:
    free = greedy(llm)
    stop, k = first_new_id(list(free.token_ids), 3)
    out = greedy(llm, stop_token_ids=[stop])
    assert list(out.token_ids) == list(free.token_ids)[:k + 1]
    assert (out.finish_reason, out.stop_reason) == ("stop", stop)
    assert free.text.startswith(out.text + piece(llm, stop)), (out.text, free.text)
    kept = greedy(llm, stop_token_ids=[stop], include_stop_str_in_output=True)
    assert kept.text == out.text + piece(llm, stop)
    assert kept.token_ids == out.token_ids


def test_stop_token_ids_end_each_of_n_sampled_sequences_at_its_own_first_stop_id(llm: LLM) -> None:
    free = greedy(llm)
    stops = sorted(set(free.token_ids[2:6]))
    sp = SamplingParams(n=3, max_tokens=24, temperature=0.9, seed=4, logprobs=1, stop_token_ids=stops)
    [out] = llm.generate([PROMPT], sp)
    assert len(out.outputs) == 3
    for o in out.outputs:
        ids = list(o.token_ids)
        hits = [k for k, t in enumerate(ids) if t in stops]
        if o.finish_reason == "stop":
            assert hits == [len(ids) - 1] and o.stop_reason == ids[-1], (ids, o.stop_reason)
        else:
            assert (o.finish_reason, hits, len(ids)) == ("length", [], 24)
        assert o.logprobs is not None and len(o.logprobs) == len(ids)
        assert math.isclose(o.cumulative_logprob or 0.0, sum(lp[t].logprob for t, lp in zip(ids, o.logprobs)))


def test_the_end_token_as_a_stop_token_id_ends_with_stop_reason_none_as_vllm_gives(llm: LLM) -> None:
    eos = info(llm)['token_eos']
    [out] = llm.generate([PROMPT], SamplingParams(max_tokens=12, temperature=0, stop_token_ids=[eos]),
                         grammar='root ::= " The end."')
    o = out.outputs[0]
    assert o.token_ids[-1] == eos and eos not in o.token_ids[:-1]
    assert (o.text, o.finish_reason, o.stop_reason) == (" The end.", "stop", None)


def test_include_stop_str_in_output_puts_the_stop_string_back_at_the_end(llm: LLM) -> None:
    free = greedy(llm, max_tokens=16)
    word = free.text.split()[2]  # a word the answer reaches
    [cut, kept] = llm.generate([PROMPT, PROMPT], [SamplingParams(max_tokens=16, temperature=0, stop=[word]),
                                                  SamplingParams(max_tokens=16, temperature=0, stop=[word],
                                                                 include_stop_str_in_output=True)])
    assert cut.outputs[0].stop_reason == word and kept.outputs[0].stop_reason == word
    assert kept.outputs[0].text == cut.outputs[0].text + word
    assert free.text.startswith(kept.outputs[0].text)


def test_skip_special_tokens_false_shows_special_tokens_but_never_the_end_tokens_text(llm: LLM) -> None:
    bos, eos = info(llm)['token_bos'], info(llm)['token_eos']
    grammar = 'root ::= " The" <[%d]> " end"' % bos  # a special token in the middle, then the end token
    outs = llm.generate([PROMPT] * 3, [SamplingParams(max_tokens=8, temperature=0),
                                       SamplingParams(max_tokens=8, temperature=0, skip_special_tokens=False),
                                       SamplingParams(max_tokens=8, temperature=0, skip_special_tokens=False,
                                                      include_stop_str_in_output=True)], grammar=grammar)
    plain, shown, with_end = (o.outputs[0] for o in outs)
    assert bos in plain.token_ids and plain.token_ids[-1] == eos
    assert plain.token_ids == shown.token_ids == with_end.token_ids
    assert plain.text == " The end"
    assert shown.text == f" The{piece(llm, bos, True)} end"
    assert with_end.text == shown.text + piece(llm, eos, True)


def test_detokenize_false_gives_the_same_token_ids_and_no_text(llm: LLM) -> None:
    free = greedy(llm)
    bare = greedy(llm, detokenize=False)
    assert bare.token_ids == free.token_ids and bare.text == ""


def test_bad_words_of_one_token_are_never_generated_and_longer_ones_are_refused_naming_the_word(llm: LLM) -> None:
    free = greedy(llm, max_tokens=16)
    one = next((t for t in free.token_ids[:8] if piece(llm, t).strip()
                and llm.tokenize(piece(llm, t).strip(), add_bos=False) == [t]), None)
    if one is None:
        pytest.skip(f"no token of the greedy answer {free.token_ids} is a word of its own")
    word = piece(llm, one).strip()
    out = greedy(llm, max_tokens=16, bad_words=[word])
    assert one not in out.token_ids and word not in out.text.split(), (word, out.text)
    long_word = next(w for w in ("dog", "princess", "everywhere", "xylophone")
                     if len(llm.tokenize(w, add_bos=False)) > 1)
    with pytest.raises(NotImplementedError, match=f"bad_words: '{long_word}' is"):
        greedy(llm, bad_words=[long_word])


def test_allowed_token_ids_are_the_only_ones_sampled_the_end_token_included(llm: LLM) -> None:
    allowed = sorted(set(greedy(llm).token_ids[:4]))
    [out] = llm.generate([PROMPT], SamplingParams(n=2, max_tokens=10, temperature=1.0, seed=2, allowed_token_ids=allowed))
    for o in out.outputs:
        assert set(o.token_ids) <= set(allowed), o.token_ids
        assert (len(o.token_ids), o.finish_reason) == (10, "length")  # the end token is not among them


def test_min_tokens_keeps_the_stop_ids_away_until_that_many_tokens(llm: LLM) -> None:
    free = greedy(llm)
    stop, k = first_new_id(list(free.token_ids), 1)
    assert len(greedy(llm, stop_token_ids=[stop]).token_ids) == k + 1
    out = greedy(llm, stop_token_ids=[stop], min_tokens=k + 3, max_tokens=12)
    ids = list(out.token_ids)
    assert len(ids) >= k + 3 and stop not in ids[:k + 3], ids
    assert out.finish_reason == "length" or (out.finish_reason, ids[-1], out.stop_reason) == ("stop", stop, stop)
    assert out.text == llm.detokenize(ids if out.finish_reason == "length" else ids[:-1]).decode("utf-8")
    exact = greedy(llm, stop_token_ids=[stop], min_tokens=6, max_tokens=6)
    assert (len(exact.token_ids), exact.finish_reason) == (6, "length")


def test_prompt_logprobs_are_the_models_own_as_the_answer_scores_the_same_tokens(llm: LLM) -> None:
    [first] = llm.generate([PROMPT], SamplingParams(max_tokens=6, temperature=0, logprobs=2))
    assert first.prompt_logprobs is None
    answer = first.outputs[0]
    prompt_ids = list(first.prompt_token_ids or [])
    ids = prompt_ids + list(answer.token_ids)
    [scored] = llm.generate(TokensPrompt(prompt_token_ids=ids), SamplingParams(max_tokens=1, prompt_logprobs=2))
    pl = scored.prompt_logprobs
    assert pl is not None and len(pl) == len(ids) and pl[0] is None
    for i in range(1, len(ids)):
        entry = pl[i]
        assert entry is not None and ids[i] in entry and len(entry) <= 3, (i, entry)
    assert answer.logprobs is not None
    for j, t in enumerate(answer.token_ids):  # scored from the prompt, as the answer was sampled
        got, want = pl[len(prompt_ids) + j], answer.logprobs[j]
        assert got is not None and set(got) == set(want), (j, got, want)
        for tid in want:
            assert math.isclose(got[tid].logprob, want[tid].logprob, abs_tol=1e-3), (j, tid, got[tid], want[tid])


def test_prompt_logprobs_beyond_the_servers_max_logprobs_is_refused_naming_both(llm: LLM) -> None:
    with pytest.raises(ValueError, match=r"prompt_logprobs=21: at most 20 .*--max-logprobs"):
        llm.generate([PROMPT], SamplingParams(prompt_logprobs=21))


def test_prompt_logprobs_score_a_special_token_inside_the_prompt_and_zero_gives_the_token_alone(llm: LLM) -> None:
    bos, eos = info(llm)['token_bos'], info(llm)['token_eos']
    words = llm.tokenize("The dog ran", add_bos=False)
    ids = [bos, *words[:2], eos, *words[2:]]  # the end token mid-prompt, which a grammar cannot force
    [out] = llm.generate(TokensPrompt(prompt_token_ids=ids), SamplingParams(max_tokens=1, prompt_logprobs=0))
    pl = out.prompt_logprobs
    assert pl is not None and pl[0] is None and len(pl) == len(ids)
    for i in range(1, len(ids)):
        entry = pl[i]
        assert entry is not None and list(entry) == [ids[i]] and entry[ids[i]].logprob <= 0.0, (i, entry)
    [alone] = llm.generate(TokensPrompt(prompt_token_ids=[bos]), SamplingParams(max_tokens=1, prompt_logprobs=1))
    assert alone.prompt_logprobs == [None]


def test_truncate_prompt_tokens_keeps_the_last_tokens_of_the_prompt(llm: LLM) -> None:
    long = "Once upon a time there was a little girl named Lily who liked to play"
    [full] = llm.generate([long], SamplingParams(max_tokens=1, temperature=0))
    full_ids = list(full.prompt_token_ids or [])
    [cut] = llm.generate([long], SamplingParams(max_tokens=8, temperature=0, truncate_prompt_tokens=5))
    assert cut.prompt_token_ids == full_ids[-5:] and cut.prompt == long
    assert cut.outputs[0].token_ids == greedy(llm, TokensPrompt(prompt_token_ids=full_ids[-5:]), max_tokens=8).token_ids
    [short] = llm.generate([PROMPT], SamplingParams(max_tokens=1, temperature=0, truncate_prompt_tokens=100))
    assert len(short.prompt_token_ids or []) < 100 and short.prompt_token_ids == llm.tokenize(PROMPT, special=True)


def test_the_vllm_fields_work_through_the_engines_own_generate(stories_model: Path) -> None:
    with Engine(stories_model, n_ctx=512, n_parallel=2, args=ON_THE_CPU) as eng:
        [free] = eng.generate([PROMPT], SamplingParams(max_tokens=10, temperature=0))
        ids = list(free.outputs[0].token_ids)
        stop, k = first_new_id(ids, 2)
        [out] = eng.generate([PROMPT], SamplingParams(max_tokens=10, temperature=0, stop_token_ids=[stop]))
        assert list(out.outputs[0].token_ids) == ids[:k + 1]
    async def batch() -> list[Any]:
        from llama_preempt import AsyncEngine

        async with await AsyncEngine.create(stories_model, n_ctx=512, n_parallel=2, args=ON_THE_CPU) as aeng:
            return await aeng.generate_all([PROMPT], SamplingParams(max_tokens=10, temperature=0, stop_token_ids=[stop]))

    [aout] = asyncio.run(batch())
    assert list(aout.outputs[0].token_ids) == ids[:k + 1]


# --- RequestOutput: num_cached_tokens, prompt_logprobs, metrics ---

def test_num_cached_tokens_is_the_servers_cache_hit_and_llm_outputs_carry_no_metrics(llm: LLM) -> None:
    prompt = "The cat sat by the warm fire and purred at the little dog"
    [first] = llm.generate([prompt], SamplingParams(max_tokens=4, temperature=0))
    assert first.num_cached_tokens == first.timings["cache_n"]
    [again] = llm.generate([prompt], SamplingParams(max_tokens=4, temperature=0))
    assert isinstance(again.num_cached_tokens, int) and again.num_cached_tokens > 0  # the prompt's cells are reused
    assert again.num_cached_tokens < len(again.prompt_token_ids or [])
    assert again.metrics is None and again.prompt_logprobs is None  # vLLM's LLM: log stats off


def test_asyncllm_outputs_carry_measured_metrics_and_deltas_join_to_the_whole_answer(stories_model: Path) -> None:
    async def main() -> dict[str, Any]:
        eng = AsyncLLM.from_engine_args(AsyncEngineArgs(model=str(stories_model), max_model_len=1024, max_num_seqs=2,
                                                        engine_kwargs={"args": ON_THE_CPU}))
        quiet = AsyncLLM.from_engine_args(AsyncEngineArgs(model=str(stories_model), max_model_len=512, max_num_seqs=1,
                                                          disable_log_stats=True, engine_kwargs={"args": ON_THE_CPU}))
        try:
            got: dict[str, Any] = {}
            got["whole"] = [o async for o in eng.generate(PROMPT, SamplingParams(max_tokens=12, temperature=0), "w")]
            stop, _ = first_new_id(list(got["whole"][-1].outputs[0].token_ids), 3)
            sp = SamplingParams(max_tokens=12, temperature=0, stop_token_ids=[stop], output_kind=RequestOutputKind.DELTA)
            got["deltas"] = [o async for o in eng.generate(PROMPT, sp, "d")]
            got["silent"] = [o async for o in quiet.generate(PROMPT, SamplingParams(max_tokens=3), "q")]
            bos = quiet.model_info()["token_bos"]
            got["bos_text"] = bytes(quiet.engine._core.detokenize([bos], True)).decode()
            shown = SamplingParams(max_tokens=8, temperature=0, skip_special_tokens=False,
                                   output_kind=RequestOutputKind.DELTA)
            got["specials"] = [o async for o in quiet.generate(PROMPT, shown, "s",
                                                                 grammar='root ::= " The" <[%d]> " end"' % bos)]
            return got
        finally:
            eng.shutdown()
            quiet.shutdown()

    got = asyncio.run(main())
    whole, deltas = got["whole"], got["deltas"]
    m = whole[-1].metrics
    assert isinstance(m, RequestStateStats)
    assert m.num_generation_tokens == len(whole[-1].outputs[0].token_ids)
    assert m.queued_ts <= m.first_token_ts <= m.last_token_ts and m.scheduled_ts <= m.first_token_ts
    assert m.first_token_latency == pytest.approx(m.first_token_ts - m.queued_ts)
    assert m.arrival_time > 0 and whole[-1].num_cached_tokens is not None
    assert deltas[-1].finished and deltas[-1].outputs[0].finish_reason == "stop"
    ids = [t for o in deltas for t in o.outputs[0].token_ids]
    text = "".join(o.outputs[0].text for o in deltas)
    full = whole[-1].outputs[0]
    assert ids == list(full.token_ids)[:len(ids)] and ids[-1] == deltas[-1].outputs[0].stop_reason
    assert full.text.startswith(text)
    assert all(o.metrics is None for o in got["silent"] + got["specials"])  # disable_log_stats=True
    # a special token's text streams as it comes; the end token's, held back a chunk, never
    specials = got["specials"]
    assert "".join(o.outputs[0].text for o in specials) == f" The{got['bos_text']} end" and specials[-1].finished


def test_abort_stops_a_request_that_takes_several_server_requests(stories_model: Path) -> None:
    async def main() -> list[Any]:
        eng = AsyncLLM(stories_model, n_ctx=1024, n_parallel=2, args=ON_THE_CPU)
        try:
            sp = SamplingParams(max_tokens=60, min_tokens=4, ignore_eos=True, prompt_logprobs=1)
            outs = []
            async for o in eng.generate(PROMPT, sp, "x"):  # scored, then the first 4 tokens, then the rest
                outs.append(o)
                if len(outs) == 1:
                    await eng.abort("x")
            return outs
        finally:
            eng.shutdown()

    outs = asyncio.run(main())
    last = outs[-1].outputs[0]
    assert outs[-1].finished and last.finish_reason == "abort" and len(last.token_ids) < 60
    assert outs[-1].prompt_logprobs is not None and outs[-1].prompt_logprobs[0] is None


# --- the modules vLLM programs import ---

def test_tokens_and_text_prompts_from_llama_preempt_inputs_generate_as_vllms(llm: LLM) -> None:
    ids = llm.tokenize(PROMPT, special=True)
    [by_ids] = llm.generate(TokensPrompt(prompt_token_ids=ids), SamplingParams(max_tokens=6, temperature=0))
    [by_text] = llm.generate(TextPrompt(prompt=PROMPT), SamplingParams(max_tokens=6, temperature=0))
    [named] = llm.generate({"prompt_token_ids": ids, "prompt": "ignored: the ids are generated from"},
                           SamplingParams(max_tokens=6, temperature=0))
    assert by_ids.prompt is None and by_ids.prompt_token_ids == ids
    assert by_text.prompt == PROMPT and by_text.prompt_token_ids == ids
    assert by_ids.outputs[0].token_ids == by_text.outputs[0].token_ids == named.outputs[0].token_ids
    with pytest.raises(NotImplementedError, match="multi_modal_data"):
        llm.generate(TokensPrompt(prompt_token_ids=ids, multi_modal_data={"image": object()}))


def test_sampling_params_module_and_beam_search_as_vllms() -> None:
    import llama_preempt
    from llama_preempt import inputs, outputs, sampling_params

    assert llama_preempt.TokensPrompt is inputs.TokensPrompt and llama_preempt.TextPrompt is inputs.TextPrompt
    assert sampling_params.SamplingParams is llama_preempt.SamplingParams
    assert sampling_params.RequestOutputKind is llama_preempt.RequestOutputKind
    assert outputs.RequestOutput is llama_preempt.RequestOutput
    bp = sampling_params.BeamSearchParams(beam_width=2, max_tokens=8)
    assert (bp.beam_width, bp.max_tokens, bp.length_penalty) == (2, 8, 1.0)
    with pytest.raises(ValueError, match="beam_width"):
        sampling_params.BeamSearchParams(beam_width=0, max_tokens=8)


def test_beam_search_says_what_to_use_instead(llm: LLM) -> None:
    from llama_preempt.sampling_params import BeamSearchParams

    with pytest.raises(NotImplementedError, match=r"SamplingParams\(n="):
        llm.beam_search([{"prompt": PROMPT}], BeamSearchParams(beam_width=2, max_tokens=8))
