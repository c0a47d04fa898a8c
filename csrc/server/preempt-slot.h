// Per-slot preemption state, kept in the parked slots' table (parked_slots::state(), one entry per
// slot for the server's life); upstream's server_slot points to its entry (`slot.preempt`) for
// /slots and for its reset, which frees it.
//
// Plain data: /slots and /metrics read it from the worker thread during yields, so it is only
// written on the main loop, outside yield_to_queue lambdas.
#pragma once

#include "preempt-config.h"
#include "preempt-disk-park.h"
#include "preempt-drain.h"
#include "preempt-events.h"
#include "preempt-executor.h"
#include "preempt-policy.h"
#include "preempt-stats.h"
#include "preempt-swap.h"
#include "server-common.h"
#include "server-task.h"

#include <cstdint>
#include <memory>
#include <new>
#include <stdexcept>
#include <vector>

namespace llama_preempt {

// upstream's slot_state by name, for /slots (its values in order, SLOT_STATE_PREEMPTED last: a
// static_assert in preempt-upstream.inc keeps the two in step). This header comes before upstream's
// enum, hence its value by number.
constexpr int slot_state_preempted = 6;

// "parked" has one source: upstream's slot state (SLOT_STATE_PREEMPTED), which the executor sets
// at a park and clears at the resume
inline bool is_parked_state(int state) {
    return state == slot_state_preempted;
}

inline const char * slot_state_name(int state) {
    static const char * const names[] = {
        "idle", "wait_other", "started", "processing_prompt", "done_prompt", "generating", "preempted",
    };
    return state >= 0 && state < (int) (sizeof(names) / sizeof(names[0])) ? names[state] : "unknown";
}

struct slot_preempt_state {
    parked_from from = parked_from::none;  // the phase it was parked from (read while parked only)

    // SWAP: the slot's state in host RAM or, for a disk park, in its file (preempt-swap.h), and its
    // prompt (tokens and checkpoints) kept beside it, so that a parked slot's prompt is empty like its cells
    swap_state    swap;
    server_prompt swap_prompt;

    // RECOMPUTE replay list: the tokens the slot held plus `sampled`, which it had sampled and
    // sent but not decoded yet. Re-prefilling exactly these puts the logits where the interrupted
    // step was about to read them.
    server_tokens replay;
    int32_t n_replay_done = 0;      // replay tokens already added to a batch
    bool    resuming      = false;  // replaying after a park
    int32_t n_redo_left   = 0;      // a prompt-phase victim: prompt tokens it is processing again

    // generating beyond the decode width (the plan's pause): it keeps its cells and its sampled
    // token, and sits the step out; the executor sets it every step
    bool    paused          = false;
    int64_t t_paused_us     = 0;      // when its current pause began
    int64_t t_paused_total_us = 0;    // paused, in all, for this request (the pauses that ended)

    park_reason reason      = park_reason::pool_full;  // why it was parked
    park_choice choice      = park_choice::no_state;   // why by SWAP or by RECOMPUTE
    bool        waits_for_unpark = false;  // parked through the API: the planner leaves it parked until unparked

    int64_t t_arrival_us = -1; // when its request reached the slot (the planner ages a held request's wait)
    int32_t n_restore   = 0;  // cells needed to be back where it was
    int64_t t_parked_us = 0;
    int32_t n_gen_forced = 0; // stats.n_gen at the last forced park (LLAMA_SERVER_PREEMPT_EVERY)

    // the cells holding its sequence, of those the ones another sequence holds too (a linked prefix,
    // an n_cmpl family's prompt: a park frees the difference), and the ones charged to it (it is their
    // lowest sequence: each cell is charged once). Refreshed by preempt_server::count_cells()
    int32_t n_cells        = 0;
    int32_t n_cells_shared = 0;
    int32_t n_cells_first  = 0;

    // per request, shown in /slots
    int32_t n_preempt   = 0;
    int32_t n_recompute = 0;  // tokens re-prefilled for this request
    int64_t t_parked_total_us = 0;

    // where a parked slot's state waits, read from the one place that holds it (the swap state):
    // a file (disk), host RAM, or nowhere (RECOMPUTE: its tokens are re-prefilled). A disk park
    // whose file failed while its host copy was kept is a RAM park from then on, as it says here.
    // Asked of a slot that is not parked, it says recompute (no state is kept).
    park_tier tier() const {
        return swap.state_bytes() == 0 ? park_tier::recompute : swap.tier();
    }

