// The whole decision for one victim, and what a failed move falls back to.
//
// plan_step() (preempt-policy.h) says which slots to park and resume; this says how: for each
// victim its tier (RAM, disk, RECOMPUTE), whether its file is written in the background, and the
// shape of its resume; for a parked slot on disk, whether its host copy and its read ahead stay in
// RAM this step. Every input is plain data an executor reports (preempt-executor.h), so the server
// and the simulator ask the same questions and get the same answers.
#pragma once

#include "preempt-policy.h"

#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

namespace llama_preempt {

// the tiers a victim's state may go to, as the executor sees them at the park
struct tier_state {
    preempt_mode mode    = preempt_mode::automatic;  // effective (effective_mode())
    tier_rooms   rooms;    // the tiers the executor has, each one's room, and the host RAM parks may still hold
    cost_rates   rates;    // the measured prices
    int32_t      n_batch = 512;
    int          force_to = -1;  // fault seam (a park_tier; -1: none): a park that copies goes to this tier where it
                                 // fits, for the reason its first choice was made (LLAMA_SERVER_PREEMPT_DISK_ALWAYS)
};

// a victim at the moment of its park
struct victim_state {
    int32_t     id     = -1;
    park_reason reason = park_reason::pool_full;
    park_input  in;
    size_t      bytes  = 0;  // its state (0: nothing worth copying, or RECOMPUTE only: not sized)
    int64_t     t_begin_us = 0;  // when its park began, by the executor's clock (its time is logged from there)
};

// everything an executor needs to carry out one park
struct park_order {
    int32_t       id         = -1;
    park_reason   reason     = park_reason::pool_full;
    park_input    in;
    size_t        bytes      = 0;      // the state copied out (0 for RECOMPUTE)
    park_decision how;                 // tier, why, predicted costs
    bool          background = false;  // disk: written from a host copy the RAM budget holds until written
    park_shape    shape;               // where its resume re-enters, cells it needs back
    int64_t       t_begin_us = 0;      // the victim's: when its park began

    park_tier tier() const { return how.tier; }
};

// A tier for one victim (choose_park() with the tiers' state), whether its move runs in the
// background, and its shape. `waits_behind`: another parked slot comes back before it (waits_behind_parked()).
park_order decide_park(const victim_state & v, const tier_state & t, bool waits_behind);

// what went wrong carrying out a decision
enum class move_failure {
    none,
    copy_out,    // the state could not be copied to host RAM (no memory, a failed copy)
    write,       // its store could not be written (a disk park's file could not be had)
    restore,     // the state could not be brought back (a lost file, no RAM to read it into)
};

// A park whose move failed falls back to the tier that still holds the state within its room, as
// the failed move reported it (`still_in`: a disk park whose file failed, its host copy within the
// RAM budget: RAM, for the reason it was chosen); else RECOMPUTE (move_failed). Nothing is lost.
park_order park_fallback(const park_order & o, park_tier still_in, int32_t n_batch);

// A resume whose restore failed comes back by RECOMPUTE from the tokens kept beside the state.
park_tier restore_fallback(park_tier from, move_failure f);

// the next slot back has its file read ahead when its state fits what is left of the RAM budget
bool may_read_ahead(size_t bytes, size_t ram_left_now);

// The test knob LLAMA_SERVER_PREEMPT_EVERY=N: the generating slots to park now (reason forced),
// each after N tokens generated since its last forced park. None when every <= 0.
std::vector<int32_t> forced_parks(const std::vector<slot_view> & slots, int32_t every);

// After a plan, read from the views it was made from: nothing runs (every busy slot parked, by
// the plan or before it, or held) and a parked slot waits on purpose (for its unpark, or out a
// minimum park time: `min_park_time`). The loop then idles a moment instead of spinning until
// that changes.
bool loop_idles(const std::vector<slot_view> & slots, const plan & pl, bool min_park_time);

} // namespace llama_preempt
