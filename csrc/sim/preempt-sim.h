// A simulator of llama-server's loop over a unified KV pool, driven by the real policy.
//
// Each simulated step does what update_slots() does, in the same order: the planner
// (plan_step(), the very function the server calls) decides purges, parks, resumes and holds, and
// apply_plan() carries them out through this simulator's executor (preempt-sim-park.cpp), as it
// does through the server's: each victim's tier is the policy's decide_park(), priced with the
// simulated costs. The batch takes one token per decoding slot (the plan's paused slots sit out),
// then prompt and replay chunks in slot order up to n_batch (the plan holds the prompts its budget
// does not reach); the step costs what step_cost says of its shape, and the planner reads that cost
// through the same online fit as the server's (step_cost_fit). Pure C++ and no llama types, so operators can
// size -c and --preempt-ram for a workload in seconds (llama_preempt.simulate), and a fleet of
// such servers behind a router (simulate_fleet(), preempt-fleet.cpp).
#pragma once

#include "preempt-executor.h"
#include "preempt-policy.h"
#include "preempt-sim-cache.h"
#include "preempt-sim-prompts.h"
#include "preempt-sim-tiers.h"

#include <algorithm>
#include <cstdint>
#include <deque>
#include <limits>
#include <memory>
#include <string>
#include <vector>

namespace llama_preempt {

struct sim_request {
    double  t_arrival = 0.0;  // seconds since the start (with `after`: since that request was done)
    int32_t n_prompt  = 1;    // prompt tokens
    int32_t n_gen     = 1;    // tokens to generate (ignore_eos)
    // a multi-turn chat: the conversation it continues (-1: none; its prompt begins with that chat's
    // earlier prompts and answers), the leading prompt tokens every request shares (a common system
    // prompt), and the request it follows (-1: none; the caller's index of an earlier request): it
    // arrives t_arrival seconds after that one's answer, as a user's next turn does
    int32_t conversation = -1;
    int32_t n_shared     = 0;
    int32_t after        = -1;
};

struct sim_params {
    int32_t n_pool  = 4096;   // cells in the unified pool (-c)
    int32_t n_slots = 4;      // -np
    int32_t n_batch = 512;    // -b
    bool    preempt = true;   // false: upstream's behaviour (a full pool fails every running request)
    bool    kv_unified = true;  // false: a static split (--no-kv-unified): each slot's attention spans its own
                                // cells only (step_cost::span_cell_s; n_pool is the slots' shares together)
    bool    attn_own_cells = true;  // a unified pool's attention walks each slot's own cells (--attn-own-cells, the
                                    // CPU's flash attention), so it spans no more than a split's; false: the pool's
                                    // used cells (-fa off, --no-attn-own-cells, a device whose kernel spans the pool)
    int64_t preempt_ram_mib = 8192;  // --preempt-ram (MiB): -1 no limit, 0 recompute only (ram_budget_from_mib())
    int64_t host_kv_ram_mib = -2;    // --host-kv-ram (MiB): the host budget parks share with the prompt cache (-2: not given)
    int64_t cache_ram_mib   = 0;     // --cache-ram (MiB): upstream's RAM prompt cache (0: none, as here by default; the server's is 8192)
    float   slot_prompt_similarity = 0.1f;  // --slot-prompt-similarity: a request takes the idle slot whose prompt it shares this much of
    preempt_mode mode = preempt_mode::automatic;   // --preempt-mode: the server's choose_park() with the rates below
    sched_params sched;                            // how the planner shares an overloaded pool (the server's flags)

    // costs (seconds and bytes); defaults are SmolLM2-135M Q4_1 on 2 CPU cores (see simulate.py)
    step_cost cost;                   // a step: fixed, per generated and prompt token, per cell attended
    double bytes_per_cell  = 23040;   // KV bytes per cell (all layers, K and V)
    double state_overhead_bytes = 0;  // bytes of a sequence's state beyond its cells (the serializer's headers)
    double swap_out_bps    = 9.5e9;   // park copy bandwidth, bytes/s (bench/swap_bandwidth.py, CPU)
    double swap_in_bps     = 15.0e9;  // restore copy bandwidth, bytes/s

