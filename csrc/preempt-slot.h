// Per-slot preemption state, a member of upstream's server_slot (`slot.preempt`).
//
// Plain data: /slots and /metrics read it from the worker thread during yields, so it is only
// written on the main loop, outside yield_to_queue lambdas.
#pragma once

#include "preempt-copy.h"
#include "preempt-policy.h"
#include "server-common.h"
#include "server-task.h"

#include <cstdint>
#include <memory>
#include <new>
#include <stdexcept>

namespace llama_preempt {

// what a slot was doing when it was parked, so the resume knows where to re-enter
enum class parked_from {
    none,        // not parked
    started,     // a new request that had not started its prompt
    prompt,      // mid-prompt: starts its prompt over
    generating,  // generating: replays prompt.tokens + sampled, then carries on sampling
};

// host RAM for one context's sequence state: a block from the server's host_pool (warm memory when
// one was freed before; pinned when a device backend offers it), left uninitialised (the copy fills
// it) and allocated without throwing, so a large swap neither zero-fills gigabytes on the main
// loop nor aborts. It is freed through the copier that fills it (`copier`): a transfer into it, or
// an upload from it ahead of its restore, may still be running then.
struct host_buffer {
    uint8_t * data = nullptr;
    size_t    size = 0;  // bytes of state (the block may be larger)
    std::shared_ptr<seq_copier> copier;  // the copier whose transfers may still use it

    host_buffer() = default;
    host_buffer(const host_buffer &) = delete;
    host_buffer & operator=(const host_buffer &) = delete;
    host_buffer(host_buffer && o) noexcept { take(o); }
    host_buffer & operator=(host_buffer && o) noexcept {
        if (this != &o) {
            reset();
            take(o);
        }
        return *this;
    }
    ~host_buffer() { reset(); }

    bool alloc(size_t n, const std::shared_ptr<host_pool> & from, ggml_backend_buffer_type_t pinned_buft) {
        reset();
        if (n == 0) {
            return true;
        }
        pool  = from;
        block = pool->take(n, pinned_buft);
        data  = block.data;
        size  = data ? n : 0;
        return data != nullptr;
    }

    void reset() {
        if (copier) {
            copier->release(data);  // a transfer into it, or an upload from it, may still run
            copier.reset();
        }
        if (pool) {
            pool->give(std::move(block));
            pool.reset();
        }
        block.release();
        data = nullptr;
        size = 0;
    }

    bool is_pinned() const { return block.pinned != nullptr; }

private:
    void take(host_buffer & o) {
        block     = std::move(o.block);
        pool      = std::move(o.pool);
        copier    = std::move(o.copier);
        data = o.data;
        size = o.size;
        o.data = nullptr;
        o.size = 0;
    }

    host_block                 block;
    std::shared_ptr<host_pool> pool;
};

// how a parked slot comes back
enum class park_mode {
    none,
    recompute,  // cells dropped; the replay list is re-prefilled (zero host RAM)
    swap,       // sequence state of the target and draft contexts copied to host RAM (exact)
};

struct slot_preempt_state {
    parked_from from = parked_from::none;  // != none while parked (state SLOT_STATE_PREEMPTED)
    park_mode   mode = park_mode::none;

    // SWAP: the slot's state in host RAM, and its prompt (tokens and checkpoints) kept beside it,
    // so that a parked slot's prompt is empty like its cells
    host_buffer          swap_tgt;
    host_buffer          swap_dft;
    server_prompt        swap_prompt;

    // RECOMPUTE replay list: the tokens the slot held plus `sampled`, which it had sampled and
    // sent but not decoded yet. Re-prefilling exactly these puts the logits where the interrupted
    // step was about to read them.
    server_tokens replay;
    int32_t n_replay_done = 0;      // replay tokens already added to a batch
    bool    resuming      = false;  // replaying after a park
    int32_t n_redo_left   = 0;      // a prompt-phase victim: prompt tokens it is processing again

    park_reason reason      = park_reason::pool_full;  // why it was parked
    park_choice choice      = park_choice::no_state;   // why by SWAP or by RECOMPUTE
    int32_t n_copy_ranges   = 0;      // SWAP: cell ranges the sequence's state was copied from
    const char * copied_by  = "";     // SWAP: how the park copied (copy_report::how())
    bool    copy_in_flight  = false;  // SWAP: the transfer to host RAM may still be running
    int64_t t_copy_hold_us  = 0;      // LLAMA_SERVER_PREEMPT_COPY_HOLD_MS: counts as in flight until then (tests)
    bool        held_by_api = false;  // parked through the API: the planner leaves it parked until unparked

    int32_t n_restore   = 0;  // cells needed to be back where it was
    int64_t t_parked_us = 0;
    int32_t n_gen_forced = 0; // stats.n_gen at the last forced park (LLAMA_SERVER_PREEMPT_EVERY)

    // per request, shown in /slots
    int32_t n_preempt   = 0;
    int32_t n_recompute = 0;  // tokens re-prefilled for this request
    int64_t t_parked_total_us = 0;

    bool is_parked() const { return from != parked_from::none; }

    size_t swap_bytes() const { return swap_tgt.size + swap_dft.size; }

    void free_swap() {
        swap_tgt.reset();
        swap_dft.reset();
        swap_prompt.clear();
    }

    // the /slots fields; `state` is the slot's state by name (slot_state_name()), `task` its
    // request (or null): id_cmpl is the "id" its OpenAI-style responses carry, so a client can
    // find its own slot
    void add_to_json(json & res, const char * state, const server_task * task) const {
        res["state"]        = state;
        res["id_cmpl"]      = task ? json(task->params.oaicompat_cmpl_id) : json(nullptr);
        res["priority"]     = task ? task->params.priority : 0;
        res["is_preempted"] = is_parked();
        res["n_preempt"]    = n_preempt;
        res["n_recompute"]  = n_recompute;
        res["preempt_mode"] = !is_parked() ? json(nullptr) : json(mode == park_mode::swap ? "swap" : "recompute");
        res["parked_by"]    = !is_parked() ? json(nullptr) : json(park_reason_key(reason));
        res["preempt_ram_bytes"] = swap_bytes();
        res["preempt_choice"] = !is_parked() ? json(nullptr) : json(park_choice_name(choice));
        res["preempt_copy_in_flight"] = copy_in_flight;
        res["t_preempted_ms"] = t_parked_so_far_us() / 1000.0;
    }

    // time parked, this request: the parks it came back from, and the current one while it lasts
    // (an operator looks while the slot is parked: a total kept only at resume reads 0 then)
    int64_t t_parked_so_far_us() const {
        return t_parked_total_us + (is_parked() ? ggml_time_us() - t_parked_us : 0);
    }

    int32_t n_replay_left() const {
        return resuming ? (int32_t) replay.size() - n_replay_done : 0;
    }
};

// thrown by the bottom of the KV-full retry ladder after it parked a victim: update_slots() ends
// the step without failing anyone, and the next step builds a new batch
struct step_retry : std::runtime_error {
    using std::runtime_error::runtime_error;
};

} // namespace llama_preempt
