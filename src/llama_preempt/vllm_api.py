"""vLLM's offline classes over the Engine: `LLM` (generate, chat, embed) and `AsyncLLM`
(`from_engine_args(AsyncEngineArgs(model=...))`, `generate(prompt, sampling_params, request_id)`
streaming RequestOutputs, `abort`, `shutdown`), so a vLLM program runs by changing its imports
and the model (a GGUF file):

    from llama_preempt import LLM, SamplingParams     # was: from vllm import LLM, SamplingParams
    llm = LLM(model="model.gguf")
    for o in llm.generate(["Hello, my name is"], SamplingParams(temperature=0.8, top_p=0.95)):
        print(o.prompt, o.outputs[0].text)

`LLM` holds the Engine it starts (`llm.engine`), `AsyncLLM` the AsyncEngine (`.engine` is then
that AsyncEngine's Engine); what they do not answer themselves, the Engine's own calls (and, on
`LLM`, llama-cpp-python's, as when it was an Engine) answer on them, forwarded.
"""
from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from typing import Any, Sequence

from .aio import AsyncEngine
from .engine import Engine
from .facade import EngineFacade
from .llamacpp_api import LlamaCalls
from .prompts import vllm_prompts
from .reports import Completion
from .sampling import SamplingParams

# vLLM engine arguments that choose how vLLM runs on its GPUs; llama.cpp has no such choice (its
# KV pool is n_ctx, max_model_len here), so they are taken and change nothing
_NO_EFFECT = {"trust_remote_code": False, "enforce_eager": False, "gpu_memory_utilization": 0.9, "dtype": "auto",
              "swap_space": 4, "disable_log_stats": False}


def _engine_kwargs(where: str, model: str | os.PathLike[str], max_model_len: int | None, max_num_seqs: int | None,
                   seed: int | None, tensor_parallel_size: int, quantization: str | None, tokenizer: str | None,
                   task: str, extra: dict[str, Any]) -> dict[str, Any]:
    for name, default in _NO_EFFECT.items():
        extra.pop(name, default)
    if tokenizer is not None:
        raise ValueError(f"{where}: tokenizer= — a GGUF file carries its tokenizer; leave it None")
    if quantization is not None:
        raise ValueError(f"{where}: quantization= — a GGUF file's types are fixed when it is made; pick the file")
    if tensor_parallel_size != 1:
        raise NotImplementedError(f"{where}: tensor_parallel_size={tensor_parallel_size}: llama.cpp splits a model "
                                  "over several GPUs by layers or rows: args=['-sm', 'row'] (or 'layer')")
    if task not in ("auto", "generate", "embed"):
        raise ValueError(f"{where}: task={task!r}: one of 'auto', 'generate', 'embed'")
    # A seeded request gives the same tokens every time, as vLLM users expect of SamplingParams(seed=):
    # without batch-invariant kernels a request's logits change with the batch it shares and where its
    # cells lie, so in one program the same seeded request came out different once others had run
    # (the slots it got, its prompt from the cache, its neighbours differ). deterministic=False opts
    # out (prefill at about 0.73x on SmolLM2; decode within noise: bench/README.md); it needs flash
    # attention, so a caller who turned that off keeps the default kernels.
    fa_off = extra.get("flash_attn") is False or _flag_value(extra.get("args", ()), ("-fa", "--flash-attn")) == "off"
    extra.setdefault("deterministic", not fa_off)
    return {"model": model, "n_ctx": max_model_len, "n_parallel": max_num_seqs, "seed": seed,
            "embedding": task == "embed", **extra}


def _flag_value(args: Any, names: tuple[str, ...]) -> str | None:
    """The value given to one of `names` in an args list or string (None: not given)."""
    items = args.split() if isinstance(args, str) else list(args)
    for i, a in enumerate(items[:-1]):
        if a in names:
            return str(items[i + 1])
    return None


