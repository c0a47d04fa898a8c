#!/usr/bin/env python3
"""Regenerate one patch of the series from edits made in vendor/llama.cpp (a developer tool).

    python vendor/mkpatch.py patches/0002-preempt-hooks.patch tools/server/server-context.cpp ...

The base is the pristine tree plus every patch that sorts before the named one; the patch is the
diff of the listed files between that base and vendor/llama.cpp. Later patches in the series must
not touch the same hunks (keep one purpose per patch).
"""
from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fetch  # noqa: E402


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    target = Path(argv[0]).resolve()
    files = argv[1:]
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "base"
        fetch.extract(fetch.find_sdist(), base)
        for p in fetch.patch_files():
            if p.name >= target.name:
                break
            fetch.apply_patch(base, p)
        chunks: list[str] = []
        for rel in files:
            a, b = base / rel, fetch.TREE / rel
            proc = subprocess.run(
                ["diff", "-u", "--label", f"a/{rel}", "--label", f"b/{rel}",
                 str(a) if a.exists() else "/dev/null", str(b)],
                capture_output=True, text=True)
            if proc.returncode > 1:
                raise SystemExit(proc.stderr)
            chunks.append(proc.stdout)
    text = "".join(chunks)
    if not text:
        print(f"mkpatch: no difference in {files}", file=sys.stderr)
        return 1
    target.write_text(text)
    print(f"mkpatch: wrote {target.name} ({text.count(chr(10))} lines)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
