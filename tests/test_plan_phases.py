"""plan_step() in phases: each phase of the planner run alone over one step's budget
(llama_preempt._core.StepBudget, the same compiled phases the server's planner runs), and the
phases in order giving plan_step()'s plan."""
from __future__ import annotations

import random

import pytest

from llama_preempt import _core

P = _core.SlotPhase
# a CPU-shaped step: a wider batch buys almost nothing, so the decode width is narrow
CPU = _core.StepCost(fixed_s=0.0003, decode_token_s=0.0100, prompt_token_s=0.0038, attend_cell_s=0.0)


def gen(id: int, n_cells: int, arrival: int = 0, **kw: object) -> _core.SlotView:
    return _core.SlotView(id, P.GENERATING, n_cells=n_cells, arrival=arrival, **kw)


def new(id: int, left: int, arrival: int = 0, **kw: object) -> _core.SlotView:
    return _core.SlotView(id, P.PROMPT, n_cells=0, n_prompt_left=left, is_new=True, arrival=arrival, **kw)


def parked(id: int, n_restore: int, t: int = 0, n_preempt: int = 1, **kw: object) -> _core.SlotView:
    return _core.SlotView(id, P.PARKED, n_restore=n_restore, t_parked_us=t, n_preempt=n_preempt, **kw)


def idle(id: int, n_cells: int) -> _core.SlotView:
    return _core.SlotView(id, P.IDLE, n_cells=n_cells)


def limited(n_pool: int, n_width: int) -> _core.PlanParams:
    s = _core.SchedParams()
    s.n_width = n_width
    p = _core.PlanParams(n_pool, sched=s)
    p.cost = CPU
    p.cost_ready = True
    p.park_to_admit = True
    return p


def test_the_budget_counts_what_running_slots_hold_and_need_and_paused_slots_need_nothing() -> None:
    b = _core.StepBudget([gen(0, 100, arrival=1), gen(1, 50, arrival=2), idle(2, 30), parked(3, 40)], _core.PlanParams(4096))
    assert (b.used, b.need, b.n_running, b.n_growing) == (180, 2, 2, 2)
    assert b.restore == [3]
    b = _core.StepBudget([gen(0, 100, arrival=1), gen(1, 50, arrival=2), gen(2, 50, arrival=3)], limited(4096, 1))
    assert b.paused == [1, 2]
    assert (b.need, b.n_running, b.n_growing) == (1, 3, 1)


def test_end_unfittable_ends_only_parked_slots_larger_than_the_pool() -> None:
    b = _core.StepBudget([parked(0, 256), parked(1, 100), gen(2, 10)], _core.PlanParams(256))
    b.end_unfittable()
    assert b.plan.fail == [0]
    b.resume_due()
    assert b.plan.resume == [1]  # the ended one is never brought back


def test_park_for_running_purges_caches_before_it_parks_and_stops_once_the_step_fits() -> None:
    b = _core.StepBudget([gen(0, 120), gen(1, 100), idle(2, 30)], _core.PlanParams(256))
    b.park_for_running()
    assert (b.plan.purge, b.plan.park) == ([2], [])
    b = _core.StepBudget([gen(0, 120), gen(1, 80), gen(2, 50)], _core.PlanParams(256))
    b.park_for_running()
    assert b.plan.park == [2] and b.used == 200 and b.n_running == 2


def test_park_for_running_gives_a_parked_decoders_seat_to_the_oldest_paused_slot() -> None:
    # width 1: slot 0 decodes, 1 and 2 are paused. A pool too small for slot 0's next token parks
    # it only when no paused victim frees enough; here the paused go first and 0 keeps its seat
    b = _core.StepBudget([gen(0, 100, arrival=1), gen(1, 100, arrival=2), gen(2, 52, arrival=3)], limited(256, 1))
    b.park_for_running()
    assert b.plan.park == [2] and 1 in b.paused and 0 not in b.paused


def test_resume_due_brings_parked_slots_back_fit_first_never_in_a_step_that_parked() -> None:
    b = _core.StepBudget([gen(0, 100), parked(1, 200, t=1), parked(2, 50, t=2)], _core.PlanParams(256))
    b.resume_due()
    assert b.plan.resume == [2] and b.waiting  # slot 1 does not fit yet: it waits
    b = _core.StepBudget([gen(0, 150), gen(1, 100), parked(2, 5, t=1)], _core.PlanParams(256))
    b.park_for_running()
    b.resume_due()
    assert b.plan.park == [1] and b.plan.resume == []


def test_resume_due_leaves_headroom_for_the_slots_it_joins() -> None:
    # 8 cells per growing slot (two: slot 0 and the one resumed) on top of its restore and the margin
    slots = [gen(0, 100), parked(1, 130, t=1)]
    b = _core.StepBudget(slots, _core.PlanParams(100 + 1 + 130 + 16 + 8))
    b.resume_due()
    assert b.plan.resume == [1]
    b = _core.StepBudget(slots, _core.PlanParams(100 + 1 + 130 + 16 + 8 - 1))
    b.resume_due()
    assert b.plan.resume == [] and b.waiting


