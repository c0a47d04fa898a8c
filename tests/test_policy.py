"""The preemption policy, driven through llama_preempt._core with no model: the same compiled
code the server runs."""
from __future__ import annotations

import pytest

from llama_preempt import _core

P = _core.SlotPhase


def gen(id: int, n_cells: int, **kw: object) -> _core.SlotView:
    return _core.SlotView(id, P.GENERATING, n_cells=n_cells, **kw)


def prompt(id: int, n_cells: int, left: int, **kw: object) -> _core.SlotView:
    return _core.SlotView(id, P.PROMPT, n_cells=n_cells, n_prompt_left=left, **kw)


def parked(id: int, n_restore: int, t: int = 0, n_preempt: int = 1) -> _core.SlotView:
    return _core.SlotView(id, P.PARKED, n_restore=n_restore, t_parked_us=t, n_preempt=n_preempt)


def idle(id: int, n_cells: int) -> _core.SlotView:
    return _core.SlotView(id, P.IDLE, n_cells=n_cells)


def test_slot_view_rejects_unknown_fields() -> None:
    with pytest.raises(TypeError, match="no field 'bogus'"):
        _core.SlotView(0, P.IDLE, bogus=1)


def test_plan_params_reject_an_empty_pool() -> None:
    with pytest.raises(ValueError):
        _core.PlanParams(0)


def test_nothing_happens_when_the_next_step_fits() -> None:
    pl = _core.plan_step([gen(0, 100), gen(1, 100)], _core.PlanParams(256))
    assert not pl.has_action()
    assert (pl.n_used, pl.n_need) == (200, 2)


def test_a_full_pool_parks_the_smallest_slot_that_is_not_the_leader() -> None:
    slots = [gen(0, 120), gen(1, 80), gen(2, 50)]
    pl = _core.plan_step(slots, _core.PlanParams(256))
    assert list(pl.park) == [2]
    assert pl.n_used == 200


def test_the_leader_is_never_parked_even_when_it_is_alone_with_the_overflow() -> None:
    pl = _core.plan_step([gen(0, 250), idle(1, 0)], _core.PlanParams(256))
    assert list(pl.park) == []


def test_idle_caches_are_dropped_before_any_running_slot_is_parked() -> None:
    slots = [gen(0, 120), gen(1, 100), idle(2, 30)]
    pl = _core.plan_step(slots, _core.PlanParams(256))
    assert list(pl.purge) == [2]
    assert list(pl.park) == []


def test_a_slot_parked_three_times_is_passed_over_while_another_candidate_exists() -> None:
    slots = [gen(0, 150), gen(1, 40, n_preempt=3), gen(2, 60)]
    pl = _core.plan_step(slots, _core.PlanParams(256))
    assert list(pl.park) == [2]
    # with no other candidate the starved slot is still eligible
    pl = _core.plan_step([gen(0, 200), gen(1, 60, n_preempt=3)], _core.PlanParams(256))
    assert list(pl.park) == [1]


def test_families_and_multimodal_slots_are_never_victims() -> None:
    slots = [gen(0, 150), gen(1, 40, in_family=True), gen(2, 60, is_multimodal=True)]
    pl = _core.plan_step(slots, _core.PlanParams(256))
    assert list(pl.park) == []


def test_a_resuming_slot_is_passed_over_while_another_candidate_exists() -> None:
    slots = [gen(0, 150), prompt(1, 30, 40, n_replay_left=40), gen(2, 60)]
    assert _core.select_victim(slots, _core.PlanParams(256)) == 2


def test_prompt_phase_slots_are_victims() -> None:
    slots = [gen(0, 200), prompt(1, 40, 100)]
    pl = _core.plan_step(slots, _core.PlanParams(256, n_batch=32))
    assert list(pl.park) == [1]


def test_a_resuming_slot_is_charged_its_whole_remaining_replay() -> None:
    p = _core.PlanParams(1024, n_batch=32)
    assert _core.reservation(prompt(0, 0, 300, n_replay_left=300), p) == 300
    assert _core.reservation(prompt(0, 0, 300), p) == 32
    assert _core.reservation(gen(0, 10, n_draft=3), p) == 4


def test_children_share_their_prompt_cells_with_the_parent() -> None:
    slots = [gen(0, 100, in_family=True), gen(1, 110, in_family=True, n_shared=100)]
    pl = _core.plan_step(slots, _core.PlanParams(200))
    assert pl.n_used == 110
    assert not pl.has_action()


def test_restore_order_is_most_preempted_first_then_longest_parked() -> None:
    slots = [parked(0, 10, t=300, n_preempt=1), parked(1, 10, t=100, n_preempt=1),
             parked(2, 10, t=500, n_preempt=2)]
    assert list(_core.restore_order(slots)) == [2, 1, 0]


def test_parked_slots_resume_fit_first_when_room_returns() -> None:
    slots = [gen(0, 100), parked(1, 200, t=1), parked(2, 50, t=2)]
    pl = _core.plan_step(slots, _core.PlanParams(256))
    assert list(pl.resume) == [2]  # slot 1 does not fit beside slot 0 yet; slot 2 does


def test_nothing_resumes_in_a_step_that_parked() -> None:
    slots = [gen(0, 150), gen(1, 100), parked(2, 5, t=1)]
    pl = _core.plan_step(slots, _core.PlanParams(256))
    assert list(pl.park) == [1]
    assert list(pl.resume) == []


