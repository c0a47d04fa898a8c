#!/usr/bin/env python3
"""Fetch llama.cpp from the pinned llama-cpp-python sdist and apply our patch series.

Usage:
    python vendor/fetch.py                 # make vendor/llama.cpp (no-op when up to date)
    python vendor/fetch.py --force         # re-extract and re-patch even when the stamp matches
    python vendor/fetch.py --pristine DIR  # extract the unpatched tree into DIR (for making patches)

The tree comes from the PyPI sdist ``llama-cpp-python==0.3.36``, whose ``vendor/llama.cpp/`` is
upstream llama.cpp at commit 0c1e570 (2026-10-01). We verify the sdist by sha256, extract only
``vendor/llama.cpp/`` into ``vendor/llama.cpp/`` next to this script, then apply
``patches/*.patch`` in name order. A stamp file records the sdist hash and the hash of every patch,
so a second run with nothing changed does nothing.

Standard library only: this runs from CMake's configure step before any package is installed.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

SDIST_NAME = "llama-cpp-python"
SDIST_VERSION = "0.3.36"
SDIST_FILE = "llama_cpp_python-0.3.36.tar.gz"
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
SDIST_PREFIX = "llama_cpp_python-0.3.36/vendor/llama.cpp/"
UPSTREAM_COMMIT = "0c1e570"

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
TREE = HERE / "llama.cpp"
CACHE = HERE / ".cache"
PATCHES = ROOT / "patches"
STAMP = TREE / ".llama-preempt-stamp.json"


class FetchError(RuntimeError):
    pass


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def find_sdist() -> Path:
    """Return a verified copy of the sdist, downloading it with pip when it is not cached."""
    explicit = os.environ.get("LLAMA_PREEMPT_SDIST")
    candidates = [Path(explicit)] if explicit else []
    candidates.append(CACHE / SDIST_FILE)
    for cand in candidates:
        if cand.is_file():
            digest = sha256_of(cand)
            if digest == SDIST_SHA256:
                return cand
            if cand.parent == CACHE:
                cand.unlink()  # a stale or truncated download: fetch it again
            else:
                raise FetchError(f"{cand}: sha256 {digest} does not match the pinned {SDIST_SHA256}")

    CACHE.mkdir(parents=True, exist_ok=True)
    # Inside pip's isolated build environment (pip install .) the interpreter cannot see the pip it
    # came with: PYTHONPATH and PYTHONNOUSERSITE hide it. Run pip without those variables.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONNOUSERSITE", "PYTHONHOME")}
    pips = [[sys.executable, "-m", "pip"]] + [[exe] for exe in ("pip", "pip3") if shutil.which(exe)]
    with tempfile.TemporaryDirectory(dir=CACHE) as tmp:
        got = Path(tmp) / SDIST_FILE
        tried: list[str] = []
        print(f"fetch: downloading {SDIST_NAME}=={SDIST_VERSION} sdist", flush=True)
        # pip also prepares the sdist's metadata (in an isolated build env); we only need the file.
        # Only the sdist itself is asked for as source: `--no-binary :all:` would make that build
        # env build its own requirements from source too (CMake itself: a quarter of an hour on 2
        # cores), so it is only the last resort.
        attempts = [pip + ["download", "--no-deps", "--no-binary", binary, "-d", tmp, f"{SDIST_NAME}=={SDIST_VERSION}"]
                    for binary in (SDIST_NAME, ":all:") for pip in pips]
        for cmd in attempts:
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
            if got.is_file():
                break
            tried.append(f"$ {' '.join(cmd)}\n(exit {proc.returncode}) {proc.stdout[-1500:]}{proc.stderr[-1500:]}")
        if not got.is_file():
            raise FetchError(
                "could not download the llama-cpp-python sdist with pip:\n" + "\n".join(tried) + "\n"
                "Download it by hand with\n"
                f"  pip download --no-deps --no-binary :all: {SDIST_NAME}=={SDIST_VERSION}\n"
                "and point LLAMA_PREEMPT_SDIST at the .tar.gz."
            )
        digest = sha256_of(got)
        if digest != SDIST_SHA256:
            raise FetchError(f"downloaded sdist has sha256 {digest}, expected {SDIST_SHA256}")
        dest = CACHE / SDIST_FILE
        shutil.move(str(got), dest)
    return dest


def extract(sdist: Path, dest: Path) -> None:
    """Extract only vendor/llama.cpp/ of the sdist into dest."""
    tmp = dest.with_name(dest.name + ".partial")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    n = 0
    with tarfile.open(sdist, "r:gz") as tar:
        for member in tar:
            if not member.name.startswith(SDIST_PREFIX):
                continue
            rel = member.name[len(SDIST_PREFIX):]
            parts = Path(rel).parts
            if not rel or rel.startswith("/") or ".." in parts:
                continue
            if parts[0] == ".git":
                continue  # a submodule pointer into llama-cpp-python's own repository
            if not (member.isfile() or member.isdir()):
                continue  # the tree has no links we need; skip anything exotic
            target = tmp / rel
            if member.isdir():
                target.mkdir(parents=True, exist_ok=True)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            src = tar.extractfile(member)
            assert src is not None
            with target.open("wb") as out:
                shutil.copyfileobj(src, out)
            os.chmod(target, 0o755 if member.mode & 0o111 else 0o644)
            n += 1
    if n == 0:
        raise FetchError(f"{sdist} holds no {SDIST_PREFIX}")
    if dest.exists():
        shutil.rmtree(dest)
    tmp.rename(dest)


def patch_files() -> list[Path]:
    return sorted(PATCHES.glob("*.patch"))


def apply_patch(tree: Path, patch: Path) -> None:
    """Apply one patch with git apply (works outside a repository), or patch(1) without git."""
    if shutil.which("git"):
        base = ["git", "apply", "--whitespace=nowarn", "-p1"]
        # the tree sits inside our own repository: stop git from finding it, so paths stay
        # relative to the tree
        env = dict(os.environ, GIT_CEILING_DIRECTORIES=str(tree.resolve().parent))
        check = subprocess.run(base + ["--check", str(patch)], cwd=tree, capture_output=True, text=True, env=env)
        if check.returncode != 0:
            raise FetchError(f"patch {patch.name} does not apply to llama.cpp {UPSTREAM_COMMIT}:\n{check.stderr}")
        subprocess.run(base + [str(patch)], cwd=tree, check=True, env=env)
    elif shutil.which("patch"):
        cmd = ["patch", "-p1", "--forward", "--batch", "-i", str(patch)]
        dry = subprocess.run(cmd + ["--dry-run"], cwd=tree, capture_output=True, text=True)
        if dry.returncode != 0:
            raise FetchError(f"patch {patch.name} does not apply to llama.cpp {UPSTREAM_COMMIT}:\n{dry.stdout}{dry.stderr}")
        subprocess.run(cmd, cwd=tree, check=True, capture_output=True)
    else:
        raise FetchError("applying patches needs git or patch(1) on PATH")


def wanted_stamp() -> dict:
    return {
        "sdist_sha256": SDIST_SHA256,
        "upstream_commit": UPSTREAM_COMMIT,
        "patches": {p.name: sha256_of(p) for p in patch_files()},
    }


def current_stamp() -> dict | None:
    try:
        return json.loads(STAMP.read_text())
    except (OSError, ValueError):
        return None


def ensure_tree(force: bool = False) -> bool:
    """Make vendor/llama.cpp match the pinned sdist plus our patches. Returns True if it changed."""
    want = wanted_stamp()
    if not force and current_stamp() == want:
        return False
    sdist = find_sdist()
    print(f"fetch: extracting llama.cpp {UPSTREAM_COMMIT} from {sdist.name}", flush=True)
    extract(sdist, TREE)
    for p in patch_files():
        print(f"fetch: applying {p.name}", flush=True)
        apply_patch(TREE, p)
    STAMP.write_text(json.dumps(want, indent=2) + "\n")
    return True


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--force", action="store_true", help="re-extract and re-patch unconditionally")
    ap.add_argument("--pristine", metavar="DIR", help="extract the unpatched tree into DIR and exit")
    args = ap.parse_args(argv)
    try:
        if args.pristine:
            extract(find_sdist(), Path(args.pristine).resolve())
            print(f"fetch: unpatched llama.cpp {UPSTREAM_COMMIT} in {args.pristine}")
            return 0
        changed = ensure_tree(force=args.force)
        print("fetch: vendor/llama.cpp " + ("ready" if changed else "up to date"))
        return 0
    except FetchError as e:
        print(f"fetch: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
