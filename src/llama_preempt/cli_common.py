"""What every llama-preempt command shares: its one-line error and the console it prints to."""
from __future__ import annotations

import os
import sys
from typing import Any


class CLIError(Exception):
    pass


def _console(stderr: bool = False) -> Any:
    """A terminal's own width; piped into a file or another program, wide enough that no table is
    cut (rich would assume 80 columns there) unless COLUMNS says otherwise."""
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    width = None if stream.isatty() or os.environ.get("COLUMNS") else 200
    return Console(stderr=stderr, highlight=False, width=width)
