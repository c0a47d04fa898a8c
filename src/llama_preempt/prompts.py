"""The forms a prompt takes, read in one place for every call: a text or token ids (for
/completion), chat messages (for /v1/chat/completions), vLLM's prompt dicts ({"prompt": text},
{"prompt_token_ids": [...]}), and the `prompt` / `prompt_token_ids` a vLLM RequestOutput carries."""
from __future__ import annotations

from typing import Any, Protocol, Sequence, Union

Prompt = Union[str, Sequence[int], Sequence[dict[str, Any]]]


def is_prompt(p: Any) -> bool:
    """A text or token-id prompt (for /completion), not chat messages."""
    return isinstance(p, str) or (isinstance(p, list) and bool(p) and all(isinstance(t, int) for t in p))


def is_one_prompt(p: Any) -> bool:
    """One prompt (text, token ids, or one chat's messages), not a list of prompts."""
    return is_prompt(p) or (isinstance(p, list) and bool(p) and all(isinstance(m, dict) for m in p))


def vllm_prompt(p: Any, where: str) -> Any:
    """vLLM's prompt dicts (inputs.TextPrompt, inputs.TokensPrompt) as the Engine's prompts:
    {"prompt": text} is the text, {"prompt_token_ids": [...]} the ids (its "prompt", if given, only
    names it, as in vLLM); anything else as given."""
    if not isinstance(p, dict):
        return p
    unknown = set(p) - _PROMPT_KEYS - set(_PROMPT_REFUSED)
    if unknown:
        raise ValueError(f"{where}: a prompt dict takes 'prompt' (TextPrompt) or 'prompt_token_ids' (TokensPrompt), "
                         f"got keys {sorted(p)}")
    for key, instead in _PROMPT_REFUSED.items():
        if p.get(key) is not None:
            raise NotImplementedError(f"{where}: {key!r}: {instead}")
    if "prompt_token_ids" in p:
        ids = p["prompt_token_ids"]
        if isinstance(ids, (str, bytes)) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
            raise TypeError(f"{where}: prompt_token_ids must be a list of token ids (int), got {ids!r}")
        return list(ids)
    if "prompt" in p:
        return p["prompt"]
    raise ValueError(f"{where}: a prompt dict must have 'prompt' or 'prompt_token_ids', got keys {sorted(p)}")


_PROMPT_KEYS = {"prompt", "prompt_token_ids"}
# vLLM's other prompt keys, and what to do instead here
_PROMPT_REFUSED = {
    "multi_modal_data": "images and audio go through the chat route with a multimodal projector "
                        "(Engine(args=['--mmproj', F]) and submit(messages=[...]) with image_url parts)",
    "mm_processor_kwargs": "there is no multimodal processor to configure here (see multi_modal_data)",
    "token_type_ids": "token type ids are for cross-encoders; use embed() on an LLM(task='embed')",
    "cache_salt": "the server's prompt cache has no per-request salt (any request may reuse a cached prefix); "
                  "generate(..., cache_prompt=False) keeps a request from reusing one",
}


def vllm_prompts(prompts: Any, where: str) -> list[Any]:
    """vLLM's generate() prompts (one prompt or a list of them, each in any of vLLM's forms) as a
    list of the Engine's prompts."""
    items = [prompts] if isinstance(prompts, (str, dict)) else list(prompts)
    return [vllm_prompt(p, f"{where}: prompts[{i}]") for i, p in enumerate(items)]


class Tokenizer(Protocol):
    """What tokenizes a text prompt: the Engine."""

    def tokenize(self, text: bytes | str, add_bos: bool = True, special: bool = False) -> list[int]: ...


def prompt_fields(prompt: Any, tokenizer: Tokenizer) -> dict[str, Any]:
    """vLLM's `prompt` and `prompt_token_ids` of a prompt: a text prompt's tokens as the server
    tokenizes it (start token added, special text parsed); token ids as given; chat messages have
    neither."""
    if isinstance(prompt, str):
        return {"prompt": prompt, "prompt_token_ids": tokenizer.tokenize(prompt, special=True)}
    if is_prompt(prompt):
        return {"prompt": None, "prompt_token_ids": list(prompt)}
    return {"prompt": None, "prompt_token_ids": None}
