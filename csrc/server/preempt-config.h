// llama-preempt: the server's preemption settings, built once from the parameters and the
// environment (the flags, and the test knobs LLAMA_SERVER_PREEMPT_*), so that the mechanics read
// one struct instead of the environment and the flags each in its own place.
#pragma once

#include "preempt-copy.h"
#include "preempt-disk.h"
#include "preempt-policy.h"
#include "preempt-swap.h"

#include <cstddef>
#include <cstdint>
#include <string>

struct common_params;

namespace llama_preempt {

struct preempt_config {
    bool         on = false;
    std::string  off_why;                    // why preemption is off (for the slot actions' errors)
    int32_t      ram_mib    = 0;             // --preempt-ram as given
    size_t       ram_budget = 0;             // bytes parked slots may hold at once (SIZE_MAX: no limit)
    preempt_mode mode       = preempt_mode::automatic;  // effective: RECOMPUTE with --preempt-ram 0 and no disk tier
    copy_route   route      = copy_route::bulk;         // LLAMA_SERVER_PREEMPT_COPY=graph|slice (tests, bench)
    std::string  disk_dir;                   // --preempt-disk ("" : no disk tier)
    int32_t      disk_mib    = -1;           // --preempt-disk-mib as given
    size_t       disk_budget = 0;            // bytes parked files may take at once (SIZE_MAX: the disk's free space; 0: no disk tier)
    disk_knobs   disk;                       // LLAMA_SERVER_PREEMPT_DISK_FAIL, _DISK_HOLD_MS, _DISK_NAME
    bool         disk_always = false;        // LLAMA_SERVER_PREEMPT_DISK_ALWAYS: every SWAP park goes to disk where it fits
    cost_rates   rates;                      // LLAMA_SERVER_PREEMPT_RATES fixes them (tests)
    swap_knobs   swap;                       // knobs that reach into a swap

    // test knobs of the loop
    int32_t every    = 0;      // LLAMA_SERVER_PREEMPT_EVERY=N: park generating slots every N tokens
    bool    reactive = false;  // LLAMA_SERVER_PREEMPT_REACTIVE: the planner never parks, only the retry ladder does
    int64_t min_parked_us  = 0;      // LLAMA_SERVER_PREEMPT_HOLD_MS: a parked slot stays parked at least this long

    // idle swap memory kept for reuse: a quarter of the budget, at most 512 MiB (none with the
    // per-slice route, which is the baseline: upstream's copy into fresh memory)
    size_t pool_cap() const;
};

// `has_memory`: the loaded model has KV memory. Throws std::invalid_argument for a bad
// --preempt-mode (the flag parser refuses it first; this guards a host that sets it directly).
preempt_config make_preempt_config(const common_params & params, bool has_memory);

// the startup lines: on and how, or off and why, and every test knob that is set
void log_preempt_config(const preempt_config & cfg, size_t n_slots, int32_t n_ctx);

} // namespace llama_preempt
