"""What the benchmark scripts share about writing results."""
from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"


def display_path(path: Path) -> str:
    """A path as results record it: relative to the repository, never this machine's layout."""
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return path.name