def test_a_parked_slot_resumes_into_an_empty_pool_without_the_margin() -> None:
    pl = _core.plan_step([parked(0, 250), idle(1, 0)], _core.PlanParams(256))
    assert list(pl.resume) == [0]


def test_a_parked_sequence_larger_than_the_pool_fails_instead_of_waiting_forever() -> None:
    pl = _core.plan_step([parked(0, 256), gen(1, 10)], _core.PlanParams(256))
    assert list(pl.fail) == [0]
    assert list(pl.resume) == []


def test_new_requests_wait_behind_a_parked_slot() -> None:
    slots = [gen(0, 200), parked(1, 100, t=1), prompt(2, 0, 20, is_new=True)]
    pl = _core.plan_step(slots, _core.PlanParams(256))
    assert list(pl.resume) == []
    assert list(pl.hold) == [2]


def test_new_requests_are_admitted_when_they_fit_and_nobody_waits() -> None:
    slots = [gen(0, 100), prompt(1, 0, 20, is_new=True)]
    pl = _core.plan_step(slots, _core.PlanParams(256, n_batch=32))
    assert list(pl.hold) == []
    assert pl.n_need == 1 + 20


def test_a_new_request_is_admitted_into_an_empty_pool_even_if_its_chunk_is_large() -> None:
    slots = [prompt(0, 0, 5000, is_new=True), idle(1, 0)]
    pl = _core.plan_step(slots, _core.PlanParams(256, n_batch=2048))
    assert list(pl.hold) == []


def test_the_policy_never_livelocks_every_step_makes_progress() -> None:
    """The server's loop in simulation (the planner and the park mechanics the server calls) on a
    tiny pool that three requests overflow together: every request finishes, the pool never
    overflows, and it took parks to get there."""
    p = _core.SimParams()
    p.n_pool, p.n_slots, p.n_batch = 128, 3, 16
    for ram in (-1, 0):  # by SWAP and by RECOMPUTE
        p.preempt_ram_mib = ram
        r = _core.simulate([0.0, 0.0, 0.0], [20, 30, 40], [70, 70, 70], p)
        assert [q.outcome for q in r.requests] == [_core.SimOutcome.COMPLETED] * 3  # all completed
        assert not r.hit_step_limit
        assert r.peak_cells <= p.n_pool
        assert r.n_park_swap + r.n_park_recompute > 0
        assert (r.n_park_recompute == 0) == (ram != 0)


def test_a_new_requests_cache_is_reclaimed_for_a_parked_slot_that_waits() -> None:
    # a new request whose slot caches 2000 cells must not keep a parked slot out forever
    slots = [parked(0, 2300, t=1), prompt(1, 2000, 500, is_new=True)]
    pl = _core.plan_step(slots, _core.PlanParams(4096))
    assert list(pl.purge) == [1]
    assert list(pl.resume) == [0]
    assert list(pl.hold) == []  # with its cache reclaimed, the new request fits beside it too


def test_idle_caches_are_reclaimed_before_new_requests_caches() -> None:
    slots = [gen(0, 3000), idle(1, 500), prompt(2, 600, 10, is_new=True), parked(3, 400, t=1)]
    pl = _core.plan_step(slots, _core.PlanParams(4096))
    assert list(pl.purge) == [1]
    assert list(pl.resume) == [3]


def test_with_nothing_running_the_head_of_the_line_always_goes() -> None:
    # a parked slot that cannot resume this step (held) leaves the first new request to run
    held = parked(0, 100, t=1)
    held.can_resume = False
    pl = _core.plan_step([held, prompt(1, 0, 50, is_new=True), prompt(2, 0, 50, is_new=True)],
                         _core.PlanParams(256))
    assert list(pl.resume) == []
    assert list(pl.hold) == [2]


def test_a_slot_holding_no_cells_is_passed_over_as_a_victim() -> None:
    slots = [gen(0, 150), prompt(1, 0, 64), gen(2, 90)]
    assert _core.select_victim(slots, _core.PlanParams(256)) == 2


def test_a_new_request_into_an_empty_pool_gets_idle_caches_out_of_its_way() -> None:
    slots = [prompt(0, 0, 5000, is_new=True), idle(1, 200)]
    pl = _core.plan_step(slots, _core.PlanParams(256, n_batch=2048))
    assert list(pl.purge) == [1]
    assert list(pl.hold) == []


# --- request priority ---

def test_the_lowest_priority_slot_is_parked_first_even_when_it_is_the_largest() -> None:
    slots = [gen(0, 50, priority=5), gen(1, 60, priority=5), gen(2, 140, priority=0)]
    # within one priority the smallest would go (slot 0); priority comes first
    assert _core.select_victim(slots, _core.PlanParams(256)) == 2
    pl = _core.plan_step(slots, _core.PlanParams(256))
    assert pl.park == [2]


def test_the_leader_is_the_largest_of_the_highest_priority() -> None:
    # the high-priority slot is the leader even though a low-priority one is larger: it keeps running
    slots = [gen(0, 40, priority=9), gen(1, 200, priority=0)]
    assert _core.select_victim(slots, _core.PlanParams(245)) == 1


