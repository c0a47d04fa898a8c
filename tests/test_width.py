"""The decode width, without a model: the step cost's online fit, the width rule that reads it, and
the planner's pauses (llama_preempt._core, the code the server runs)."""
from __future__ import annotations

import random
from dataclasses import replace

import pytest

from llama_preempt import _core
from llama_preempt.simulator import Costs, Workload, simulate

P = _core.SlotPhase

# a step on a few CPU cores where the fixed part is small: a wider batch buys almost nothing (16 slots
# deliver 3 % more than one)
CPU = _core.StepCost(fixed_s=0.0003, decode_token_s=0.0100, prompt_token_s=0.0038, attend_cell_s=0.0)
# a GPU-shaped step: the fixed part (weights read once, launches) dominates, a token adds little
GPU = _core.StepCost(fixed_s=0.0060, decode_token_s=0.00004, prompt_token_s=0.00002, attend_cell_s=2e-9)


def gen(id: int, n_cells: int, arrival: int, **kw: object) -> _core.SlotView:
    return _core.SlotView(id, P.GENERATING, n_cells=n_cells, arrival=arrival, **kw)


def params(cost: _core.StepCost, n_pool: int = 4096, **sched: object) -> _core.PlanParams:
    s = _core.SchedParams()
    for k, v in sched.items():
        setattr(s, k, v)
    p = _core.PlanParams(n_pool, sched=s)
    p.cost = cost
    p.cost_ready = True
    return p


def width_of(cost: _core.StepCost, n: int, n_cells: int = 200, loss: float = 0.05) -> int:
    u = [_core.decode_slot_cost(cost, n_cells)] * n
    return _core.decode_width(cost.fixed_s, u, loss)


def test_a_flat_cost_curve_gets_a_narrow_width_and_a_steep_one_a_wide_width() -> None:
    assert width_of(CPU, 16) == 1
    assert width_of(GPU, 64) >= 48
    assert width_of(GPU, 512) > 256


def test_the_width_is_the_fewest_slots_within_the_loss_of_the_best_throughput() -> None:
    # equal slots: thr(k) = k / (fixed + k u) rises towards thr(n); the width is the first k within
    # the loss of it, k >= (1 - loss) n fixed / (fixed + loss n u)
    u, n = 0.002, 100
    for fixed in (0.0, 0.001, 0.002, 0.006, 0.02, 0.2):
        for loss in (0.02, 0.05, 0.2):
            best = n / (fixed + n * u)
            want = next(k for k in range(1, n + 1) if k / (fixed + k * u) >= (1 - loss) * best)
            assert _core.decode_width(fixed, [u] * n, loss) == want, (fixed, loss)
    # giving up more throughput narrows the width
    assert _core.decode_width(0.02, [u] * n, 0.2) < _core.decode_width(0.02, [u] * n, 0.05)
    # a slot whose context makes the batch slower is never worth it: the best width stops before it
    assert _core.decode_width(0.004, [0.001, 0.001, 0.001, 0.5], 0.0001) == 3


def test_width_loss_zero_lets_every_slot_decode_and_none_generating_is_zero() -> None:
    assert _core.decode_width(0.0, [0.01] * 9, 0.0) == 9
    assert _core.decode_width(0.01, [], 0.05) == 0


def test_the_attention_term_narrows_the_width_as_the_contexts_grow() -> None:
    cost = _core.StepCost(fixed_s=0.005, decode_token_s=0.0002, prompt_token_s=0.0001, attend_cell_s=1e-7)
    assert width_of(cost, 64, n_cells=100) > width_of(cost, 64, n_cells=4000)


def test_the_fit_recovers_the_costs_of_a_synthetic_cost_table() -> None:
    truth = _core.StepCost(fixed_s=0.0042, decode_token_s=0.0031, prompt_token_s=0.0009, attend_cell_s=3e-7)
    fit = _core.StepCostFit()  # the server's prior, which is not the truth
    rng = random.Random(7)
    for _ in range(600):
        shape = _core.StepShape(n_decode=rng.randint(0, 12), n_prompt=rng.choice([0, 0, 17, 64]),
                                n_attended=rng.randint(0, 20_000))
        if shape.n_decode + shape.n_prompt == 0:
            continue
        fit.observe(shape, truth.seconds(shape) * rng.uniform(0.99, 1.01))
    got = fit.cost()
    assert fit.ready and fit.n_samples > 500
    for name in ("fixed_s", "decode_token_s", "prompt_token_s", "attend_cell_s"):
        assert getattr(got, name) == pytest.approx(getattr(truth, name), rel=0.1), name


