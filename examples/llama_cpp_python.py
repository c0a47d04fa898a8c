"""A llama-cpp-python script, run on llama-preempt's Engine by changing one line: the import.
The calls, their parameter names and the OpenAI-shaped results are llama_cpp.Llama's.

    python examples/llama_cpp_python.py MODEL.gguf
"""
from __future__ import annotations

import sys

# from llama_cpp import Llama
from llama_preempt import Engine as Llama  # the one changed line

llm = Llama(model_path=sys.argv[1], n_ctx=2048, verbose=False)
out = llm("Once upon a time", max_tokens=24, temperature=0, stop=["\n\n"])
print("completion:", out["choices"][0]["text"])
chat = llm.create_chat_completion(messages=[{"role": "user", "content": "Tell me a story"}], max_tokens=24,
                                  temperature=0)
print("chat:", chat["choices"][0]["message"]["content"])
print("stream:", end=" ", flush=True)
for chunk in llm.create_chat_completion(messages=[{"role": "user", "content": "Tell me a story"}], max_tokens=24,
                                        temperature=0, stream=True):
    print(chunk["choices"][0]["delta"].get("content", "") if chunk["choices"] else "", end="", flush=True)
print()
llm.close()