def test_a_high_priority_slot_is_parked_only_when_no_lower_priority_candidate_exists() -> None:
    slots = [gen(0, 100, priority=2), gen(1, 90, priority=2), gen(2, 30, priority=1, n_preempt=3)]
    # the starved low-priority slot still goes before any higher-priority one
    assert _core.select_victim(slots, _core.PlanParams(256)) == 2
    assert _core.select_victim(slots, _core.PlanParams(256), skip=[2]) == 1


def test_the_starvation_guard_orders_slots_within_one_priority() -> None:
    slots = [gen(0, 200), gen(1, 20, n_preempt=3), gen(2, 30)]
    assert _core.select_victim(slots, _core.PlanParams(256)) == 2


def test_restore_goes_highest_priority_first() -> None:
    slots = [_core.SlotView(0, P.PARKED, n_restore=50, t_parked_us=1, n_preempt=3, priority=0),
             _core.SlotView(1, P.PARKED, n_restore=50, t_parked_us=5, n_preempt=1, priority=4),
             _core.SlotView(2, P.PARKED, n_restore=50, t_parked_us=2, n_preempt=1, priority=4)]
    assert _core.restore_order(slots) == [2, 1, 0]
    # room for one: the high-priority slot parked longest comes back
    assert _core.plan_step(slots, _core.PlanParams(60)).resume == [2]


# --- SWAP or RECOMPUTE (choose_park): the server's and the simulator's one implementation ---


def rates(park_gbps: float, restore_gbps: float, prefill_tps: float, write_gbps: float | None = None,
          read_gbps: float | None = None) -> _core.CostRates:
    """Measured rates as the server keeps them: host copies in GB/s, prefill in tokens/s, and the
    disk's write and read in GB/s (left at their defaults when not given)."""
    r = _core.CostRates()
    r.park_bps, r.restore_bps, r.prefill_tps = park_gbps * 1e9, restore_gbps * 1e9, prefill_tps
    if write_gbps is not None:
        r.disk_write_bps = write_gbps * 1e9
    if read_gbps is not None:
        r.disk_read_bps = read_gbps * 1e9
    return r


def test_auto_takes_the_cheaper_of_swap_and_recompute_by_the_rates() -> None:
    mib = 1 << 20
    # 40 MiB at 2 + 4 GB/s is about 31 ms; 1000 tokens at 10,000 tokens/s is 100 ms
    d = _core.choose_park("auto", 40 * mib, 1000, 1 << 40, rates(2, 4, 10_000))
    assert (d.swap, d.why) == (True, "swap_cheaper")
    assert d.swap_ms == pytest.approx(1e3 * 40 * mib / 2e9 + 1e3 * 40 * mib / 4e9)
    assert d.recompute_ms == pytest.approx(100.0)
    # the same victim over a slow link: 0.2 + 0.4 GB/s is about 315 ms
    d = _core.choose_park("auto", 40 * mib, 1000, 1 << 40, rates(0.2, 0.4, 10_000))
    assert (d.swap, d.why) == (False, "recompute_cheaper")


def test_the_budget_the_mode_and_an_unsizable_state_come_before_the_price() -> None:
    cheap = rates(100, 100, 1)
    assert _core.choose_park("auto", 2 << 20, 100, 1 << 20, cheap).why == "over_budget"
    assert _core.choose_park("swap", 2 << 20, 100, 1 << 20, cheap).why == "over_budget"
    assert _core.choose_park("auto", 0, 100, 1 << 40, cheap).why == "no_state"
    assert _core.choose_park("recompute", 2 << 20, 100, 1 << 40, cheap).why == "recompute_mode"
    dear = rates(0.001, 0.001, 1e6)
    d = _core.choose_park("swap", 2 << 20, 100, 1 << 40, dear)
    assert (d.swap, d.why) == (True, "swap_mode")  # swap regardless of the price
    with pytest.raises(ValueError, match="auto, swap or recompute"):
        _core.choose_park("fast", 1, 1, 1, dear)


def test_the_rates_are_moving_averages_of_samples_large_enough_to_time() -> None:
    r = _core.CostRates()
    default = r.park_bps
    r.observe_park(1000, 10)  # 1 kB: fixed overhead, not bandwidth
    assert r.park_bps == default and r.n_park_samples == 0
    r.observe_park(8 << 20, 1000)  # 8 MiB in 1 ms: the first sample replaces the default
    assert r.park_bps == pytest.approx((8 << 20) * 1e3)
    r.observe_park(8 << 20, 2000)  # then a quarter of each new sample
    assert r.park_bps == pytest.approx(0.75 * (8 << 20) * 1e3 + 0.25 * (8 << 20) * 5e2)
    r.observe_prefill(16, 1000)  # too few tokens to time
    assert r.n_prefill_samples == 0
    r.observe_prefill(512, 100_000)
    assert r.prefill_tps == pytest.approx(5120.0)
    r.observe_restore(4 << 20, 500)
    assert r.restore_bps == pytest.approx((4 << 20) * 2e3) and r.n_restore_samples == 1


