"""The C++/Python boundary: Python reads what the compiled core reports, and carries all of it."""
from __future__ import annotations

from dataclasses import fields

import pytest
from llama_preempt import _core
from llama_preempt.engine import EndEvent, FailEvent, ParkEvent, ResumeEvent
from llama_preempt.stats import (COUNTERS, DISK_FAILURES, GAUGES, LABELED, PARK_CHOICES, PARK_TIERS, PREEMPT_MODES,
                                 PreemptStats, labeled_field)


def test_the_stats_type_carries_every_series_the_core_reports() -> None:
    """A metric added to csrc/server/preempt-metrics.cpp without a PreemptStats field fails here."""
    carried = {f.name for f in fields(PreemptStats)}
    names = [name for name, _ in _core.metric_names()]
    assert names, "the core reports no series"
    missing = [n for n in names if n not in carried]
    assert not missing, f"PreemptStats lacks {missing}"
    assert set(COUNTERS) | set(GAUGES) == set(names)


def test_stats_from_series_need_every_series_and_keep_each_value() -> None:
    values = {name: i + 1 for i, (name, _) in enumerate(_core.metric_names())}
    st = PreemptStats.from_series(values, [], {"preempt_parks_by_choice_total": {"swap_cheaper": 3},
                                               "preempt_parks_by_tier_total": {"disk": 2}})
    for name, v in values.items():
        assert getattr(st, name) == v
    assert st.parks_by_choice == {"swap_cheaper": 3}
    assert st.parks_by_tier == {"disk": 2}
    assert st.restores_by_tier == {} and st.disk_failures == {}
    del values["n_preempt_total"]
    try:
        PreemptStats.from_series(values, [])
    except KeyError as e:
        assert "n_preempt_total" in str(e)
    else:
        raise AssertionError("a missing series was not noticed")


def test_the_stats_type_carries_every_labeled_series_the_core_reports() -> None:
    """A labeled counter added to labeled_items() in csrc/server/preempt-metrics.cpp without a field fails here."""
    carried = {f.name for f in fields(PreemptStats)}
    names = [name for name, _ in _core.labeled_metric_names()]
    assert "preempt_parks_by_tier_total" in names and "preempt_disk_failures_total" in names
    missing = [n for n in names if labeled_field(n) not in carried]
    assert not missing, f"PreemptStats lacks a field for {missing}"
    assert LABELED == tuple(_core.labeled_metric_names())


def test_the_names_python_uses_come_from_the_core() -> None:
    assert PREEMPT_MODES == tuple(_core.PREEMPT_MODES)
    assert PARK_CHOICES == tuple(_core.PARK_CHOICES) and "swap_cheaper" in PARK_CHOICES
    assert {"disk_cheaper", "ram_full"} <= set(PARK_CHOICES)
    assert PARK_TIERS == ("recompute", "ram", "disk", "ram_q8") == tuple(_core.PARK_TIERS)
    assert DISK_FAILURES == tuple(_core.DISK_FAILURES) and "checksum" in DISK_FAILURES
    assert {"planner", "api", "last_resort", "forced"} == set(_core.PARK_REASONS)


def test_the_policys_enums_cross_as_str_enums_in_both_directions() -> None:
    """C++ hands Python a member equal to the server's name for it; Python may hand back a member or
    that name; anything else is a ValueError that lists the names."""
    assert tuple(_core.ParkTier) == (_core.ParkTier.RECOMPUTE, _core.ParkTier.RAM, _core.ParkTier.DISK,
                                     _core.ParkTier.RAM_Q8)
    assert PARK_TIERS == tuple(t.value for t in _core.ParkTier)
    assert PARK_CHOICES == tuple(c.value for c in _core.ParkChoice)
    assert {t: 1 for t in _core.ParkTier}["disk"] == 1 and f"{_core.ParkTier.DISK}" == "disk"
    assert _core.ParkReason.POOL_FULL == "planner"  # as /slots' parked_by says
    for mode in (_core.PreemptMode.SWAP, "swap"):
        assert _core.effective_mode(mode, 0, -1) is _core.PreemptMode.SWAP
    assert _core.effective_mode("swap", 0, 0) is _core.PreemptMode.RECOMPUTE  # nowhere to swap to
    with pytest.raises(ValueError, match="PreemptMode must be auto, swap or recompute, got 'fast'"):
        _core.effective_mode("fast", 0, 0)
    with pytest.raises(TypeError):
        _core.effective_mode(1, 0, 0)


def test_the_step_events_are_the_cores_own_types() -> None:
    assert (ParkEvent, ResumeEvent, EndEvent, FailEvent) == (_core.ParkEvent, _core.ResumeEvent, _core.EndEvent,
                                                             _core.FailEvent)
    assert "choice" in ParkEvent._fields and "n_generated" in EndEvent._fields
    assert "tier" in ParkEvent._fields and "tier" in ResumeEvent._fields
    assert "parked" in _core.StepReportCore._fields


def test_a_lognormal_workload_is_mostly_short_with_a_long_tail_and_round_trips_through_jsonl(tmp_path) -> None:
    from llama_preempt.simulator import Workload

    wl = Workload.lognormal(400, rate=5.0, prompt_median=64, gen_median=48, max_prompt=1000, max_gen=500, seed=3)
    assert len(wl) == 400 and list(wl.t_arrival) == sorted(wl.t_arrival)
    assert max(wl.n_prompt) <= 1000 and max(wl.n_gen) <= 500 and min(wl.n_prompt) >= 1
    short = sum(p <= 128 for p in wl.n_prompt)
    assert short > 250 and max(wl.n_prompt) > 5 * 64  # most short, a few many times the median
    assert wl == Workload.lognormal(400, rate=5.0, prompt_median=64, gen_median=48, max_prompt=1000, max_gen=500, seed=3)
    path = tmp_path / "w.jsonl"
    wl.to_jsonl(path)
    back = Workload.from_jsonl(path)
    assert back.n_prompt == wl.n_prompt and back.n_gen == wl.n_gen
    assert all(abs(a - b) < 1e-3 for a, b in zip(back.t_arrival, wl.t_arrival))