def test_admit_new_holds_everything_behind_a_waiting_parked_slot() -> None:
    slots = [gen(0, 200), parked(1, 100, t=1), new(2, 20, arrival=5)]
    b = _core.StepBudget(slots, _core.PlanParams(256))
    b.resume_due()
    b.admit_new()
    assert b.plan.hold == [2]
    b = _core.StepBudget([gen(0, 100), new(2, 20, arrival=5)], _core.PlanParams(256))
    b.admit_new()
    assert b.plan.hold == [] and b.n_running == 2 and b.need == 21


def test_admit_new_parks_a_paused_slot_for_a_new_prompt_only_where_that_lets_it_in() -> None:
    slots = [gen(0, 100, arrival=1), gen(1, 100, arrival=2), new(2, 40, arrival=3)]
    b = _core.StepBudget(slots, limited(100 + 100 + 1 + 8 + 20, 1))
    b.admit_new()
    assert b.plan.park == [1] and b.plan.hold == []
    b = _core.StepBudget(slots, limited(100 + 1 + 8 + 20, 1))  # even with slot 1 gone the prompt does not fit
    b.admit_new()
    assert b.plan.park == [] and b.plan.hold == [2]


def test_ensure_progress_lets_the_head_of_the_line_go_when_nothing_runs() -> None:
    b = _core.StepBudget([parked(0, 250), idle(1, 100)], _core.PlanParams(256))
    b.resume_due()
    assert b.plan.resume == []  # the idle cache is in the way of the margin and the headroom
    b.ensure_progress()
    assert b.plan.purge == [1] and b.plan.resume == [0]
    b = _core.StepBudget([new(0, 600), new(1, 10)], _core.PlanParams(256, n_batch=512))
    b.plan  # nothing yet
    b.admit_new()
    b.ensure_progress()
    assert 0 not in b.plan.hold


def test_resume_not_due_brings_back_the_rest_only_with_a_limited_width() -> None:
    slots = [gen(0, 50, arrival=1), gen(1, 50, arrival=2), parked(2, 20, t=1, was_generating=True, arrival=3)]
    b = _core.StepBudget(slots, limited(4096, 1))
    b.resume_due()
    assert b.plan.resume == []  # not due: it would only sit paused
    b.resume_not_due()
    assert b.plan.resume == [2]
    b = _core.StepBudget(slots, _core.PlanParams(4096))
    b.resume_due()
    assert b.plan.resume == [2]  # without a limit every parked slot is due


def test_pick_next_back_is_the_next_parked_slot_that_waits_for_room() -> None:
    slots = [gen(0, 240), parked(1, 100, t=1), parked(2, 100, t=2, n_preempt=2),
             _core.SlotView(3, P.PARKED, n_restore=10, n_preempt=5, waits_for_unpark=True)]
    b = _core.StepBudget(slots, _core.PlanParams(256))
    b.pick_next_back()
    assert b.plan.restore_next == 2  # most preempted first; slot 3 waits for its unpark


def test_share_prompt_tokens_lists_the_paused_and_shares_the_budget_in_arrival_order() -> None:
    slots = [gen(0, 100, arrival=1), new(1, 300, arrival=9), new(2, 200, arrival=5), new(3, 60, arrival=7)]
    s = _core.SchedParams()
    s.n_prompt_budget = 256
    b = _core.StepBudget(slots, _core.PlanParams(4096, sched=s))
    b.admit_new()
    b.share_prompt_tokens()
    assert b.plan.hold == [1] and b.plan.n_prompt_budget == 256
    assert (b.plan.n_used, b.plan.n_need) == (b.used, b.need)


def test_the_phases_in_order_are_plan_step() -> None:
    rng = random.Random(7)
    phases = ("end_unfittable", "park_for_running", "resume_due", "admit_new", "ensure_progress",
              "resume_not_due", "pick_next_back", "share_prompt_tokens")
    for trial in range(300):
        slots = []
        for i in range(rng.randint(1, 8)):
            kind = rng.choice(["gen", "new", "parked", "idle"])
            if kind == "gen":
                slots.append(gen(i, rng.randint(1, 120), arrival=rng.randint(0, 20)))
            elif kind == "new":
                slots.append(new(i, rng.randint(1, 300), arrival=rng.randint(0, 20)))
            elif kind == "parked":
                slots.append(parked(i, rng.randint(1, 300), t=rng.randint(0, 9), n_preempt=rng.randint(1, 4)))
            else:
                slots.append(idle(i, rng.randint(0, 60)))
        p = limited(rng.choice([128, 256, 512]), rng.choice([0, 1, 2])) if trial % 2 else _core.PlanParams(rng.choice([128, 256, 512]))
        b = _core.StepBudget(slots, p)
        for phase in phases:
            getattr(b, phase)()
        want = _core.plan_step(slots, p)
        got = b.plan
        for field in ("purge", "fail", "park", "resume", "hold", "pause", "restore_next", "n_used", "n_need",
                      "n_decode_width", "n_prompt_budget"):
            assert getattr(got, field) == getattr(want, field), (trial, field)


def test_a_budget_needs_slot_ids() -> None:
    with pytest.raises(ValueError, match="id >= 0"):
        _core.StepBudget([_core.SlotView(-1, P.IDLE)], _core.PlanParams(256))
