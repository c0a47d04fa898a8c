"""Where the binaries installed by this package live: the drop-in llama-server and upstream's
ggml-rpc-server (llama.cpp's RPC backend: a device, or a whole machine, served over TCP)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Callable

# the first line of `llama-server --version` from this package's build (csrc/server/preempt-version.cpp):
# "llama-preempt 0.1.0 (KV preemption for llama-server, upstream llama.cpp 0c1e570)"
IDENTITY_PREFIX = "llama-preempt "


class ServerBinaryNotFound(FileNotFoundError):
    pass


def _packaged(exe: str) -> list[Path]:
    """Where this install puts its binaries: the environment's scripts folder (and, the same in a
    virtual environment, the folder of the running Python)."""
    return [Path(sysconfig.get_path("scripts")) / exe, Path(sys.executable).parent / exe]


def identity(binary: Path, timeout: float = 30.0) -> str:
    """The first line `binary --version` prints (llama-server prints it on stderr)."""
    try:
        p = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=timeout,
                           stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"(`{binary} --version` failed: {e})"
    lines = [line.strip() for line in (p.stderr + "\n" + p.stdout).splitlines() if line.strip()]
    return lines[0] if lines else "(nothing)"


def _is_ours(binary: Path) -> str | None:
    """None when `binary --version` names llama-preempt first; else what it printed instead."""
    first = identity(binary)
    return None if first.startswith(IDENTITY_PREFIX) else first


def _installed_binary(name: str, env_var: str, check: Callable[[Path], str | None] | None = None) -> Path:
    """$env_var, else the copy this install put in the environment's scripts folder, else the first
    `name` on PATH, which `check` (given) must accept: it answers None, or what is wrong with it."""
    explicit = os.environ.get(env_var)
    if explicit:
        p = Path(explicit)
        if not p.is_file():
            raise ServerBinaryNotFound(f"{env_var}={explicit} is not a file")
        return p
    exe = f"{name}.exe" if sys.platform == "win32" else name
    for c in _packaged(exe):
        if c.is_file():
            return c
    found = shutil.which(exe)
    if found and check is not None:
        wrong = check(Path(found))
        if wrong is not None:
            raise ServerBinaryNotFound(
                f"the {name} on PATH ({found}) is not llama-preempt's: its --version says {wrong!r} rather than "
                f"'{IDENTITY_PREFIX}...' (an upstream build has no preemption); install this package "
                f"(pip install llama-preempt), or set {env_var} to the path of llama-preempt's {name}")
    if found:
        return Path(found)
    raise ServerBinaryNotFound(f"{name} not found: install this package (pip install llama-preempt) or set {env_var}")


def server_binary() -> Path:
    """Path of the patched llama-server ($LLAMA_PREEMPT_SERVER overrides); one found only on PATH
    must say it is llama-preempt's (ServerBinaryNotFound otherwise)."""
    return _installed_binary("llama-server", "LLAMA_PREEMPT_SERVER", _is_ours)


def rpc_server_binary() -> Path:
    """Path of upstream's RPC server, built with this package ($LLAMA_PREEMPT_RPC_SERVER overrides)."""
    return _installed_binary("ggml-rpc-server", "LLAMA_PREEMPT_RPC_SERVER")
