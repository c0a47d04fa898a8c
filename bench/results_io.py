"""What the benchmark scripts share about writing results."""
from __future__ import annotations

import json
import platform
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"


def display_path(path: Path) -> str:
    """A path as results record it: relative to the repository, never this machine's layout."""
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return path.name


def machine() -> dict[str, str]:
    return {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
            "python": platform.python_version()}


def write_results(name: str, record: dict[str, Any], markdown: list[str], out: Path = RESULTS) -> None:
    """bench/results/NAME.json (the record, with the machine) and NAME.md (the table)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps({**record, "machine": machine()}, indent=2) + "\n")
    (out / f"{name}.md").write_text("\n".join(markdown) + "\n")


def md_table(headers: list[str], rows: list[list[Any]]) -> list[str]:
    """A markdown table, one line a row."""
    return ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)] + \
           ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