def test_the_simulator_prices_victims_with_the_same_choice() -> None:
    import llama_preempt
    from llama_preempt.simulator import Costs, Workload

    wl = Workload((0.0,) * 4, (300, 300, 300, 300), (300, 300, 300, 300))
    fast = llama_preempt.simulate(wl, n_ctx=1024, n_parallel=4)
    assert fast.parks_swap > 0 and fast.parks_recompute == 0
    assert fast.parks_by_choice == {"swap_cheaper": fast.parks}
    slow = llama_preempt.simulate(wl, n_ctx=1024, n_parallel=4,
                                  costs=Costs(swap_out_gbps=0.0005, swap_in_gbps=0.0005))
    assert slow.parks_swap == 0 and slow.parks_recompute > 0
    assert slow.parks_by_choice == {"recompute_cheaper": slow.parks}
    forced = llama_preempt.simulate(wl, n_ctx=1024, n_parallel=4, preempt_mode="swap",
                                    costs=Costs(swap_out_gbps=0.0005, swap_in_gbps=0.0005))
    assert forced.parks_recompute == 0 and forced.parks_by_choice == {"swap_mode": forced.parks}


# --- which slot may be parked, and what a parked slot needs to come back ---

def test_family_multimodal_and_unreplayable_slots_may_not_be_parked_and_say_why() -> None:
    assert _core.may_park(gen(0, 10)) and _core.park_blocker(gen(0, 10)) == ""
    assert "n_cmpl" in _core.park_blocker(gen(0, 10, in_family=True))
    assert "media" in _core.park_blocker(gen(0, 10, is_multimodal=True))
    assert "replayed" in _core.park_blocker(gen(0, 10, can_park=False))
    assert not _core.may_park(gen(0, 10, in_family=True))


F = _core.ParkedFrom


@pytest.mark.parametrize("at, replaying, held, swap, want_from, want_restore, want_redo", [
    # by SWAP: back in place plus its next step (one token, or one prompt chunk of at most n_batch)
    (F.GENERATING, False, 100, True, F.GENERATING, 101, 0),
    (F.PROMPT, False, 100, True, F.PROMPT, 100 + 64, 0),
    # by RECOMPUTE: a generating slot replays what it held plus the token it had sampled
    (F.GENERATING, False, 100, False, F.GENERATING, 101, 0),
    # mid-prompt: starts its prompt over and redoes what it had processed
    (F.PROMPT, False, 100, False, F.PROMPT, 164, 100),
    # mid-replay: the replay list is still whole
    (F.PROMPT, True, 40, False, F.GENERATING, 77, 0),
    # a new request that had not started: its first chunk
    (F.STARTED, False, 0, False, F.STARTED, 64, 0),
])
def test_the_policy_shapes_every_park(at, replaying, held, swap, want_from, want_restore, want_redo) -> None:
    victim = _core.ParkInput(at, replaying=replaying, n_held=held, n_prompt=500, n_replay=77)
    shape = _core.shape_park(victim, swap, 64)
    assert (shape.from_, shape.n_restore, shape.n_redo) == (want_from, want_restore, want_redo)


def test_a_prompt_victims_swap_restore_needs_no_more_than_its_prompt() -> None:
    shape = _core.shape_park(_core.ParkInput(F.PROMPT, n_held=480, n_prompt=500), True, 64)
    assert shape.n_restore == 500


def test_only_a_slot_holding_prompt_or_generated_cells_has_state_to_swap() -> None:
    assert _core.has_swap_state(_core.ParkInput(F.GENERATING, n_held=10))
    assert _core.has_swap_state(_core.ParkInput(F.PROMPT, n_held=10))
    assert not _core.has_swap_state(_core.ParkInput(F.PROMPT, replaying=True, n_held=10))  # recompute it again
    assert not _core.has_swap_state(_core.ParkInput(F.STARTED, n_held=10))  # only a cache
    assert not _core.has_swap_state(_core.ParkInput(F.GENERATING, n_held=0))


def test_a_zero_ram_budget_means_recompute_whatever_the_mode() -> None:
    assert _core.effective_mode("swap", 0) == "recompute"
    assert _core.effective_mode("auto", 0) == "recompute"
    assert _core.effective_mode("swap", 1) == "swap"
    assert _core.effective_mode("auto", -1) == "auto"
    assert _core.ram_budget_from_mib(-1) == 2**64 - 1
    assert _core.ram_left(_core.ram_budget_from_mib(1), 1 << 19) == 1 << 19
    assert _core.ram_left(100, 300) == 0


def test_restore_ahead_is_the_next_parked_slot_that_waits_for_room_not_for_unpark() -> None:
    # the pool is full: nothing resumes this step, and the slot to come back first is named
    slots = [gen(0, 900), parked(1, 200, t=2, n_preempt=1), parked(2, 200, t=1, n_preempt=1)]
    pl = _core.plan_step(slots, _core.PlanParams(1000))
    assert list(pl.resume) == [] and pl.restore_next == 2  # longest parked first
    held = _core.SlotView(2, P.PARKED, n_restore=200, t_parked_us=1, n_preempt=1, waits_for_unpark=True)
    pl = _core.plan_step([gen(0, 900), parked(1, 200, t=2), held], _core.PlanParams(1000))
    assert pl.restore_next == 1  # a slot parked through the API waits for unpark: never uploaded ahead
    # one that resumes this step is not uploaded ahead; the next one is
    pl = _core.plan_step([gen(0, 10), parked(1, 200, t=2), parked(2, 200, t=1)], _core.PlanParams(1000))
    assert list(pl.resume) == [2, 1] and pl.restore_next == -1


def test_a_slot_parked_through_the_api_is_never_resumed_by_the_planner() -> None:
    held = _core.SlotView(1, P.PARKED, n_restore=10, t_parked_us=1, n_preempt=1, waits_for_unpark=True)
    pl = _core.plan_step([held], _core.PlanParams(1000))
    assert list(pl.resume) == []


