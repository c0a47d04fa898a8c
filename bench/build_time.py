"""The first build, as a new user meets it: `pip install .` from a clean clone, cold (no ccache, a
fresh build folder, a fresh virtual environment), beside llama-cpp-python's own cold build from its
sdist on the same machine, and where our build's time goes (per target, from ninja's log).

    python bench/build_time.py                   # both cold builds, one after the other (~10 min here)
    python bench/build_time.py --ours-only       # only ours
    python bench/build_time.py --breakdown DIR   # only the per-target table of a build folder's .ninja_log

Writes bench/results/build_time.{json,md}. The per-target times are each compile's wall time under
ninja's parallel jobs (on 2 cores with 4 jobs, about twice its CPU time): their shares are what
the table is for. Nothing here is a test; the README's goal (at most 1.3x llama-cpp-python's cold
build) is read from these figures."""
from __future__ import annotations

import argparse
import collections
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.results_io import ROOT, md_table, write_results  # noqa: E402

LLAMA_CPP_PYTHON = "llama-cpp-python==0.3.36"  # the sdist vendor/fetch.py pins


@dataclass
class Timed:
    what: str
    wall_s: float
    cpu_s: float  # user + system of every process it ran


def timed(what: str, cmd: list[str], cwd: Path, env: dict[str, str], log: Path) -> Timed:
    before = os.times()
    t0 = time.monotonic()
    with open(log, "w") as out:
        proc = subprocess.run(cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT)
    wall = time.monotonic() - t0
    after = os.times()
    if proc.returncode != 0:
        raise SystemExit(f"build_time: {what} failed (exit {proc.returncode}); see {log}")
    cpu = (after.children_user - before.children_user) + (after.children_system - before.children_system)
    print(f"build_time: {what}: {wall:.0f} s wall, {cpu:.0f} s CPU", flush=True)
    return Timed(what, wall, cpu)


def cold_env(venv: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env.update(CCACHE_DISABLE="1", PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}",
               PIP_NO_CACHE_DIR="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    return env


def fresh_venv(where: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", str(where)], check=True)
    return where


def ours_cold(work: Path) -> tuple[Timed, Path]:
    """A clean clone of this repository's HEAD, built and installed by `pip install .`."""
    clone = work / "clone"
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(clone)], check=True)
    venv = fresh_venv(work / "venv-ours")
    t = timed("pip install . (llama-preempt, cold)", [str(venv / "bin" / "pip"), "install", "."], clone,
              cold_env(venv), work / "ours.log")
    builds = sorted((clone / "build").glob("*/.ninja_log"))
    return t, builds[0].parent if builds else clone


def theirs_cold(work: Path, wheels: Path) -> Timed:
    """llama-cpp-python built from its sdist into a wheel, nothing cached."""
    venv = fresh_venv(work / "venv-theirs")
    return timed(f"pip wheel {LLAMA_CPP_PYTHON} from its sdist (cold)",
                 [str(venv / "bin" / "pip"), "wheel", "--no-deps", "--no-binary", "llama-cpp-python",
                  "-w", str(wheels), LLAMA_CPP_PYTHON], work, cold_env(venv), work / "theirs.log")


def breakdown(build_dir: Path) -> list[tuple[str, float, int]]:
    """(target, seconds, files) from ninja's log, the first build of each output only."""
    first: dict[str, float] = {}
    for line in (build_dir / ".ninja_log").read_text().splitlines():
        if line.startswith("#"):
            continue
        start, end, _mtime, out, _hash = line.split("\t")
        first.setdefault(out, (int(end) - int(start)) / 1000)
    seconds: dict[str, float] = collections.Counter()
    files: dict[str, int] = collections.Counter()
    for out, s in first.items():
        target = out.split("CMakeFiles/")[1].split(".dir")[0] if "CMakeFiles/" in out else "link and generate"
        seconds[target] += s
        files[target] += 1
    return sorted(((t, s, files[t]) for t, s in seconds.items()), key=lambda r: -r[1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ours-only", action="store_true", help="skip llama-cpp-python's build")
    ap.add_argument("--breakdown", type=Path, metavar="DIR", help="only the per-target table of DIR/.ninja_log")
    ap.add_argument("--name", default="build_time", help="results name (default build_time)")
    ap.add_argument("--keep-wheel", type=Path, metavar="DIR",
                    help="keep llama-cpp-python's wheel in DIR (tests/test_neighbours.py and the comparisons install it)")
    a = ap.parse_args(argv)
    record: dict[str, Any] = {}
    if a.breakdown is not None:
        rows = breakdown(a.breakdown)
    else:
        with tempfile.TemporaryDirectory(prefix="llama-preempt-build-time-") as tmp:
            ours, build_dir = ours_cold(Path(tmp))
            record["ours"] = vars(ours)
            if not a.ours_only:
                record["llama_cpp_python"] = vars(theirs_cold(Path(tmp), a.keep_wheel or Path(tmp) / "wheels"))
                record["ratio_wall"] = round(ours.wall_s / record["llama_cpp_python"]["wall_s"], 2)
            rows = breakdown(build_dir)  # read before the clone is removed
    total = sum(s for _t, s, _n in rows)
    record["targets"] = [{"target": t, "seconds": round(s, 1), "files": n} for t, s, n in rows]
    md = [f"# {a.name}", ""]
    if "ours" in record:
        md += md_table(["build", "wall s", "CPU s"],
                       [[record[k]["what"], f"{record[k]['wall_s']:.0f}", f"{record[k]['cpu_s']:.0f}"]
                        for k in ("ours", "llama_cpp_python") if k in record])
        if "ratio_wall" in record:
            md += ["", f"ours / llama-cpp-python (wall): {record['ratio_wall']}x"]
        md += [""]
    md += md_table(["target", "compile s (under parallel jobs)", "share", "outputs"],
                   [[t, f"{s:.1f}", f"{100 * s / total:.0f} %", n] for t, s, n in rows])
    print("\n".join(md))
    write_results(a.name, record, md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
