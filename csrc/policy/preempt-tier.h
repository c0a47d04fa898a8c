// Where a parked slot's state waits, as one interface: a tier says what it costs (price) and how
// much it can take (room), and moves a state (copy out, copy in, forget). The policy prices a victim
// from the tiers (tier_state_of()) and carries its choice out through the tier it chose
// (park_victim(), resume_parked(): preempt-executor.h). Each executor implements the three tiers,
// RAM, disk and RECOMPUTE, once: the server over the real slots and copies
// (csrc/server/preempt-tiers.h) and the simulator in simulated time (preempt-sim-tiers.cpp).
// Where a state is, is one value everywhere (park_tier: the executors, the trace, /slots, the
// events). Adding a tier: docs/contributing.md.
#pragma once

#include "preempt-decide.h"

#include <cstddef>
#include <cstdint>

namespace llama_preempt {

// the outcome of a move of state (a park's copy out, a resume's copy back)
struct move_result {
    move_failure failure     = move_failure::none;
    park_tier    still_in    = park_tier::recompute;  // a failed copy out: the tier that still holds the state within
                                                      // its room (a disk park's host copy: RAM), else recompute
    // a copy in: when it began (the executor's clock, µs; the parked time ends there) and whether
    // the state had been brought up ahead (read ahead, uploaded ahead)
    int64_t      t_begin_us  = 0;
    bool         ahead       = false;

    bool ok() const { return failure == move_failure::none; }
};

// what restoring ahead does for the next slot back whose state waits in a tier, while the others
// decode: nothing, an upload of its host copy to the device (no new host RAM), or its bytes read
// back into host RAM (only where they fit the RAM left)
enum class ahead_kind { none, upload, read_in };

class kv_tier {
public:
    virtual ~kv_tier() = default;

    virtual park_tier where() const = 0;
    // its restore ahead (apply_plan()); a tier that says nothing is restored at its turn only
    virtual ahead_kind ahead() const { return ahead_kind::none; }
    // price: its measured rates, into what the policy prices a park with (RAM: the park and restore
    // copies; disk: the file's write and read; RECOMPUTE: the prefill)
    virtual void price(cost_rates & rates) const = 0;
    // room: bytes of state it can take now (SIZE_MAX: no limit; 0: none, or no such tier)
    virtual size_t room() const = 0;

    // a victim's state into it, as the order says (the executor's victim() sized it); the slot
    // leaves the pool afterwards (plan_executor::park())
    virtual move_result copy_out(const park_order & o) = 0;
    // a parked slot's state back into the pool
    virtual move_result copy_in(int32_t id) = 0;
    // a parked slot's copied state goes, never to come back (its restore failed, its request ended)
    virtual void forget(int32_t id) = 0;
    // restore ahead, as ahead() says: the next slot back's state brought up now, while others decode
    virtual void read_ahead(int32_t id) { (void) id; }
};

// one executor's tiers, by where a state waits; a tier an executor does not have is null (the
// simulator has no compressed tier, a server only under its flag) and is never offered
struct tier_set {
    kv_tier * by_where[N_PARK_TIERS] = {};

    kv_tier & operator[](park_tier t) const { return *by_where[(int) t]; }
    bool has(park_tier t) const { return by_where[(int) t] != nullptr; }
};

// The rates the tiers price with, each its own (kv_tier::price()), over `base` (a tier the
// executor lacks leaves its rates as they are there).
cost_rates rates_of(const tier_set & tiers, cost_rates base = {});

// What the policy reads of the tiers to price a victim: each one's rates and room, what parks may
// still hold of host RAM (`host_left`: every copy passes through it), with the executor's mode,
// batch and test seam (`force_to`: a park_tier, -1 none).
tier_state tier_state_of(const tier_set & tiers, size_t host_left, preempt_mode mode, int32_t n_batch, int force_to = -1);

} // namespace llama_preempt