def test_the_fit_never_prices_a_part_below_zero_and_skips_stalls() -> None:
    fit = _core.StepCostFit()
    rng = random.Random(3)
    truth = _core.StepCost(fixed_s=0.001, decode_token_s=0.01, prompt_token_s=0.004, attend_cell_s=0.0)
    for _ in range(200):
        shape = _core.StepShape(n_decode=rng.randint(1, 4), n_prompt=rng.choice([0, 32]), n_attended=rng.randint(100, 900))
        fit.observe(shape, truth.seconds(shape) * rng.uniform(0.95, 1.05))
    before = fit.cost()
    fit.observe(_core.StepShape(n_decode=1, n_attended=200), 5.0)  # a 5 s stall
    after = fit.cost()
    assert after.decode_token_s == pytest.approx(before.decode_token_s)
    for c in (before, after):
        assert min(c.fixed_s, c.decode_token_s, c.prompt_token_s, c.attend_cell_s) >= 0


def test_before_the_fit_is_ready_every_slot_decodes() -> None:
    slots = [gen(i, 100, arrival=i) for i in range(6)]
    p = params(CPU)
    p.cost_ready = False
    pl = _core.plan_step(slots, p)
    assert list(pl.pause) == [] and pl.n_decode_width == 6


def test_on_a_cpu_the_oldest_decodes_and_the_rest_are_paused() -> None:
    slots = [gen(0, 90, arrival=12), gen(1, 40, arrival=10), gen(2, 300, arrival=11), gen(3, 10, arrival=13)]
    pl = _core.plan_step(slots, params(CPU))
    assert pl.n_decode_width == 1
    assert sorted(pl.pause) == [0, 2, 3]  # slot 1 arrived first
    pl = _core.plan_step(slots, params(GPU))
    assert list(pl.pause) == [] and pl.n_decode_width == 4


def test_the_oldest_decoding_slot_is_never_the_one_paused_for_a_newcomer() -> None:
    rng = random.Random(11)
    for trial in range(300):
        n = rng.randint(2, 16)
        arrivals = rng.sample(range(1000), n)
        slots = [gen(i, rng.randint(1, 400), arrival=a) for i, a in enumerate(arrivals)]
        cost = _core.StepCost(fixed_s=rng.uniform(0, 0.01), decode_token_s=rng.uniform(1e-5, 0.01),
                              prompt_token_s=0.001, attend_cell_s=rng.uniform(0, 1e-7))
        oldest = min(slots, key=lambda s: s.arrival)
        # a newcomer that arrived later (a prompt just done, now generating) changes none of this
        for views in (slots, slots + [gen(n, 5, arrival=2000)]):
            pl = _core.plan_step(views, params(cost, max_gap_us=0))
            decoding = [s for s in views if s.id not in set(pl.pause)]
            paused = [s for s in views if s.id in set(pl.pause)]
            assert oldest.id not in set(pl.pause), trial
            # the decoding ones are exactly the oldest
            assert all(d.arrival < q.arrival for d in decoding for q in paused), trial


def test_a_higher_priority_request_takes_a_seat_first() -> None:
    slots = [gen(0, 100, arrival=1), gen(1, 100, arrival=2, priority=5)]
    pl = _core.plan_step(slots, params(CPU))
    assert list(pl.pause) == [0]


def test_a_paused_slot_overdue_for_a_token_decodes_beside_the_width() -> None:
    now = 100_000_000
    slots = [gen(0, 100, arrival=1, t_last_token_us=now - 10_000),
             gen(1, 100, arrival=2, t_last_token_us=now - 2_500_000),
             gen(2, 100, arrival=3, t_last_token_us=now - 3_000_000)]
    p = params(CPU, max_gap_us=3_000_000)
    p.t_now_us = now
    pl = _core.plan_step(slots, p)
    assert list(pl.pause) == [1]  # slot 2 waited out the bound
    p.sched.max_gap_us = 0
    assert sorted(_core.plan_step(slots, p).pause) == [1, 2]


def test_a_fixed_width_and_width_loss_zero_turn_the_rule_off() -> None:
    slots = [gen(i, 100, arrival=i) for i in range(5)]
    assert sorted(_core.plan_step(slots, params(CPU, n_width=3)).pause) == [3, 4]
    assert list(_core.plan_step(slots, params(CPU, width_loss=0.0)).pause) == []


def test_paused_slots_hold_their_cells_but_need_none_and_go_first_as_victims() -> None:
    # the oldest (slot 1) decodes; slots 0 and 2 are paused. The pool is full: a paused one goes
    # (the latest small one) before the decoding slot, which holds the fewest cells
    slots = [gen(0, 60, arrival=2), gen(1, 50, arrival=1), gen(2, 140, arrival=3)]
    pl = _core.plan_step(slots, params(CPU, n_pool=256))
    assert list(pl.park) == [0]
    assert 1 not in set(pl.pause)
    # with nothing paused the same pool would park the smallest, the decoding slot 1
    pl = _core.plan_step(slots, params(CPU, n_pool=256, width_loss=0.0))
    assert list(pl.park) == [1]


