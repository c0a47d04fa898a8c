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
    """vLLM's prompt dicts as the Engine's prompts: {"prompt": text} is the text, {"prompt_token_ids":
    [...]} the ids; anything else as given."""
    if not isinstance(p, dict):
        return p
    if "prompt" in p:
        return p["prompt"]
    if "prompt_token_ids" in p:
        return list(p["prompt_token_ids"])
    raise ValueError(f"{where}: a prompt dict must have 'prompt' or 'prompt_token_ids', got keys {sorted(p)}")


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
