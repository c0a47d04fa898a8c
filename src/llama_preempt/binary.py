"""Where the drop-in llama-server binary installed by this package lives."""
from __future__ import annotations

import os
import shutil
import sys
import sysconfig
from pathlib import Path


class ServerBinaryNotFound(FileNotFoundError):
    pass


def server_binary() -> Path:
    """Path of the patched llama-server: $LLAMA_PREEMPT_SERVER, else the one this install put in
    the environment's scripts folder, else the first llama-server on PATH."""
    explicit = os.environ.get("LLAMA_PREEMPT_SERVER")
    if explicit:
        p = Path(explicit)
        if not p.is_file():
            raise ServerBinaryNotFound(f"LLAMA_PREEMPT_SERVER={explicit} is not a file")
        return p
    exe = "llama-server.exe" if sys.platform == "win32" else "llama-server"
    candidates = [Path(sysconfig.get_path("scripts")) / exe, Path(sys.executable).parent / exe]
    for c in candidates:
        if c.is_file():
            return c
    found = shutil.which(exe)
    if found:
        return Path(found)
    raise ServerBinaryNotFound(
        "llama-server not found: install this package (pip install .) or set LLAMA_PREEMPT_SERVER"
    )
