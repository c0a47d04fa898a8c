#!/usr/bin/env python3
"""Put llama.cpp's web UI (tools/ui, Svelte) into the vendored tree as pre-built assets, so the
server serves it at GET / as upstream's release binaries do.

Upstream's own CMake embeds `tools/ui/dist` when it is there (scripts/ui-assets.cmake, "pre-built
assets"), so this only has to provide that folder:

1. already in the tree (our sdist ships it): nothing to do;
2. built before and cached in vendor/.ui/: copied in;
3. the assets this repository ships (vendor/ui-assets.tar.gz), when vendor/ui-assets.json says
   they were built from exactly this tree's tools/ui (its files' sha256): unpacked. A first
   `pip install .` then needs neither npm nor the two and a half minutes its build takes here;
4. npm on PATH: `npm ci` and `npm run build` in a scratch copy of tools/ui (npm packages only,
   no browser downloads), cached, copied in;
5. otherwise: the build goes on without the UI and says so once; /props says so too.

`python vendor/ui.py --write-assets` builds the UI with npm from the patched tree and writes the
shipped assets and their stamp (run it whenever a patch or the pin changes tools/ui; CI's tests
check the stamp). They are made by this script alone, never edited by hand.

CMake's configure step runs this after vendor/fetch.py. Stdlib only; it never fails the build.
"""
from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import fetch  # noqa: E402

UI = fetch.TREE / "tools" / "ui"
DIST = UI / "dist"
CACHE = HERE / ".ui" / f"dist-{fetch.UPSTREAM_COMMIT}"
SHIPPED = HERE / "ui-assets.tar.gz"
SHIPPED_STAMP = HERE / "ui-assets.json"
_SKIP = {"node_modules", "dist"}


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


def source_sha256(ui: Path = UI) -> str:
    """One sha256 over tools/ui's sources (every file but node_modules/ and dist/, by relative
    path and content): what the shipped assets were built from."""
    h = hashlib.sha256()
    for path in sorted(p for p in ui.rglob("*") if p.is_file() and not _SKIP & set(p.relative_to(ui).parts)):
        rel = path.relative_to(ui).as_posix()
        h.update(rel.encode() + b"\0" + hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()


def write_assets(dist: Path) -> None:
    """The shipped assets: a tarball of `dist` that is the same bytes for the same files (sorted,
    no owners or times), and its stamp."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(p for p in dist.rglob("*") if p.is_file()):
            info = tarfile.TarInfo(path.relative_to(dist).as_posix())
            info.size, info.mode, info.mtime = path.stat().st_size, 0o644, 0
            with open(path, "rb") as f:
                tar.addfile(info, f)
    with open(SHIPPED, "wb") as out, gzip.GzipFile(fileobj=out, mode="wb", mtime=0, compresslevel=9) as gz:
        gz.write(buf.getvalue())
    stamp = {"upstream_commit": fetch.UPSTREAM_COMMIT, "tools_ui_sha256": source_sha256(),
             "assets_sha256": hashlib.sha256(SHIPPED.read_bytes()).hexdigest(),
             "made_by": "python vendor/ui.py --write-assets"}
    SHIPPED_STAMP.write_text(json.dumps(stamp, indent=2) + "\n")


def shipped_fits() -> bool:
    """The shipped assets were built from this tree's tools/ui, and are the bytes the stamp names."""
    if not SHIPPED.is_file() or not SHIPPED_STAMP.is_file():
        return False
    stamp = json.loads(SHIPPED_STAMP.read_text())
    return (stamp.get("tools_ui_sha256") == source_sha256()
            and stamp.get("assets_sha256") == hashlib.sha256(SHIPPED.read_bytes()).hexdigest())


def unpack_shipped(out: Path) -> None:
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    with tarfile.open(SHIPPED, "r:gz") as tar:
        for member in tar.getmembers():  # our own tarball, checked by sha256; still, files only, inside out
            if not member.isfile() or member.name.startswith("/") or ".." in Path(member.name).parts:
                raise RuntimeError(f"vendor/ui-assets.tar.gz holds an unexpected entry {member.name!r}")
        tar.extractall(out)


def main() -> int:
    if not UI.is_dir():
        say("no tools/ui in the vendored tree: building without the web UI")
        return 0
    if "--write-assets" in sys.argv[1:]:
        with tempfile.TemporaryDirectory(prefix="llama-preempt-ui-assets-") as tmp:
            npm_build(Path(tmp) / "dist")
            if not complete(Path(tmp) / "dist"):
                raise RuntimeError("the build produced no index.html")
            write_assets(Path(tmp) / "dist")
        say(f"wrote {SHIPPED.name} ({SHIPPED.stat().st_size // 1024} KiB) and {SHIPPED_STAMP.name}")
        return 0
    if complete(DIST):
        return 0
    if not complete(CACHE) and shipped_fits():
        unpack_shipped(DIST)
        say("web UI: the assets this repository ships (vendor/ui-assets.tar.gz, built from this tools/ui)")
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
