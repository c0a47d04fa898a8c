"""The unpatched llama-server for the benchmarks' "stock" cell, built once into build/stock.

The source is our vendored tree with patches/ reversed, which is the pinned sdist's tree exactly
(this works offline, from our own sdist too), configured with the same options
(cmake/llama-options.cmake), so "stock" and "ours" differ only by the patches. The tree sits at the same place relative to its build dir as
vendor/llama.cpp does relative to ours, so with ccache (CCACHE_BASEDIR = the repository) every object
the patches do not touch is a cache hit.

    python bench/stock.py          # build (or reuse) and print the binary's path
"""
from __future__ import annotations

import os
import shlex
import shutil
import subprocess
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


def unpatch(dest: Path, log: Path) -> None:
    """The pristine tree, offline: a copy of vendor/llama.cpp with the patch series reversed (the
    sdist of llama-cpp-python may not be cached where the bench runs, a GPU machine say)."""
    tree = ROOT / "vendor" / "llama.cpp"
    if not (tree / "CMakeLists.txt").is_file():
        raise StockBuildError("vendor/llama.cpp is missing: build the package first (pip install .)")
    tmp = dest.with_name(dest.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(tree, tmp, ignore=shutil.ignore_patterns(".llama-preempt-stamp.json"))
    env = {**os.environ, "GIT_CEILING_DIRECTORIES": str(tmp.parent)}
    for patch in sorted((ROOT / "patches").glob("*.patch"), reverse=True):
        cmd = ["git", "apply", "-R", "-p1", str(patch)] if shutil.which("git") else \
              ["patch", "-R", "-p1", "--batch", "-i", str(patch)]
        proc = subprocess.run(cmd, cwd=tmp, capture_output=True, text=True, env=env)
        if proc.returncode != 0:
            raise StockBuildError(f"taking {patch.name} back out failed: {proc.stderr or proc.stdout}")
        with log.open("a") as f:
            f.write(f"reversed {patch.name}\n")
    shutil.rmtree(dest, ignore_errors=True)
    os.replace(tmp, dest)


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
        log(f"stock: the unpatched llama.cpp into {SOURCE.relative_to(ROOT)} (our tree with patches/ taken back out)")
        unpatch(SOURCE, build_log)
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
