"""llama.cpp's own server test suite, run against our binary (tests/upstream/): every selected test
passes, and the skips are only the listed ones (network models, router mode; see its README)."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RUN = ROOT / "tests" / "upstream" / "run.py"


def failure_report(output: str) -> str:
    """What a failed run needs to be read from CI's short excerpt: the failing tests by name, the
    start of each failure's traceback (the servers' logs that follow it are long), and the tail."""
    lines = output.splitlines()
    named = [ln for ln in lines if ln.startswith(("FAILED ", "ERROR "))]
    heads: list[str] = []
    heads_left = 0
    in_failures = False
    for ln in lines:
        if re.match(r"^=+ (FAILURES|ERRORS) =+$", ln):
            in_failures = True
        elif re.match(r"^=+ short test summary", ln):
            in_failures = False
        elif in_failures and re.match(r"^_{3,} .* _{3,}$", ln):
            heads.append(ln)
            heads_left = 25
            continue
        if in_failures and heads and heads_left > 0:
            heads.append(ln)
            heads_left -= 1
    return "\n".join(["failing: " + ", ".join(named) if named else "failing: (none named)", *heads, "...",
                      *lines[-15:]])


def test_upstreams_server_tests_pass_against_our_binary(stories_model: Path) -> None:
    if stories_model.name != "stories260K.gguf" or "generated" in stories_model.name:
        pytest.skip("upstream's tests check the real stories260K's text; only the generated stand-in is here")
    for mod in ("aiohttp", "openai", "prometheus_client", "wget", "filelock", "xdist"):
        pytest.importorskip(mod, reason=f"upstream's test requirements are not installed ({mod}): pip install '.[test]'")
    env_model = {"LLAMA_PREEMPT_TEST_MODEL": str(stories_model)}
    import os

    p = subprocess.run([sys.executable, str(RUN)], capture_output=True, text=True, timeout=1800,
                       env={**os.environ, **env_model})
    tail = failure_report(p.stdout + p.stderr)
    assert p.returncode == 0, tail
    summary = re.search(r"(\d+) passed(?:, (\d+) skipped)?", p.stdout + p.stderr)
    assert summary and int(summary.group(1)) >= 250, tail
    assert "failed" not in (p.stdout + p.stderr).splitlines()[-1], tail
    print((p.stdout + p.stderr).splitlines()[-1])