    // the disk tier: --preempt-disk-mib (0: no disk tier, -1: no limit) and its rates
    int64_t preempt_disk_mib = 0;
    double  disk_write_bps = cost_rates::DEFAULT_DISK_WRITE_BPS;
    double  disk_read_bps  = cost_rates::DEFAULT_DISK_READ_BPS;

    // the compressed tier: --preempt-compress q8_0 (host RAM packed to q8_0) and its rates
    bool    compress_q8 = false;
    double  pack_bps    = cost_rates::DEFAULT_PACK_BPS;
    double  unpack_bps  = cost_rates::DEFAULT_UNPACK_BPS;
    double  pack_ratio  = cost_rates::DEFAULT_PACK_RATIO;  // packed bytes per byte of state

    int64_t max_steps = 50000000;     // a guard against a workload that cannot finish (per server)
};

enum class sim_outcome : int32_t { pending = 0, completed = 1, failed = 2 };

struct sim_request_result {
    sim_outcome outcome     = sim_outcome::pending;
    double      t_start     = -1;  // admitted into a slot
    double      t_first     = -1;  // first token
    double      t_done      = -1;
    int32_t     n_preempt   = 0;
    double      t_parked_s  = 0;   // time spent parked
    double      t_second    = -1;  // second token (the first one decoded after the prompt)
    double      max_gap_s   = 0;   // the longest wait between two of its tokens
    double      t_arrival   = -1;  // when it arrived (a turn that follows another: that one's end and its pause)
    int32_t     n_prompt_cached = 0;  // prompt tokens it did not compute (the server's tokens_cached; prompt_n is the rest)
    sim_prompt_source cached_from = sim_prompt_source::none;
};

// one decision of the simulated server's policy, as the server's step events report it
struct sim_decision {
    int64_t       step    = 0;   // the step it was made in (res.n_steps then)
    decision_kind kind    = decision_kind::park;
    int32_t       request = -1;  // the request the slot served (the order it arrived here)
    park_tier     tier    = park_tier::recompute;
    park_reason   reason  = park_reason::pool_full;
    park_choice   why     = park_choice::no_state;
    int32_t       n_held  = 0;   // park: the tokens it held
    size_t        bytes   = 0;   // park: its state copied out
};

struct sim_result {
    std::vector<sim_request_result> requests;
    std::vector<sim_decision>       trace;  // every park, resume and failure of a parked request, in order
    int64_t n_steps              = 0;
    int64_t n_park_swap          = 0;
    int64_t n_park_recompute     = 0;
    int64_t n_park_disk          = 0;  // of the swap parks, those to the disk tier
    int64_t n_park_ram_q8        = 0;  // of the swap parks, those packed to q8_0 (the compressed tier)
    int64_t parks_by_choice[N_PARK_CHOICES] = {};  // as the server's preempt_parks_by_choice_total
    int64_t n_resume             = 0;
    int64_t n_recompute_tokens   = 0;
    int64_t n_tokens_generated   = 0;
    double  peak_parked_bytes    = 0;  // host RAM (RAM parks, disk writes in flight, reads ahead)
    double  peak_disk_bytes      = 0;
    int32_t peak_cells           = 0;
    double  makespan_s           = 0;
    bool    hit_step_limit       = false;
    int64_t n_width_steps        = 0;  // steps with a slot generating: the planner chose a decode width in each
    int64_t sum_decode_width     = 0;  //   the widths summed (their mean: sum / steps)
    int32_t max_decode_width     = 0;
    // the prompt cache (sim_params::cache_ram_mib), as the server's /metrics count it
    int64_t n_prompt_tokens_computed = 0;  // prompt tokens prefilled (prompt_n summed; replays not counted)
    int64_t n_prompt_cache_ram_hits  = 0;  // a request's prefix restored from the RAM cache
    int64_t n_prompt_cache_disk_hits = 0;  // prompt files read back (n_prompt_cache_disk_hits_total)
    int64_t n_prompt_cache_spilled   = 0;  // cached prompts written to the disk tier (n_prompt_cache_spilled_total)
    int64_t n_prompt_cache_evicted   = 0;  // cached prompts the host budget made leave RAM (n_prompt_cache_evicted_total)
    int64_t n_prompt_cache_read_ahead = 0; // prompt files read ahead for a waiting request
    int64_t n_prompt_cache_disk_skipped = 0;  // cached prompts dropped for want of disk room
    int64_t n_prompt_cache_streamed = 0;      // of the spilled, prompts larger than the RAM cache streamed from their slot
    int64_t n_prompt_cache_streamed_back = 0; // of the disk hits, files streamed straight into a slot
    double  peak_cache_bytes         = 0;  // the RAM cache's bytes
};

// one slot of a simulated server
struct sim_slot {
    int32_t    id    = 0;
    int32_t    req   = -1;  // request it serves, -1 when idle
    slot_phase phase = slot_phase::idle;
    bool       is_new = false;  // admitted, has not processed a prompt chunk yet
    int32_t    cells  = 0;      // cells held (an idle or new slot's are a reclaimable cache)
    sim_tokens tokens;          // an idle or new slot's: the prompt its cells hold (tokens.n == cells)
    sim_prompt_source from = sim_prompt_source::none;  // a new slot's: where its cells came from
    bool       started = false;  // its prompt's first chunk was taken (what its cells share with it kept)
    int32_t    prompt_done = 0;
    int32_t    gen_done    = 0;
    double     t_last_used = 0;
    double     t_arrival   = -1;    // when its request reached the slot (the planner ages its wait from there)

