"""llama-server's flags from named settings: one builder for the Engine (in process) and for
ServerConfig (a llama-server child), so both spell every setting the same way."""
from __future__ import annotations

import os
from typing import Union

# value flags: setting name -> flag
_VALUE_FLAGS = (
    ("n_ctx", "-c"), ("n_parallel", "-np"), ("n_batch", "-b"), ("n_ubatch", "-ub"),
    ("preempt_ram_mib", "--preempt-ram"), ("preempt_mode", "--preempt-mode"), ("preempt_disk", "--preempt-disk"),
    ("preempt_disk_mib", "--preempt-disk-mib"), ("n_predict", "-n"),
    ("seed", "--seed"), ("threads", "-t"), ("n_gpu_layers", "-ngl"), ("cache_ram_mib", "--cache-ram"),
)
# on/off flags: setting name -> (flag when True, flag when False)
_SWITCHES = (
    ("kv_unified", "--kv-unified", "--no-kv-unified"),
    ("preempt", "--preempt", "--no-preempt"),
    ("metrics", "--metrics", None),
    ("slots", "--slots", "--no-slots"),
    ("deterministic", "--deterministic", None),
    ("embedding", "--embedding", None),
)

Value = Union[int, str, bool, "os.PathLike[str]", None]


def server_flags(model: str | os.PathLike[str], **settings: Value) -> list[str]:
    """`-m MODEL` and a flag for every setting that is not None (a switch set to False gives its
    --no- form where llama-server has one). Raises TypeError for a setting it does not know."""
    known = {name for name, _ in _VALUE_FLAGS} | {name for name, _, _ in _SWITCHES}
    unknown = sorted(set(settings) - known)
    if unknown:
        raise TypeError(f"unknown llama-server setting(s): {', '.join(unknown)}; pass other flags as args")
    argv = ["-m", os.fspath(model)]
    for name, flag in _VALUE_FLAGS:
        value = settings.get(name)
        if value is not None:
            argv += [flag, os.fspath(value) if isinstance(value, os.PathLike) else str(value)]
    for name, on, off in _SWITCHES:
        value = settings.get(name)
        if value is None:
            continue
        chosen = on if value else off
        if chosen is not None:
            argv.append(chosen)
    return argv
