// How one victim is parked: host RAM, disk or RECOMPUTE, by measured cost (preempt-choice.cpp).
// Pure C++ like the planner (preempt-policy.h), which includes it.
#pragma once

#include "preempt-types.h"  // park_tier, cost_rates

#include <algorithm>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace llama_preempt {

enum class preempt_mode {
    automatic,  // the cheapest by measured cost: SWAP to RAM (within its budget), to disk, or RECOMPUTE
    swap,       // SWAP whenever the state fits the RAM budget, else to disk where there is one
    recompute,  // never SWAP
};

// "auto", "swap", "recompute"; false for anything else
bool parse_preempt_mode(const std::string & name, preempt_mode & mode);
const char * preempt_mode_name(preempt_mode mode);


// why a victim was parked the way it was (a /metrics label)
enum class park_choice {
    swap_cheaper,       // auto: predicted SWAP to RAM (park + restore) below RECOMPUTE
    recompute_cheaper,  // auto: predicted RECOMPUTE at or below SWAP (to RAM or disk)
    swap_mode,          // --preempt-mode swap, and the state fits the RAM left
    recompute_mode,     // --preempt-mode recompute, or --preempt-ram 0 without a disk tier
    over_budget,        // the state fits neither what is left of --preempt-ram nor of the disk tier
    no_state,           // nothing worth copying (mid-replay, nothing held, state not sizeable)
    swap_failed,        // SWAP chosen, but host RAM could not be had, the copy failed or its file could not be written
    disk_cheaper,       // auto: fits the RAM, but a disk park (its read hidden) is priced below what that RAM is worth
    ram_full,           // the state does not fit what is left of --preempt-ram: parked on disk
};
constexpr int N_PARK_CHOICES = 9;
const char * park_choice_name(park_choice c);

// Why a tier was taken, whatever the tier: with the tier, this is a park's reason. park_choice,
// the label /metrics, the events and the trace show, is read from the two (park_choice_of()).
enum class choice_reason {
    cheapest,     // auto: priced below the other tiers that could take it, RECOMPUTE included
    mode,         // the mode's own pick: --preempt-mode swap's first tier with room, or recompute
    room,         // a tier before it (in tier order) had no room for the state
    no_room,      // no tier that copies had room: RECOMPUTE
    no_state,     // nothing to copy: RECOMPUTE
    move_failed,  // its move failed and no tier still held the state: RECOMPUTE
};
park_choice park_choice_of(park_tier where, choice_reason reason);
const char * choice_reason_name(choice_reason r);  // "cheapest", "mode", "room", "no_room", "no_state", "move_failed"


// One tier as a victim's choice sees it: the data choose_park() filters and ranks, so a tier is a
// row of tier_offers(), not a branch of the choice.
struct tier_offer {
    park_tier where   = park_tier::recompute;
    bool      copies  = false;  // keeps the state; RECOMPUTE re-prefills the tokens instead
    bool      fits    = false;  // the state fits its room now (RECOMPUTE: always)
    double    ms      = 0;      // its quote: what parking the state there and bringing it back costs the loop
    double    rank_ms = 0;      // what taking it costs in all: its quote, plus what the room it takes is worth to
                                // the next victim (host RAM left short: that victim pays a read it cannot hide)
    bool      background = false;  // its move runs in the background from a host copy the budget holds until it
                                   // lands (a disk park's write while that copy fits); else the loop waits for it
};

// A victim's decision: the offers it was made from, and the one taken.
struct park_decision {
    park_tier     tier   = park_tier::recompute;  // where its state waits
    choice_reason reason = choice_reason::no_state;
    park_choice   why    = park_choice::no_state;  // park_choice_of(tier, reason)
    std::vector<tier_offer> offers;  // every tier's quote, in tier order

