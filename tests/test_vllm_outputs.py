"""vLLM's outputs keep their invariants: each CompletionOutput's `token_ids`, `logprobs` and
`cumulative_logprob` agree in length and content, whatever ended the sequence (the length, a stop
string, the end token), for n > 1, and streamed (DELTA and CUMULATIVE) as whole. The server gives a
caller of the ids (`return_tokens`) one probability per id: a stop string's tokens keep theirs, and
a token that ends inside a UTF-8 character gets its own (patches/0004-client-surface)."""
from __future__ import annotations

import asyncio
import math
from pathlib import Path
from typing import Any, Iterator

import pytest

from llama_preempt import LLM, AsyncLLM, RequestOutputKind, SamplingParams
from llama_preempt.outputs import CompletionOutput

PROMPTS = ["Once upon a time", "The little dog", "Lily wanted to"]


@pytest.fixture(scope="module")
def llm(stories_model: Path) -> Iterator[LLM]:
    with LLM(model=str(stories_model), max_model_len=4096, max_num_seqs=8) as llm:
        yield llm


def assert_agree(o: CompletionOutput, what: str) -> None:
    assert o.logprobs is not None, f"{what}: no logprobs"
    assert len(o.token_ids) == len(o.logprobs), \
        f"{what}: {len(o.token_ids)} token ids against {len(o.logprobs)} logprobs ({o.finish_reason}, {o.stop_reason!r})"
    for i, (tid, lp) in enumerate(zip(o.token_ids, o.logprobs)):
        assert tid in lp, f"{what}: token {i} ({tid}) is not among its logprobs {sorted(lp)}"
    total = sum(lp[tid].logprob for tid, lp in zip(o.token_ids, o.logprobs))
    assert o.cumulative_logprob is not None and math.isclose(o.cumulative_logprob, total, rel_tol=1e-9, abs_tol=1e-9), \
        f"{what}: cumulative_logprob {o.cumulative_logprob} is not the sum of the tokens' {total}"


@pytest.mark.parametrize("how", ["length", "stop string", "end token"])
def test_token_ids_logprobs_and_their_sum_agree_at_every_finish_reason(llm: LLM, how: str) -> None:
    params = {"length": SamplingParams(n=2, max_tokens=24, temperature=0.8, seed=3, logprobs=2),
              "stop string": SamplingParams(n=2, max_tokens=200, temperature=0.8, seed=3, logprobs=2, stop=["."]),
              "end token": SamplingParams(n=2, max_tokens=50, temperature=0.8, seed=3, logprobs=2)}[how]
    # a grammar that is complete after a few words leaves the end token as the only one to sample
    fields = {"grammar": 'root ::= "The end" " of it"?'} if how == "end token" else {}
    outs = llm.generate(PROMPTS, params, **fields)
    seen = set()
    for prompt, out in zip(PROMPTS, outs):
        assert len(out.outputs) == 2
        for o in out.outputs:
            assert_agree(o, f"{how}: {prompt!r} #{o.index}")
            seen.add((o.finish_reason, o.stop_reason))
    want = {"length": ("length", None), "stop string": ("stop", "."), "end token": ("stop", None)}[how]
    assert want in seen, f"{how}: no sequence ended that way ({seen})"


def test_a_token_ending_inside_a_utf8_character_keeps_its_logprob(llm: LLM) -> None:
    # stories260K spells "é" with two byte tokens; the first ends inside the character
    params = SamplingParams(max_tokens=6, temperature=0, logprobs=1)
    [out] = llm.generate(["Say é"], params, grammar='root ::= "é" "é" "." ')
    o = out.outputs[0]
    assert o.text.startswith("éé"), o.text
    assert len(o.token_ids) >= 4, o.token_ids  # two tokens a character
    assert_agree(o, "é")


@pytest.mark.parametrize("kind", [RequestOutputKind.DELTA, RequestOutputKind.CUMULATIVE])
def test_streamed_outputs_agree_as_they_arrive_and_at_the_end(stories_model: Path, kind: RequestOutputKind) -> None:
    async def main() -> list[Any]:
        eng = AsyncLLM(stories_model, n_ctx=1024, n_parallel=4)
        try:
            params = SamplingParams(n=2, max_tokens=80, temperature=0.8, seed=5, logprobs=2, stop=["."], output_kind=kind)
            return [o async for o in eng.generate("Once upon a time", params, "r1")]
        finally:
            eng.shutdown()

    outs = asyncio.run(main())
    assert outs and outs[-1].finished
    for seq in range(2):
        if kind == RequestOutputKind.DELTA:
            parts = [o for out in outs for o in out.outputs if o.index == seq]
            ids = [t for p in parts for t in p.token_ids]
            lps = [lp for p in parts for lp in (p.logprobs or [])]
            whole = CompletionOutput(seq, "", ids, sum(lp[t].logprob for t, lp in zip(ids, lps)) if len(ids) == len(lps)
                                     else None, lps, parts[-1].finish_reason, parts[-1].stop_reason)
            for p in parts:
                if p.token_ids:
                    assert_agree(p, f"delta of #{seq}")
        else:
            whole = next(o for o in outs[-1].outputs if o.index == seq)
        assert whole.finish_reason == "stop" or whole.finish_reason == "length"
        assert_agree(whole, f"{kind.name} #{seq}")
