// The preemption policy, part two: how a victim is parked. Host RAM (SWAP), a file on disk (SWAP
// through RAM to --preempt-disk) or RECOMPUTE, priced per victim with the rates the server measures
// from its own parks, restores, disk files and prompt batches (preempt-policy.h).
#include "preempt-policy.h"

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

bool read_cached_prompt(size_t bytes, size_t n_tokens, const cost_rates & rates) {
    const double read_s    = bytes / rates.disk_read_bps + bytes / rates.restore_bps;
    const double prefill_s = n_tokens / rates.prefill_tps;
    return read_s < prefill_s;
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
            return where == park_tier::recompute ? park_choice::recompute_cheaper
                 : where == park_tier::disk      ? park_choice::disk_cheaper
                                                 : park_choice::swap_cheaper;  // RAM, plain or compressed
        case choice_reason::mode:
            return where == park_tier::recompute ? park_choice::recompute_mode
                 : where == park_tier::ram       ? park_choice::swap_mode
                                                 : park_choice::ram_full;  // swap mode skips to disk only past a full RAM
        case choice_reason::room:        return where == park_tier::ram ? park_choice::swap_mode : park_choice::ram_full;
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

// Each tier's quote for one victim, in milliseconds of the decode loop:
//  - RAM: its state copied out and back (park + restore);
//  - disk: the same two copies, plus the file's write when the host copy does not fit what is left
//    of the RAM (then the loop waits for it; otherwise it is written in the background and the
//    RAM is held only until then), plus the read back unless that read runs ahead of its turn
//    (the victim waits behind another parked slot);
//  - RECOMPUTE: its tokens re-prefilled.
// RAM is worth more than its own quote when taking it leaves less than the state's own size: the
// next victim of that size goes to disk and pays a read it cannot hide. So its rank adds that read,
// and a victim whose read can be hidden gives the RAM up (disk_cheaper) when RAM is that short.
std::vector<tier_offer> tier_offers(const park_options & o, const cost_rates & rates) {
    const double copy_ms  = o.bytes > 0 ? 1e3 * o.bytes / rates.park_bps + 1e3 * o.bytes / rates.restore_bps : 0;
    const double write_ms = 1e3 * o.bytes / rates.disk_write_bps;
    const double read_ms  = 1e3 * o.bytes / rates.disk_read_bps;
    const bool fits_ram  = o.bytes <= o.ram_left;
    const bool fits_disk = o.disk_left > 0 && o.bytes <= o.disk_left;

    tier_offer ram { park_tier::ram, true, fits_ram, copy_ms, copy_ms };
    if (fits_ram && fits_disk && o.bytes > o.ram_left - o.bytes) {
        ram.rank_ms += read_ms;
    }
    tier_offer disk { park_tier::disk, true, fits_disk, 0, 0 };
    if (fits_disk && o.bytes > 0) {
        disk.ms = disk.rank_ms = copy_ms + (fits_ram ? 0 : write_ms) + (o.waits_behind ? 0 : read_ms);
    }
    const double recompute_ms = 1e3 * o.n_tokens / rates.prefill_tps;
    const tier_offer recompute { park_tier::recompute, false, true, recompute_ms, recompute_ms };
    if (!(o.offered & tier_bit(park_tier::ram_q8))) {
        return { ram, disk, recompute };
    }
    // RAM compressed to q8_0 (opt-in): the RAM park's copies plus packing and unpacking, for its
    // packed share of the same RAM
    const bool   fits_q8 = o.bytes > 0 && o.bytes * rates.pack_ratio <= o.ram_left;
    const double q8_ms   = copy_ms + 1e3 * o.bytes / rates.pack_bps + 1e3 * o.bytes / rates.unpack_bps;
    const tier_offer ram_q8 { park_tier::ram_q8, true, fits_q8, q8_ms, q8_ms };
    return { ram, ram_q8, disk, recompute };
}

park_decision choose_park(preempt_mode mode, const park_options & o, const cost_rates & rates) {
    const std::vector<tier_offer> offers = tier_offers(o, rates);
    park_decision d;
    for (const tier_offer & t : offers) {
        switch (t.where) {
            case park_tier::ram:       d.swap_ms      = t.ms; break;
            case park_tier::disk:      d.disk_ms      = t.ms; break;
            case park_tier::ram_q8:    break;  // its quote is in the offers (tier_offers())
            case park_tier::recompute: d.recompute_ms = t.ms; break;
        }
    }
    auto take = [&](park_tier where, choice_reason reason) {
        d.tier   = where;
        d.reason = reason;
        d.why    = park_choice_of(where, reason);
        return d;
    };
    if (mode == preempt_mode::recompute) {
        return take(park_tier::recompute, choice_reason::mode);
    }
    if (o.bytes == 0) {
        return take(park_tier::recompute, choice_reason::no_state);
    }
    // the tiers that keep the state and have room for it: swap takes the first, auto the cheapest
    // in all (ties to the earlier)
    const tier_offer * best = nullptr;
    bool full_before = false;  // a tier before the chosen one had no room
    bool full_seen   = false;
    for (const tier_offer & t : offers) {
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
        return take(park_tier::recompute, choice_reason::no_room);
    }
    const choice_reason reason = full_before ? choice_reason::room
                               : mode == preempt_mode::swap ? choice_reason::mode : choice_reason::cheapest;
    if (mode == preempt_mode::swap || best->ms < d.recompute_ms) {
        return take(best->where, reason);
    }
    return take(park_tier::recompute, choice_reason::cheapest);
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
