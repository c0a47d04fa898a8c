"""The unpatched llama-server for the benchmarks' "stock" cell, built once into build/stock.

The source is the same pinned sdist as ours, extracted without patches/ (vendor/fetch.py
--pristine), configured with the same options (cmake/llama-options.cmake), so "stock" and "ours"
differ only by the patches. The tree sits at the same place relative to its build dir as
vendor/llama.cpp does relative to ours, so with ccache (CCACHE_BASEDIR = the repository) every object
the patches do not touch is a cache hit.

    python bench/stock.py          # build (or reuse) and print the binary's path
"""
from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from results_io import ROOT  # bench/ is on sys.path when run as a script

STOCK = ROOT / "build" / "stock"
SOURCE = STOCK / "vendor" / "llama.cpp"
BUILD = STOCK / "build" / "release"


class StockBuildError(RuntimeError):
    pass


def _run(cmd: list[str], log: Path) -> None:
    with log.open("a") as f:
        f.write("$ " + " ".join(cmd) + "\n")
        f.flush()
        proc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT,
                              env={**os.environ, "CCACHE_BASEDIR": str(ROOT), "CCACHE_NOHASHDIR": "1"})
    if proc.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:])
        raise StockBuildError(f"{' '.join(cmd[:3])} ... failed (exit {proc.returncode}); {log}:\n{tail}")


def _same_compilers() -> list[str]:
    """The compilers of our own build (ccache keys on the compiler: c++ and g++ differ)."""
    out = []
    for cache in sorted((ROOT / "build").glob("*/CMakeCache.txt")):
        if cache.parent.name == "stock":
            continue
        for line in cache.read_text(errors="replace").splitlines():
            for var in ("CMAKE_C_COMPILER", "CMAKE_CXX_COMPILER"):
                if line.startswith(var + ":"):
                    out.append(f"-D{var}={line.split('=', 1)[1]}")
        if out:
            return out
    return out


def stock_server(log=print) -> Path:
    """The stock binary, built on first use (minutes; seconds with a warm ccache)."""
    exe = BUILD / "bin" / "llama-server"
    if exe.is_file():
        return exe
    STOCK.mkdir(parents=True, exist_ok=True)
    build_log = STOCK / "build.log"
    if not (SOURCE / "CMakeLists.txt").is_file():
        log(f"stock: extracting the unpatched llama.cpp into {SOURCE.relative_to(ROOT)}")
        _run([sys.executable, str(ROOT / "vendor" / "fetch.py"), "--pristine", str(SOURCE)], build_log)
    gen = ["-G", "Ninja"] if shutil.which("ninja") else []
    gen += _same_compilers()
    log(f"stock: building the unpatched llama-server into {BUILD.relative_to(ROOT)} (log: {build_log.relative_to(ROOT)})")
    # the same backend as ours: CMAKE_ARGS (e.g. -DGGML_CUDA=ON) is how our build is asked for one
    backend = shlex.split(os.environ.get("CMAKE_ARGS", ""))
    _run(["cmake", "-S", str(ROOT / "bench" / "stock"), "-B", str(BUILD), *gen, *backend, "-DCMAKE_BUILD_TYPE=Release",
          f"-DLLAMA_STOCK_SOURCE={SOURCE}"], build_log)
    _run(["cmake", "--build", str(BUILD), "--target", "llama-server", "-j", str(os.cpu_count() or 2)], build_log)
    if not exe.is_file():
        raise StockBuildError(f"the stock build finished but {exe} is missing; see {build_log}")
    return exe


if __name__ == "__main__":
    print(stock_server())
