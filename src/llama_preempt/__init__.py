"""llama-preempt: KV preemption for llama.cpp's HTTP server."""
from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
