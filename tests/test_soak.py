"""The soak (tests/soak.py): a short run in every CI, the long one marked slow."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from soak import soak


def check(res, mode: str) -> None:  # type: ignore[no-untyped-def]
    print(res.summary())
    assert not res.lost, res.lost[:5]
    assert res.completed + res.deserved_errors == res.requests > 0
    assert res.streamed > 0 and res.families > 0
    assert res.parks[mode] > 0 and sum(res.parks.values()) == res.parks[mode]
    assert res.over_budget == 0 and res.peak_parked_bytes <= res.budget_bytes
    assert res.idle_ok and res.server_alive
    assert res.rss_end_mib - res.rss_start_mib < 64


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads the server's RSS from /proc")
@pytest.mark.parametrize("mode, ram_mib", [("swap", 1), ("recompute", 0)])
def test_a_short_soak_loses_nothing_and_leaks_nothing(stories_model: Path, tmp_path: Path, mode: str,
                                                       ram_mib: int) -> None:
    check(soak(stories_model, duration_s=10, clients=6, seed=1, log_dir=tmp_path, ram_mib=ram_mib), mode)


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads the server's RSS from /proc")
def test_a_long_soak_loses_nothing_and_leaks_nothing(stories_model: Path, tmp_path: Path) -> None:
    check(soak(stories_model, duration_s=float(os.environ.get("SOAK_SECONDS", "300")), clients=8, seed=2,
               log_dir=tmp_path), "swap")
