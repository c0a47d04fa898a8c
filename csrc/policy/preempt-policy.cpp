// The preemption policy, read top to bottom: plan_step() is the whole of it. The orders it walks
// (victims, resumes, admissions) are preempt-order.cpp; how a victim is parked (RAM, disk or
// RECOMPUTE, by measured cost) is preempt-choice.cpp.
#include "preempt-policy.h"
#include "preempt-order.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>

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

park_block park_blocker(const slot_view & s) {
    return s.in_family     ? park_block::family
         : s.is_multimodal ? park_block::multimodal
         : !s.can_park     ? park_block::not_replayable
         :                   park_block::none;
}

bool may_park(const slot_view & s) {
    return park_blocker(s) == park_block::none;
}

const char * park_block_reason(park_block b) {
    switch (b) {
        case park_block::none:           return "";
        case park_block::family:         return "it serves an n_cmpl request, whose slots share their prompt cells";
        case park_block::multimodal:     return "its prompt holds media, which a replay cannot re-encode";
        case park_block::not_replayable: return "its request cannot be replayed (embedding input or an aLoRA adapter)";
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

// slot ids are looked up often in a step: index them once
struct slot_index {
    std::vector<const slot_view *> by_id;

    explicit slot_index(const std::vector<slot_view> & slots) {
        int32_t n = 0;
        for (const auto & s : slots) {
            n = std::max(n, s.id + 1);
        }
        by_id.assign(n, nullptr);
        for (const auto & s : slots) {
            if (s.id >= 0) {
                by_id[s.id] = &s;
            }
        }
    }

    const slot_view * operator[](int32_t id) const {
        return id >= 0 && id < (int32_t) by_id.size() ? by_id[id] : nullptr;
    }
};

plan plan_step(const std::vector<slot_view> & slots, const plan_params & p) {
    plan pl;
    const slot_index find(slots);
    std::vector<uint8_t> failed(find.by_id.size(), 0);

    // Three groups: running slots (generating, or past the first chunk of their prompt) hold and
    // need cells; parked slots wait to come back; new requests wait to be admitted. Room goes to
    // running slots first, then to parked ones, then to new ones: first come, first served.
    int32_t used      = 0;  // cells held now
    int32_t need      = 0;  // cells the running slots' next step adds
    int32_t n_running = 0;
    for (const auto & s : slots) {
        used += charged_cells(s);
        if (is_running(s)) {
            need += reservation(s, p);
            n_running += 1;
        }
    }
    // the margin is waived when nothing else runs: then the slot must be let through
    auto fits = [&](int32_t extra) {
        return used + need + extra + (n_running > 0 ? p.margin : 0) <= p.n_pool;
    };

    // 1. a parked sequence that cannot fit even an empty pool would wait forever: end it
    for (const auto & s : slots) {
        if (s.phase == slot_phase::parked && s.n_restore + 1 > p.n_pool) {
            pl.fail.push_back(s.id);
            failed[s.id] = 1;
        }
    }

    // cells held only as a cache can be reclaimed, one slot at a time and only when needed:
    // idle slots first, then what new requests' slots cache (largest first in each group)
    std::vector<const slot_view *> cached;
    for (const auto & s : slots) {
        if ((s.phase == slot_phase::idle || is_new(s)) && charged_cells(s) > 0) {
            cached.push_back(&s);
        }
    }
    std::stable_sort(cached.begin(), cached.end(), [](const slot_view * a, const slot_view * b) {
        if (is_new(*a) != is_new(*b)) {
            return !is_new(*a);
        }
        return charged_cells(*a) > charged_cells(*b);
    });
    size_t i_cached = 0;
    auto purge_one = [&]() -> bool {
        if (i_cached >= cached.size()) {
            return false;
        }
        const slot_view * s = cached[i_cached++];
        used -= charged_cells(*s);
        pl.purge.push_back(s->id);
        return true;
    };
    auto make_room = [&](int32_t extra) {
        while (!fits(extra) && purge_one()) {
        }
        return fits(extra);
    };

    // 2. the running slots' next step does not fit: idle caches go first, then victims are parked
    if (!make_room(0) && p.park) {
        // select_victim() in a loop, in one pass: parking a victim does not change the order
        const auto order = victim_order(slots, p, {});
        for (size_t i = 0; i < order.size() && !fits(0); ++i) {
            const slot_view * s = order[i];
            used -= charged_cells(*s);
            need -= reservation(*s, p);
            n_running -= 1;
            pl.park.push_back(s->id);
        }
        // when none is left to park, the decode's own retry ladder is the last line
    }

    // 3. restore in restore order, fit-first, but never in a step that parked (that would thrash);
    //    a resuming slot is charged its whole replay, not one batch. Thrash guard: a resume leaves
    //    n_restore_headroom cells per running slot free (their growth over that many steps), so
    //    that the slots it joins do not park it, or another, again at once
    bool waiting = false;
    const std::vector<int32_t> restore = restore_order(slots, p);
    for (int32_t id : restore) {
        if (failed[id]) {
            continue;
        }
        const slot_view * s = find[id];
        if (!s->can_resume || s->waits_for_unpark) {
            waiting = true;
            continue;
        }
        if (pl.park.empty() && make_room(s->n_restore + p.sched.n_restore_headroom * (n_running + 1))) {
            need += s->n_restore;
            n_running += 1;
            pl.resume.push_back(id);
        } else {
            waiting = true;
        }
    }

    // 4. admit new requests in arrival order while they fit and nobody parked is waiting. One
    //    that does not fit may be passed by later ones that do, but only for pass_limit_us: from
    //    then on it holds every later one, so a long prompt is not passed over for ever by short
    //    ones. With nothing running, the first one always goes (its own size checks end it if it
    //    can never fit).
    bool blocked = waiting;  // a parked slot waits for room: nothing new goes
    for (const slot_view * s : admission_order(slots, p)) {
        const int32_t res = reservation(*s, p);
        // make_room first: even the request that goes regardless gets idle caches out of its way
        if (!blocked && (make_room(res) || n_running == 0)) {
            need += res;
            n_running += 1;
        } else {
            pl.hold.push_back(s->id);
            waiting = true;
            const bool waited_long = s->t_arrival_us < 0 || p.t_now_us - s->t_arrival_us >= p.sched.pass_limit_us;
            blocked = blocked || waited_long;  // later arrivals queue behind this one
        }
    }

    // 5. progress: with nothing running, the head of the line must go, or the loop would spin
    //    without decoding anything. Reclaim every cache, then resume the first parked slot (it
    //    fits an empty pool, else it is in `fail`), or else admit the first new request.
    if (n_running == 0 && waiting) {
        while (purge_one()) {
        }
        for (int32_t id : restore) {
            const slot_view * s = find[id];
            if (!failed[id] && s->can_resume && !s->waits_for_unpark && pl.park.empty()) {
                need += s->n_restore;
                n_running += 1;
                pl.resume.push_back(id);
                break;
            }
        }
        if (n_running == 0 && !pl.hold.empty()) {
            pl.hold.erase(pl.hold.begin());
        }
    }

    // 6. the parked slot that comes back next, once this step's plan is applied: its state can
    //    travel to the device ahead of time. A slot parked in this step counts too, ranked as it
    //    will be (one more park, parked last); a slot parked through the API waits for unpark.
    const slot_view * next = nullptr;
    auto ahead_of = [](const slot_view & a, int32_t a_preempt, const slot_view * b, int32_t b_preempt) {
        if (a.priority != b->priority) {
            return a.priority > b->priority;
        }
        return a_preempt > b_preempt;  // ties: the earlier parked, which `restore` and then `park` list first
    };
    int32_t next_preempt = 0;
    for (int32_t id : restore) {
        const slot_view * s = find[id];
        if (!failed[id] && !s->waits_for_unpark && !contains_id(pl.resume, id) &&
            (!next || ahead_of(*s, s->n_preempt, next, next_preempt))) {
            next = s;
            next_preempt = s->n_preempt;
        }
    }
    for (int32_t id : pl.park) {
        const slot_view * s = find[id];
        if (!next || ahead_of(*s, s->n_preempt + 1, next, next_preempt)) {
            next = s;
            next_preempt = s->n_preempt + 1;
        }
    }
    pl.restore_next = next ? next->id : -1;

    // 7. the batch's prompt budget: while slots generate, a long prompt (or replay) is spread over
    //    steps instead of stalling their decode for a whole n_batch chunk
    pl.n_prompt_budget = p.sched.n_prompt_budget;

    pl.n_used = used;
    pl.n_need = need;
    return pl;
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
           " hold=" + ids_to_string(pl.hold) + " used=" + std::to_string(pl.n_used) +
           " need=" + std::to_string(pl.n_need);
}

} // namespace llama_preempt
