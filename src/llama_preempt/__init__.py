"""llama-preempt: KV preemption for llama.cpp's HTTP server, and the same server in process.

    from llama_preempt import Engine, AsyncEngine, SamplingParams

    with Engine("model.gguf", n_ctx=2048, n_parallel=4) as eng:
        outs = eng.generate(["Once upon a time", "The dog"], SamplingParams(max_tokens=64, temperature=0))
        chat = eng.create_chat_completion(messages=[{"role": "user", "content": "Hi"}])  # llama-cpp-python's call

Everything public is importable from here; the compiled core is loaded on first use of a name that
needs it, so `import llama_preempt` (and the `llama-preempt` command) work without it.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# name -> the module that holds it
_EXPORTS = {
    "Engine": "engine", "Llama": "llama", "LlamaGrammar": "grammar", "LlamaState": "llama_state",
    "LLM": "vllm_api", "AsyncLLM": "vllm_api", "AsyncEngineArgs": "vllm_api", "EngineArgs": "vllm_api",
    "RequestOutput": "reports", "CompletionOutput": "outputs", "RequestOutputKind": "outputs", "Logprob": "outputs",
    "FieldTypeError": "checks", "FieldValueError": "checks", "Request": "request", "RequestError": "engine", "RequestCancelled": "request",
    "GenerateError": "engine", "EngineError": "engine", "EngineClosedError": "engine", "EngineBusyError": "engine",
    "ModelLoadError": "engine", "EngineArgumentError": "engine", "ContextSizeError": "errors",
    "AsyncEngine": "aio", "StreamNotice": "aio",
    "SamplingParams": "sampling", "TextPrompt": "inputs", "TokensPrompt": "inputs", "PromptType": "inputs",
    "Completion": "reports", "StepReport": "reports", "ParkEvent": "reports", "ResumeEvent": "reports",
    "EndEvent": "reports", "FailEvent": "reports", "stream_text": "reports",
    "ParkTier": "reports", "ParkReason": "reports", "ParkChoice": "reports", "PreemptMode": "reports", "StopType": "reports",
    "PreemptStats": "stats", "SlotStats": "stats",
    "LlamaServer": "server", "ServerConfig": "server", "ServerStartError": "server",
    "Workload": "simulator", "SimReport": "simulator",
    "run_doctor": "doctor", "DoctorReport": "doctor", "DoctorRoute": "doctor", "DoctorControl": "doctor", "DoctorError": "doctor",
}

__all__ = ["__version__", "simulate", *_EXPORTS]

if TYPE_CHECKING:  # what type checkers and IDEs see; at run time the names load on first use
    from .aio import AsyncEngine, StreamNotice
    from .doctor import DoctorControl, DoctorError, DoctorReport, DoctorRoute, run_doctor
    from .checks import FieldTypeError, FieldValueError
    from .outputs import CompletionOutput, Logprob, RequestOutputKind
    from .reports import Completion as RequestOutput
    from .vllm_api import LLM, AsyncEngineArgs, AsyncLLM, EngineArgs
    from .grammar import LlamaGrammar
    from .llama import Llama
    from .llama_state import LlamaState
    from .errors import ContextSizeError
    from .engine import (Engine, EngineArgumentError, EngineBusyError, EngineClosedError, EngineError, GenerateError,
                         ModelLoadError, Request, RequestCancelled, RequestError)
    from .reports import (Completion, EndEvent, FailEvent, ParkChoice, ParkEvent, ParkReason, ParkTier, PreemptMode,
                          ResumeEvent, StepReport, StopType, stream_text)
    from .inputs import PromptType, TextPrompt, TokensPrompt
    from .sampling import SamplingParams
    from .server import LlamaServer, ServerConfig, ServerStartError
    from .simulator import SimReport, Workload
    from .stats import PreemptStats, SlotStats


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'llama_preempt' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


def simulate(*args: Any, **kwargs: Any) -> Any:
    """The server loop in simulation with the server's own planner; see llama_preempt.simulator."""
    from .simulator import simulate as _simulate

    return _simulate(*args, **kwargs)
