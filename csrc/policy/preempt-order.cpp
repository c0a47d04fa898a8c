// Who goes first when the pool is short (preempt-order.h): the victim order, the restore order and
// the admission order, with aging. The planner (plan_step(), preempt-policy.cpp) walks them.
#include "preempt-order.h"

#include <algorithm>
#include <climits>
#include <cstdint>
#include <utility>

namespace llama_preempt {

// Running slots that may be parked, best victim first: lowest priority first; within a priority,
// the paused before the decoding (a paused slot waits anyway: its park stalls nobody), the latest
// arrival among them first; of the rest, the fresh before the spared (starved, resuming, holding
// no cells, about to finish, or decoding a token for the gap bound: taken only when no fresh
// candidate of that priority exists), then the one that frees least (its park wastes least: the
// fewest tokens to recompute, the smallest state to copy; a prefix it shares stays), then the latest arrival (first come, first served),
// then the later id so the order is stable. The leader keeps
// running: the slot with the most tokens among those of the highest priority. Parking it would
// waste the most work, and a pool that cannot hold the leader alone is a context overflow, not a
// scheduling problem. Parking others never changes who leads, so one order serves a whole step.
std::vector<const slot_view *> victim_order(const std::vector<slot_view> & slots, const plan_params & p,
                                            const std::vector<int32_t> & skip, const decode_seats * seats) {
    const slot_view * lead = nullptr;
    for (const auto & s : slots) {
        if (is_running(s) && !contains_id(skip, s.id) &&
            (!lead || s.priority > lead->priority || (s.priority == lead->priority && s.n_cells > lead->n_cells))) {
            lead = &s;
        }
    }

    std::vector<const slot_view *> cand;
    for (const auto & s : slots) {
        if (!is_running(s) || &s == lead || contains_id(skip, s.id)) {
            continue;
        }
        if (may_park(s)) {
            cand.push_back(&s);
        }
    }
    // "spared" is a victim's rank, not where a parked state waits (park_tier)
    auto spared = [&](const slot_view * s) {
        const bool resuming = s->phase == slot_phase::prompt && s->n_replay_left > 0;
        // a slot holding no cells frees nothing but its reservation; one about to finish frees
        // its cells in a few steps anyway, and parking it would only delay its end
        const bool finishing = s->n_gen_left >= 0 && s->n_gen_left <= p.sched.n_near_finish;
        const bool trickle   = seats && (size_t) s->id < seats->trickle.size() && seats->trickle[s->id];
        return s->n_preempt >= p.sched.n_starved || resuming || freed_cells(*s) == 0 || finishing || trickle;
    };
    auto is_paused = [&](const slot_view * s) {
        return seats && s->id >= 0 && (size_t) s->id < seats->paused.size() && seats->paused[s->id];
    };
    std::sort(cand.begin(), cand.end(), [&](const slot_view * a, const slot_view * b) {
        if (a->priority != b->priority) {
            return a->priority < b->priority;
        }
        const bool pa = is_paused(a), pb = is_paused(b);
        if (pa != pb) {
            return pa;
        }
        if (pa) {
            // paused: the furthest from a seat first (the latest arrival), so the next ones stay
            if (a->arrival != b->arrival) {
                return a->arrival > b->arrival;
            }
            return a->id > b->id;
        }
        const bool sa = spared(a), sb = spared(b);
        if (sa != sb) {
            return sb;
        }
        if (freed_cells(*a) != freed_cells(*b)) {
            return freed_cells(*a) < freed_cells(*b);
        }
        if (a->arrival != b->arrival) {
            return a->arrival > b->arrival;
        }
        return a->id > b->id;
    });
    return cand;
}

// which slot may be parked at all (the victim order below, the slot API and the mechanics ask)
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
        case park_block::family:         return "it serves an n_cmpl request whose prompt is not yet in every choice's cells";
        case park_block::multimodal:     return "its prompt holds media, which a replay cannot re-encode";
        case park_block::not_replayable: return "its request cannot be replayed (embedding input or an aLoRA adapter)";
    }
    return "?";
}

int32_t select_victim(const std::vector<slot_view> & slots, const plan_params & p,
                      const std::vector<int32_t> & skip) {
    const auto order = victim_order(slots, p, skip);
    return order.empty() ? -1 : order.front()->id;
}