def test_a_slot_parked_through_the_api_never_holds_back_a_new_request() -> None:
    # issue 64: one running slot holds 100 of 4,096 cells, one waits for its unpark, a new
    # 20-token prompt arrives: it goes now, and nothing waits on the parked one
    held = _core.SlotView(1, P.PARKED, n_restore=10, t_parked_us=1, n_preempt=1, waits_for_unpark=True)
    newcomer = _core.SlotView(2, P.PROMPT, n_cells=0, n_prompt_left=20, is_new=True, arrival=5)
    pl = _core.plan_step([gen(0, 100), held, newcomer], _core.PlanParams(4096))
    assert list(pl.hold) == [] and list(pl.resume) == [] and list(pl.purge) == []
    # three newcomers: all three go
    many = [_core.SlotView(i, P.PROMPT, n_cells=0, n_prompt_left=20, is_new=True, arrival=5 + i) for i in (2, 3, 4)]
    pl = _core.plan_step([gen(0, 100), held, *many], _core.PlanParams(4096))
    assert list(pl.hold) == []
    # and with nothing running, the API-parked slot makes the planner neither resume it nor purge
    # the idle caches for it
    pl = _core.plan_step([held, _core.SlotView(3, P.IDLE, n_cells=100)], _core.PlanParams(4096))
    assert list(pl.resume) == [] and list(pl.purge) == []


def test_the_flag_checks_are_llama_servers_own() -> None:
    assert _core.parse_preempt_ram_mib("-1") == -1 and _core.parse_preempt_ram_mib("4096") == 4096
    for bad in ("-2", "lots", "1.5", "99999999999", ""):
        with pytest.raises(ValueError, match="--preempt-ram expects"):
            _core.parse_preempt_ram_mib(bad)
    assert _core.parse_preempt_mode("swap") == "swap"
    with pytest.raises(ValueError, match="--preempt-mode expects auto, swap or recompute"):
        _core.parse_preempt_mode("fast")
    assert tuple(_core.PREEMPT_MODES) == ("auto", "swap", "recompute")


# --- the disk tier in the choice: RAM, disk or RECOMPUTE ---

MIB = 1 << 20


def test_a_victim_that_does_not_fit_the_ram_goes_to_disk_when_that_is_cheaper_than_a_recompute() -> None:
    r = rates(10, 10, 1000, 1, 2)
    # 10 MiB: copies 2 ms, written on the loop 10.5 ms, read 5.2 ms; 1000 tokens at 1000/s: 1 s
    d = _core.choose_park("auto", 10 * MIB, 1000, 1 * MIB, r, disk_left=1 << 40)
    assert (d.swap, d.disk, d.tier, d.why) == (True, True, "disk", "ram_full")
    assert d.disk_ms == pytest.approx(1e3 * 10 * MIB * (2 / 10e9 + 1 / 1e9 + 1 / 2e9))
    # the same victim, its read hidden behind another parked slot
    d = _core.choose_park("auto", 10 * MIB, 1000, 1 * MIB, r, disk_left=1 << 40, waits_behind=True)
    assert d.disk_ms == pytest.approx(1e3 * 10 * MIB * (2 / 10e9 + 1 / 1e9))
    # a slow disk against a fast prefill: recompute
    d = _core.choose_park("auto", 10 * MIB, 10, 1 * MIB, rates(10, 10, 1e6, 0.01, 0.01), disk_left=1 << 40)
    assert (d.swap, d.tier, d.why) == (False, "recompute", "recompute_cheaper")
    # no disk tier, or a full one: over the budget as before
    assert _core.choose_park("auto", 10 * MIB, 1000, 1 * MIB, r).why == "over_budget"
    assert _core.choose_park("auto", 10 * MIB, 1000, 1 * MIB, r, disk_left=5 * MIB).why == "over_budget"
    # --preempt-mode swap: to disk whatever the price, when it does not fit the RAM
    d = _core.choose_park("swap", 10 * MIB, 10, 1 * MIB, rates(10, 10, 1e6, 0.01, 0.01), disk_left=1 << 40)
    assert (d.tier, d.why) == ("disk", "ram_full")
    assert _core.choose_park("recompute", 10 * MIB, 1000, 1 * MIB, r, disk_left=1 << 40).why == "recompute_mode"


def test_ram_goes_to_disk_when_it_is_short_and_the_victims_read_can_be_hidden() -> None:
    r = rates(10, 10, 1000, 1, 2)
    # 10 MiB fits 15 MiB of RAM, leaving less than its own size for the next victim: the RAM is
    # worth a visible read, and a victim whose read runs ahead gives it up
    d = _core.choose_park("auto", 10 * MIB, 1000, 15 * MIB, r, disk_left=1 << 40, waits_behind=True)
    assert (d.tier, d.why) == ("disk", "disk_cheaper")
    # written in the background (it fits the RAM): the write is not on the price
    assert d.disk_ms == pytest.approx(d.swap_ms)
    # its read cannot be hidden: RAM
    assert _core.choose_park("auto", 10 * MIB, 1000, 15 * MIB, r, disk_left=1 << 40).tier == "ram"
    # plenty of RAM: RAM, hidden read or not
    assert _core.choose_park("auto", 10 * MIB, 1000, 1 << 40, r, disk_left=1 << 40, waits_behind=True).why == "swap_cheaper"
    # --preempt-mode swap keeps what fits in RAM
    assert _core.choose_park("swap", 10 * MIB, 1000, 15 * MIB, r, disk_left=1 << 40, waits_behind=True).tier == "ram"