    // parked, or resuming after a park
    park_tier tier       = park_tier::recompute;  // where its state waits (recompute: nowhere, its tokens re-prefill)
    bool    from_gen     = false;  // parked while generating (else mid-prompt)
    int32_t held         = 0;      // cells it held when parked
    int32_t n_restore    = 0;      // cells it needs to be back where it was
    double  t_parked     = 0;
    double  t_restore0   = 0;      // when its restore began (copy_in): the parked time ends there
    double  bytes        = 0;      // its swapped state
    double  ram          = 0;      // host RAM it holds now (a RAM park, a disk park's write in flight, a read ahead)
    double  t_io_done    = 0;      // its disk write (or read ahead) is done then
    bool    reading      = false;  // its file is being read back ahead
    bool    streamed     = false;  // a disk park that did not fit what parks may hold: streamed to its file and back, never through host RAM
    int32_t replay_total = 0;      // recompute: prompt + generated + sampled
    int32_t replay_left  = 0;      // recompute: replay tokens still to re-prefill
    int32_t redo_left    = 0;      // a prompt-phase victim: prompt tokens it processes again
    int32_t n_preempt    = 0;
    double  t_last_token = -1;     // its last token (the planner's bound on a paused slot's wait)
    int32_t n_tokens     = 0;      // tokens its request has been sent
};

// upstream's get_available_slot(): an idle slot for a request of `tokens` (nullptr: none), and
// whether the slot's prompt goes to the RAM cache first (preempt-sim-cache.cpp)
sim_slot * pick_slot(std::vector<sim_slot> & slots, const sim_tokens & tokens, float similarity, bool has_cache,
                     bool & update_cache);

constexpr double SIM_NEVER = std::numeric_limits<double>::infinity();

// One simulated llama-server with its own clock. It does not know the workload: its caller brings
// each request when it arrives (arrive()) and advances it in time (run_until()), so one loop serves
// a lone server (simulate()) and a fleet behind a router (simulate_fleet()) alike. Requests are
// numbered, and res.requests kept, in the order they arrive here.
struct sim_server final : plan_executor {
    sim_params  p;
    plan_params pp;
    sim_result  res;

    std::vector<sim_request> reqs;     // every request that arrived here
    std::vector<sim_slot>    slots;
    std::deque<int32_t>      waiting;  // arrived, no slot yet (upstream's deferred tasks)
    double t = 0;
    double parked_bytes = 0;  // host RAM the parked slots hold
    sim_disk disk;            // the disk tier (--preempt-disk): its files' bytes, its one I/O thread
    int32_t restore_next = -1; // the last plan's: it keeps a written disk park's host copy
    std::vector<uint8_t> held; // per slot: a prompt kept waiting this step
    std::vector<uint8_t> paused; // per slot: a generating slot beyond the decode width this step
    int32_t prompt_budget = 0; // the last plan's: prompt tokens a step adds while slots generate
    std::vector<int32_t> caps;   // per slot: the plan's share of the step's prompt tokens (-1: up to n_batch)
    step_cost_fit fit;         // the step cost as the planner knows it: fitted from the simulated steps, as the server's
    width_guard   guard;       // the width rule's live check, as the server's
    bool   stopped = false;  // gave up: the step limit, or held requests that nothing can unblock

