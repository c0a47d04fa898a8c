// plan_step()'s phases over one step's budget (see preempt-step.h).
#include "preempt-step.h"

#include <algorithm>

namespace llama_preempt {

slot_index::slot_index(const std::vector<slot_view> & slots) {
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

// Phase 0: who decodes (plan_seats()): the generating slots oldest first, as many as the decode
// width the measured step cost pays for; the rest keep their cells and wait (paused), except one
// overdue for a token, so that no stream goes quiet for longer than max_gap_us. Three groups:
// running slots (generating, or past the first chunk of their prompt) hold and need cells; parked
// slots wait to come back; new requests wait to be admitted.
step_budget::step_budget(const std::vector<slot_view> & slots, const plan_params & p)
    : slots(slots), p(p), find(slots), seats(plan_seats(slots, p, find.by_id.size())), failed(find.by_id.size(), 0) {
    pl.n_decode_width = seats.width;
    for (const auto & s : slots) {
        used += charged_cells(s);
        if (is_running(s)) {
            need += need_of(s);
            n_running += 1;
            n_growing += seats.paused[s.id] ? 0 : 1;
        }
    }
    // cells held only as a cache can be reclaimed, one slot at a time and only when needed: idle
    // slots first, then what new requests' slots cache (largest first in each group)
    for (const auto & s : slots) {
        if ((s.phase == slot_phase::idle || is_new(s)) && freed_cells(s) > 0) {
            cached_.push_back(&s);
        }
    }
    std::stable_sort(cached_.begin(), cached_.end(), [](const slot_view * a, const slot_view * b) {
        if (is_new(*a) != is_new(*b)) {
            return !is_new(*a);
        }
        return freed_cells(*a) > freed_cells(*b);
    });
    // victims in one order for the whole step: parking one does not change the order of the rest
    victims = victim_order(slots, p, {}, &seats);
    // restores in restore order; with a limited width in the decode order (those parked mid-prompt
    // after those parked while generating)
    if (seats.limited) {
        restore = decode_order(slots, p, true);
        restore.erase(std::remove_if(restore.begin(), restore.end(),
                                     [&](int32_t id) { return find[id]->phase != slot_phase::parked; }), restore.end());
        for (int32_t id : restore_order(slots, p)) {
            if (!contains_id(restore, id)) {
                restore.push_back(id);
            }
        }
    } else {
        restore = restore_order(slots, p);
    }
}

int32_t step_budget::need_of(const slot_view & s) const {
    return seats.paused[s.id] ? 0 : reservation(s, p);
}

bool step_budget::fits(int32_t extra) const {
    return used + need + extra + (n_running > 0 ? p.margin : 0) <= p.n_pool;
}

bool step_budget::purge_one() {
    if (i_cached_ >= cached_.size()) {
        return false;
    }
    const slot_view * s = cached_[i_cached_++];
    used -= freed_cells(*s);  // a prefix a running slot shares stays
    pl.purge.push_back(s->id);
    return true;
}

bool step_budget::make_room(int32_t extra) {
    while (!fits(extra) && purge_one()) {
    }
    return fits(extra);
}

void step_budget::park(const slot_view & s) {
    used -= freed_cells(s);  // its shared prefix stays with the other holders
    need -= need_of(s);
    n_running -= 1;
    n_growing -= seats.paused[s.id] ? 0 : 1;
    pl.park.push_back(s.id);
}

void step_budget::let_in(int32_t res, bool grows) {
    need += res;
    n_running += 1;
    n_growing += grows ? 1 : 0;
}

bool step_budget::discretionary_victim(const slot_view & v) const {
    return seats.paused[v.id] && !contains_id(pl.park, v.id) && v.n_preempt < p.sched.n_starved;
}

bool step_budget::park_paused_for(int32_t extra, const slot_view * later_than) {
    if (!seats.limited || !p.park_to_admit || !p.park) {
        return false;
    }
    std::vector<const slot_view *> take;
    int32_t freed = 0;
    for (const slot_view * v : victims) {
        if (fits_freeing(freed, extra)) {
            break;
        }
        const bool later = !later_than || v->arrival > later_than->arrival || v->t_last_token_us > later_than->t_last_token_us;
        if (discretionary_victim(*v) && later) {
            take.push_back(v);
            freed += freed_cells(*v);
        }
    }
    if (!fits_freeing(freed, extra)) {
        return false;
    }
    for (const slot_view * v : take) {
        park(*v);
    }
    return true;
}

void end_unfittable(step_budget & b) {
    for (const auto & s : b.slots) {
        if (s.phase == slot_phase::parked && s.n_restore + 1 > b.p.n_pool) {
            b.pl.fail.push_back(s.id);
            b.failed[s.id] = 1;
        }
    }
}

void park_for_running(step_budget & b) {
    if (!b.make_room(0) && b.p.park) {
        for (size_t i = 0; i < b.victims.size() && !b.fits(0); ++i) {
            b.park(*b.victims[i]);
        }
        // when none is left to park, the decode's own retry ladder is the last line
    }
    // a decoding slot parked gives its seat to the oldest paused one, where its next token fits
    std::vector<uint8_t> & paused = b.seats.paused;
    for (int32_t id : b.pl.park) {
        if (paused[id] || b.find[id]->phase != slot_phase::generating) {
            continue;
        }
        for (int32_t next : b.seats.order) {
            if (paused[next] && !contains_id(b.pl.park, next)) {
                const int32_t res = reservation(*b.find[next], b.p);
                if (b.fits(res)) {
                    paused[next] = 0;
                    b.need += res;
                    b.n_growing += 1;
                }
                break;
            }
        }
    }
}

// Thrash guard: a resume leaves n_restore_headroom cells per growing slot free (their growth over
// that many steps), so that the slots it joins do not park it, or another, again at once. Never in
// a step that parked (that would thrash); a resuming slot is charged its whole replay.
static int32_t resume_need(const step_budget & b, const slot_view & s) {
    return s.n_restore + b.p.sched.n_restore_headroom * (b.n_growing + 1);
}

static bool try_resume(step_budget & b, int32_t id) {
    const slot_view * s = b.find[id];
    if (b.pl.park.empty() && b.make_room(resume_need(b, *s))) {
        b.let_in(s->n_restore, true);
        b.pl.resume.push_back(id);
        return true;
    }
    return false;
}

// with a limited width, a due slot that does not fit takes the room of paused slots that arrived
// after it or were served a token after it (the latest arrival first): they wait for a seat either
// way, it is due now (its seat, or its token for the gap bound)
static bool resume_by_parking_later(step_budget & b, const slot_view & s) {
    if (!b.seats.limited || !b.p.park_to_admit || !b.p.park || !b.make_room(0)) {
        return false;
    }
    const int32_t extra = resume_need(b, s);
    b.make_room(extra);
    if (!b.park_paused_for(extra, &s)) {
        return false;
    }
    b.let_in(s.n_restore, true);
    b.pl.resume.push_back(s.id);
    return true;
}

// With a limited width only the due come back now: one that is not would sit paused, so new
// requests' prompts go first and it takes what room is left (resume_not_due())
void resume_due(step_budget & b) {
    for (int32_t id : b.restore) {
        const slot_view * s = b.find[id];
        // a slot parked through the API waits for its unpark and for nothing else: it holds no
        // admission back, since nothing the pool frees would bring it back
        if (b.failed[id] || !b.seats.due[id] || s->waits_for_unpark) {
            continue;
        }
        if (!s->can_resume || !(try_resume(b, id) || resume_by_parking_later(b, *s))) {
            b.waiting = true;
        }
    }
}

// One that does not fit may be passed by later ones that do, but only for pass_limit_us: from then
// on it holds every later one, so a long prompt is not passed over for ever by short ones. With
// nothing running, the first one always goes (its own size checks end it if it can never fit).
// With a limited width, a paused slot (the latest arrival first) may be parked to let a new prompt
// in: it waits for a seat either way, and the new request's first token comes now instead of after
// the answers ahead of it.
void admit_new(step_budget & b) {
    bool blocked = b.waiting;  // a due parked slot waits for room: nothing new goes
    for (const slot_view * s : admission_order(b.slots, b.p)) {
        const int32_t res = reservation(*s, b.p);
        // make_room first: even the request that goes regardless gets idle caches out of its way
        if (!blocked && (b.make_room(res) || b.park_paused_for(res) || b.n_running == 0)) {
            b.let_in(res, false);
        } else {
            b.pl.hold.push_back(s->id);
            b.waiting = true;
            const bool waited_long = s->t_arrival_us < 0 || b.p.t_now_us - s->t_arrival_us >= b.p.sched.pass_limit_us;
            blocked = blocked || waited_long;  // later arrivals queue behind this one
        }
    }
}

// Without this the loop would spin without decoding anything: reclaim every cache, then resume the
// first parked slot (it fits an empty pool, else it was ended), or else admit the first new request.
void ensure_progress(step_budget & b) {
    const bool any_parked = std::any_of(b.restore.begin(), b.restore.end(),
                                        [&](int32_t id) { return !b.failed[id] && !b.find[id]->waits_for_unpark; });
    if (b.n_running != 0 || !(b.waiting || any_parked)) {
        return;
    }
    while (b.purge_one()) {
    }
    for (int32_t id : b.restore) {
        const slot_view * s = b.find[id];
        if (!b.failed[id] && s->can_resume && !s->waits_for_unpark && b.pl.park.empty() && !contains_id(b.pl.resume, id)) {
            b.let_in(s->n_restore, false);
            b.pl.resume.push_back(id);
            break;
        }
    }
    if (b.n_running == 0 && !b.pl.hold.empty()) {
        b.pl.hold.erase(b.pl.hold.begin());
    }
}

void resume_not_due(step_budget & b) {
    if (!b.seats.limited) {
        return;
    }
    for (int32_t id : b.restore) {
        const slot_view * s = b.find[id];
        if (!b.failed[id] && !b.seats.due[id] && s->can_resume && !s->waits_for_unpark && !contains_id(b.pl.resume, id)) {
            try_resume(b, id);
        }
    }
}

// Its state can travel to the device ahead of time. A slot parked in this step counts too, ranked
// as it will be (one more park, parked last); a slot parked through the API waits for unpark. With
// a limited width: the first in the decode order still parked.
void pick_next_back(step_budget & b) {
    const plan & pl = b.pl;
    auto back_now = [&](int32_t id) {
        return !b.failed[id] && !b.find[id]->waits_for_unpark && !contains_id(pl.resume, id);
    };
    b.pl.restore_next = -1;
    if (b.seats.limited) {
        for (int32_t id : b.restore) {
            if (back_now(id)) {
                b.pl.restore_next = id;
                return;
            }
        }
        // else the one parked now that is earliest in the decode order
        const slot_view * first = nullptr;
        for (int32_t id : pl.park) {
            const slot_view * s = b.find[id];
            if (!first || s->priority > first->priority || (s->priority == first->priority && s->arrival < first->arrival)) {
                first = s;
            }
        }
        b.pl.restore_next = first ? first->id : -1;
        return;
    }
    const slot_view * next = nullptr;
    int32_t next_preempt = 0;
    auto ahead_of = [&](const slot_view & a, int32_t a_preempt) {
        if (a.priority != next->priority) {
            return a.priority > next->priority;
        }
        return a_preempt > next_preempt;  // ties: the earlier parked, which `restore` and then `park` list first
    };
    for (int32_t id : b.restore) {
        const slot_view * s = b.find[id];
        if (back_now(id) && (!next || ahead_of(*s, s->n_preempt))) {
            next = s;
            next_preempt = s->n_preempt;
        }
    }
    for (int32_t id : pl.park) {
        const slot_view * s = b.find[id];
        if (!next || ahead_of(*s, s->n_preempt + 1)) {
            next = s;
            next_preempt = s->n_preempt + 1;
        }
    }
    b.pl.restore_next = next ? next->id : -1;
}

// While slots generate, a long prompt (or replay) is spread over steps instead of stalling their
// decode for a whole n_batch chunk. Replays, then prompts in arrival order, share the budget
// (share_prompt_budget()): the ones it does not reach wait
void share_prompt_tokens(step_budget & b) {
    for (int32_t id : b.seats.order) {
        if (b.seats.paused[id] && !contains_id(b.pl.park, id)) {
            b.pl.pause.push_back(id);
        }
    }
    b.pl.n_prompt_budget = b.p.sched.n_prompt_budget;
    share_prompt_budget(b.slots, b.p, b.pl);
    b.pl.n_used = b.used;
    b.pl.n_need = b.need;
}

} // namespace llama_preempt
