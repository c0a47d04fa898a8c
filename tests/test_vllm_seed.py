"""vLLM's seeded sampling through this library: SamplingParams(seed=...) gives the same tokens every
time in one program, whatever ran before it (issue 51: 1 run in 3 of such a program differed).
LLM turns on --deterministic unless told otherwise; without it, the same request beside other ones
and in other slots can sample other tokens."""
from __future__ import annotations

from pathlib import Path

from helpers import ON_THE_CPU
from llama_preempt import LLM, SamplingParams

PROMPTS = ["The dog", "Once upon a time", "Lily saw", "The sun was"]


def texts(llm: LLM, sp: SamplingParams) -> list[list[str]]:
    return [[o.text for o in r.outputs] for r in llm.generate(PROMPTS, sp)]


def test_a_seeded_request_gives_the_same_texts_every_time_in_one_program(stories_model: Path) -> None:
    sp = SamplingParams(n=2, seed=1, temperature=0.9, top_p=0.95, max_tokens=48)
    # on the CPU, on every build: --deterministic's kernels are the CPU's (a GPU build's Engine
    # offloads, and a GPU's kernels follow the batch and the cells the requests land in)
    with LLM(model=str(stories_model), max_num_seqs=4, args=ON_THE_CPU) as llm:
        assert llm.request("GET", "/props")["llama_preempt"]["deterministic"] is True
        first = texts(llm, sp)
        llm.generate(["Something else entirely"], SamplingParams(temperature=1.0, max_tokens=20))  # other work between
        assert texts(llm, sp) == first == texts(llm, sp)
        # the n sequences of a request differ from each other (seed, seed + 1)
        assert all(len(set(pair)) == 2 for pair in first), first


def test_deterministic_false_is_honoured_and_flash_attention_off_keeps_the_default_kernels(stories_model: Path) -> None:
    with LLM(model=str(stories_model), max_num_seqs=2, deterministic=False) as llm:
        assert llm.request("GET", "/props")["llama_preempt"]["deterministic"] is False
    with LLM(model=str(stories_model), max_num_seqs=2, args=["-fa", "off"]) as llm:
        assert llm.request("GET", "/props")["llama_preempt"]["deterministic"] is False
