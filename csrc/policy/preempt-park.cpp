// A victim's park: its reason's names and its shape (preempt-park.h).
#include "preempt-park.h"

#include <algorithm>

namespace llama_preempt {

const char * park_reason_name(park_reason r) {
    switch (r) {
        case park_reason::pool_full:   return "pool full";
        case park_reason::forced:      return "forced (LLAMA_SERVER_PREEMPT_EVERY)";
        case park_reason::last_resort: return "last resort (decode failed at n_batch 1)";
        case park_reason::api:         return "api (POST /slots/{id}?action=park)";
    }
    return "?";
}

const char * park_reason_key(park_reason r) {
    switch (r) {
        case park_reason::pool_full:   return "planner";
        case park_reason::forced:      return "forced";
        case park_reason::last_resort: return "last_resort";
        case park_reason::api:         return "api";
    }
    return "?";
}

bool has_swap_state(const park_input & in) {
    return in.n_held > 0 && !in.replaying && (in.at == parked_from::prompt || in.at == parked_from::generating);
}

park_shape shape_park(const park_input & in, bool swap, int32_t n_batch) {
    park_shape out;
    if (swap) {
        // back in place plus its next step: one token, or its next prompt chunk
        out.from      = in.at;
        out.n_restore = in.n_held + (in.at == parked_from::generating ? 1 : std::min(n_batch, in.n_prompt - in.n_held));
        return out;
    }
    switch (in.at) {
        case parked_from::generating:
            // replays what it held plus the token it had sampled and not decoded yet
            out.from      = parked_from::generating;
            out.n_restore = in.n_held + 1;
            break;
        case parked_from::prompt:
            if (in.replaying) {
                // parked again mid-replay: the replay list is still whole
                out.from      = parked_from::generating;
                out.n_restore = in.n_replay;
            } else {
                // mid-prompt: it starts its prompt over, up to where it was plus one chunk
                out.from      = parked_from::prompt;
                out.n_redo    = in.n_held;
                out.n_restore = std::min(in.n_prompt, in.n_held + n_batch);
            }
            break;
        case parked_from::started:
            out.from      = parked_from::started;
            out.n_restore = std::min(in.n_prompt, n_batch);
            break;
        case parked_from::none:
            break;
    }
    return out;
}

} // namespace llama_preempt
