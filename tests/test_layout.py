"""csrc/'s folders keep their direction (docs/contributing.md, "csrc/: our C++, by folder"): the
mechanics (store/) see only the shared plain types (common/), never the planner or the choices;
the policy sees neither the mechanics, the server nor the simulator; the OS call that hands freed
pages back lives in the store. Read from the sources' own #include lines."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

CSRC = Path(__file__).resolve().parent.parent / "csrc"
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def headers_of(folder: str) -> set[str]:
    return {p.name for p in (CSRC / folder).glob("*.h")}


def includes(folder: str) -> dict[str, set[str]]:
    """Each source of the folder, and the quoted headers it includes."""
    out: dict[str, set[str]] = {}
    for p in sorted((CSRC / folder).iterdir()):
        if p.suffix in (".h", ".cpp", ".inc"):
            out[p.name] = set(INCLUDE.findall(p.read_text()))
    return out


@pytest.mark.parametrize("folder, forbidden", [
    ("store", ("policy", "server", "sim", "python")),
    ("policy", ("store", "server", "sim", "python")),
    ("common", ("policy", "store", "server", "sim", "python")),
])
def test_a_folder_includes_no_header_of_the_folders_it_must_not_see(folder: str, forbidden: tuple[str, ...]) -> None:
    banned = {h: f for f in forbidden for h in headers_of(f)}
    assert banned, "the forbidden folders hold no headers: the check would prove nothing"
    crossings = [f"{src} includes {h} ({banned[h]}/)" for src, incs in includes(folder).items()
                 for h in sorted(incs) if h in banned]
    assert crossings == []


def test_the_simulator_lives_in_its_own_folder_and_the_server_does_not_compile_it() -> None:
    assert not list((CSRC / "policy").glob("preempt-sim*")) and not list((CSRC / "policy").glob("preempt-fleet*"))
    assert (CSRC / "sim" / "preempt-sim.h").is_file()
    cmake = (CSRC.parent / "CMakeLists.txt").read_text()
    server_sources = cmake[cmake.index("set(LLAMA_PREEMPT_SOURCES"):]
    server_sources = server_sources[:server_sources.index(")")]
    assert "csrc/sim/" not in server_sources


def test_only_the_store_calls_the_allocator_to_give_pages_back() -> None:
    callers = sorted(str(p.relative_to(CSRC)) for p in CSRC.rglob("*") if p.suffix in (".h", ".cpp", ".inc")
                     and re.search(r"\bmalloc_trim\s*\(", re.sub(r"//.*", "", p.read_text())))
    assert callers == ["store/preempt-hostmem.cpp"]


def test_every_unit_of_ours_stays_under_600_lines() -> None:
    # the project's rule: mechanics live in units of one purpose, under 600 lines, in csrc/ and in
    # the Python layer alike (docs/contributing.md)
    root = CSRC.parent
    units = [p for p in CSRC.rglob("*") if p.suffix in (".h", ".cpp", ".inc")]
    units += list((root / "src" / "llama_preempt").glob("*.py"))
    assert len(units) > 50, "found too few units: the check would prove nothing"
    over = {str(p.relative_to(root)): n for p in units if (n := len(p.read_text().splitlines())) >= 600}
    assert over == {}
    # a .cpp is read with its header: the two together are the unit a newcomer reads
    def lines(p: Path) -> int:
        return len(p.read_text().splitlines())

    with_header = {str(p.relative_to(root)): lines(p) + lines(p.with_suffix(".h"))
                   for p in CSRC.rglob("*.cpp") if p.with_suffix(".h").is_file()}
    assert {k: n for k, n in with_header.items() if n >= 600} == {}
