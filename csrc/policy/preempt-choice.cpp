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

// The three prices of one victim, in milliseconds of the decode loop:
//  - RAM: its state copied out and back (park + restore);
//  - disk: the same two copies, plus the file's write when the host copy does not fit what is left
//    of the RAM (then the loop waits for it; otherwise it is written in the background and the
//    RAM is held only until then), plus the read back unless that read runs ahead of its turn
//    (the victim waits behind another parked slot);
//  - RECOMPUTE: its tokens re-prefilled.
// RAM is worth more than its own price when taking it leaves less than the state's own size: the
// next victim of that size goes to disk and pays a read it cannot hide. So a victim whose read
// can be hidden gives the RAM up (disk_cheaper) when RAM is that short; one that does not fit the
// RAM goes to disk when that is cheaper than a recompute (ram_full).
park_decision choose_park(preempt_mode mode, const park_options & o, const cost_rates & rates) {
    park_decision d;
    const double copy_ms  = o.bytes > 0 ? 1e3 * o.bytes / rates.park_bps + 1e3 * o.bytes / rates.restore_bps : 0;
    const double write_ms = 1e3 * o.bytes / rates.disk_write_bps;
    const double read_ms  = 1e3 * o.bytes / rates.disk_read_bps;
    const bool fits_ram  = o.bytes <= o.ram_left;
    const bool fits_disk = o.disk_left > 0 && o.bytes <= o.disk_left;

    d.swap_ms      = copy_ms;
    d.disk_ms      = fits_disk && o.bytes > 0 ? copy_ms + (fits_ram ? 0 : write_ms) + (o.waits_behind ? 0 : read_ms) : 0;
    d.recompute_ms = 1e3 * o.n_tokens / rates.prefill_tps;

    auto take = [&](park_tier tier, park_choice why) {
        d.tier = tier;
        d.why  = why;
        return d;
    };
    if (mode == preempt_mode::recompute) {
        return take(park_tier::recompute, park_choice::recompute_mode);
    }
    if (o.bytes == 0) {
        return take(park_tier::recompute, park_choice::no_state);
    }
    if (!fits_ram && !fits_disk) {
        return take(park_tier::recompute, park_choice::over_budget);
    }
    if (mode == preempt_mode::swap) {
        return fits_ram ? take(park_tier::ram, park_choice::swap_mode) : take(park_tier::disk, park_choice::ram_full);
    }
    if (!fits_ram) {
        return d.disk_ms < d.recompute_ms ? take(park_tier::disk, park_choice::ram_full)
                                          : take(park_tier::recompute, park_choice::recompute_cheaper);
    }
    // it fits the RAM: what that RAM is worth, against a disk park and against one re-prefill
    const bool   ram_short = fits_disk && o.bytes > o.ram_left - o.bytes;
    const double ram_worth = copy_ms + (ram_short ? read_ms : 0);
    if (fits_disk && d.disk_ms < ram_worth) {
        return d.disk_ms < d.recompute_ms ? take(park_tier::disk, park_choice::disk_cheaper)
                                          : take(park_tier::recompute, park_choice::recompute_cheaper);
    }
    return d.swap_ms < d.recompute_ms ? take(park_tier::ram, park_choice::swap_cheaper)
                                      : take(park_tier::recompute, park_choice::recompute_cheaper);
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
