// Carrying a plan out through an executor (see preempt-executor.h).
#include "preempt-executor.h"

namespace llama_preempt {

park_order park_victim(plan_executor & ex, int32_t id, park_reason reason) {
    const victim_state v = ex.victim(id, reason);  // first: the park's time starts here, as its state is sized
    const tier_state   t = ex.tiers();
    park_order o = decide_park(v, t, t.rooms.any_read_back_room() && v.bytes > 0 && waits_behind_parked(ex.views(), id));
    bool fallback = false;
    if (o.how.copies()) {
        const move_result r = ex.tier(o.tier()).copy_out(o);
        if (!r.ok()) {
            o = park_fallback(o, r.still_in, t.n_batch);
            fallback = true;
        }
    }
    ex.park(o);
    ex.record({ decision_kind::park, id, o.tier(), reason, o.how.why, fallback, o.in.n_held, o.bytes });
    return o;
}

void resume_parked(plan_executor & ex, int32_t id) {
    park_tier from = ex.parked(id).tier;
    move_result r;
    if (from != park_tier::recompute) {
        kv_tier & tier = ex.tier(from);
        r = tier.copy_in(id);
        if (!r.ok()) {
            tier.forget(id);  // what is left of its state: the slot replays what it held
            from = restore_fallback(from, r.failure);
        }
    }
    ex.resume(id, from, r);
    ex.record({ decision_kind::resume, id, from, park_reason::pool_full, park_choice::no_state, !r.ok() });
}

tier_state tier_state_of(const tier_set & tiers, size_t host_left, preempt_mode mode, int32_t n_batch, int force_to) {
    tier_state t;
    t.mode     = mode;
    t.n_batch  = n_batch;
    t.force_to = force_to;
    t.rooms.host_left = host_left;
    t.rates    = rates_of(tiers);
    for (const kv_tier * k : tiers.by_where) {
        if (k != nullptr) {
            t.rooms.set(k->where(), k->room());
        }
    }
    return t;
}

cost_rates rates_of(const tier_set & tiers, cost_rates base) {
    for (const kv_tier * k : tiers.by_where) {
        if (k != nullptr) {
            k->price(base);
        }
    }
    return base;
}

policy_step_result policy_step(plan_executor & ex) {
    ex.settle();
    policy_step_result r;
    plan_params pp = ex.params();
    const tier_state ts = ex.tiers();
    pp.park_to_admit = ts.mode != preempt_mode::recompute && ts.rooms.any_copy_room();
    r.views = ex.views();
    r.pl    = plan_step(r.views, pp);
    ex.planned(r.pl);
    apply_plan(r.pl, ex);
    return r;
}

void apply_plan(const plan & pl, plan_executor & ex) {
    for (int32_t id : pl.purge) {
        ex.purge(id);
    }
    for (int32_t id : pl.fail) {
        ex.record({ decision_kind::fail, id });  // before: the slot lets its request go
        ex.fail(id);
    }
    for (int32_t id : pl.park) {
        park_victim(ex, id, park_reason::pool_full);
    }
    for (int32_t id : pl.resume) {
        resume_parked(ex, id);
    }
    for (int32_t id : pl.hold) {
        ex.hold(id);
    }
    for (const auto & [id, n] : pl.chunks) {
        ex.chunk(id, n);
    }
    ex.pause(pl.pause);
    // restore ahead, as the next slot back's tier does it (kv_tier::ahead()): its RAM buffer
    // uploaded, or its file read back into host RAM when its state fits what is left of the budget,
    // while others decode
    if (pl.restore_next >= 0) {
        const parked_state p = ex.parked(pl.restore_next);
        if (p.tier != park_tier::recompute) {
            const ahead_kind how = ex.tier(p.tier).ahead();
            if (how == ahead_kind::upload ||
                (how == ahead_kind::read_in && !p.in_ram && may_read_ahead(p.bytes, ex.tiers().rooms.host_left))) {
                ex.tier(p.tier).read_ahead(pl.restore_next);
            }
        }
    }
}

} // namespace llama_preempt
