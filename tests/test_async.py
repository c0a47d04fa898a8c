"""AsyncEngine: many requests and streams in one event loop, woken by the core's news (no
polling), a cancelled task cancelling its request and freeing its slot, park notices as typed
events -- against the real Engine on stories260K."""
from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from helpers import ON_THE_CPU
from llama_preempt import (AsyncEngine, Completion, Engine, GenerateError, RequestError, SamplingParams, StreamNotice,
                           stream_text)

CHAT = [{"role": "user", "content": "Tell me a story"}]
PROMPTS = ["Once upon a time", "The dog", "A little girl", "One day", "The sun", "Lily saw", "Tom had", "The park"]


async def until(pred: Any, timeout: float, what: str) -> None:
    """Wait, yielding to the event loop, until pred() holds; AssertionError naming `what` after timeout."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not pred():
        assert asyncio.get_running_loop().time() < deadline, f"waited {timeout} s for {what}"
        await asyncio.sleep(0.01)


def test_eight_streams_and_answers_run_together_in_one_event_loop(stories_model: Path) -> None:
    # the answers are compared across runs whose batches differ (who starts when is up to the
    # threads): --deterministic makes each the one it gives alone, with its kernels, the CPU's (a GPU
    # build's Engine would offload)
    with Engine(stories_model, ON_THE_CPU, n_ctx=1024, n_parallel=4, deterministic=True) as sync:
        refs = [c.text for c in sync.generate(PROMPTS, n_predict=24, temperature=0)]

    async def main() -> tuple[list[str], list[Completion], Completion]:
        async with await AsyncEngine.create(stories_model, ON_THE_CPU, n_ctx=1024, n_parallel=4,
                                            deterministic=True) as eng:
            async def one(p: str) -> str:
                return "".join([stream_text(c) async for c in eng.stream(p, n_predict=24, temperature=0)])

            streamed = await asyncio.gather(*(one(p) for p in PROMPTS))
            answered = await asyncio.gather(*(eng.complete(p, n_predict=24, temperature=0) for p in PROMPTS))
            chat = await eng.chat(CHAT, max_tokens=8, temperature=0)
            return list(streamed), list(answered), chat

    streamed, answered, chat = asyncio.run(main())
    assert streamed == refs
    assert [c.text for c in answered] == refs and all(c.n_generated == 24 for c in answered)
    assert chat.n_generated == 8 and chat.text


def test_a_cancelled_task_cancels_its_request_and_frees_its_slot(stories_model: Path) -> None:
    async def main() -> None:
        async with AsyncEngine(stories_model, n_ctx=1024, n_parallel=2) as eng:
            first = asyncio.Event()

            async def reader() -> None:
                async for _ in eng.stream("Once upon a time", n_predict=900, ignore_eos=True):
                    first.set()

            task = asyncio.create_task(reader())
            await asyncio.wait_for(first.wait(), 60)
            # the stats are as of a step boundary (age_ms): the request shows within a step or two
            await until(lambda: any(s.is_processing for s in eng.stats().slots), 30, "the request to show")
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await until(lambda: not any(s.is_processing for s in eng.stats().slots), 30, "the slot to be freed")
            # a task cancelled while it awaits a whole answer too
            answer = asyncio.create_task(eng.complete("The dog", n_predict=900, ignore_eos=True))
            await until(lambda: any(s.is_processing for s in eng.stats().slots), 30, "the request to start")
            answer.cancel()
            with pytest.raises(asyncio.CancelledError):
                await answer
            await until(lambda: not any(s.is_processing for s in eng.stats().slots), 30, "the slot to be freed")
            assert (await eng.complete("Once", n_predict=3)).n_generated == 3

    asyncio.run(main())


def test_leaving_a_stream_early_cancels_its_request(stories_model: Path) -> None:
    async def main() -> None:
        async with AsyncEngine(stories_model, n_ctx=1024, n_parallel=2) as eng:
            agen = eng.stream("Once upon a time", n_predict=900, ignore_eos=True)
            async for _ in agen:
                break
            await agen.aclose()
            await until(lambda: not any(s.is_processing for s in eng.stats().slots), 30, "the slot to be freed")

    asyncio.run(main())


def test_park_notices_arrive_as_typed_events_in_the_stream(stories_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLAMA_SERVER_PREEMPT_EVERY", "8")  # every generating slot is parked every 8 tokens

    async def main() -> list[Any]:
        async with AsyncEngine(stories_model, n_ctx=512, n_parallel=2) as eng:
            return [x async for x in eng.stream("Once upon a time", n_predict=32, temperature=0, notices=True)]

    items = asyncio.run(main())
    notices = [x.kind for x in items if isinstance(x, StreamNotice)]
    assert notices.count("preempted") >= 2 and notices.count("resumed") == notices.count("preempted")
    assert sum(1 for x in items if isinstance(x, dict) and stream_text(x)) >= 30


def test_async_errors_are_the_callers_or_the_servers(stories_model: Path) -> None:
    async def main() -> None:
        async with AsyncEngine(stories_model, n_ctx=512, n_parallel=2) as eng:
            with pytest.raises(ValueError, match="stream"):
                await eng.complete("Once", stream=True)
            with pytest.raises(TypeError, match="either prompt"):
                await eng.complete("Once", messages=CHAT)
            with pytest.raises(RequestError, match="n_predict") as e:
                await eng.complete("Once", n_predict=2**40)
            assert e.value.status == 400
            with pytest.raises(RequestError, match="n_predict"):
                async for _ in eng.stream("Once", n_predict="many"):
                    pass
            outs = await eng.generate_all(["Once", "The dog"], [SamplingParams(max_tokens=2), SamplingParams(max_tokens=4)])
            assert [o.n_generated for o in outs] == [2, 4]
            with pytest.raises(ValueError, match="seed"):  # caught at the call, before anything runs
                SamplingParams(max_tokens=2, seed=2**40)
            with pytest.raises(GenerateError) as g:  # a token id the model does not have: the server's 400
                await eng.generate_all(["Once", [10**6]], [SamplingParams(max_tokens=2), SamplingParams(max_tokens=2)])
            assert isinstance(g.value.results[0], Completion) and isinstance(g.value.results[1], RequestError)

    asyncio.run(main())


def test_aclose_with_drain_lets_the_requests_in_flight_finish(stories_model: Path) -> None:
    async def main() -> list[Completion]:
        eng = AsyncEngine(stories_model, n_ctx=512, n_parallel=2)
        tasks = [asyncio.create_task(eng.complete(p, n_predict=48, ignore_eos=True)) for p in PROMPTS[:2]]
        await until(lambda: sum(s.is_processing for s in eng.stats().slots) == 2, 30, "both requests to start")
        await eng.aclose(drain=60)
        assert eng.closed
        return list(await asyncio.gather(*tasks))

    assert [c.n_generated for c in asyncio.run(main())] == [48, 48]
