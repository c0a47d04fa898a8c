// The preemption policy, read top to bottom: plan_step() is the whole of it, its phases are
// preempt-step.cpp. The orders it walks
// (victims, resumes, admissions, the prompt budget's share) are preempt-order.cpp; a victim's
// park shape is preempt-park.cpp; how a victim is parked (RAM, disk or
// RECOMPUTE, by measured cost) is preempt-choice.cpp.
#include "preempt-policy.h"
#include "preempt-order.h"
#include "preempt-step.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <stdexcept>

namespace llama_preempt {

int32_t reservation(const slot_view & s, const plan_params & p) {
    switch (s.phase) {
        case slot_phase::generating:
            return 1 + std::max(0, s.n_draft);
        case slot_phase::prompt:
            if (s.n_replay_left > 0) {
                return std::max(s.n_replay_left, std::min(p.n_batch, s.n_prompt_left));
            }
            return std::min(p.n_batch, s.n_prompt_left);
        default:
            return 0;
    }
}

int32_t charged_cells(const slot_view & s) {
    if (s.phase == slot_phase::parked) {
        return 0;
    }
    return std::max(0, s.n_cells - s.n_shared);
}

int32_t freed_cells(const slot_view & s) {
    if (s.phase == slot_phase::parked) {
        return 0;
    }
    return std::max(0, s.n_cells - std::max(s.n_linked, s.n_shared));
}

// The planner, once per step before the batch is built: its phases in order over one step's budget
// of cells (preempt-step.h). Room goes to running slots first, then to parked slots (restore
// order), then to new requests: first come, first served.
plan plan_step(const std::vector<slot_view> & slots, const plan_params & p) {
    for (const auto & s : slots) {
        if (s.id < 0) {
            throw std::invalid_argument("plan_step: every slot needs an id >= 0");
        }
    }
    step_budget b(slots, p);  // 0. who decodes, what the running slots hold and need
    end_unfittable(b);        // 1. a parked slot larger than the pool ends
    park_for_running(b);      // 2. the running slots' next step fits: caches, then victims go
    resume_due(b);            // 3. the parked slots due back return where they fit
    admit_new(b);             // 4. new requests, while they fit and nobody due waits
    ensure_progress(b);       // 5. with nothing running, the head of the line goes
    resume_not_due(b);        // 6. with a limited width, the rest of the parked where room is left
    pick_next_back(b);        // 7. the next slot back, for restore ahead
    share_prompt_tokens(b);   // 8. who pauses, and the batch's prompt tokens shared out
    return b.pl;
}

static std::string ids_to_string(const std::vector<int32_t> & ids) {
    std::string out = "[";
    for (size_t i = 0; i < ids.size(); ++i) {
        out += (i ? "," : "") + std::to_string(ids[i]);
    }
    return out + "]";
}

std::string plan_to_string(const plan & pl) {
    return "purge=" + ids_to_string(pl.purge) + " fail=" + ids_to_string(pl.fail) +
           " park=" + ids_to_string(pl.park) + " resume=" + ids_to_string(pl.resume) +
           " hold=" + ids_to_string(pl.hold) + " pause=" + ids_to_string(pl.pause) +
           " width=" + std::to_string(pl.n_decode_width) + " used=" + std::to_string(pl.n_used) +
           " need=" + std::to_string(pl.n_need);
}

} // namespace llama_preempt
