"""llama-cpp-python's `Llama` constructor over the Engine: every keyword of `llama_cpp.Llama(...)`
is taken, as the llama-server flag that does the same, or refused saying what to use instead, so

    from llama_preempt import Llama        # was: from llama_cpp import Llama
    llm = Llama(model_path="model.gguf", n_ctx=2048, n_gpu_layers=-1, flash_attn=True, use_mlock=True)

runs as it did, now with many requests at once and preemption underneath. `Llama` holds the
Engine it starts (`llm.engine`); its calls are llama-cpp-python's (`llm(prompt)`,
`create_chat_completion`, `set_seed`, ...: llamacpp_api.py) and the Engine's own answer on it too
(`llm.submit`, `llm.stats()`, ...). `n_ctx` is the KV pool every slot shares (default: the model's
trained context, not llama_cpp's 512). `Llama.from_pretrained(repo_id, filename)` loads a file
already in the local Hugging Face cache (hub.py); nothing is downloaded.
"""
from __future__ import annotations

import inspect
import os
import shlex
import shutil
import tempfile
from typing import Any, Callable

from .checks import closest
from .engine import Engine
from .hub import hub_snapshot
from .llama_attrs import LlamaAttributes

_GGML_TYPES = {0: "f32", 1: "f16", 2: "q4_0", 3: "q4_1", 6: "q5_0", 7: "q5_1", 8: "q8_0", 30: "bf16"}
_SPLIT_MODES = {0: "none", 1: "layer", 2: "row"}
_POOLING = {0: "none", 1: "mean", 2: "cls", 3: "last", 4: "rank"}
_ROPE_SCALING = {0: "none", 1: "linear", 2: "yarn", 3: "longrope"}


def _named(table: dict[int, str], flag: str) -> Callable[[Any], list[str]]:
    """A flag whose value llama_cpp gives as its enum's int (or already as the name)."""
    def to_flag(v: Any) -> list[str]:
        if isinstance(v, str):
            return [flag, v]
        if v not in table:
            raise ValueError(f"Llama(): {v!r} is not one of {sorted(table)} ({', '.join(table.values())})")
        return [flag, table[v]]
    return to_flag


def _kv_override(overrides: dict[str, Any]) -> list[str]:
    out: list[str] = []
    for key, v in overrides.items():
        kind = "bool" if isinstance(v, bool) else "int" if isinstance(v, int) else "float" if isinstance(v, float) else "str"
        out += ["--override-kv", f"{key}={kind}:{str(v).lower() if kind == 'bool' else v}"]
    return out


def _refuse(why: str) -> Callable[[Any], list[str]]:
    def refused(v: Any) -> list[str]:
        raise NotImplementedError(why)
    return refused