    bool copies() const { return tier != park_tier::recompute; }  // the state is copied out
    // a tier's offer (null: not offered)
    const tier_offer * offer(park_tier where) const {
        for (const tier_offer & o : offers) {
            if (o.where == where) {
                return &o;
            }
        }
        return nullptr;
    }
    // a tier's quote (0: not offered)
    double quote_of(park_tier where) const {
        const tier_offer * o = offer(where);
        return o ? o->ms : 0;
    }
};

// a tier as a bit of a set of tiers (tier_rooms::present)
constexpr unsigned tier_bit(park_tier t) { return 1u << (unsigned) t; }

// The tiers an executor has, and the room each has now (its kv_tier::room()). Every copy passes
// through host RAM, so each tier's model also reads what parks may still hold of it (host_left).
struct tier_rooms {
    unsigned present   = tier_bit(park_tier::recompute);
    size_t   room[N_PARK_TIERS] = {};
    size_t   host_left = SIZE_MAX;

    bool   has(park_tier t) const { return (present & tier_bit(t)) != 0; }
    size_t of(park_tier t) const { return has(t) ? room[(int) t] : 0; }
    void   set(park_tier t, size_t bytes) { present |= tier_bit(t); room[(int) t] = bytes; }
    // some tier that copies has room: a park by choice can keep its state
    bool any_copy_room() const;
    // some tier whose read back can run ahead of a slot's turn has room
    bool any_read_back_room() const;
};

// What one victim could be parked into.
struct park_options {
    size_t     bytes        = 0;      // state to copy (0: cannot be copied)
    int64_t    n_tokens     = 0;      // tokens a RECOMPUTE resume re-prefills
    bool       waits_behind = false;  // another parked slot comes back first: its read back runs ahead of its turn
    tier_rooms rooms;
};

// --preempt-ram 0 without a disk tier means RECOMPUTE whatever the mode: there is nowhere to swap to
preempt_mode effective_mode(preempt_mode mode, size_t ram_budget, size_t disk_budget = 0);
// bytes of --preempt-ram or --preempt-disk-mib (MiB; -1 no limit) as a budget (SIZE_MAX: no limit)
size_t ram_budget_from_mib(int64_t mib);
// what is left of a budget with `held` bytes parked
size_t ram_left(size_t ram_budget, size_t held);

// The one host budget for KV that leaves the device (--host-kv-ram): parked states and upstream's
// prompt cache together. Parked states come first (they are requests in flight), up to their own
// cap (--preempt-ram); cached prompts get what parks leave, up to theirs (--cache-ram), and give
// way, least recently used first, when a park needs the room.
struct host_budget {
    size_t total     = SIZE_MAX;  // bytes (SIZE_MAX: no limit)
    size_t park_cap  = SIZE_MAX;  // --preempt-ram
    size_t cache_cap = SIZE_MAX;  // --cache-ram (0: no prompt cache)

    size_t parks() const { return std::min(park_cap, total); }  // what parked states may hold
    // what cached prompts may hold with `parked` bytes held by parked states (and `extra` about to be)
    size_t cache_room(size_t parked, size_t extra = 0) const { return std::min(cache_cap, ram_left(total, parked + extra)); }
};

// from the flags in MiB (-1 no limit): `host_mib` -2 (not given) is the larger of the two caps, so
// the defaults (8192 and 8192) make one 8 GiB budget instead of two
host_budget host_budget_from_mib(int64_t host_mib, int64_t park_mib, int64_t cache_mib);

// The tiers the executor has for one victim, in tier order (the order --preempt-mode swap prefers
// them in, and ties go to; RECOMPUTE last), each quoted by its own model (preempt-tier-model.h).
std::vector<tier_offer> tier_offers(const park_options & o, const cost_rates & rates);

// One victim: the tiers that copy filtered by room, the cheapest taken (auto) or the first
// (swap), against RECOMPUTE's re-prefill (see preempt-choice.cpp).
park_decision choose_park(preempt_mode mode, const park_options & o, const cost_rates & rates);

} // namespace llama_preempt
