// The preemption policy, part two: how a victim is parked. Host RAM (SWAP), a file on disk (SWAP
// through RAM to --preempt-disk) or RECOMPUTE, priced per victim with the rates the server measures
// from its own parks, restores, disk files and prompt batches (preempt-policy.h).
#include "preempt-policy.h"
#include "preempt-tier-model.h"

#include <algorithm>
#include <cstdint>

namespace llama_preempt {

bool parse_preempt_mode(const std::string & name, preempt_mode & mode) {
    if (name == "auto")      { mode = preempt_mode::automatic; return true; }
    if (name == "swap")      { mode = preempt_mode::swap;      return true; }
    if (name == "recompute") { mode = preempt_mode::recompute; return true; }
    return false;
}

const char * preempt_mode_name(preempt_mode mode) {
    switch (mode) {
        case preempt_mode::automatic: return "auto";
        case preempt_mode::swap:      return "swap";
        case preempt_mode::recompute: return "recompute";
    }
    return "?";
}

const char * park_choice_name(park_choice c) {
    switch (c) {
        case park_choice::swap_cheaper:      return "swap_cheaper";
        case park_choice::recompute_cheaper: return "recompute_cheaper";
        case park_choice::swap_mode:         return "swap_mode";
        case park_choice::recompute_mode:    return "recompute_mode";
        case park_choice::over_budget:       return "over_budget";
        case park_choice::no_state:          return "no_state";
        case park_choice::swap_failed:       return "swap_failed";
        case park_choice::disk_cheaper:      return "disk_cheaper";
        case park_choice::ram_full:          return "ram_full";
    }
    return "?";
}

preempt_mode effective_mode(preempt_mode mode, size_t ram_budget, size_t disk_budget) {
    return ram_budget == 0 && disk_budget == 0 ? preempt_mode::recompute : mode;
}

size_t ram_budget_from_mib(int64_t mib) {
    return mib < 0 ? SIZE_MAX : (size_t) mib << 20;
}

size_t ram_left(size_t ram_budget, size_t held) {
    return ram_budget - std::min(held, ram_budget);
}

host_budget host_budget_from_mib(int64_t host_mib, int64_t park_mib, int64_t cache_mib) {
    host_budget b;
    b.park_cap  = ram_budget_from_mib(park_mib);
    b.cache_cap = ram_budget_from_mib(cache_mib);
    b.total     = host_mib != -2 ? ram_budget_from_mib(host_mib) : std::max(b.park_cap, b.cache_cap);
    return b;
}

park_choice park_choice_of(park_tier where, choice_reason reason) {
    switch (reason) {
        case choice_reason::cheapest:
        case choice_reason::mode:
        case choice_reason::room:        return model_of(where).label(reason);
        case choice_reason::no_room:     return park_choice::over_budget;
        case choice_reason::no_state:    return park_choice::no_state;
        case choice_reason::move_failed: return park_choice::swap_failed;
    }
    return park_choice::no_state;
}

const char * choice_reason_name(choice_reason r) {
    switch (r) {
        case choice_reason::cheapest:    return "cheapest";
        case choice_reason::mode:        return "mode";
        case choice_reason::room:        return "room";
        case choice_reason::no_room:     return "no_room";
        case choice_reason::no_state:    return "no_state";
        case choice_reason::move_failed: return "move_failed";
    }
    return "?";
}

bool tier_rooms::any_copy_room() const {
    for (const tier_model * m : tier_models()) {
        if (m->copies() && of(m->where()) > 0) {
            return true;
        }
    }
    return false;
}

bool tier_rooms::any_read_back_room() const {
    for (const tier_model * m : tier_models()) {
        if (m->reads_back() && of(m->where()) > 0) {
            return true;
        }
    }
    return false;
}

// Each tier the executor has quotes the victim itself (preempt-tier-model.h). A tier that takes
// host RAM is worth more than its own quote to the next victim when it leaves less than the state's
// own size: that victim lands in a later tier and pays its read back, so each tier is told the read
// of the first later tier that fits and reads back (spill_read_ms).
std::vector<tier_offer> tier_offers(const park_options & o, const cost_rates & rates) {
    std::vector<const tier_model *> present;
    std::vector<quote_input> q;
    for (const tier_model * m : tier_models()) {
        if (o.rooms.has(m->where()) || !m->copies()) {
            quote_input in;
            in.bytes        = o.bytes;
            in.n_tokens     = o.n_tokens;
            in.waits_behind = o.waits_behind;
            in.host_left    = o.rooms.host_left;
            in.room         = m->copies() ? o.rooms.of(m->where()) : SIZE_MAX;
            present.push_back(m);
            q.push_back(in);
        }
    }
    // from the last tier back: each is told the read of the first tier after it that fits and reads back
    double spill_read_ms = 0;
    for (size_t i = present.size(); i-- > 0;) {
        q[i].spill_read_ms = spill_read_ms;
        if (present[i]->reads_back() && present[i]->fits(q[i], rates)) {
            spill_read_ms = present[i]->read_back_ms(q[i], rates);
        }
    }
    std::vector<tier_offer> offers;
    for (size_t i = 0; i < present.size(); ++i) {
        offers.push_back(present[i]->quote(q[i], rates));
    }
    return offers;
}

park_decision choose_park(preempt_mode mode, const park_options & o, const cost_rates & rates) {
    park_decision d;
    d.offers = tier_offers(o, rates);
    // the tier that keeps nothing (RECOMPUTE): what every copy is weighed against
    const tier_offer * replay = nullptr;
    for (const tier_offer & t : d.offers) {
        replay = t.copies ? replay : &t;
    }
    auto take = [&](park_tier where, choice_reason reason) {
        d.tier   = where;
        d.reason = reason;
        d.why    = park_choice_of(where, reason);
        return d;
    };
    if (mode == preempt_mode::recompute) {
        return take(replay->where, choice_reason::mode);
    }
    if (o.bytes == 0) {
        return take(replay->where, choice_reason::no_state);
    }
    // the tiers that keep the state and have room for it: swap takes the first, auto the cheapest
    // in all (ties to the earlier)
    const tier_offer * best = nullptr;
    bool full_before = false;  // a tier before the chosen one had no room
    bool full_seen   = false;
    for (const tier_offer & t : d.offers) {
        if (!t.copies) {
            continue;
        }
        if (!t.fits) {
            full_seen = true;
            continue;
        }
        if (!best || (mode == preempt_mode::automatic && t.rank_ms < best->rank_ms)) {
            best        = &t;
            full_before = full_seen;
        }
    }
    if (!best) {
        return take(replay->where, choice_reason::no_room);
    }
    const choice_reason reason = full_before ? choice_reason::room
                               : mode == preempt_mode::swap ? choice_reason::mode : choice_reason::cheapest;
    if (mode == preempt_mode::swap || best->ms < replay->ms) {
        return take(best->where, reason);
    }
    return take(replay->where, choice_reason::cheapest);
}

// the victim ranked as it will be once parked (one more park, parked last), by the planner's own
// restore order; slots that wait for an unpark are not coming back
bool waits_behind_parked(const std::vector<slot_view> & slots, int32_t id_victim) {
    std::vector<slot_view> after;
    int64_t t_last = 0;
    bool    found  = false;
    for (const auto & s : slots) {
        if (s.phase == slot_phase::parked) {
            t_last = std::max(t_last, s.t_parked_us);
        }
    }
    for (const auto & s : slots) {
        if (s.id == id_victim) {
            slot_view v   = s;
            v.phase       = slot_phase::parked;
            v.n_preempt  += 1;
            v.t_parked_us = t_last + 1;
            after.push_back(v);
            found = true;
        } else if (s.phase == slot_phase::parked && !s.waits_for_unpark) {
            after.push_back(s);
        }
    }
    const auto order = restore_order(after);
    return found && !order.empty() && order.front() != id_victim;
}

} // namespace llama_preempt