# llama_cpp.Llama keyword -> (its default: nothing to pass, the flags of another value)
_KEYWORDS: dict[str, tuple[Any, Callable[[Any], list[str]]]] = {
    "split_mode": (1, _named(_SPLIT_MODES, "-sm")),
    "main_gpu": (0, lambda v: ["-mg", str(v)]),
    "tensor_split": (None, lambda v: ["-ts", ",".join(str(x) for x in v)]),
    "rpc_servers": (None, lambda v: ["--rpc", v if isinstance(v, str) else ",".join(v)]),
    "vocab_only": (False, _refuse("Llama(vocab_only=True): the Engine serves requests and needs the weights; to "
                                  "tokenize only, load the model and call tokenize()")),
    "use_mmap": (True, lambda v: []),   # below: the two are llama-server's one --load-mode
    "use_mlock": (False, lambda v: []),
    "kv_overrides": (None, _kv_override),
    "n_ubatch": (512, lambda v: ["-ub", str(v)]),
    "n_threads_batch": (None, lambda v: ["-tb", str(v)]),
    "rope_scaling_type": (-1, _named(_ROPE_SCALING, "--rope-scaling")),
    "pooling_type": (-1, _named(_POOLING, "--pooling")),
    "rope_freq_base": (0.0, lambda v: ["--rope-freq-base", str(v)]),
    "rope_freq_scale": (0.0, lambda v: ["--rope-freq-scale", str(v)]),
    "yarn_ext_factor": (-1.0, lambda v: ["--yarn-ext-factor", str(v)]),
    "yarn_attn_factor": (1.0, lambda v: ["--yarn-attn-factor", str(v)]),
    "yarn_beta_fast": (32.0, lambda v: ["--yarn-beta-fast", str(v)]),
    "yarn_beta_slow": (1.0, lambda v: ["--yarn-beta-slow", str(v)]),
    "yarn_orig_ctx": (0, lambda v: ["--yarn-orig-ctx", str(v)]),
    "logits_all": (False, lambda v: []),  # logprobs are asked per request (logprobs=N): nothing to keep
    "offload_kqv": (True, lambda v: [] if v else ["--no-kv-offload"]),
    "flash_attn": (None, lambda v: ["-fa", "on" if v else "off"]),  # None: llama.cpp's own choice (auto)
    "op_offload": (None, lambda v: [] if v else ["--no-op-offload"]),
    "swa_full": (None, lambda v: ["--swa-full"] if v else []),
    "no_perf": (False, lambda v: ["--no-perf"] if v else []),
    "last_n_tokens_size": (64, lambda v: ["--repeat-last-n", str(v)]),
    "lora_base": (None, _refuse("Llama(lora_base=...): llama.cpp applies an adapter to the model itself; pass "
                                "lora_path= alone")),
    "lora_scale": (1.0, lambda v: []),  # read with lora_path
    "lora_path": (None, lambda v: []),  # below, with its scale
    "numa": (False, lambda v: ["--numa", v if isinstance(v, str) else "distribute"] if v else []),
    "chat_handler": (None, _refuse("Llama(chat_handler=...): a Python chat handler cannot run in llama.cpp's C++ "
                                   "server; use chat_format= or args=['--chat-template-file', PATH]")),
    "draft_model": (None, _refuse("Llama(draft_model=...): speculative decoding is the server's: "
                                  "args=['-md', DRAFT.gguf] or args=['--spec-type', 'draft-mtp']")),
    "tokenizer": (None, _refuse("Llama(tokenizer=...): the tokenizer is the GGUF's, inside llama.cpp")),
    "type_k": (None, _named(_GGML_TYPES, "-ctk")),
    "type_v": (None, _named(_GGML_TYPES, "-ctv")),
    "spm_infill": (False, lambda v: ["--spm-infill"] if v else []),
}
_LLAMA_SEED_DEFAULT = 0xFFFFFFFF  # llama_cpp.LLAMA_DEFAULT_SEED: a random seed


def llama_flags(**given: Any) -> list[str]:
    """The llama-server flags of llama_cpp.Llama keywords (those at their default give none)."""
    argv: list[str] = []
    for name, value in given.items():
        default, to_flags = _KEYWORDS[name]
        if value is not None and value != default:
            argv += to_flags(value)
    mmap, mlock = given.get("use_mmap", True), given.get("use_mlock", False)
    if (mmap, mlock) != (True, False):
        argv += ["--load-mode", {(False, False): "none", (False, True): "mlock", (True, True): "mmap+mlock"}[
            (bool(mmap), bool(mlock))]]
    if given.get("lora_path"):
        scale = given.get("lora_scale", 1.0)
        argv += ["--lora", given["lora_path"]] if scale == 1.0 else ["--lora-scaled", given["lora_path"], str(scale)]
    return argv