    size_t swap_bytes() const { return swap.bytes(); }

    void free_swap() {
        swap.free();
        swap_prompt.clear();
    }

    // what /slots shows of the slot's park; `state` is upstream's slot_state (slot_state_name()),
    // `task` its request (or null): id_cmpl is the "id" its OpenAI-style responses carry, so a
    // client can find its own slot
    slot_park_fields park_fields(int state, const server_task * task) const {
        slot_park_fields f;
        f.state          = slot_state_name(state);
        f.id_cmpl        = task ? task->params.oaicompat_cmpl_id : "";
        f.priority       = task ? task->params.priority : 0;
        f.is_preempted   = is_parked_state(state);
        f.is_paused      = paused && !f.is_preempted;
        if (f.is_paused) {
            f.state = "paused";
        }
        f.n_preempt      = n_preempt;
        f.n_recompute    = n_recompute;
        f.tier           = tier();
        f.parked_by      = reason;
        f.choice         = choice;
        f.ram_bytes      = swap_bytes();
        f.disk_bytes     = swap.disk.bytes_on_disk();
        f.copy_in_flight = swap.copy_in_flight;
        f.t_preempted_ms = t_parked_so_far_us(f.is_preempted) / 1000.0;
        f.n_cells        = n_cells;
        f.n_cells_shared = n_cells_shared;
        return f;
    }

    // the same fields as /slots' JSON (the park's kind, reason and choice null unless parked)
    void add_to_json(json & res, int state, const server_task * task) const {
        const auto f      = park_fields(state, task);
        const bool parked = f.is_preempted;
        res["state"]        = f.state;
        res["id_cmpl"]      = task ? json(f.id_cmpl) : json(nullptr);
        res["priority"]     = f.priority;
        res["is_preempted"] = parked;
        res["is_paused"]    = f.is_paused;
        res["t_paused_ms"]  = (t_paused_total_us + (f.is_paused ? ggml_time_us() - t_paused_us : 0)) / 1000.0;
        res["n_preempt"]    = f.n_preempt;
        res["n_recompute"]  = f.n_recompute;
        res["preempt_mode"] = !parked ? json(nullptr) : json(f.tier == park_tier::recompute ? "recompute" : "swap");
        res["parked_by"]    = !parked ? json(nullptr) : json(park_reason_key(f.parked_by));
        res["preempt_tier"] = !parked ? json(nullptr) : json(park_tier_name(f.tier));
        res["preempt_ram_bytes"]  = f.ram_bytes;
        res["preempt_disk_bytes"] = f.disk_bytes;
        res["preempt_choice"] = !parked ? json(nullptr) : json(park_choice_name(f.choice));
        res["preempt_copy_in_flight"] = f.copy_in_flight;
        res["t_preempted_ms"] = f.t_preempted_ms;
        res["n_cells"]        = f.n_cells;
        res["n_cells_shared"] = f.n_cells_shared;
    }

    // time parked, this request: the parks it came back from, and the current one while it lasts
    // (an operator looks while the slot is parked: a total kept only at resume reads 0 then)
    int64_t t_parked_so_far_us(bool parked) const {
        return t_parked_total_us + (parked ? ggml_time_us() - t_parked_us : 0);
    }

    int32_t n_replay_left() const {
        return resuming ? (int32_t) replay.size() - n_replay_done : 0;
    }
};

// Our state of every slot, one entry per slot for the server's life: preempt_server owns it and
// hands it to the parts that read or change it (the parked slots, the batch hooks, the drain, the
// step recorder); upstream's slot points to its entry for /slots and its reset. Never read back
// through a port.
class slot_table {
public:
    void init(int32_t n) { states_.resize(n); }  // once: upstream's slots point into it (server_slot::preempt)
    int32_t size() const { return (int32_t) states_.size(); }
    slot_preempt_state & operator[](int32_t id) { return states_[id]; }
    const slot_preempt_state & operator[](int32_t id) const { return states_[id]; }

private:
    std::vector<slot_preempt_state> states_;
};

// thrown by the bottom of the KV-full retry ladder after it parked a victim: update_slots() ends
// the step without failing anyone, and the next step builds a new batch
struct step_retry : std::runtime_error {
    using std::runtime_error::runtime_error;
};

} // namespace llama_preempt