def test_the_tiers_are_rows_with_a_room_check_and_a_quote_from_the_rates() -> None:
    r = rates(10, 10, 1000, 1, 2)
    rows = _core.tier_offers(10 * MIB, 1000, 1 * MIB, r, disk_left=1 << 40)
    assert [t["tier"] for t in rows] == ["ram", "disk", "recompute"]  # tier order: RAM, disk, RECOMPUTE last
    ram, disk, rec = rows
    copy_ms = 1e3 * 10 * MIB / 10e9 * 2
    assert ram["copies"] and not ram["fits"] and ram["ms"] == pytest.approx(copy_ms)
    # RAM has no room: the file is written on the loop, then read back at the resume
    assert disk["fits"] and disk["ms"] == pytest.approx(copy_ms + 1e3 * 10 * MIB / 1e9 + 1e3 * 10 * MIB / 2e9)
    assert not rec["copies"] and rec["fits"] and rec["ms"] == pytest.approx(1000.0)
    # no disk tier: its row has no room
    assert not _core.tier_offers(10 * MIB, 1000, 1 * MIB, r)[1]["fits"]
    # RAM taken down to less than the state's size is ranked with the read the next victim then pays
    short = _core.tier_offers(10 * MIB, 1000, 15 * MIB, r, disk_left=1 << 40)[0]
    assert short["fits"] and short["rank_ms"] == pytest.approx(copy_ms + 1e3 * 10 * MIB / 2e9)


@pytest.mark.parametrize("mode, bytes_, ram_left, disk_left, tier, reason, why", [
    ("auto", 10 * MIB, 1 << 40, 0, "ram", "cheapest", "swap_cheaper"),
    ("auto", 10 * MIB, 1 * MIB, 1 << 40, "disk", "room", "ram_full"),  # RAM had no room before it
    ("auto", 10 * MIB, 1 * MIB, 5 * MIB, "recompute", "no_room", "over_budget"),
    ("auto", 0, 1 << 40, 0, "recompute", "no_state", "no_state"),
    ("swap", 10 * MIB, 1 << 40, 1 << 40, "ram", "mode", "swap_mode"),
    ("swap", 10 * MIB, 1 * MIB, 1 << 40, "disk", "room", "ram_full"),
    ("recompute", 10 * MIB, 1 << 40, 1 << 40, "recompute", "mode", "recompute_mode"),
])
def test_a_parks_reason_is_its_tier_and_a_reason_any_tier_can_have(
        mode: str, bytes_: int, ram_left: int, disk_left: int, tier: str, reason: str, why: str) -> None:
    d = _core.choose_park(mode, bytes_, 1000, ram_left, rates(10, 10, 1000, 1, 2), disk_left=disk_left)
    assert (d.tier, d.reason, d.why) == (tier, reason, why)


def test_auto_takes_the_cheapest_tier_with_room_from_the_rows_alone() -> None:
    """choose_park() is a function of tier_offers(): over a grid of sizes, budgets and rates, auto
    takes the row that copies, has room and ranks lowest (ties to the earlier row), unless
    RECOMPUTE's quote is at or below that row's own."""
    seen = set()
    for bytes_ in (0, 1 * MIB, 10 * MIB, 64 * MIB):
        for ram_left in (0, 5 * MIB, 15 * MIB, 1 << 40):
            for disk_left in (0, 8 * MIB, 1 << 40):
                for n_tokens in (10, 1000, 100_000):
                    for r in (rates(10, 10, 1000, 1, 2), rates(0.1, 0.1, 1e5, 5, 5), rates(2, 4, 500, 0.05, 0.1)):
                        for behind in (False, True):
                            rows = _core.tier_offers(bytes_, n_tokens, ram_left, r, disk_left=disk_left, waits_behind=behind)
                            d = _core.choose_park("auto", bytes_, n_tokens, ram_left, r, disk_left=disk_left,
                                                  waits_behind=behind)
                            rec = rows[-1]
                            fitting = [t for t in rows if t["copies"] and t["fits"]] if bytes_ > 0 else []
                            best = min(fitting, key=lambda t: t["rank_ms"]) if fitting else None
                            want = best["tier"] if best and best["ms"] < rec["ms"] else "recompute"
                            assert d.tier == want, (bytes_, ram_left, disk_left, n_tokens, behind, rows)
                            seen.add(d.tier)
    assert seen == {"ram", "disk", "recompute"}  # the grid reaches every tier


def test_a_victim_waits_behind_a_parked_slot_by_the_planners_restore_order() -> None:
    # parked slots come back highest priority first, then most parked, then longest parked
    assert not _core.waits_behind_parked([gen(0, 100), gen(1, 100)], 1)  # nothing parked
    assert _core.waits_behind_parked([gen(0, 100), gen(1, 100), parked(2, 50, t=5, n_preempt=1)], 1)
    # parked three times already: it will be the most parked and comes back first
    assert not _core.waits_behind_parked([gen(0, 100), gen(1, 100, n_preempt=3), parked(2, 50, t=5, n_preempt=1)], 1)
    # a higher priority comes back before the parked one
    assert not _core.waits_behind_parked([gen(0, 100), gen(1, 100, priority=2), parked(2, 50, t=5, n_preempt=1)], 1)
    # a slot parked through the API does not come back by itself
    held = _core.SlotView(2, P.PARKED, n_restore=50, t_parked_us=5, n_preempt=1, waits_for_unpark=True)
    assert not _core.waits_behind_parked([gen(0, 100), gen(1, 100), held], 1)


