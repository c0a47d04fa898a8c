// llama-preempt: the server's preemption settings, built once from the parameters and the
// environment (the flags, and the test knobs LLAMA_SERVER_PREEMPT_*), so that the mechanics read
// one struct instead of the environment and the flags each in its own place.
#pragma once

#include "preempt-copy.h"
#include "preempt-disk.h"
#include "preempt-flags.h"
#include "preempt-policy.h"
#include "preempt-swap.h"

#include <cstddef>
#include <cstdint>
#include <string>

struct common_params;

namespace llama_preempt {

// The test knobs (LLAMA_SERVER_PREEMPT_*), the one seam through which tests and benchmarks reach
// in: read once by make_preempt_config(), never from the environment elsewhere. Each reaches a
// decision only as an input the policy names (force_to in tier_state, can_resume in slot_view,
// plan_params.park, cost_rates.fixed, forced_parks()); the rest are faults and delays injected
// into the mechanics (a copy, a file), which the policy then sees fail like any other.
struct test_knobs {
    // decision inputs
    int32_t    every         = 0;      // LLAMA_SERVER_PREEMPT_EVERY=N: forced_parks() parks generating slots every N tokens
    bool       reactive      = false;  // LLAMA_SERVER_PREEMPT_REACTIVE: the planner never parks (plan_params.park), only the retry ladder does
    int64_t    min_parked_us = 0;      // LLAMA_SERVER_PREEMPT_HOLD_MS: a parked slot stays parked at least this long (slot_view.can_resume)
    bool       disk_always   = false;  // LLAMA_SERVER_PREEMPT_DISK_ALWAYS: every SWAP park goes to disk where it fits (tier_state.force_to)
    // LLAMA_SERVER_PREEMPT_RATES: the rates are fixed, as preempt_config.rates says (cost_rates.fixed)
    // faults and delays in the mechanics
    copy_route route = copy_route::bulk;  // LLAMA_SERVER_PREEMPT_COPY=graph|slice (tests, bench)
    swap_knobs swap;                      // _FAIL_RESTORE, _FAIL_ALLOC, _COPY_HOLD_MS
    bool       verify_all = false;        // LLAMA_SERVER_PREEMPT_VERIFY: the guard checks every copy (--preempt-verify always)
    copy_faults faults;                   // _REFUSE_GATHER, _CORRUPT: a device without the gather's ops, a flipped byte
    disk_knobs disk;                      // _DISK_FAIL, _DISK_HOLD_MS, _DISK_NAME
};

// --preempt-sched KEY=N,... as the planner's knobs: the policy's defaults, the keys given replacing
// them (the simulator reads the same flag the same way). Throws std::invalid_argument.
sched_params sched_from_flag(const preempt_sched_flag & f);

struct preempt_config {
    bool         on = false;
    std::string  off_why;                    // why preemption is off (for the slot actions' errors)
    int32_t      ram_mib    = 0;             // --preempt-ram as given
    size_t       ram_budget = 0;             // bytes parked slots may hold at once (SIZE_MAX: no limit): host.parks()
    host_budget  host;                       // --host-kv-ram: parked slots and the prompt cache together
    preempt_mode mode       = preempt_mode::automatic;  // effective: RECOMPUTE with --preempt-ram 0 and no disk tier
    std::string  disk_dir;                   // --preempt-disk ("" : no disk tier)
    bool         compress_q8 = false;        // --preempt-compress q8_0: the compressed host tier (server/preempt-tiers.h)
    int32_t      disk_mib    = -1;           // --preempt-disk-mib as given
    std::string  disk_mib_from;              // where that limit came from (disk_limit_from())
    size_t       disk_budget = 0;            // bytes parked files may take at once (SIZE_MAX: the disk's free space; 0: no disk tier)
    cost_rates   rates;                      // the starting rates (LLAMA_SERVER_PREEMPT_RATES fixes them)
    sched_params sched;                      // how the planner shares an overloaded pool
    int32_t      verify_first = 3;           // --preempt-verify: swap copies the guard checks per device (-1 every one, 0 none)
    test_knobs   knobs;                      // the test knobs, all of them
    std::string  share_off;                  // why prompts never link a prefix ("": they do; prefix_share_off(), set once the model is loaded)

    // idle swap memory kept for reuse: a quarter of the budget, at most 512 MiB (none with the
    // per-slice route, which is the baseline: upstream's copy into fresh memory)
    size_t pool_cap() const;
};

// `has_memory`: the loaded model has KV memory. Throws std::invalid_argument for a bad
// --preempt-mode (the flag parser refuses it first; this guards a host that sets it directly).
preempt_config make_preempt_config(const common_params & params, bool has_memory);

// whether attention over the pool visits only each request's own cells: flash attention's runs of
// cells (--attn-own-cells, patches/0011); -fa off computes its products over every cell up to the
// pool's highest used one
bool attn_own_cells_active(const common_params & params);

// the devices other than the CPU that layers may run on ("" where every layer runs on the CPU: -ngl 0
// or -dev none)
std::string layer_devices(const common_params & params);

// whether a token's attention reads every used cell of the pool, as the step cost prices it
bool attention_spans_pool(const common_params & params);

// --deterministic's batch-invariant kernels are the CPU's: a warning where layers run on another device
void log_deterministic_devices(const common_params & params);

// the startup lines: on and how, or off and why, and every test knob that is set
void log_preempt_config(const preempt_config & cfg, size_t n_slots, int32_t n_ctx);

} // namespace llama_preempt