def test_paused_slots_need_no_room_for_their_next_token() -> None:
    # 250 of 256 cells held: three decoding slots need 3 cells and the margin 8, one decoding needs 1 + 8
    slots = [gen(0, 100, arrival=1), gen(1, 100, arrival=2), gen(2, 47, arrival=3)]
    assert list(_core.plan_step(slots, params(CPU, n_pool=256, width_loss=0.0)).park) != []
    pl = _core.plan_step(slots, params(CPU, n_pool=256))
    assert list(pl.park) == [] and sorted(pl.pause) == [1, 2]


def test_prompts_share_the_budget_in_arrival_order_not_slot_order() -> None:
    slots = [gen(0, 100, arrival=1),
             _core.SlotView(1, P.PROMPT, n_cells=0, n_prompt_left=300, arrival=9),
             _core.SlotView(2, P.PROMPT, n_cells=0, n_prompt_left=200, arrival=5),
             _core.SlotView(3, P.PROMPT, n_cells=0, n_prompt_left=60, arrival=7)]
    s = _core.SchedParams()
    s.n_prompt_budget = 256
    pl = _core.plan_step(slots, _core.PlanParams(4096, sched=s))
    # 256 tokens: slot 2 (200 tokens, first to arrive), then slot 3 (60: it takes the last 56); slot 1,
    # first by slot order, gets none and waits
    assert list(pl.hold) == [1]


# --- the simulator, which runs the same planner and the same fit ---

def _sim(costs: object, **kw: object) -> object:
    from llama_preempt.simulator import Costs, Workload, simulate

    wl = Workload.lognormal(40, rate=kw.pop("rate", 4.0), prompt_median=60, gen_median=80, max_prompt=300,
                            max_gen=300, seed=3)
    return simulate(wl, n_ctx=kw.pop("n_ctx", 8192), n_parallel=kw.pop("n_parallel", 16),
                    costs=Costs(**costs), **kw)


def test_the_simulator_chooses_a_narrow_width_on_a_cpu_and_a_wide_one_on_a_gpu() -> None:
    # every request at about once, so that all 16 slots have something to decode
    cpu = _sim({"step_ms": 0.3, "decode_token_ms": 10.0, "prefill_token_ms": 4.0, "attend_cell_ns": 0.0}, rate=1000.0)
    gpu = _sim({"step_ms": 5.0, "decode_token_ms": 0.125, "prefill_token_ms": 0.03, "attend_cell_ns": 2.0}, rate=1000.0)
    assert cpu.completed == gpu.completed == 40
    # (until the fit has seen 32 steps every slot decodes: the widest step comes from then)
    assert cpu.decode_width_mean < 1.5
    assert gpu.decode_width_mean > 4 and gpu.decode_width_max >= 14  # (the mean counts the tail, with few left)


def test_a_paused_slot_in_the_pool_waits_at_most_the_gap_bound_for_its_next_token() -> None:
    # one slot decodes at a time and the pool holds every request: the others sit paused in it
    costs = {"step_ms": 0.3, "decode_token_ms": 10.0, "prefill_token_ms": 4.0, "attend_cell_ns": 0.0}
    bounded = _sim(costs, sched="width=1,max-gap-ms=1000")
    unbounded = _sim(costs, sched="width=1,max-gap-ms=0")
    assert bounded.parks == 0 and bounded.completed == 40
    # the bound, plus the step in flight when it falls due and the step that carries the token:
    # each at most a 256-token prompt chunk (4 ms a token) and 16 generated tokens (10 ms each)
    step = 0.0003 + 256 * 0.004 + 16 * 0.010
    assert bounded.gap_max_s <= 1.0 + 2 * step
    assert unbounded.gap_max_s > 5.0


# --- the attention span as the pool has it, and the width rule's live check (issue 50) ---

def test_the_fit_recovers_a_span_cost_that_grows_with_the_pools_occupancy() -> None:
    # a unified pool: every token spans the pool's used cells, whatever its own context
    truth = _core.StepCost(fixed_s=0.0013, decode_token_s=0.0005, prompt_token_s=0.00003, attend_cell_s=0.0,
                           span_cell_s=6e-9)
    fit = _core.StepCostFit(_core.StepCost(fixed_s=0.005, decode_token_s=0.0085, prompt_token_s=0.0048,
                                           attend_cell_s=4.5e-6))
    rng = random.Random(11)
    for _ in range(2000):
        n_decode, n_prompt = rng.randint(1, 64), rng.choice([0, 0, 40, 256])
        used = rng.randint(500, 12_000)
        shape = _core.StepShape(n_decode=n_decode, n_prompt=n_prompt, n_attended=(n_decode + n_prompt) * rng.randint(50, 300),
                                n_spanned=(n_decode + n_prompt) * used)
        fit.observe(shape, truth.seconds(shape) * rng.uniform(0.98, 1.02))
    got = fit.cost()
    assert got.span_cell_s == pytest.approx(truth.span_cell_s, rel=0.15)
    assert got.decode_token_s == pytest.approx(truth.decode_token_s, rel=0.15)


