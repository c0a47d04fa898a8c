"""The official openai client against the drop-in llama-server (start it first):

    llama-preempt serve -m MODEL.gguf -c 4096 -np 4 --port 8080
    python examples/openai_client.py --base-url http://127.0.0.1:8080/v1
"""
from __future__ import annotations

import argparse

from openai import OpenAI


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base-url", default="http://127.0.0.1:8080/v1")
    ap.add_argument("--max-tokens", type=int, default=32)
    args = ap.parse_args()

    client = OpenAI(base_url=args.base_url, api_key="none")  # llama-server wants no key unless --api-key
    messages = [{"role": "user", "content": "Tell me a story"}]
    whole = client.chat.completions.create(model="any", messages=messages, max_tokens=args.max_tokens, temperature=0)
    print("whole:   ", whole.choices[0].message.content)
    print("streamed:", end=" ", flush=True)
    for chunk in client.chat.completions.create(model="any", messages=messages, max_tokens=args.max_tokens,
                                                temperature=0, stream=True):
        if chunk.choices and chunk.choices[0].delta.content:
            print(chunk.choices[0].delta.content, end="", flush=True)
    print()


if __name__ == "__main__":
    main()
