"""The llama-preempt command line."""
from __future__ import annotations

import argparse
import sys

from . import __version__
from .binary import server_binary


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="llama-preempt", description="KV preemption for llama.cpp's HTTP server")
    ap.add_argument("--version", action="version", version=f"llama-preempt {__version__}")
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("server-path", help="print the path of the drop-in llama-server binary")
    args = ap.parse_args(argv)
    if args.cmd == "server-path":
        print(server_binary())
    return 0


if __name__ == "__main__":
    sys.exit(main())
