#!/usr/bin/env python3
"""Put llama.cpp's web UI (tools/ui, Svelte) into the vendored tree as pre-built assets, so the
server serves it at GET / as upstream's release binaries do.

Upstream's own CMake embeds `tools/ui/dist` when it is there (scripts/ui-assets.cmake, "pre-built
assets"), so this only has to provide that folder:

1. already in the tree (our sdist ships it): nothing to do;
2. built before and cached in vendor/.ui/: copied in;
3. npm on PATH: `npm ci` and `npm run build` in a scratch copy of tools/ui (npm packages only,
   no browser downloads), cached, copied in;
4. otherwise: the build goes on without the UI and says so once; /props says so too.

CMake's configure step runs this after vendor/fetch.py. Stdlib only; it never fails the build.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import fetch  # noqa: E402

UI = fetch.TREE / "tools" / "ui"
DIST = UI / "dist"
CACHE = HERE / ".ui" / f"dist-{fetch.UPSTREAM_COMMIT}"


def say(msg: str) -> None:
    print(f"llama-preempt: {msg}", flush=True)


def complete(dist: Path) -> bool:
    return (dist / "index.html").is_file() and (dist / "_app").is_dir()


def npm_build(out: Path) -> None:
    npm = shutil.which("npm")
    if npm is None:
        raise RuntimeError("npm is not on PATH")
    with tempfile.TemporaryDirectory(prefix="llama-preempt-ui-") as tmp:
        src = Path(tmp) / "ui"
        shutil.copytree(UI, src, ignore=shutil.ignore_patterns("node_modules", "dist"))
        env = {**os.environ, "PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD": "1", "PUPPETEER_SKIP_DOWNLOAD": "1",
               "LLAMA_UI_OUT_DIR": str(out), "CI": "1"}
        for cmd in ([npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"], [npm, "run", "build"]):
            proc = subprocess.run(cmd, cwd=src, env=env, capture_output=True, text=True)
            if proc.returncode != 0:
                tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-15:])
                raise RuntimeError(f"`{' '.join(cmd[1:])}` failed:\n{tail}")


def main() -> int:
    if not UI.is_dir():
        say("no tools/ui in the vendored tree: building without the web UI")
        return 0
    if complete(DIST):
        return 0
    if not complete(CACHE):
        say("building the web UI with npm (once; cached in vendor/.ui)")
        part = CACHE.with_name(CACHE.name + ".partial")
        shutil.rmtree(part, ignore_errors=True)
        try:
            npm_build(part)
            if not complete(part):
                raise RuntimeError("the build produced no index.html")
        except (RuntimeError, OSError) as e:
            shutil.rmtree(part, ignore_errors=True)
            say(f"building without the web UI ({e}); GET / will be 404 and /props says ui: false")
            return 0
        shutil.rmtree(CACHE, ignore_errors=True)
        os.replace(part, CACHE)
    shutil.rmtree(DIST, ignore_errors=True)
    shutil.copytree(CACHE, DIST)
    say("web UI: embedding the pre-built assets from tools/ui/dist")
    return 0


if __name__ == "__main__":
    sys.exit(main())
