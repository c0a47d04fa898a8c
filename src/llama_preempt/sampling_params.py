"""vLLM's `vllm.sampling_params` module under this library's name: `from
llama_preempt.sampling_params import SamplingParams, BeamSearchParams, RequestOutputKind` works
where a program imported them from vllm.sampling_params."""
from __future__ import annotations

from .outputs import RequestOutputKind
from .sampling import BeamSearchParams, SamplingParams

__all__ = ["BeamSearchParams", "RequestOutputKind", "SamplingParams"]
