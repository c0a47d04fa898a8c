"""python -m bench [--quick]: the side-by-side cells (bench/cells.py)."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the scripts import each other by name

from cells import main  # noqa: E402

sys.exit(main())
