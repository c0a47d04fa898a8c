"""vLLM's prompt types (`vllm.inputs`), so `from llama_preempt.inputs import TokensPrompt` works
where a program had `from vllm.inputs import TokensPrompt`:

    llm.generate(TokensPrompt(prompt_token_ids=[1, 403, 407]), SamplingParams(max_tokens=8))
    llm.generate([TextPrompt(prompt="Once upon a time"), "The dog"])

They are TypedDicts, as vLLM's, so a plain {"prompt_token_ids": [...]} or {"prompt": "..."} is the
same thing. A TokensPrompt is generated from its ids (its `prompt`, if any, only names it); the
multimodal keys are refused with what to use instead (prompts.py)."""
from __future__ import annotations

from typing import Any, NotRequired, TypedDict, Union


class TextPrompt(TypedDict):
    """A text prompt, tokenized by the server."""

    prompt: str
    multi_modal_data: NotRequired[Any]
    mm_processor_kwargs: NotRequired[dict[str, Any]]
    cache_salt: NotRequired[str]


class TokensPrompt(TypedDict):
    """A prompt of token ids, sent as they are."""

    prompt_token_ids: list[int]
    prompt: NotRequired[str]
    token_type_ids: NotRequired[list[int]]
    multi_modal_data: NotRequired[Any]
    mm_processor_kwargs: NotRequired[dict[str, Any]]
    cache_salt: NotRequired[str]


SingletonPrompt = Union[str, TextPrompt, TokensPrompt]
PromptType = SingletonPrompt

__all__ = ["PromptType", "SingletonPrompt", "TextPrompt", "TokensPrompt"]