    host_ram host;  // the one host budget the parks and the prompt cache share
    // the prompt cache (p.cache_ram_mib != 0; preempt-sim-cache.cpp): upstream's RAM cache and its disk side
    sim_prompts prompts { p, t, res, host, disk, parked_bytes, [this] { return tiers().rates; } };

    // its tiers: views of this server (so it is never copied or moved: a fleet keeps its servers in place)
    sim_recompute_tier rec_tier  { *this };
    sim_ram_tier       ram_tier  { *this };
    sim_disk_tier      disk_tier { *this };
    sim_q8_tier        q8_tier   { *this };

    explicit sim_server(const sim_params & p);
    sim_server(const sim_server &) = delete;
    sim_server & operator=(const sim_server &) = delete;

    // a request arrives (at rq.t_arrival, which is not before any earlier arrival's); an idle
    // server's clock jumps to it. Its result is res.requests.back().
    void arrive(const sim_request & rq);

    // every step that starts before t_until, the next arrival anywhere (SIM_NEVER: run out);
    // the caller brings the arrivals at t_until afterwards
    void run_until(double t_until);
    // at most one step, before t_until (the fleet's loop when turns follow others); false: none was due
    bool advance(double t_until);

    bool has_work() const;
    int32_t n_parked() const;  // requests parked now
    int32_t n_busy()   const;  // requests in a slot now, parked ones included
    int32_t n_queued() const { return (int32_t) waiting.size(); }

    // one update_slots(); t_next: the next arrival (SIM_NEVER: none). false: nothing will move again
    bool step(double t_next);

    // the pieces of a step: its plan, its batch fitted to the pool, its time, the slots after it
    struct sim_batch {
        std::vector<int32_t> chunk;  // by slot: tokens it adds this step
        int32_t n_gen    = 0;
        int32_t n_prompt = 0;
    };
    void plan_here();
    void fill_batch(sim_batch & b);
    bool fit_batch(sim_batch & b);
    void charge(const sim_batch & b);
    void advance_slots(const sim_batch & b, double t_step_start);
    bool is_running(const sim_slot & s) const;
    slot_view view(const sim_slot & s) const;
    void finish(sim_slot & s, sim_outcome outcome);
    void token(sim_slot & s);  // a token reaches the slot's client now
    void admit();
    void settle_disk();  // written files free their host copy, reads ahead let go (disk_hold())
    void hold_ram(sim_slot & s, double bytes);  // its host copy, as the RAM budget counts it
    void free_ram(sim_slot & s);
    size_t ram_budget() const;
    size_t ram_room() const;  // what parks may still hold of host RAM (the RAM tier's room, and the compressed one's)
    bool last_resort();
    int32_t cells_used() const;
    void clear_idle(sim_slot & s);  // an idle slot's cells go (to the RAM cache first, where there is one)
    void start_prompt(sim_slot & s);  // its first chunk: what its cells share with the prompt is kept

    // upstream's slot choice and prompt_load() with the prompt cache (preempt-sim-cache.cpp)
    sim_tokens tokens_of(int32_t req) const;
    void load_prompt(sim_slot & s, const sim_tokens & tokens);

    // the executor (preempt-executor.h), in simulated time (preempt-sim-park.cpp)
    void         settle() override;
    plan_params  params() override;
    std::vector<slot_view> views() const override;
    tier_state   tiers() const override;
    kv_tier &    tier(park_tier where) override;
    tier_set     all_tiers() const;
    victim_state victim(int32_t id, park_reason reason) override;
    parked_state parked(int32_t id) const override;
    void         purge(int32_t id) override;
    void         fail(int32_t id) override;
    void         park(const park_order & o) override;
    void         resume(int32_t id, park_tier from, const move_result & restore) override;
    void         hold(int32_t id) override;
    void         chunk(int32_t id, int32_t n) override;
    void         pause(const std::vector<int32_t> & ids) override;
    void         record(const decision & d) override;
};

} // namespace llama_preempt
