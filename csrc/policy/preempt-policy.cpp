// The preemption policy, read top to bottom: plan_step() is the whole of it. The orders it walks
// (victims, resumes, admissions, the prompt budget's share) are preempt-order.cpp; a victim's
// park shape is preempt-park.cpp; how a victim is parked (RAM, disk or
// RECOMPUTE, by measured cost) is preempt-choice.cpp.
#include "preempt-policy.h"
#include "preempt-order.h"

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

// plan_step(), step 7: the parked slot that comes back next (-1: none)
static int32_t next_back(const std::vector<slot_view> & slots, const plan & pl, const std::vector<int32_t> & restore,
                         const std::vector<uint8_t> & failed, bool by_decode_order) {
    const slot_index find(slots);
    if (by_decode_order) {
        for (int32_t id : restore) {
            if (!failed[id] && !find[id]->waits_for_unpark && !contains_id(pl.resume, id)) {
                return id;
            }
        }
        // else the one parked now that is earliest in the decode order
        const slot_view * first = nullptr;
        for (int32_t id : pl.park) {
            const slot_view * s = find[id];
            if (!first || s->priority > first->priority || (s->priority == first->priority && s->arrival < first->arrival)) {
                first = s;
            }
        }
        return first ? first->id : -1;
    }
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
    return next ? next->id : -1;
}

