// llama-preempt: preemption inside llama-server, compiled on its own behind the port
// (preempt-port.h). Read it with the policy (policy/preempt-policy.h and preempt-decide.h: every
// decision; the executor interface, policy/preempt-executor.h) and the settings (preempt-config.h).
//
// preempt_server owns preemption's settings and the step: the policy's view of the slots (each
// slot translated by the port, view_of()), the plan run through the executor, the last resort, the
// slot API's decisions and the gauges. What carries a plan out are classes that own their state:
// the parked slots (preempt-parked.h: parks, resumes, restores ahead, the copy guard, the disk
// tier), the tiers over them (preempt-tiers.h), the step's batch (preempt-batch.h: held prompts,
// chunks, replays, the step cost), upstream's prompt cache as the host budget sees it
// (preempt-prompt-cache.h), the drain (preempt-drain-loop.h) and the Engine's step log
// (preempt-step-recorder.h). Upstream reaches it only through the hooks of preempt-hooks.inc, whose
// definitions are in the adapter (preempt-upstream.inc); it reaches upstream only through the port,
// upstream's public headers (its parameters, metrics, queues and prompt cache) and libllama.
//
// Invariants it keeps:
//  - prompt.tokens equals the slot's cells in the KV cache, for a parked slot too (both empty;
//    a swapped slot keeps its tokens beside its buffers);
//  - a parked slot stays "processing" (SLOT_STATE_PREEMPTED), so nobody else claims it, and it
//    never enters a batch;
//  - a resumed slot never re-enters STARTED once its stream began: no second stream start, no
//    update_prompt_start(), no stats.n_gen = 0, no init_sampler(); its sampler, grammar, RNG and
//    penalties carry on from where they were.
//
// Everything here runs on the main loop, outside yield_to_queue(): /slots and /metrics read the
// slot fields from the worker thread only during yields.
#pragma once

#include "preempt-batch.h"
#include "preempt-config.h"
#include "preempt-drain-loop.h"
#include "preempt-executor.h"
#include "preempt-host-ram.h"
#include "preempt-metrics.h"
#include "preempt-parked.h"
#include "preempt-port.h"
#include "preempt-prompt-cache.h"
#include "preempt-stats.h"
#include "preempt-step-recorder.h"
#include "preempt-tiers.h"

#include "common.h"
#include "server-common.h"
#include "server-queue.h"
#include "server-task.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace llama_preempt {

// what the slot API answers: the result's fields, or the error a client made (a 400)
struct slot_action_answer {
    std::string error;  // "" : done
    json        out;
};

class preempt_server final : private cache_neighbours {
public:
    // upstream's members it is handed, and why: the ports (the step's own, and the roles it hands
    // its parts: the parked slots', the batch's, the loop's), the
    // metrics (what /metrics shows), the flags, the pool's cells, the target context (a sequence's
    // state, the batch size), the prompt cache (a purged slot's prompt, the host budget's cap) and
    // the task queue (a prompt file read ahead for a waiting request)
    preempt_server(const server_ports & ports, server_metrics & metrics, const common_params & params, const int32_t & n_ctx,
                   llama_context * const & ctx_tgt, std::unique_ptr<server_prompt_cache> & prompt_cache, server_queue & queue_tasks);

    preempt_server(const preempt_server &) = delete;
    preempt_server & operator=(const preempt_server &) = delete;

    // once, after the slots exist: is preemption active, and why (not)
    void init();

    // runs in update_slots() right before pre_decode(): every slot is at a token boundary and
    // prompt.tokens matches the cache
    void update();
    // The bottom of the KV-full retry ladder: the decode failed at n_batch 1 (see the definition)
    bool last_resort(int32_t off);
    // in pre_decode(), where the generating slots join the batch: a paused one sits the step out
    bool decode_paused(int32_t id) const { return cfg.on && table[id].paused; }
    // in send_final_response(): how many times the finished request was parked
    void observe_final(int32_t n_preempt);
    // POST /slots/{id}?action=park|unpark, on the main loop at a token boundary
    slot_action_answer slot_action(int32_t id_slot, bool park);

    // A request with no slot waits in the queue, unless --max-queue requests wait already (`n_waiting`):
    // then it is answered 503 (with Retry-After) at once, with this text, so that a balancer sends it
    // elsewhere; "" : it waits. A request that waited before (`queued_before`: taken out for a slot
    // that another got first) keeps its place whatever the count.
    std::string queue_refusal(bool queued_before, size_t n_waiting, int32_t id_task);
    // llama-server --preempt-selftest (preempt-selftest.h): every park route on this model and these
    // flags, checked, printed as a table and a report; LLAMA_PREEMPT_SELFTEST_JSON=FILE also writes
    // them as JSON (llama-preempt doctor reads it). 0 when every route is right.
    int selftest(const common_params & params, bool has_draft);

    // what /metrics shows now of the slots and the copies
    preempt_gauges gauges() const;
    // the counters and gauges /metrics shows, as types (the Engine's stats; the adapter adds each
    // slot's /slots fields)
    engine_stats stats() const;

    // the parts, which the hooks and the Engine reach
    slot_table      table;     // our state of each slot (upstream's slot points to its entry)
    preempt_config  cfg;       // the flags and test knobs, read once
    host_ram        host;      // the one host budget (--host-kv-ram): every host RAM reservation
    step_recorder   steps;     // what each step did, while a host drives the loop
    parked_slots    parked;    // the parked slots and their copies
    cached_prompts  prompts;   // upstream's prompt cache as what gives way to the host budget, and its disk side
    server_drain    drain;     // the graceful drain on SIGTERM / SIGINT
    batch_hooks     batch;     // the step's batch as the plan shapes it, and the step cost's fit
    server_tiers    tiers;     // the tiers a state waits in, as the policy prices them and the executor moves through them

private:
    // what the prompt cache asks of the server beside it (cache_neighbours)
    size_t parked_bytes() const override { return parked.ram_held(); }
    size_t room_cells(int32_t id, size_t need) override { return port_.room_cells(id, need); }

    struct executor;
    friend struct executor;

    slot_view view(int32_t id) const;
    std::vector<slot_view> views() const;
    plan_params params() const;
    tier_set tier_set_now() const;
    tier_state tier_state_now() const;
    park_order park(int32_t id, park_reason reason);
    void fail(int32_t id);
    void set_paused(const std::vector<int32_t> & ids);
    void end_replays();
    void planned(const plan & pl);
    void settle();
    bool end_families();
    void count_cells();
public:
    int32_t link_prefix(int32_t id);  // upstream's STARTED branch: a prefix another slot holds, linked (its tokens)
private:

    step_port &                            port_;
    server_metrics &                       metrics_;
    const common_params &                  params_;
    const int32_t &                        n_ctx_;
    llama_context * const &                ctx_tgt_;  // upstream's, read each time: a wake from sleep makes a new context
    std::unique_ptr<server_prompt_cache> & prompt_cache_;

    int64_t t_cells_us_   = 0;   // when count_cells() last walked the cells
    bool    cells_shared_ = false;  // a cell was shared at the last walk, or a prefix was linked since

    int64_t t_wake_us_    = 0;   // when the request handlers were last woken to check should_stop()
    int32_t restore_next_ = -1;  // the last plan's restore_next (it keeps a written disk park's host copy)
};

} // namespace llama_preempt
