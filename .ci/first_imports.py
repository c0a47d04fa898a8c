"""The README's promise after `pip install .` alone: every public module of llama_preempt imports,
and every name the package exports resolves, with only the declared dependencies installed.
.ci/run runs this in a virtual environment without extras; a module that needs an undeclared
package fails it, naming the module and the package."""
from __future__ import annotations

import importlib
import pkgutil
import sys

import llama_preempt


def main() -> int:
    failed: list[str] = []
    names = sorted(m.name for m in pkgutil.walk_packages(llama_preempt.__path__, "llama_preempt."))
    for name in names:
        try:
            importlib.import_module(name)
        except Exception as e:  # noqa: BLE001 - every failure is reported, then the run fails
            failed.append(f"import {name}: {type(e).__name__}: {e}")
    for export in llama_preempt.__all__:
        try:
            getattr(llama_preempt, export)
        except Exception as e:  # noqa: BLE001
            failed.append(f"llama_preempt.{export}: {type(e).__name__}: {e}")
    for line in failed:
        print(f"first_imports: {line}", file=sys.stderr)
    print(f"first_imports: {len(names)} modules, {len(llama_preempt.__all__)} exported names; "
          f"{len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
