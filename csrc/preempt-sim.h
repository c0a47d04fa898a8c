// A simulator of llama-server's loop over a unified KV pool, driven by the real policy.
//
// Each simulated step does what update_slots() does, in the same order: the planner
// (plan_step(), the very function the server calls) decides purges, parks, resumes and holds;
// the batch takes one token per generating slot, then prompt and replay chunks in slot order up
// to n_batch; the step costs time by per-token rates. A victim is swapped or recomputed by the
// server's own choose_park(), priced with the simulated copy and prefill costs. Pure C++ and no llama types, so operators can
// size -c and --preempt-ram for a workload in seconds (llama_preempt.simulate).
#pragma once

#include "preempt-policy.h"

#include <cstdint>
#include <vector>

namespace llama_preempt {

struct sim_request {
    double  t_arrival = 0.0;  // seconds since the start
    int32_t n_prompt  = 1;    // prompt tokens
    int32_t n_gen     = 1;    // tokens to generate (ignore_eos)
};

struct sim_params {
    int32_t n_pool  = 4096;   // cells in the unified pool (-c)
    int32_t n_slots = 4;      // -np
    int32_t n_batch = 512;    // -b
    bool    preempt = true;   // false: upstream's behaviour (a full pool fails every running request)
    int64_t ram_budget_bytes = int64_t(8192) << 20;  // --preempt-ram in bytes; -1 no limit, 0 recompute only
    preempt_mode mode = preempt_mode::automatic;   // --preempt-mode: the server's choose_park() with the rates below

    // costs (seconds and bytes); defaults are SmolLM2-135M Q4_1 on 2 CPU cores (see simulate.py)
    double step_s          = 0.0023;  // fixed cost of a step that decodes anything
    double decode_token_s  = 0.0046;  // per generated token in the batch
    double prefill_token_s = 0.0022;  // per prompt or replay token in the batch
    double bytes_per_cell  = 23040;   // KV bytes per cell (all layers, K and V)
    double swap_out_bps    = 9.5e9;   // park copy bandwidth, bytes/s (bench/swap_bandwidth.py, CPU)
    double swap_in_bps     = 15.0e9;  // restore copy bandwidth, bytes/s

    int64_t max_steps = 50000000;     // a guard against a workload that cannot finish
};

enum class sim_outcome : int32_t { pending = 0, completed = 1, failed = 2 };

struct sim_request_result {
    sim_outcome outcome     = sim_outcome::pending;
    double      t_start     = -1;  // admitted into a slot
    double      t_first     = -1;  // first token
    double      t_done      = -1;
    int32_t     n_preempt   = 0;
    double      t_parked_s  = 0;   // time spent parked
};

struct sim_result {
    std::vector<sim_request_result> requests;
    int64_t n_steps              = 0;
    int64_t n_park_swap          = 0;
    int64_t n_park_recompute     = 0;
    int64_t parks_by_choice[N_PARK_CHOICES] = {};  // as the server's preempt_parks_by_choice_total
    int64_t n_resume             = 0;
    int64_t n_recompute_tokens   = 0;
    int64_t n_tokens_generated   = 0;
    int64_t n_restore_fail       = 0;  // always 0 here: a simulated restore does not fail
    double  peak_parked_bytes    = 0;
    int32_t peak_cells           = 0;
    double  makespan_s           = 0;
    bool    hit_step_limit       = false;
};

sim_result simulate(const std::vector<sim_request> & requests, const sim_params & p);

} // namespace llama_preempt
