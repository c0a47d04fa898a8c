"""The C++/Python boundary: Python reads what the compiled core reports, and carries all of it."""
from __future__ import annotations

from dataclasses import fields

from llama_preempt import _core
from llama_preempt.engine import EndEvent, FailEvent, ParkEvent, ResumeEvent
from llama_preempt.stats import COUNTERS, GAUGES, PARK_CHOICES, PREEMPT_MODES, PreemptStats


def test_the_stats_type_carries_every_series_the_core_reports() -> None:
    """A metric added to csrc/preempt-metrics.cpp without a PreemptStats field fails here."""
    carried = {f.name for f in fields(PreemptStats)}
    names = [name for name, _ in _core.metric_names()]
    assert names, "the core reports no series"
    missing = [n for n in names if n not in carried]
    assert not missing, f"PreemptStats lacks {missing}"
    assert set(COUNTERS) | set(GAUGES) == set(names)


def test_stats_from_series_need_every_series_and_keep_each_value() -> None:
    values = {name: i + 1 for i, (name, _) in enumerate(_core.metric_names())}
    st = PreemptStats.from_series(values, [], {"swap_cheaper": 3})
    for name, v in values.items():
        assert getattr(st, name) == v
    assert st.parks_by_choice == {"swap_cheaper": 3}
    del values["n_preempt_total"]
    try:
        PreemptStats.from_series(values, [])
    except KeyError as e:
        assert "n_preempt_total" in str(e)
    else:
        raise AssertionError("a missing series was not noticed")


def test_the_names_python_uses_come_from_the_core() -> None:
    assert PREEMPT_MODES == tuple(_core.PREEMPT_MODES)
    assert PARK_CHOICES == tuple(_core.PARK_CHOICES) and "swap_cheaper" in PARK_CHOICES
    assert {"planner", "api", "last_resort", "forced"} == set(_core.PARK_REASONS)


def test_the_step_events_are_the_cores_own_types() -> None:
    assert (ParkEvent, ResumeEvent, EndEvent, FailEvent) == (_core.ParkEvent, _core.ResumeEvent, _core.EndEvent,
                                                             _core.FailEvent)
    assert "choice" in ParkEvent._fields and "n_generated" in EndEvent._fields
    assert "parked" in _core.StepReportCore._fields
