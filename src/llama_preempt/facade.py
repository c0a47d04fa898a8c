"""What every personality over the Engine shares (llama-cpp-python's `Llama`, vLLM's `LLM`): it
holds the Engine (`.engine`), closes it, and lets the Engine's own calls answer on it too
(`llm.submit(...)`, `llm.stats()`, `llm.args`, ...), forwarded to the Engine it holds."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from .engine import Engine

_F = TypeVar("_F", bound="EngineFacade")


class EngineFacade:
    """A personality over an Engine it holds; see the module's docstring."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def __getattr__(self, name: str) -> Any:
        # only reached for what the facade itself lacks: the Engine's own calls and attributes
        engine = self.__dict__.get("engine")
        if engine is None or (name.startswith("__") and name.endswith("__")):
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        return getattr(engine, name)

    def __dir__(self) -> list[str]:
        engine = self.__dict__.get("engine")
        return sorted(set(super().__dir__()) | (set(dir(engine)) if engine is not None else set()))

    def __enter__(self: _F) -> _F:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self, *, drain: float = 0.0) -> None:
        """Close the Engine: see Engine.close (a second close does nothing)."""
        self.engine.close(drain=drain)

    @property
    def closed(self) -> bool:
        return self.engine.closed
