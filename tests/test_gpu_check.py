"""bench/gpu_check.sh, the device check, runs its phases on the CPU build too (GPU_CHECK_CPU=1):
in the background in its own process group, collected into one tarball by the call that started it
or by a later one."""
from __future__ import annotations

import os
import re
import subprocess
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_device_check_runs_its_phases_on_the_cpu_build_and_a_second_call_collects(tmp_path: Path) -> None:
    env = {**os.environ, "GPU_CHECK_CPU": "1", "GPU_CHECK_WORK": str(tmp_path / "work"), "GPU_CHECK_PHASES": "doctor rpc",
           "GPU_CHECK_DEADLINE_S": "280"}
    script = str(ROOT / "bench" / "gpu_check.sh")
    first = subprocess.run(["bash", script, str(tmp_path / "out1"), "0"], capture_output=True, text=True, env=env, timeout=60)
    assert first.returncode == 0, first.stderr
    assert "gpu_check: still running" in first.stdout or "gpu_check: done" in first.stdout
    # a later call on the same machine starts nothing new: it waits for the phases and collects them
    second = subprocess.run(["bash", script, str(tmp_path / "out2"), "300"], capture_output=True, text=True, env=env,
                            timeout=360)
    assert "gpu_check: done" in second.stdout, second.stdout
    summary = second.stdout
    for name in ("doctor", "rpc"):
        assert re.search(rf"{name}: rc=0 in \d+s", summary), summary
    assert "all phases done" in summary and "mixed" not in summary  # only the phases asked for
    with tarfile.open(tmp_path / "out2" / "gpu_check.tgz") as tar:
        names = set(tar.getnames())
        doctor = tar.extractfile("gpu_check/doctor.txt").read().decode()
        rpc = tar.extractfile("gpu_check/rpc.txt").read().decode()
    assert {"gpu_check/summary.txt", "gpu_check/devices.txt", "gpu_check/rpc_server.log"} <= names
    assert doctor.count("result: OK") == 2 and doctor.count("rc=0") == 2, doctor
    # through the RPC device, flash attention on and off, every route right
    assert rpc.count("result: OK") == 2 and "RPC0" in rpc, rpc
