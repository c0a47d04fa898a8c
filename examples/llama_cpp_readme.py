"""llama-cpp-python's README, its high-level examples as they are, with the import and the model
path changed: completion with stop and echo, chat, JSON mode, JSON schema mode, embeddings,
tokenize/detokenize.

    python examples/llama_cpp_readme.py MODEL.gguf
"""
import sys

# from llama_cpp import Llama
from llama_preempt import Llama  # the changed import

model_path = sys.argv[1]  # the changed model path

# --- High-level API ---
llm = Llama(
      model_path=model_path,
      # n_gpu_layers=-1, # Uncomment to use GPU acceleration
      # seed=1337, # Uncomment to set a specific seed
      # n_ctx=2048, # Uncomment to increase the context window
)
output = llm(
      "Q: Name the planets in the solar system? A: ", # Prompt
      max_tokens=32, # Generate up to 32 tokens, set to None to generate up to the end of the context window
      stop=["Q:", "\n"], # Stop generating just before the model would generate a new question
      echo=True # Echo the prompt back in the output
) # Generate a completion, can also call create_completion
print(output)

# --- Chat Completion ---
llm = Llama(
      model_path=model_path,
      chat_format="llama-2"
)
print(llm.create_chat_completion(
      messages = [
          {"role": "system", "content": "You are an assistant who perfectly describes images."},
          {
              "role": "user",
              "content": "Describe this image in detail please."
          }
      ]
))

# --- JSON and JSON Schema Mode ---
llm = Llama(model_path=model_path, chat_format="chatml")
print(llm.create_chat_completion(
    messages=[
        {
            "role": "system",
            "content": "You are a helpful assistant that outputs in JSON.",
        },
        {"role": "user", "content": "Who won the world series in 2020"},
    ],
    response_format={
        "type": "json_object",
    },
    temperature=0.7,
))
print(llm.create_chat_completion(
    messages=[
        {
            "role": "system",
            "content": "You are a helpful assistant that outputs in JSON.",
        },
        {"role": "user", "content": "Who won the world series in 2020"},
    ],
    response_format={
        "type": "json_object",
        "schema": {
            "type": "object",
            "properties": {"team_name": {"type": "string"}},
            "required": ["team_name"],
        },
    },
    temperature=0.7,
))

# --- Embeddings ---
llm = Llama(model_path=model_path, embedding=True)
embeddings = llm.create_embedding("Hello, world!")
# or create multiple embeddings at once
embeddings = llm.create_embedding(["Hello, world!", "Goodbye, world!"])
print(len(embeddings["data"]))

# --- Tokenization ---
llm = Llama(model_path=model_path)
tokens = llm.tokenize(b"Hello, world!")
print(tokens, llm.detokenize(tokens))