// A waiting request's priority, aged: one level per p.sched.age_step_us waited since `since_us`, never
// above `top` (the highest priority among those it waits with). Aging reorders priorities only:
// among equal priorities it changes nothing, and a request of priority q waits at most
// (top - q) * age_step_us before it ranks with the highest.
static int64_t aged_priority(const slot_view & s, int64_t since_us, int32_t top, const plan_params & p) {
    if (p.sched.age_step_us <= 0 || since_us < 0 || p.t_now_us <= since_us || s.priority >= top) {
        return s.priority;
    }
    return std::min<int64_t>(top, s.priority + (p.t_now_us - since_us) / p.sched.age_step_us);
}

// `cand` by aged priority, highest first (aged since `since(s)`, up to the highest priority among
// them), ties in the order `tie` gives; the one sort the restore and the admission orders share
template <typename Since, typename Tie>
static std::vector<const slot_view *> by_aged_priority(std::vector<const slot_view *> cand, const plan_params & p,
                                                       Since since, Tie tie) {
    int32_t top = INT32_MIN;
    for (const slot_view * s : cand) {
        top = std::max(top, s->priority);
    }
    std::vector<std::pair<int64_t, const slot_view *>> keyed;
    keyed.reserve(cand.size());
    for (const slot_view * s : cand) {
        keyed.emplace_back(aged_priority(*s, since(*s), top, p), s);
    }
    std::stable_sort(keyed.begin(), keyed.end(), [&](const auto & a, const auto & b) {
        if (a.first != b.first) {
            return a.first > b.first;
        }
        return tie(*a.second, *b.second);
    });
    for (size_t i = 0; i < keyed.size(); ++i) {
        cand[i] = keyed[i].second;
    }
    return cand;
}

static std::vector<int32_t> ids_of(const std::vector<const slot_view *> & order) {
    std::vector<int32_t> ids;
    ids.reserve(order.size());
    for (const slot_view * s : order) {
        ids.push_back(s->id);
    }
    return ids;
}

std::vector<int32_t> restore_order(const std::vector<slot_view> & slots, const plan_params & p) {
    std::vector<const slot_view *> parked;
    for (const auto & s : slots) {
        if (s.phase == slot_phase::parked) {
            parked.push_back(&s);
        }
    }
    const auto order = by_aged_priority(parked, p, [](const slot_view & s) { return s.t_parked_us; },
                                        [](const slot_view & a, const slot_view & b) {
        if (a.n_preempt != b.n_preempt) {
            return a.n_preempt > b.n_preempt;      // most-preempted first
        }
        if (a.t_parked_us != b.t_parked_us) {
            return a.t_parked_us < b.t_parked_us;  // then longest parked
        }
        return a.id < b.id;
    });
    return ids_of(order);
}

std::vector<int32_t> decode_order(const std::vector<slot_view> & slots, const plan_params & p, bool parked) {
    std::vector<const slot_view *> gen;
    for (const auto & s : slots) {
        if (s.phase == slot_phase::generating || (parked && s.phase == slot_phase::parked && s.was_generating)) {
            gen.push_back(&s);
        }
    }
    const auto order = by_aged_priority(gen, p, [](const slot_view & s) { return s.t_arrival_us; },
                                        [](const slot_view & a, const slot_view & b) {
        if (a.arrival != b.arrival) {
            return a.arrival < b.arrival;
        }
        return a.id < b.id;
    });
    return ids_of(order);
}

