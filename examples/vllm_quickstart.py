"""vLLM's offline quickstart as it is, with the import and the model changed.

    python examples/vllm_quickstart.py MODEL.gguf
"""
import sys

# from vllm import LLM, SamplingParams
from llama_preempt import LLM, SamplingParams  # the changed import

prompts = [
    "Hello, my name is",
    "The president of the United States is",
    "The capital of France is",
    "The future of AI is",
]
sampling_params = SamplingParams(temperature=0.8, top_p=0.95)


def main():
    llm = LLM(model=sys.argv[1])  # the changed model
    outputs = llm.generate(prompts, sampling_params)
    print("\nGenerated Outputs:\n" + "-" * 60)
    for output in outputs:
        prompt = output.prompt
        generated_text = output.outputs[0].text
        print(f"Prompt:    {prompt!r}")
        print(f"Output:    {generated_text!r}")
        print("-" * 60)


if __name__ == "__main__":
    main()