class LLM(EngineFacade):
    """vLLM's `LLM` over the Engine: `LLM(model="model.gguf", max_model_len=4096, max_num_seqs=8)`.
    `generate` returns RequestOutputs (Completion), `chat` renders the model's chat template and
    generates from it, `embed` needs task="embed". The Engine's own calls, and llama-cpp-python's,
    work on it too (forwarded to the Engine it holds, `.engine`)."""

    def __init__(self, model: str | os.PathLike[str], *, max_model_len: int | None = None,
                 max_num_seqs: int | None = None, seed: int | None = None, tensor_parallel_size: int = 1,
                 quantization: str | None = None, tokenizer: str | None = None, task: str = "auto",
                 **kwargs: Any) -> None:
        super().__init__(Engine(**_engine_kwargs("LLM()", model, max_model_len, max_num_seqs, seed,
                                                 tensor_parallel_size, quantization, tokenizer, task, dict(kwargs))))
        self._llama = LlamaCalls(self.engine)  # llama-cpp-python's calls, which answered on an LLM before 0.2

    def __getattr__(self, name: str) -> Any:
        calls = self.__dict__.get("_llama")  # it forwards the rest to the Engine
        if calls is None or (name.startswith("__") and name.endswith("__")):
            raise AttributeError(f"'LLM' object has no attribute {name!r}")
        return getattr(calls, name)

    def __call__(self, prompt: str | list[int], *args: Any, **kwargs: Any) -> Any:
        """llama-cpp-python's `llm(prompt, ...)` (create_completion), as on the Engine."""
        return self._llama(prompt, *args, **kwargs)

    def generate(self, prompts: Any, sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
                 use_tqdm: bool = True, **fields: Any) -> list[Any]:
        """vLLM's generate: a prompt or a list of them (text, {"prompt": text} or
        {"prompt_token_ids": [...]}), one RequestOutput each, in order. `use_tqdm` is accepted (no
        progress bar is drawn). The Engine's own keywords (timeout=, return_exceptions=) work too."""
        if not isinstance(use_tqdm, bool):
            raise TypeError(f"generate(): use_tqdm must be True or False, got {use_tqdm!r}")
        return self.engine.generate(vllm_prompts(prompts, "generate()"), sampling_params, **fields)

    def chat(self, messages: Any, sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
             use_tqdm: bool = True, add_generation_prompt: bool = True, chat_template_kwargs: dict[str, Any] | None = None,
             tools: list[dict[str, Any]] | None = None, **fields: Any) -> list[Completion]:
        """vLLM's chat: one conversation (a list of messages) or a list of them, each rendered with
        the model's chat template (or the Engine's chat_format; `tools` and `chat_template_kwargs`
        go to the template) and generated from; RequestOutputs whose `prompt` is the rendered text."""
        if not isinstance(messages, (list, tuple)) or not messages:
            raise ValueError("chat(): messages must be a conversation (a list of messages) or a list of them, "
                             "and not empty")
        convs = [messages] if isinstance(messages[0], dict) else list(messages)
        rendered = [self.engine.render_chat(conv, add_generation_prompt, chat_template_kwargs=chat_template_kwargs,
                                            tools=tools) for conv in convs]
        return self.generate(rendered, sampling_params, use_tqdm=use_tqdm, **fields)

    def embed(self, prompts: Any, *args: Any, **kwargs: Any) -> Any:
        """vLLM's embed: one EmbeddingRequestOutput per prompt (`.outputs.embedding`). The
        llama-cpp-python form (embed(input, normalize=...)) answers when called with its keywords."""
        kwargs.pop("use_tqdm", None)  # vLLM's: no bar is drawn
        if args or kwargs:
            return self._llama.embed(prompts, *args, **kwargs)
        texts = [prompts] if isinstance(prompts, str) else list(prompts)
        return [EmbeddingRequestOutput(t, EmbeddingOutput(list(e))) for t, e in zip(texts, self._llama.embed(texts))]

    def get_tokenizer(self) -> Any:
        raise NotImplementedError("get_tokenizer(): the tokenizer is the GGUF's, inside llama.cpp; use "
                                  "llm.tokenize(text) and llm.detokenize(ids)")

    def beam_search(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("beam_search(): llama.cpp's server samples one sequence per slot; for several "
                                  "answers use generate(prompts, SamplingParams(n=beam_width, ...)) and rank them by "
                                  "outputs[i].cumulative_logprob (with logprobs=1)")

    def encode(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("encode(): use embed() on an LLM(task='embed')")

    def score(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("score(): start llama-server with --reranking and POST /rerank (request('POST', "
                                  "'/rerank', {...}) on an Engine(args=['--reranking']))")

    def sleep(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("sleep(): close() frees the model; a new LLM loads it again")


@dataclass
class EmbeddingOutput:
    embedding: list[float]


@dataclass
class EmbeddingRequestOutput:
    prompt: str
    outputs: EmbeddingOutput
    finished: bool = True


@dataclass
class AsyncEngineArgs:
    """vLLM's AsyncEngineArgs, for AsyncLLM.from_engine_args; `engine_kwargs` are the Engine's own
    (n_parallel, preempt_ram_mib, args, ...)."""

    model: str
    max_model_len: int | None = None
    max_num_seqs: int | None = None
    seed: int | None = None
    tensor_parallel_size: int = 1
    quantization: str | None = None
    tokenizer: str | None = None
    task: str = "auto"
    enforce_eager: bool = False
    trust_remote_code: bool = False
    gpu_memory_utilization: float = 0.9
    dtype: str = "auto"
    disable_log_stats: bool = False
    engine_kwargs: dict[str, Any] = field(default_factory=dict)


EngineArgs = AsyncEngineArgs


class AsyncLLM:
    """vLLM's AsyncLLM over the AsyncEngine it holds: `AsyncLLM.from_engine_args(AsyncEngineArgs(model=...))`,
    `async for out in engine.generate(prompt, sampling_params, request_id)`, `await abort(id)`,
    `shutdown()`. The AsyncEngine's own calls work on it too (forwarded; `.engine` is its Engine)."""

    def __init__(self, model: str | os.PathLike[str], args: Sequence[str] | str = (), *,
                 disable_log_stats: bool = False, **kwargs: Any) -> None:
        """Load the model (this blocks); the keywords are the Engine's. vLLM's own way in is
        from_engine_args. `disable_log_stats=True` leaves each output's `metrics` None, as in vLLM."""
        self.async_engine = AsyncEngine(model, args, **kwargs)
        self._log_stats = not disable_log_stats

    @classmethod
    def from_engine_args(cls, engine_args: AsyncEngineArgs, **_: Any) -> "AsyncLLM":
        a = engine_args
        kw = _engine_kwargs("AsyncLLM.from_engine_args()", a.model, a.max_model_len, a.max_num_seqs, a.seed,
                            a.tensor_parallel_size, a.quantization, a.tokenizer, a.task, dict(a.engine_kwargs))
        return cls(kw.pop("model"), disable_log_stats=a.disable_log_stats, **kw)

    def __getattr__(self, name: str) -> Any:
        held = self.__dict__.get("async_engine")
        if held is None or (name.startswith("__") and name.endswith("__")):
            raise AttributeError(f"'AsyncLLM' object has no attribute {name!r}")
        return getattr(held, name)

    async def __aenter__(self) -> "AsyncLLM":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.async_engine.aclose()

    def generate(self, prompt: Any = None, sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
                 request_id: str | None = None, *, priority: int = 0, **fields: Any) -> Any:
        """vLLM's AsyncLLM.generate (AsyncEngine.generate): `async for out in
        engine.generate(prompt, params, request_id)`, a RequestOutput at each step; each carries
        `metrics` (a RequestStateStats) unless disable_log_stats."""
        outs = self.async_engine.generate(prompt, sampling_params, request_id, priority=priority, **fields)
        return outs if self._log_stats else _without_metrics(outs)

    async def abort(self, request_id: str | Sequence[str]) -> None:
        """vLLM's abort (AsyncEngine.abort): the request(s) end with finish_reason "abort"."""
        await self.async_engine.abort(request_id)

    def shutdown(self) -> None:
        """Cancel what is pending and free the model (vLLM's sync shutdown): AsyncEngine.close()."""
        self.async_engine.close()


async def _without_metrics(outs: Any) -> Any:
    """AsyncLLM(disable_log_stats=True): the outputs without their measured `metrics`, as vLLM's."""
    from dataclasses import replace
    async with contextlib.aclosing(outs) as it:
        async for out in it:
            yield replace(out, metrics=None)