decode_seats plan_seats(const std::vector<slot_view> & slots, const plan_params & p, size_t n_ids) {
    decode_seats d;
    d.order = decode_order(slots, p);
    d.width = (int32_t) d.order.size();
    d.paused.assign(n_ids, 0);
    d.trickle.assign(n_ids, 0);
    d.due.assign(n_ids, 0);
    d.limited = p.sched.n_width > 0 || (p.cost_ready && p.sched.width_loss > 0 && !p.width_free);
    if (!d.limited) {
        for (const auto & s : slots) {
            d.due[s.id] = s.phase == slot_phase::parked;
        }
        return d;
    }
    std::vector<const slot_view *> by_id(n_ids, nullptr);
    for (const auto & s : slots) {
        by_id[s.id] = &s;
    }
    if (p.sched.n_width > 0) {
        d.width = std::min<int32_t>(p.sched.n_width, (int32_t) d.order.size());
    } else if (!d.order.empty()) {
        // in a unified pool every decoding token's attention spans the cells the slots hold (a paused
        // slot keeps its cells: pausing it does not shorten the others' span)
        int64_t n_used = 0;
        for (const auto & s : slots) {
            n_used += charged_cells(s);  // a shared prefix is in the pool once
        }
        std::vector<double> u;
        u.reserve(d.order.size());
        for (int32_t id : d.order) {
            u.push_back(decode_slot_cost(p.cost, by_id[id]->n_cells, 1 + std::max(0, by_id[id]->n_draft),
                                         p.unified ? n_used : 0));
        }
        d.width = decode_width(p.cost.fixed_s, u, p.sched.width_loss);
    }
    // a stream waits for its next token at most max_gap_us
    auto overdue = [&](const slot_view & s) {
        return p.sched.max_gap_us > 0 && s.t_last_token_us >= 0 && p.t_now_us - s.t_last_token_us >= p.sched.max_gap_us;
    };
    for (size_t i = d.width; i < d.order.size(); ++i) {
        const slot_view & s = *by_id[d.order[i]];
        d.paused[s.id]  = overdue(s) ? 0 : 1;
        d.trickle[s.id] = overdue(s) ? 1 : 0;
    }
    // the parked: due when within the width among the resident and the parked, or overdue for a
    // token (it comes back for one, then pauses); one parked mid-prompt is due: it was admitted
    // before any request still waiting
    const std::vector<int32_t> all = decode_order(slots, p, true);
    // (a fixed width counts the parked too: with width=4 and one slot resident, three parked are due)
    const int32_t width = std::max<int32_t>(1, p.sched.n_width > 0 ? p.sched.n_width : d.width);
    for (size_t i = 0; i < all.size(); ++i) {
        const slot_view & s = *by_id[all[i]];
        if (s.phase == slot_phase::parked) {
            d.due[s.id] = (int32_t) i < width || overdue(s);
        }
    }
    for (const auto & s : slots) {
        if (s.phase == slot_phase::parked && !s.was_generating) {
            d.due[s.id] = 1;
        }
    }
    return d;
}

std::vector<const slot_view *> admission_order(const std::vector<slot_view> & slots, const plan_params & p) {
    std::vector<const slot_view *> fresh;
    for (const auto & s : slots) {
        if (is_new(s)) {
            fresh.push_back(&s);
        }
    }
    return by_aged_priority(fresh, p, [](const slot_view & s) { return s.t_arrival_us; },
                            [](const slot_view & a, const slot_view & b) { return a.arrival < b.arrival; });
}

// plan_step(), step 8: the step's prompt and replay tokens, shared in order: replays first (they
// ran before any prompt still waiting), then prompts, highest priority first, then first come,
// first served. Each takes what it has left, up to what remains of the budget (while a slot
// decodes; else n_batch). A prompt that gets none waits (`hold`); the others get their share
// (`chunks`), which the loop keeps to, so the prompts are served in this order and not in the
// loop's slot order.
void share_prompt_budget(const std::vector<slot_view> & slots, const plan_params & p, plan & pl) {
    int32_t n_decoding = 0;
    for (const auto & s : slots) {
        if (s.phase == slot_phase::generating && !contains_id(pl.park, s.id) && !contains_id(pl.pause, s.id)) {
            n_decoding += 1 + std::max(0, s.n_draft);
        }
    }
    int32_t left = std::max(0, p.n_batch - n_decoding);
    if (n_decoding > 0 && pl.n_prompt_budget > 0) {
        left = std::min(left, pl.n_prompt_budget);
    }
    std::vector<const slot_view *> prompts;
    for (const auto & s : slots) {
        if (s.phase == slot_phase::prompt && !contains_id(pl.park, s.id) && !contains_id(pl.hold, s.id)) {
            prompts.push_back(&s);
        }
    }
    std::stable_sort(prompts.begin(), prompts.end(), [](const slot_view * a, const slot_view * b) {
        if ((a->n_replay_left > 0) != (b->n_replay_left > 0)) {
            return a->n_replay_left > 0;
        }
        if (a->priority != b->priority) {
            return a->priority > b->priority;
        }
        return a->arrival < b->arrival;
    });
    for (const slot_view * s : prompts) {
        const int32_t n = std::min(left, std::max(1, s->n_prompt_left));
        if (n <= 0) {
            pl.hold.push_back(s->id);
            continue;
        }
        pl.chunks.emplace_back(s->id, n);
        left -= n;
    }
}

} // namespace llama_preempt
