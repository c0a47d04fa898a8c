// llama-preempt: what the in-process Engine's stats() reads between steps, as types rather than a
// JSON tree: every series of ours /metrics shows (preempt-metrics.h), the labeled counters, and per
// slot what /slots shows of its park (preempt-slot.h writes the same fields as /slots' JSON). The
// binding (py-engine.cpp) hands them to Python as they are; PreemptStats.from_core() reads them.
#pragma once

#include "preempt-metrics.h"
#include "preempt-policy.h"

#include <cstdint>
#include <string>
#include <vector>

namespace llama_preempt {

// what a slot's park state adds to its /slots entry
struct slot_park_fields {
    std::string state;                 // upstream's slot_state by name (slot_state_name())
    std::string id_cmpl;               // the "id" of its request's OpenAI-style responses ("": no request)
    int32_t     priority     = 0;      // its request's priority
    bool        is_preempted = false;  // parked now
    bool        is_paused    = false;  // generating, but beyond the decode width: it keeps its cells and waits
    int32_t     n_preempt    = 0;      // times its request was parked
    int32_t     n_recompute  = 0;      // tokens re-prefilled for its request
    // while parked (is_preempted): where its state waits, who parked it and why that tier
    park_tier   tier      = park_tier::recompute;
    park_reason parked_by = park_reason::pool_full;
    park_choice choice    = park_choice::no_state;
    uint64_t    ram_bytes      = 0;      // host RAM its parked state holds
    uint64_t    disk_bytes     = 0;      // bytes of its state in a file of the disk tier
    bool        copy_in_flight = false;  // its copy to host RAM may still run
    double      t_preempted_ms = 0;      // time its request spent parked, the current park included
    int32_t     n_cells        = 0;      // KV cells holding its sequence (-1: the memory has no cells, a recurrent model)
    int32_t     n_cells_shared = 0;      //   of those, cells another sequence holds too: a park frees the rest
};

// one slot as the Engine's stats() reports it: upstream's own fields, and its park
struct slot_stats {
    int32_t id            = -1;
    int32_t n_ctx         = 0;
    bool    is_processing = false;
    int32_t id_task       = -1;  // -1: no request
    int32_t n_tokens      = 0;   // cells it holds in the pool (0 while parked)
    int64_t n_decoded     = 0;   // tokens generated for its request so far
    slot_park_fields park;
};

struct engine_stats {
    bool         preempt_on        = false;
    int32_t      n_pool            = 0;   // cells in the unified pool
    int64_t      ram_budget_bytes  = 0;   // --preempt-ram in bytes (-1: no limit)
    int64_t      disk_budget_bytes = 0;   // the disk tier's budget (0: no disk tier, -1: no limit)
    preempt_mode mode              = preempt_mode::automatic;
    std::vector<metric_item>    series;   // every series of metric_items(), in its order
    std::vector<labeled_metric> labeled;  // every series of labeled_items()
    std::vector<slot_stats>     slots;
    // set by the Engine when it hands them out: how old they are, and whether a step was running
    // (then they are those of the step boundary before it)
    double age_ms         = 0;
    bool   while_stepping = false;
};

} // namespace llama_preempt