plan plan_step(const std::vector<slot_view> & slots, const plan_params & p) {
    for (const auto & s : slots) {
        if (s.id < 0) {
            throw std::invalid_argument("plan_step: every slot needs an id >= 0");
        }
    }
    plan pl;
    const slot_index find(slots);
    std::vector<uint8_t> failed(find.by_id.size(), 0);

    // 0. who decodes (plan_seats()): the generating slots oldest first, as many as the decode
    //    width the measured step cost pays for; the rest keep their cells and wait (paused), except
    //    one overdue for a token, so that no stream goes quiet for longer than max_gap_us
    decode_seats seats = plan_seats(slots, p, find.by_id.size());
    std::vector<uint8_t> & paused = seats.paused;
    pl.n_decode_width = seats.width;
    // what a running slot's next step adds to the pool: nothing while it is paused
    auto need_of = [&](const slot_view & s) { return paused[s.id] ? 0 : reservation(s, p); };

    // Three groups: running slots (generating, or past the first chunk of their prompt) hold and
    // need cells; parked slots wait to come back; new requests wait to be admitted. Room goes to
    // running slots first, then to parked ones, then to new ones: first come, first served.
    int32_t used      = 0;  // cells held now
    int32_t need      = 0;  // cells the running slots' next step adds
    int32_t n_running = 0;
    int32_t n_growing = 0;  // running and not paused: the slots whose cells grow
    for (const auto & s : slots) {
        used += charged_cells(s);
        if (is_running(s)) {
            need += need_of(s);
            n_running += 1;
            n_growing += paused[s.id] ? 0 : 1;
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
    // victims in one order for the whole step: parking one does not change the order of the rest
    const auto victims = victim_order(slots, p, {}, &seats);
    // a paused slot parked by choice (to admit a prompt, or to bring a due slot back): not one
    // parked n_starved times already, so no request is swapped in and out without end
    auto discretionary_victim = [&](const slot_view & v) {
        return paused[v.id] && !contains_id(pl.park, v.id) && v.n_preempt < p.sched.n_starved;
    };
    auto park = [&](const slot_view & s) {
        used -= charged_cells(s);
        need -= need_of(s);
        n_running -= 1;
        n_growing -= paused[s.id] ? 0 : 1;
        pl.park.push_back(s.id);
    };

    // 2. the running slots' next step does not fit: idle caches go first, then victims are parked,
    //    paused ones (the latest arrival first) before those that decode
    if (!make_room(0) && p.park) {
        for (size_t i = 0; i < victims.size() && !fits(0); ++i) {
            park(*victims[i]);
        }
        // when none is left to park, the decode's own retry ladder is the last line
    }
    // a decoding slot parked gives its seat to the oldest paused one, where its next token fits
    for (int32_t id : pl.park) {
        if (paused[id] || find[id]->phase != slot_phase::generating) {
            continue;
        }
        for (int32_t next : seats.order) {
            if (paused[next] && !contains_id(pl.park, next)) {
                const int32_t res = reservation(*find[next], p);
                if (fits(res)) {
                    paused[next] = 0;
                    need += res;
                    n_growing += 1;
                }
                break;
            }
        }
    }

    // 3. restore in restore order (with a limited width: the decode order), fit-first, but never
    //    in a step that parked (that would thrash); a resuming slot is charged its whole replay,
    //    not one batch. Thrash guard: a resume leaves n_restore_headroom cells per growing slot
    //    free (their growth over that many steps), so that the slots it joins do not park it, or
    //    another, again at once. With a limited width only the due come back now: one that is not
    //    would sit paused, so new requests' prompts go first and it takes what room is left (6.)
    bool waiting = false;
    std::vector<int32_t> restore;
    if (seats.limited) {
        restore = decode_order(slots, p, true);
        restore.erase(std::remove_if(restore.begin(), restore.end(),
                                     [&](int32_t id) { return find[id]->phase != slot_phase::parked; }), restore.end());
        for (int32_t id : restore_order(slots, p)) {
            if (!contains_id(restore, id)) {
                restore.push_back(id);  // parked mid-prompt: after those parked while generating
            }
        }
    } else {
        restore = restore_order(slots, p);
    }
    auto try_resume = [&](int32_t id) {
        const slot_view * s = find[id];
        if (pl.park.empty() && make_room(s->n_restore + p.sched.n_restore_headroom * (n_growing + 1))) {
            need += s->n_restore;
            n_running += 1;
            n_growing += 1;
            pl.resume.push_back(id);
            return true;
        }
        return false;
    };
    // with a limited width, a due slot that does not fit takes the room of paused slots that
    // arrived after it or were served a token after it (the latest arrival first): they wait for a
    // seat either way, it is due now (its seat, or its token for the gap bound)
    auto resume_by_parking_later = [&](const slot_view & s) {
        if (!seats.limited || !p.park_to_admit || !p.park || !make_room(0)) {
            return false;
        }
        const int32_t extra = s.n_restore + p.sched.n_restore_headroom * (n_growing + 1);
        make_room(extra);
        std::vector<const slot_view *> take;
        int32_t freed = 0;
        for (const slot_view * v : victims) {
            if (used - freed + need + extra + p.margin <= p.n_pool) {
                break;
            }
            const bool later = v->arrival > s.arrival || v->t_last_token_us > s.t_last_token_us;
            if (discretionary_victim(*v) && later) {
                take.push_back(v);
                freed += charged_cells(*v);
            }
        }
        if (used - freed + need + extra + p.margin > p.n_pool) {
            return false;
        }
        for (const slot_view * v : take) {
            park(*v);
        }
        need += s.n_restore;
        n_running += 1;
        n_growing += 1;
        pl.resume.push_back(s.id);
        return true;
    };
    for (int32_t id : restore) {
        const slot_view * s = find[id];
        if (failed[id] || !seats.due[id]) {
            continue;
        }
        if (!s->can_resume || s->waits_for_unpark || !(try_resume(id) || resume_by_parking_later(*s))) {
            waiting = true;
        }
    }

    // 4. admit new requests in arrival order while they fit and nobody due is parked waiting. One
    //    that does not fit may be passed by later ones that do, but only for pass_limit_us: from
    //    then on it holds every later one, so a long prompt is not passed over for ever by short
    //    ones. With nothing running, the first one always goes (its own size checks end it if it
    //    can never fit). With a limited width, a paused slot (the latest arrival first) may be
    //    parked to let a new prompt in: it waits for a seat either way, and the new request's
    //    first token comes now instead of after the answers ahead of it.
    auto park_paused_for = [&](int32_t res) {
        if (!seats.limited || !p.park_to_admit || !p.park) {
            return false;
        }
        // only where the room it makes is enough: a park that does not let the request in would
        // come back at once into the room it left (and go again the step after)
        std::vector<const slot_view *> take;
        int32_t freed = 0;
        for (size_t i = 0; i < victims.size() && used - freed + need + res + p.margin > p.n_pool; ++i) {
            if (discretionary_victim(*victims[i])) {
                take.push_back(victims[i]);
                freed += charged_cells(*victims[i]);
            }
        }
        if (used - freed + need + res + p.margin > p.n_pool) {
            return false;
        }
        for (const slot_view * v : take) {
            park(*v);
        }
        return true;
    };
    bool blocked = waiting;  // a due parked slot waits for room: nothing new goes
    for (const slot_view * s : admission_order(slots, p)) {
        const int32_t res = reservation(*s, p);
        // make_room first: even the request that goes regardless gets idle caches out of its way
        if (!blocked && (make_room(res) || park_paused_for(res) || n_running == 0)) {
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
    const bool any_parked = std::any_of(restore.begin(), restore.end(), [&](int32_t id) { return !failed[id]; });
    if (n_running == 0 && (waiting || any_parked)) {
        while (purge_one()) {
        }
        for (int32_t id : restore) {
            const slot_view * s = find[id];
            if (!failed[id] && s->can_resume && !s->waits_for_unpark && pl.park.empty() && !contains_id(pl.resume, id)) {
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

    // 6. with a limited width, the parked that are not due come back where room is left
    if (seats.limited) {
        for (int32_t id : restore) {
            const slot_view * s = find[id];
            if (!failed[id] && !seats.due[id] && s->can_resume && !s->waits_for_unpark && !contains_id(pl.resume, id)) {
                try_resume(id);
            }
        }
    }

    // 7. the parked slot that comes back next, once this step's plan is applied: its state can
    //    travel to the device ahead of time. A slot parked in this step counts too, ranked as it
    //    will be (one more park, parked last); a slot parked through the API waits for unpark.
    //    With a limited width: the first in the decode order still parked.
    pl.restore_next = next_back(slots, pl, restore, failed, seats.limited);

    // 8. the batch's prompt budget: while slots generate, a long prompt (or replay) is spread over
    //    steps instead of stalling their decode for a whole n_batch chunk. Replays, then prompts in
    //    arrival order, share it (share_prompt_budget()): the ones it does not reach wait
    for (int32_t id : seats.order) {
        if (paused[id] && !contains_id(pl.park, id)) {
            pl.pause.push_back(id);
        }
    }
    pl.n_prompt_budget = p.sched.n_prompt_budget;
    share_prompt_budget(slots, p, pl);

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
           " hold=" + ids_to_string(pl.hold) + " pause=" + ids_to_string(pl.pause) +
           " width=" + std::to_string(pl.n_decode_width) + " used=" + std::to_string(pl.n_used) +
           " need=" + std::to_string(pl.n_need);
}

} // namespace llama_preempt
