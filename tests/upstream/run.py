#!/usr/bin/env python3
"""Run llama.cpp's own server test suite against our llama-server, offline (see
tests/upstream/llama_preempt_upstream.py for how their harness is adapted from outside).

    python tests/upstream/run.py                  # -n 2 -m "not slow", as upstream's tests.sh
    python tests/upstream/run.py unit/test_basic.py -x   # any pytest arguments instead

Needs the packages in their requirements (pip install '.[upstream]') and the stories260K test model:
$LLAMA_PREEMPT_TEST_MODEL, else ../shared/models/stories260K.gguf; without it there is nothing
to run and it says so (exit 0 with everything skipped would prove nothing).
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
TESTS = ROOT / "vendor" / "llama.cpp" / "tools" / "server" / "tests"


def model() -> Path | None:
    explicit = os.environ.get("LLAMA_PREEMPT_TEST_MODEL")
    if explicit:
        return Path(explicit)
    shared = ROOT.parent / "shared" / "models" / "stories260K.gguf"
    return shared if shared.is_file() else None


def main(argv: list[str]) -> int:
    from llama_preempt.binary import server_binary

    m = model()
    if m is None:
        print("upstream tests: no stories260K model (set LLAMA_PREEMPT_TEST_MODEL): not run", file=sys.stderr)
        return 3
    exe = server_binary()
    # the web UI is in the build when vendor/ui.py put its assets in the tree; only then do
    # upstream's two UI tests run
    ui = "1" if (ROOT / "vendor" / "llama.cpp" / "tools" / "ui" / "dist" / "index.html").is_file() else "0"
    env = {**os.environ, "LLAMA_SERVER_BIN_PATH": str(exe), "LLAMA_PREEMPT_UPSTREAM_MODEL": str(m),
           "LLAMA_PREEMPT_UPSTREAM_UI": ui,
           # upstream's tests specify upstream's pool: `-np N` splits -c into N fixed shares (they
           # check n_ctx per slot and the errors at a share's end). Our llama-server shares one
           # pool under -np N while preemption is on; --no-kv-unified (this env twin) is the
           # documented way back to the split, so each test checks what it was written for. Tests
           # that pass --kv-unified themselves still get one pool, with preemption active.
           "LLAMA_ARG_KV_UNIFIED": "0",
           "LLAMA_CACHE": str(ROOT / "build" / "upstream-cache"),
           "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    # upstream's own default (tests.sh): the slow tests need their big models and SLOW_TESTS=1
    args = argv or ["-n", "2", "-m", "not slow"]
    cmd = [sys.executable, "-m", "pytest", "unit", "-p", "llama_preempt_upstream", "-q", "-rfEs",
           "-p", "no:cacheprovider", *args]
    return subprocess.run(cmd, cwd=TESTS, env=env).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
