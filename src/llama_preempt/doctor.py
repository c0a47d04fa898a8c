"""`llama-preempt doctor`: every park route checked on this machine, with the user's model and flags.

It runs the drop-in `llama-server --preempt-selftest` with the flags given (the self-test itself is
C++, csrc/server/preempt-selftest.h: one implementation for both entry points), which parks one
sequence by each route (SWAP by the bulk copier, by device graphs, by single slices, restore ahead,
to disk, RECOMPUTE), checks every copy byte for byte and the answer against the unparked one, and
prints a table and a report to paste into a bug report. `run_doctor()` returns it typed.
"""
from __future__ import annotations

import json
import os
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from .binary import server_binary


class DoctorError(RuntimeError):
    """The self-test could not run (the model did not load, a flag was refused); the message holds
    llama-server's last lines."""


@dataclass(frozen=True)
class DoctorDevice:
    device: str          # ggml's device name ("CPU", "CUDA0", "RPC0[127.0.0.1:50052]")
    moved_by: str        # "memcpy", "device graphs", "single slices" or a mix
    why: str             # why some slices went one at a time ("" when none did)
    n_bytes: int


@dataclass(frozen=True)
class DoctorRoute:
    route: str           # bulk, graphs, slices, restore ahead, disk, recompute
    tried: bool
    why_not: str         # not tried: why
    n_bytes: int
    park_gbps: float
    restore_gbps: float
    verified: int        # 1 every copy byte-identical, 0 a mismatch, -1 nothing to check (recompute)
    mismatch: str        # where the first differing byte is (copy, context, tensor, layer, cell, device)
    same_answer: bool
    first_diff: int
    answer_must_match: bool
    answer_explained: bool  # every copy exact and the answer differs as the backend's answers follow the batch (the control)
    ok: bool
    note: str
    devices: tuple[DoctorDevice, ...]


@dataclass(frozen=True)
class DoctorControl:
    """The unparked answer recomputed in another layout and other batches, no park: whether this
    backend's answers follow the batch (then a SWAP answer may differ although every copy is exact)."""
    tried: bool
    batch_invariant: bool   # the same logits, bit for bit
    first_logits_diff: int  # the first generated token whose logits differ (-1: none)
    first_token_diff: int   # the first generated token that differs (-1: none)


@dataclass(frozen=True)
class DoctorReport:
    ok: bool
    returncode: int      # llama-server's: 0 every route right, 1 otherwise
    build: str
    routes: tuple[DoctorRoute, ...]
    links: tuple[Mapping[str, Any], ...]  # {"device", "what" (memcpy, device_to_host, host_to_device), "gbps", "pinned"}
    not_tried: tuple[str, ...]
    device_notes: tuple[str, ...]  # what a device lacks (asynchronous copies, events, pinned memory) and what it does instead
    control: DoctorControl
    text: str            # the table and the report, as printed

    def route(self, name: str) -> DoctorRoute:
        for r in self.routes:
            if r.route == name:
                return r
        raise KeyError(f"no route {name!r}; the routes are {[r.route for r in self.routes]}")

    @classmethod
    def from_json(cls, d: Mapping[str, Any], returncode: int, text: str) -> "DoctorReport":
        routes = tuple(DoctorRoute(**{**r, "devices": tuple(DoctorDevice(**x) for x in r["devices"])}) for r in d["routes"])
        return cls(ok=bool(d["ok"]), returncode=returncode, build=d["build"], routes=routes,
                   links=tuple(d["links"]), not_tried=tuple(d["not_tried"]), device_notes=tuple(d["device_notes"]),
                   control=DoctorControl(**d["control"]), text=text)


def run_doctor(server_args: Sequence[str], *, env: Mapping[str, str] | None = None, timeout: float = 600,
               binary: Path | None = None) -> DoctorReport:
    """Run `llama-server --preempt-selftest SERVER_ARGS` and return what it found. `env`: extra
    environment (the test knobs). Raises DoctorError when it could not run at all."""
    exe = str(binary or server_binary())
    with tempfile.TemporaryDirectory(prefix="llama-preempt-doctor-") as tmp:
        out = Path(tmp) / "selftest.json"
        full_env = {**os.environ, **(env or {}), "LLAMA_PREEMPT_SELFTEST_JSON": str(out)}
        try:
            p = subprocess.run([exe, "--preempt-selftest", *server_args], capture_output=True, text=True, timeout=timeout,
                               env=full_env, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired as e:
            raise DoctorError(f"the self-test did not finish in {timeout:g} s") from e
        if not out.is_file():
            tail = "\n".join((p.stderr or "").strip().splitlines()[-8:])
            raise DoctorError(f"llama-server --preempt-selftest exited {p.returncode} before testing anything:\n{tail}")
        return DoctorReport.from_json(json.loads(out.read_text()), p.returncode, p.stdout)
