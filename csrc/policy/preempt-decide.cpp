// The whole decision for one victim, and its fallbacks (see preempt-decide.h).
#include "preempt-decide.h"

namespace llama_preempt {

park_order decide_park(const victim_state & v, const tier_state & t, bool waits_behind) {
    park_order o;
    o.id     = v.id;
    o.reason = v.reason;
    o.in     = v.in;
    o.t_begin_us = v.t_begin_us;

    park_options opt;
    opt.bytes    = has_swap_state(v.in) && t.mode != preempt_mode::recompute ? v.bytes : 0;
    opt.n_tokens = v.in.n_held;
    opt.rooms    = t.rooms;
    // a slot parked through the API waits for its unpark: its read can always be had ahead
    opt.waits_behind = opt.bytes > 0 && t.rooms.any_read_back_room() && (v.reason == park_reason::api || waits_behind);
    o.how = choose_park(t.mode, opt, t.rates);
    const tier_offer * forced = t.force_to >= 0 ? o.how.offer((park_tier) t.force_to) : nullptr;
    if (forced && forced->fits && o.how.copies()) {
        o.how.tier = forced->where;  // the test seam keeps the reason (and label) the first choice was made for
    }
    o.bytes = o.how.copies() ? opt.bytes : 0;
    o.background = o.how.offer(o.how.tier)->background;  // the tier taken is always among the offers
    o.shape = shape_park(v.in, o.how.copies(), t.n_batch);
    return o;
}

park_order park_fallback(const park_order & o, park_tier still_in, int32_t n_batch) {
    park_order r = o;
    r.background = false;
    if (still_in != park_tier::recompute && still_in != o.how.tier) {
        r.how.tier = still_in;  // parked there from now on, for the reason it was chosen
        return r;
    }
    r.how.tier   = park_tier::recompute;
    r.how.reason = choice_reason::move_failed;
    r.how.why    = park_choice_of(park_tier::recompute, choice_reason::move_failed);
    r.bytes    = 0;
    r.shape    = shape_park(o.in, false, n_batch);
    return r;
}

park_tier restore_fallback(park_tier from, move_failure f) {
    (void) from;
    (void) f;
    return park_tier::recompute;  // the tokens kept beside the state are always enough to replay
}

bool may_read_ahead(size_t bytes, size_t ram_left_now) {
    return bytes <= ram_left_now;
}

std::vector<int32_t> forced_parks(const std::vector<slot_view> & slots, int32_t every) {
    std::vector<int32_t> out;
    if (every <= 0) {
        return out;
    }
    for (const auto & s : slots) {
        if (s.phase == slot_phase::generating && may_park(s) && s.n_gen_since_forced >= every) {
            out.push_back(s.id);
        }
    }
    return out;
}

bool loop_idles(const std::vector<slot_view> & slots, const plan & pl, bool min_park_time) {
    bool any_runs = false;
    bool any_held = min_park_time;
    for (const auto & s : slots) {
        const bool parked = (s.phase == slot_phase::parked && !contains_id(pl.resume, s.id)) || contains_id(pl.park, s.id);
        const bool idle   = s.phase == slot_phase::idle || contains_id(pl.fail, s.id);
        any_runs |= !idle && !parked && !contains_id(pl.hold, s.id);
        any_held |= parked && s.waits_for_unpark;
    }
    return any_held && !any_runs;
}

} // namespace llama_preempt
