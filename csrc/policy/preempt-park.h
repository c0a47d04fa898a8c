// A victim's park, before the planner's view of slots: why it was parked, what it was doing, and
// where its resume re-enters with how many cells (pure C++, as the planner in preempt-policy.h,
// which includes this).
#pragma once

#include <cstdint>

namespace llama_preempt {

enum class park_reason {
    pool_full,  // the planner saw the next step overflow the pool
    forced,     // LLAMA_SERVER_PREEMPT_EVERY test knob
    last_resort, // the decode failed at n_batch 1 and a victim existed
    api,         // POST /slots/{id}?action=park: stays parked until unparked
};

const char * park_reason_name(park_reason r);
// a short name for /slots' parked_by: planner, forced, last_resort, api
const char * park_reason_key(park_reason r);

// what a slot was doing when it was parked, so its resume knows where to re-enter
enum class parked_from {
    none,        // not parked
    started,     // a new request that had not started its prompt
    prompt,      // mid-prompt: starts its prompt over
    generating,  // generating (or replaying after an earlier park): replays, then carries on sampling
};

// a victim at the moment it is parked
struct park_input {
    parked_from at        = parked_from::none;  // what it is doing: started, prompt or generating
    bool        replaying = false;  // prompt: re-prefilling the replay list of an earlier park
    int32_t     n_held    = 0;      // cells it holds
    int32_t     n_prompt  = 0;      // its request's prompt tokens
    int32_t     n_replay  = 0;      // replaying: the whole replay list
};

// where the resume re-enters and what it needs
struct park_shape {
    parked_from from      = parked_from::none;
    int32_t     n_restore = 0;  // cells to be back where it was, plus its next step (the planner's fit)
    int32_t     n_redo    = 0;  // RECOMPUTE mid-prompt: prompt tokens it processes again
};

// Whether the victim has state worth copying: cells of a prompt or a generation. A slot mid-replay
// has a whole replay list (recompute it again) and a new request holds only a cache.
bool has_swap_state(const park_input & in);

// The park of a victim by SWAP (`swap`) or RECOMPUTE, with prompt chunks of n_batch.
park_shape shape_park(const park_input & in, bool swap, int32_t n_batch);

} // namespace llama_preempt