def test_in_a_unified_pool_a_decoding_slot_costs_its_token_times_the_pools_used_cells() -> None:
    cost = _core.StepCost(fixed_s=0.001, decode_token_s=0.0001, prompt_token_s=0.0, attend_cell_s=0.0, span_cell_s=1e-8)
    own = _core.decode_slot_cost(cost, 200)
    pooled = _core.decode_slot_cost(cost, 200, 1, 10_000)
    assert pooled - own == pytest.approx(1e-8 * (10_000 - 201))
    # pausing a slot does not shorten the others' span (it keeps its cells): the width rule knows it
    slots = [gen(i, 150, arrival=i) for i in range(48)]
    split, unified = params(cost), params(cost)
    split.unified = False
    assert _core.plan_step(slots, unified).n_decode_width <= _core.plan_step(slots, split).n_decode_width


def test_the_simulators_unified_pool_pays_for_its_span_unless_attention_walks_its_own_cells() -> None:
    wl = Workload.lognormal(64, rate=500.0, prompt_median=80, gen_median=40, max_prompt=200, max_gen=100, seed=5)
    costs = Costs(step_ms=1.0, decode_token_ms=0.2, prefill_token_ms=0.02, attend_cell_ns=0.0, span_cell_ns=20.0)
    free = replace(costs, span_cell_ns=0.0)
    kw = {"n_ctx": 16 * 512, "n_parallel": 16, "preempt": False, "cache_ram_mib": 0}
    split = simulate(wl, costs=costs, kv_unified=False, **kw)
    spanning = simulate(wl, costs=costs, attn_own_cells=False, **kw)
    own = simulate(wl, costs=costs, **kw)  # the default: the CPU's flash attention walks each slot's own cells
    assert split.completed == spanning.completed == own.completed == 64
    # the same steps, each token spanning its own cells in the split and with own cells, the pool's
    # used cells in a unified pool whose attention spans it (-fa off, a GPU's kernel)
    assert spanning.makespan_s > 1.2 * split.makespan_s
    assert own.makespan_s == pytest.approx(split.makespan_s, rel=0.05)
    assert simulate(wl, costs=free, kv_unified=False, **kw).makespan_s == pytest.approx(
        simulate(wl, costs=free, attn_own_cells=False, **kw).makespan_s)


def _guard_run(limited_tps: float, full_tps: float, loss: float = 0.05, steps: int = 2000) -> _core.WidthGuard:
    """A guard fed steps of 10 decoded tokens: limited ones at limited_tps, full-width ones (when it
    probes) at full_tps."""
    g = _core.WidthGuard()
    for _ in range(steps):
        limited = g.allow_limit()
        tps = limited_tps if limited else full_tps
        g.observe(10, 10 / tps, limited, loss)
    return g


def test_the_width_rule_falls_back_to_full_width_when_the_limited_width_is_slower() -> None:
    # the fit said a narrow width gives up under 5 %; measured, every slot decoding delivers 30 % more
    g = _guard_run(limited_tps=1000.0, full_tps=1300.0)
    assert g.n_probes >= 1 and g.n_fallbacks == g.n_probes
    assert g.last_full_tps == pytest.approx(1300.0) and g.last_limited_tps == pytest.approx(1000.0)
    assert not g.allow_limit()  # held off: every slot decodes


def test_the_width_rule_keeps_its_width_when_it_gives_up_no_more_than_the_loss() -> None:
    g = _guard_run(limited_tps=1000.0, full_tps=1040.0, steps=4000)  # 4 % < the 5 % allowed
    assert g.n_probes >= 3 and g.n_fallbacks == 0 and g.allow_limit()
    # each window that holds puts the next one twice as far: few full-width steps once it keeps holding
    n = g.n_probes
    for _ in range(3 * _core.WIDTH_PROBE_EVERY):
        g.observe(10, 0.01, True, 0.05)
    assert g.n_probes == n


def test_the_guard_tries_the_limit_again_after_its_hold() -> None:
    g = _guard_run(limited_tps=1000.0, full_tps=1300.0, steps=_core.WIDTH_PROBE_EVERY + _core.WIDTH_WINDOW + 2)
    assert g.n_fallbacks == 1 and not g.allow_limit()
    for _ in range(_core.WIDTH_HOLD):
        g.observe(10, 10 / 1300.0, False, 0.05)
    assert g.allow_limit()