def test_the_disk_rates_are_moving_averages_too() -> None:
    r = _core.CostRates()
    assert r.disk_write_bps == _core.DEFAULT_DISK_WRITE_BPS and r.disk_read_bps == _core.DEFAULT_DISK_READ_BPS
    r.observe_disk_write(1000, 10)  # too small to time
    assert r.n_disk_write_samples == 0
    r.observe_disk_write(8 << 20, 4000)
    r.observe_disk_read(8 << 20, 2000)
    assert r.disk_write_bps == pytest.approx((8 << 20) * 250) and r.n_disk_write_samples == 1
    assert r.disk_read_bps == pytest.approx((8 << 20) * 500) and r.n_disk_read_samples == 1


def test_a_zero_ram_budget_with_a_disk_tier_still_swaps_to_disk() -> None:
    assert _core.effective_mode("swap", 0, 0) == "recompute"
    assert _core.effective_mode("swap", 0, 64) == "swap"
    assert _core.effective_mode("auto", 0, -1) == "auto"
    assert _core.parse_preempt_disk_mib("-1") == -1 and _core.parse_preempt_disk_mib("64") == 64
    for bad in ("0", "-2", "lots", ""):
        with pytest.raises(ValueError, match="--preempt-disk-mib expects"):
            _core.parse_preempt_disk_mib(bad)


def test_the_simulator_parks_to_disk_when_the_ram_is_too_small() -> None:
    import llama_preempt
    from llama_preempt.simulator import Costs, Workload

    wl = Workload((0.0,) * 4, (300, 300, 300, 300), (300, 300, 300, 300))
    slow_prefill = Costs(prefill_token_ms=50.0)  # a recompute of 300 tokens: 15 s
    ram_only = llama_preempt.simulate(wl, n_ctx=1024, n_parallel=4, preempt_ram_mib=1, costs=slow_prefill)
    assert ram_only.parks_disk == 0 and ram_only.parks_recompute > 0
    assert ram_only.parks_by_choice.get("over_budget", 0) == ram_only.parks_recompute
    disk = llama_preempt.simulate(wl, n_ctx=1024, n_parallel=4, preempt_ram_mib=1, preempt_disk_mib=-1,
                                  costs=slow_prefill)
    assert disk.completed == 4 and disk.parks_recompute == 0
    assert disk.parks_disk == disk.parks_swap > 0 and disk.parks_by_choice == {"ram_full": disk.parks}
    assert disk.peak_disk_mib > 0 and disk.peak_parked_mib <= 1.0
    assert disk.makespan_s < ram_only.makespan_s
    # a disk budget smaller than one victim: recompute again
    small = llama_preempt.simulate(wl, n_ctx=1024, n_parallel=4, preempt_ram_mib=1, preempt_disk_mib=1,
                                   costs=slow_prefill)
    assert small.parks_disk == 0


# --- overload: who goes first when the pool is short (issue 31) ---

def sched(**kw: int) -> _core.SchedParams:
    s = _core.SchedParams()
    for k, v in kw.items():
        setattr(s, k, v)
    return s


def test_new_requests_are_admitted_in_arrival_order_not_slot_order() -> None:
    # slot 3's request came first and does not fit yet: the later, smaller one in slot 1 waits behind
    # it instead of passing it (a long prompt is never passed over by short ones for ever)
    slots = [gen(0, 180), prompt(1, 0, 20, is_new=True, arrival=9), idle(2, 0), prompt(3, 0, 100, is_new=True, arrival=4)]
    pl = _core.plan_step(slots, _core.PlanParams(256, n_batch=512))
    assert list(pl.hold) == [3, 1]
    # room returns for one: the first to arrive goes first, the next waits for its turn
    slots[0] = gen(0, 130)
    pl = _core.plan_step(slots, _core.PlanParams(256, n_batch=512))
    assert list(pl.hold) == [1]


def test_a_later_request_may_pass_one_that_does_not_fit_only_for_the_pass_limit() -> None:
    # slot 3's request (arrived first, at t=0) does not fit; slot 1's, later and small, does
    slots = [gen(0, 180), prompt(1, 0, 20, is_new=True, arrival=9, t_arrival_us=1_000_000), idle(2, 0),
             prompt(3, 0, 100, is_new=True, arrival=4, t_arrival_us=0)]
    limit = sched(pass_limit_us=5_000_000)
    early = _core.plan_step(slots, _core.PlanParams(256, t_now_us=4_000_000, sched=limit))
    assert list(early.hold) == [3]     # passed while it has waited less than the limit
    late = _core.plan_step(slots, _core.PlanParams(256, t_now_us=5_000_000, sched=limit))
    assert list(late.hold) == [3, 1]   # from then on nothing passes it
    strict = _core.plan_step(slots, _core.PlanParams(256, t_now_us=0, sched=sched(pass_limit_us=0)))
    assert list(strict.hold) == [3, 1]


