"""vLLM's AsyncLLM streaming example (examples/offline_inference/async_llm_streaming.py) as it
is, with the imports and the model changed.

    python examples/vllm_async_streaming.py MODEL.gguf
"""
import asyncio
import sys

# from vllm import SamplingParams
# from vllm.engine.arg_utils import AsyncEngineArgs
# from vllm.sampling_params import RequestOutputKind
# from vllm.v1.engine.async_llm import AsyncLLM
from llama_preempt import AsyncEngineArgs, AsyncLLM, RequestOutputKind, SamplingParams  # the changed imports


async def stream_response(engine: AsyncLLM, prompt: str, request_id: str) -> None:
    print(f"\nPrompt: {prompt!r}")
    print("Response: ", end="", flush=True)

    sampling_params = SamplingParams(
        max_tokens=100,
        temperature=0.8,
        top_p=0.95,
        seed=42,  # For reproducible results
        output_kind=RequestOutputKind.DELTA,  # Get only new tokens each iteration
    )

    try:
        async for output in engine.generate(
            request_id=request_id, prompt=prompt, sampling_params=sampling_params
        ):
            for completion in output.outputs:
                new_text = completion.text
                if new_text:
                    print(new_text, end="", flush=True)
            if output.finished:
                print("\nGeneration complete!")
                break
    except Exception as e:
        print(f"\nError during streaming: {e}")
        raise


async def main():
    print("Initializing AsyncLLM...")
    engine_args = AsyncEngineArgs(
        model=sys.argv[1],  # the changed model
        enforce_eager=True,
    )
    engine = AsyncLLM.from_engine_args(engine_args)
    try:
        prompts = [
            "The future of artificial intelligence is",
            "In a galaxy far, far away",
            "The key to happiness is",
        ]
        print(f"Running {len(prompts)} streaming requests...")
        for i, prompt in enumerate(prompts):
            request_id = f"stream-example-{i}"
            print(f"\n{'=' * 60}")
            print(f"Request #{i + 1} (ID: {request_id})")
            print(f"{'=' * 60}")
            await stream_response(engine, prompt, request_id)
            if i < len(prompts) - 1:
                await asyncio.sleep(0.5)
        print("\nAll streaming requests completed!")
    except Exception as e:
        print(f"\nError: {e}")
        raise
    finally:
        print("Shutting down engine...")
        engine.shutdown()


if __name__ == "__main__":
    asyncio.run(main())
