"""llama_preempt._core is a good neighbour in any Python process (issue 51).

It exports PyInit__core alone and binds its own symbols first (CMakeLists.txt, cmake/core-exports.map),
so another library that carries its own ggml, llama.cpp or C++ runtime pieces cannot bind to ours,
nor we to theirs. On an H200 machine `import llama_preempt._core, torch` crashed (free(): invalid
pointer) while `_core` exported 20,056 symbols, libstdc++'s among them. Each co-import runs in a
child process, so a crash is a failed test, not a dead test run: both import orders, each library
loading a model and generating (the migration case: llama-cpp-python beside us), and PyTorch beside
us computing while we generate. The packages are optional: a test whose neighbour is not installed
skips, naming it (`pip install llama-cpp-python torch` runs them).
"""
from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ORDERS = ["ours-first", "theirs-first"]


def core_path() -> Path:
    spec = importlib.util.find_spec("llama_preempt._core")
    assert spec is not None and spec.origin is not None
    return Path(spec.origin)


def run_child(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-X", "faulthandler", "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=300)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the export list is checked on Linux (ELF)")
def test_the_extension_exports_its_module_init_alone() -> None:
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("nm (binutils) is not installed")
    out = subprocess.run([nm, "-D", "--defined-only", str(core_path())], capture_output=True, text=True, check=True).stdout
    exported = sorted(line.split()[-1] for line in out.splitlines() if line.strip())
    assert exported == ["PyInit__core"], f"{len(exported)} exported: {exported[:20]}"
    # nothing of ggml, llama.cpp or the C++ runtime is undefined-and-expected from others either way:
    # what it needs from outside is the C library, libstdc++, libgomp, libm and Python
    undef = subprocess.run([nm, "-D", "--undefined-only", str(core_path())], capture_output=True, text=True,
                           check=True).stdout
    assert not [line for line in undef.splitlines() if " ggml_" in line or " llama_" in line or " gguf_" in line]


OURS = """
from llama_preempt import Engine
with Engine({model!r}, n_ctx=256, n_parallel=2) as eng:
    (out,) = eng.generate(["Once upon a time"], n_predict=8, temperature=0, ignore_eos=True)
    assert out.n_generated == 8, out
    print("ours:", repr(out.text))
"""

LLAMA_CPP = """
import llama_cpp
llm = llama_cpp.Llama(model_path={model!r}, n_ctx=256, verbose=False)
r = llm.create_completion("Once upon a time", max_tokens=8, temperature=0)
assert r["usage"]["completion_tokens"] >= 1, r
print("llama_cpp:", repr(r["choices"][0]["text"]))
"""

TORCH = """
import numpy, torch
a = numpy.arange(12, dtype=numpy.float32).reshape(3, 4)
x = torch.from_numpy(a)
assert numpy.array_equal((x @ x.T).numpy(), a @ a.T)
print("torch:", torch.__version__)
"""


@pytest.mark.parametrize("order", ORDERS)
def test_llama_cpp_python_and_llama_preempt_each_load_a_model_and_generate_in_one_process(
        stories_model: Path, order: str) -> None:
    if importlib.util.find_spec("llama_cpp") is None:
        pytest.skip("llama-cpp-python is not installed (pip install llama-cpp-python runs this)")
    ours, theirs = OURS.format(model=str(stories_model)), LLAMA_CPP.format(model=str(stories_model))
    # the first one loaded generates again once the other has loaded too
    p = run_child(ours + theirs + ours if order == "ours-first" else theirs + ours + theirs)
    assert p.returncode == 0, p.stderr[-3000:]
    # both generated, and the one loaded first generated again after the other had loaded
    assert sorted([p.stdout.count("ours:"), p.stdout.count("llama_cpp:")]) == [1, 2], p.stdout


@pytest.mark.parametrize("order", ORDERS)
def test_pytorch_and_llama_preempt_share_a_process_in_either_order(stories_model: Path, order: str) -> None:
    if importlib.util.find_spec("torch") is None:
        pytest.skip("PyTorch is not installed (pip install torch runs this)")
    imports = ["import llama_preempt._core", "import torch"]
    head = "\n".join(imports if order == "ours-first" else imports[::-1])
    p = run_child(head + "\n" + TORCH + OURS.format(model=str(stories_model)) + TORCH)
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.count("torch:") == 2 and "ours:" in p.stdout, p.stdout
