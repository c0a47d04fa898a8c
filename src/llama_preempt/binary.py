"""Where the binaries installed by this package live: the drop-in llama-server and upstream's
ggml-rpc-server (llama.cpp's RPC backend: a device, or a whole machine, served over TCP)."""
from __future__ import annotations

import os
import shutil
import sys
import sysconfig
from pathlib import Path


class ServerBinaryNotFound(FileNotFoundError):
    pass


def _installed_binary(name: str, env_var: str) -> Path:
    """$env_var, else the copy this install put in the environment's scripts folder, else the first
    `name` on PATH."""
    explicit = os.environ.get(env_var)
    if explicit:
        p = Path(explicit)
        if not p.is_file():
            raise ServerBinaryNotFound(f"{env_var}={explicit} is not a file")
        return p
    exe = f"{name}.exe" if sys.platform == "win32" else name
    candidates = [Path(sysconfig.get_path("scripts")) / exe, Path(sys.executable).parent / exe]
    for c in candidates:
        if c.is_file():
            return c
    found = shutil.which(exe)
    if found:
        return Path(found)
    raise ServerBinaryNotFound(f"{name} not found: install this package (pip install .) or set {env_var}")


def server_binary() -> Path:
    """Path of the patched llama-server ($LLAMA_PREEMPT_SERVER overrides)."""
    return _installed_binary("llama-server", "LLAMA_PREEMPT_SERVER")


def rpc_server_binary() -> Path:
    """Path of upstream's RPC server, built with this package ($LLAMA_PREEMPT_RPC_SERVER overrides)."""
    return _installed_binary("ggml-rpc-server", "LLAMA_PREEMPT_RPC_SERVER")
