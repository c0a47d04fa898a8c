"""llama-preempt: KV preemption for llama.cpp's HTTP server."""
from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

__all__ = ["__version__", "simulate"]


def simulate(*args: Any, **kwargs: Any) -> Any:
    """The server loop in simulation with the server's own planner; see llama_preempt.simulator."""
    from .simulator import simulate as _simulate

    return _simulate(*args, **kwargs)