class Llama(LlamaAttributes):
    """llama_cpp.Llama over the Engine; see the module's docstring. The Engine's own keywords
    (n_parallel, preempt_ram_mib, args, ...) are taken too. Its one stateful context (eval,
    sample, generate, reset, n_tokens, input_ids) is llama_context.py's; llama_cpp's other
    attributes are llama_attrs.py's and the constructor's keywords, kept as attributes below."""

    def __init__(self, model_path: str | os.PathLike[str], *, n_gpu_layers: int = 0,
                 seed: int = _LLAMA_SEED_DEFAULT, n_ctx: int | None = None, n_batch: int | None = None,
                 n_threads: int | None = None, embedding: bool = False, chat_format: str | None = None,
                 verbose: bool = True, **kwargs: Any) -> None:
        # llama_cpp's __getstate__: a pickled Llama is a new one of the same keywords
        self._init_kwargs: dict[str, Any] = {
            "model_path": model_path, "n_gpu_layers": n_gpu_layers, "seed": seed, "n_ctx": n_ctx, "n_batch": n_batch,
            "n_threads": n_threads, "embedding": embedding, "chat_format": chat_format, "verbose": verbose, **kwargs}
        self._keep_attributes(model_path, n_batch, n_threads, chat_format, verbose, kwargs)
        llama = {k: kwargs.pop(k) for k in list(kwargs) if k in _KEYWORDS}
        own = set(inspect.signature(Engine.__init__).parameters) - {"self", "model", "model_path"}
        for name in kwargs:
            if name not in own:
                raise TypeError(f"Llama() got an unexpected keyword argument {name!r}"
                                f"{closest(name, own | set(_KEYWORDS) | {'n_gpu_layers', 'seed', 'n_ctx'})}")
        args = kwargs.pop("args", ())
        argv = shlex.split(args) if isinstance(args, str) else [str(a) for a in args]
        # llama_cpp's -1 is every layer (llama-server's "all"; its own -1 is "auto"); its 0, the CPU, is
        # left to llama.cpp's own choice, which is the CPU where no GPU is
        if n_gpu_layers:
            argv += ["-ngl", "all" if n_gpu_layers == -1 else str(n_gpu_layers)]
        # save_state()/load_state() copy a slot's state through the server's slot files: a directory
        # of this Llama's own unless the caller named one
        self._state_dir: str | None = None
        if "--slot-save-path" not in argv:
            self._state_dir = tempfile.mkdtemp(prefix="llama-preempt-state-")
            argv += ["--slot-save-path", self._state_dir]
        try:
            super().__init__(Engine(model_path=model_path, args=[*argv, *llama_flags(**llama)],
                                    seed=None if seed == _LLAMA_SEED_DEFAULT else seed, n_ctx=n_ctx, n_batch=n_batch,
                                    n_threads=n_threads, embedding=embedding, chat_format=chat_format,
                                    verbose=verbose, **kwargs))
        except BaseException:
            if self._state_dir is not None:
                shutil.rmtree(self._state_dir, ignore_errors=True)
            raise

    def _keep_attributes(self, model_path: str | os.PathLike[str], n_batch: int | None, n_threads: int | None,
                         chat_format: str | None, verbose: bool, kwargs: dict[str, Any]) -> None:
        """llama_cpp.Llama's attributes of its constructor's keywords: as given (None where llama.cpp
        chooses: n_threads, n_threads_batch; chat_format None is the model's own template)."""
        self.model_path = str(model_path)
        self.n_batch = n_batch if n_batch is not None else 2048  # llama-server's -b
        self.n_threads = n_threads
        self.n_threads_batch = kwargs.get("n_threads_batch")
        self.chat_format = chat_format
        self.verbose = verbose
        for name in ("kv_overrides", "last_n_tokens_size", "lora_base", "lora_path", "lora_scale", "numa",
                     "spm_infill", "tensor_split", "chat_handler", "draft_model"):
            setattr(self, name, kwargs.get(name, _KEYWORDS[name][0]))

    def __getstate__(self) -> dict[str, Any]:
        """llama_cpp pickles a Llama as its constructor's keywords; unpickling loads the model again."""
        return dict(self._init_kwargs)

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(**state)  # type: ignore[misc]

    def close(self, *, drain: float = 0.0) -> None:
        """Close the Engine (see Engine.close) and remove the directory save_state() used."""
        try:
            super().close(drain=drain)
        finally:
            if self._state_dir is not None:
                shutil.rmtree(self._state_dir, ignore_errors=True)

    @classmethod
    def from_pretrained(cls, repo_id: str, filename: str | None, additional_files: list[str] | None = None,
                        local_dir: str | os.PathLike[str] | None = None,
                        local_dir_use_symlinks: bool | str = "auto",
                        cache_dir: str | os.PathLike[str] | None = None, **kwargs: Any) -> "Llama":
        """llama_cpp.Llama.from_pretrained, from the local Hugging Face cache alone: the file of
        `repo_id` that `filename` (a name or a glob, e.g. "*Q4_K_M.gguf") matches, where
        huggingface_hub keeps it (`cache_dir`, else $HF_HUB_CACHE, $HF_HOME/hub or
        ~/.cache/huggingface/hub, at the commit refs/main names; or `local_dir`). Nothing is
        downloaded: a file not there is a FileNotFoundError naming where it looked and
        `model_path=`. `additional_files` (a split model's other parts) must be there too; the
        other keywords are the constructor's."""
        if not isinstance(filename, str) or not filename:
            raise TypeError(f"from_pretrained(): filename must be the model file's name or a glob such as "
                            f"'*Q4_K_M.gguf', got {filename!r}")
        if local_dir_use_symlinks not in (True, False, "auto"):
            raise ValueError(f"from_pretrained(): local_dir_use_symlinks must be True, False or 'auto', got "
                             f"{local_dir_use_symlinks!r}")
        snapshot = hub_snapshot(repo_id, cache_dir=cache_dir, local_dir=local_dir)
        model = snapshot.find(filename)
        for extra in additional_files or []:  # the other parts of a split GGUF load from beside the first
            snapshot.find(extra, what="additional_files")
        return cls(model_path=str(model), **kwargs)
