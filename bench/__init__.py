"""The benchmarks (run from a clone): `python -m bench` runs the side-by-side cells (bench/cells.py)."""
