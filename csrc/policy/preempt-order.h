// Who goes first when the pool is short: the orders the planner (plan_step(), preempt-policy.cpp)
// walks to choose victims, resumes and admissions (docs/design.md, "Overload: who goes first").
// select_victim(), restore_order(), decode_order() and park_blocker(), the public ones, are
// declared in preempt-policy.h.
#pragma once

#include "preempt-policy.h"

#include <vector>

namespace llama_preempt {

inline bool is_active(const slot_view & s) {
    return s.phase == slot_phase::prompt || s.phase == slot_phase::generating;
}

// a new request: in its slot, not admitted yet (its prompt has not started)
inline bool is_new(const slot_view & s) {
    return s.phase == slot_phase::prompt && s.is_new;
}

// active and admitted: a new request waits in the admission queue instead
inline bool is_running(const slot_view & s) {
    return is_active(s) && !s.is_new;
}

// One step's decode seats (plan_step(), step 0). The resident generating slots in decode order:
// the first `width` decode (the width the measured step cost pays for, or --preempt-sched width),
// the rest are paused unless overdue for a token (max_gap_us). A slot parked while generating is
// `due` when its place in the decode order, among the resident and the parked, is within the
// width, or when it is overdue for a token: it waits for room to decode, while one that is not due
// would only be paused if it came back. Without a limit every parked slot is due and nothing is
// paused.
struct decode_seats {
    bool    limited = false;
    int32_t width   = 0;
    std::vector<int32_t> order;   // resident generating slots, decode order
    std::vector<uint8_t> paused;  // by slot id
    std::vector<uint8_t> trickle; // by slot id: beyond the width, decoding one token for the gap bound
    std::vector<uint8_t> due;     // by slot id
};
// Running slots that may be parked, best victim first (the leader never among them); `skip` lists
// slots already chosen; `seats` (may be null) the step's decode seats: the paused go before those
// that decode, and one decoding a token for the gap bound is spared (parking it would defeat the
// bound, and it would come back for that token again). Parking one never changes the order of the
// rest, so one serves a step.
std::vector<const slot_view *> victim_order(const std::vector<slot_view> & slots, const plan_params & p,
                                            const std::vector<int32_t> & skip,
                                            const decode_seats * seats = nullptr);

decode_seats plan_seats(const std::vector<slot_view> & slots, const plan_params & p, size_t n_ids);

// New requests in the order they are admitted: highest (aged) priority first, then first come,
// first served.
std::vector<const slot_view *> admission_order(const std::vector<slot_view> & slots, const plan_params & p);

// plan_step(), step 8: the step's prompt and replay tokens shared in order (replays, then prompts
// by priority, then arrival): each gets its chunk in `pl.chunks`, or waits in `pl.hold`
void share_prompt_budget(const std::vector<slot_view> & slots, const plan_params & p, plan & pl);

} // namespace llama_preempt