def test_a_parked_request_resumes_before_a_newcomer_takes_its_room() -> None:
    # room for one of them (170 + 1 running, 60 to restore, the margin of 8: 239 of 256)
    slots = [gen(0, 170), parked(1, 60, t=1), prompt(2, 0, 20, is_new=True, arrival=1)]
    pl = _core.plan_step(slots, _core.PlanParams(256, sched=sched(n_restore_headroom=0)))
    assert list(pl.resume) == [1] and list(pl.hold) == [2]


def test_aging_lifts_a_waiting_request_one_priority_level_per_step_of_waiting() -> None:
    # a priority-0 request waiting since t=0 and a priority-2 newcomer: before two age steps have
    # passed the newcomer goes first; from then on the older one ranks with it, first come first served
    slots = [gen(0, 150), prompt(1, 0, 60, is_new=True, arrival=1, t_arrival_us=0),
             prompt(2, 0, 60, is_new=True, arrival=2, t_arrival_us=19_000_000, priority=2)]
    step = 10_000_000
    early = _core.plan_step(slots, _core.PlanParams(256, t_now_us=19_500_000, sched=sched(age_step_us=step)))
    assert list(early.hold) == [1]
    late = _core.plan_step(slots, _core.PlanParams(256, t_now_us=20_000_000, sched=sched(age_step_us=step)))
    assert list(late.hold) == [2]
    # without aging the priority-2 request always goes first
    never = _core.plan_step(slots, _core.PlanParams(256, t_now_us=10**12, sched=sched(age_step_us=0)))
    assert list(never.hold) == [1]


def test_aging_orders_parked_slots_across_priorities_only() -> None:
    slots = [parked(0, 10, t=0, n_preempt=1), parked(1, 10, t=5_000_000, n_preempt=1)]
    slots[1].priority = 1
    p = _core.PlanParams(256, t_now_us=9_000_000, sched=sched(age_step_us=10_000_000))
    assert list(_core.restore_order(slots, p)) == [1, 0]
    p.t_now_us = 10_000_000  # slot 0 has waited one step: it ranks with slot 1, and was parked first
    assert list(_core.restore_order(slots, p)) == [0, 1]


def test_repeated_parks_of_one_request_are_capped() -> None:
    # slot 1 is the smallest, but it was parked n_starved times already: slot 2 goes instead
    slots = [gen(0, 200), gen(1, 20, n_preempt=2), gen(2, 30, n_preempt=0)]
    assert _core.select_victim(slots, _core.PlanParams(256, sched=sched(n_starved=2))) == 2
    assert _core.select_victim(slots, _core.PlanParams(256, sched=sched(n_starved=3))) == 1


def test_a_slot_about_to_finish_is_not_parked_while_another_can_be() -> None:
    slots = [gen(0, 200), gen(1, 20, n_gen_left=4), gen(2, 30, n_gen_left=300)]
    assert _core.select_victim(slots, _core.PlanParams(256, sched=sched(n_near_finish=16))) == 2
    assert _core.select_victim(slots, _core.PlanParams(256, sched=sched(n_near_finish=0))) == 1


def test_among_equals_the_latest_arrival_is_parked_first() -> None:
    slots = [gen(0, 200), gen(1, 30, arrival=5), gen(2, 30, arrival=8), gen(3, 30, arrival=2)]
    assert _core.select_victim(slots, _core.PlanParams(512)) == 2


def test_a_resume_waits_for_headroom_so_it_is_not_parked_again_at_once() -> None:
    # 100 + 1 held and reserved, a restore of 100, the margin of 8: 209 of 256 fit, but 30 cells of
    # headroom for each of the two slots that would run do not
    slots = [gen(0, 100), parked(1, 100, t=1)]
    assert list(_core.plan_step(slots, _core.PlanParams(256, sched=sched(n_restore_headroom=0))).resume) == [1]
    assert list(_core.plan_step(slots, _core.PlanParams(256, sched=sched(n_restore_headroom=30))).resume) == []
    # with nothing else running, the progress rule brings it back regardless
    assert list(_core.plan_step([parked(1, 100, t=1)], _core.PlanParams(256, sched=sched(n_restore_headroom=99))).resume) == [1]


def test_the_prompt_budget_spreads_a_long_prompt_over_steps_beside_a_generating_slot() -> None:
    """The simulator runs the plan's budget as the server's prompt hook does: a 1,000-token prompt
    arriving beside a generating request takes ceil(1000 / 64) steps instead of two, and the
    generating request decodes a token in every one of them."""
    def run(budget: int) -> tuple[int, float, float]:
        p = _core.SimParams()
        p.n_pool, p.n_slots, p.n_batch = 4096, 2, 512
        p.sched = sched(n_prompt_budget=budget)
        r = _core.simulate([0.0, 0.05], [8, 1000], [120, 1], p)
        return r.n_steps, r.requests[0].t_done, r.requests[1].t_first
    steps_off, _, first_off = run(0)
    steps_on, _, first_on = run(64)
    assert steps_on == steps_off  # the generating request's 120 steps carry the chunks either way
    assert first_on > first_off   # the long prompt's first token comes later: 16 chunks, not 2
    pl = _core.plan_step([gen(0, 10)], _core.PlanParams(256, sched=sched(n_prompt_budget=64)))
    assert pl.n_prompt_budget == 64
