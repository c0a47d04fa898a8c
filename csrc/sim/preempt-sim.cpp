// The simulator: llama-server's loop in miniature, with the server's own planner (plan_step()).
#include "preempt-sim.h"

#include "preempt-policy.h"

#include <algorithm>
#include <cstdint>
#include <deque>

namespace llama_preempt {

sim_server::sim_server(const sim_params & p) : p(p) {
    pp.n_pool  = p.n_pool;
    pp.n_batch = p.n_batch;
    pp.sched   = p.sched;
    pp.unified = p.kv_unified;
    slots.resize(std::max(1, p.n_slots));
    for (size_t i = 0; i < slots.size(); ++i) {
        slots[i].id = (int32_t) i;
    }
    // the flags' MiB as the server reads them (preempt-config.cpp)
    disk.budget = p.preempt_disk_mib == 0 ? 0 : ram_budget_from_mib(p.preempt_disk_mib);
    host = host_ram(host_budget_from_mib(p.host_kv_ram_mib, p.preempt_ram_mib, p.cache_ram_mib), prompts.cache());
}

void sim_server::arrive(const sim_request & rq) {
    reqs.push_back(rq);
    res.requests.emplace_back();
    res.requests.back().t_arrival = rq.t_arrival;
    if (stopped) {
        return;  // it stays pending, as the requests after a lone server's step limit do
    }
    // a busy server's clock is at or past the arrival (its step in flight ends there); an idle
    // one waited for it
    t = std::max(t, rq.t_arrival);
    waiting.push_back((int32_t) reqs.size() - 1);
}

void sim_server::run_until(double t_until) {
    while (advance(t_until)) {
    }
}

bool sim_server::advance(double t_until) {
    if (stopped || t >= t_until || !has_work()) {
        return false;
    }
    if (!step(t_until)) {
        // all done (a request too large for the pool failed at admission), or held requests
        // that nothing will unblock (the step flags the step limit for those)
        stopped = res.hit_step_limit;
        return false;
    }
    if (res.n_steps >= p.max_steps) {
        res.hit_step_limit = true;
        stopped = true;
    }
    return !stopped;
}

bool sim_server::has_work() const {
    if (!waiting.empty()) {
        return true;
    }
    for (const auto & s : slots) {
        if (s.phase != slot_phase::idle) {
            return true;
        }
    }
    return false;
}

int32_t sim_server::n_parked() const {
    int32_t n = 0;
    for (const auto & s : slots) {
        n += s.phase == slot_phase::parked;
    }
    return n;
}

int32_t sim_server::n_busy() const {
    int32_t n = 0;
    for (const auto & s : slots) {
        n += s.req >= 0;
    }
    return n;
}

bool sim_server::is_running(const sim_slot & s) const {
    return (s.phase == slot_phase::prompt && !s.is_new) || s.phase == slot_phase::generating;
}

void sim_server::finish(sim_slot & s, sim_outcome outcome) {
    auto & r = res.requests[s.req];
    r.outcome = outcome;
    r.t_done  = t;
    if (s.phase == slot_phase::parked) {
        tier(s.tier).forget(s.id);  // its state goes with its request
    }
    if (outcome == sim_outcome::failed) {
        s.cells = 0;  // upstream clears a failed slot's cells
    }
    sim_tokens kept = tokens_of(s.req);
    kept.n = s.cells;  // its prompt and its answer (the chat's next tokens), but the last token sampled
    s = sim_slot{ s.id, -1, slot_phase::idle, false, s.cells };
    s.tokens      = kept;
    s.t_last_used = t;
}

void sim_server::token(sim_slot & s) {
    auto & r = res.requests[s.req];
    s.n_tokens++;
    if (s.n_tokens == 1) {
        r.t_first = t;
    } else {
        if (s.n_tokens == 2) {
            r.t_second = t;
        }
        r.max_gap_s = std::max(r.max_gap_s, t - s.t_last_token);
    }
    s.t_last_token = t;
    res.n_tokens_generated++;
}

// a step that does not fit the pool at all: upstream fails every running request; with
// preemption, the bottom of the retry ladder parks a victim and the step starts over
bool sim_server::last_resort() {
    if (!p.preempt) {
        return false;
    }
    const int32_t victim = select_victim(views(), pp);
    if (victim < 0) {
        return false;
    }
    park_victim(*this, victim, park_reason::last_resort);
    return true;
}

int32_t sim_server::cells_used() const {
    int32_t n = 0;
    for (const auto & s : slots) {
        n += s.phase == slot_phase::parked ? 0 : s.cells;
    }
    return n;
}

// the plan for this step (the server's policy_step()), and the decode width it chose
void sim_server::plan_here() {
    held.assign(slots.size(), 0);
    paused.assign(slots.size(), 0);
    caps.assign(slots.size(), -1);
    if (!p.preempt) {
        return;
    }
    const plan pl = policy_step(*this).pl;
    restore_next    = pl.restore_next;
    prompt_budget   = pl.n_prompt_budget;
    if (pl.n_decode_width > 0) {
        res.n_width_steps++;
        res.sum_decode_width += pl.n_decode_width;
        res.max_decode_width = std::max(res.max_decode_width, pl.n_decode_width);
    }
}

// the batch: one token per generating slot, then prompt and replay chunks in slot order, each up
// to its share of the step (the plan's chunks, which the server's prompt hook keeps the same way)
void sim_server::fill_batch(sim_batch & b) {
    std::fill(b.chunk.begin(), b.chunk.end(), 0);
    b.n_gen = 0;
    b.n_prompt = 0;
    for (auto & s : slots) {
        if (s.phase == slot_phase::generating && !paused[s.id]) {
            b.chunk[s.id] = 1;
            b.n_gen++;
        }
    }
    for (auto & s : slots) {
        const int32_t taken = b.n_gen + b.n_prompt;
        // a share from the plan, else (resumed in this step) the prompt budget beside the generated tokens
        const int32_t limit = caps[s.id] >= 0 ? std::min(p.n_batch, taken + caps[s.id])
                            : b.n_gen > 0 && prompt_budget > 0 ? std::min(p.n_batch, b.n_gen + prompt_budget)
                            : p.n_batch;
        if (s.phase != slot_phase::prompt || held[s.id] || taken >= limit) {
            continue;
        }
        if (s.is_new && !s.started) {
            start_prompt(s);  // the prompt starts: the cells it shares with the slot's cached prompt stay
        }
        const int32_t left = s.replay_left > 0 ? s.replay_left : reqs[s.req].n_prompt - s.prompt_done;
        b.chunk[s.id] = std::min(left, limit - taken);
        b.n_prompt += b.chunk[s.id];
    }
}

// The batch as the decode gets it: when it does not fit the pool, upstream's retry ladder (idle
// caches cleared, smaller prompt chunks, the last resort). False: the decode failed for good and
// every request in a slot ended with the context error.
bool sim_server::fit_batch(sim_batch & b) {
    while (true) {
        fill_batch(b);
        int32_t used = cells_used();
        if (used + b.n_gen + b.n_prompt <= p.n_pool) {
            return true;
        }
        // upstream clears idle caches on a failed decode (to the RAM cache first), then halves the batch
        for (auto & s : slots) {
            if (s.phase == slot_phase::idle) {
                clear_idle(s);
            }
        }
        used = cells_used();
        if (used + b.n_gen + b.n_prompt <= p.n_pool) {
            return true;
        }
        if (used + b.n_gen <= p.n_pool && b.n_prompt > 0) {
            // smaller prompt chunks fit: take what fits, slot by slot
            int32_t room = p.n_pool - used - b.n_gen;
            for (auto & s : slots) {
                if (b.chunk[s.id] > 0 && s.phase == slot_phase::prompt) {
                    b.chunk[s.id] = std::min(b.chunk[s.id], room);
                    room -= b.chunk[s.id];
                }
            }
            b.n_prompt = p.n_pool - used - b.n_gen - room;
            return true;
        }
        if (!last_resort()) {
            for (auto & s : slots) {
                if (s.phase != slot_phase::idle) {
                    finish(s, sim_outcome::failed);  // "Context size has been exceeded."
                }
            }
            return false;
        }
    }
}

// the step's time on the clock: a token at position q of its sequence reads q + 1 cells; its
// attention spans the pool's used cells in a unified pool whose attention does not walk its own
// cells (spanned_cells()); the fit and the width guard see it as the server's do
void sim_server::charge(const sim_batch & b) {
    step_shape shape;
    shape.n_decode = b.n_gen;
    shape.n_prompt = b.n_prompt;
    const int64_t n_used = cells_used() + b.n_gen + b.n_prompt;
    for (const auto & s : slots) {
        const int64_t c = b.chunk[s.id];
        if (c > 0) {
            shape.n_attended += c * s.cells + c * (c + 1) / 2;
            shape.n_spanned  += p.kv_unified && !p.attn_own_cells ? c * n_used : c * s.cells + c * (c + 1) / 2;
        }
    }
    const double dt = p.cost.seconds(shape);
    t += dt;
    res.n_steps++;
    if (p.preempt) {
        fit.observe(shape, dt);
        bool limited = false;
        for (const auto & s : slots) {
            limited |= paused[s.id] != 0;
        }
        guard.observe(b.n_gen, dt, limited, p.sched.width_loss);
    }
}

// each slot after the step: its tokens sampled, its replay or prompt moved on, its request done
void sim_server::advance_slots(const sim_batch & b, double t_step_start) {
    for (auto & s : slots) {
        const int32_t c = b.chunk[s.id];
        if (c == 0 || s.req < 0) {
            continue;
        }
        auto & r = res.requests[s.req];
        s.cells += c;
        if (s.phase == slot_phase::generating) {
            s.gen_done++;
            token(s);
        } else if (s.replay_left > 0) {
            s.replay_left -= c;
            res.n_recompute_tokens += c;
            if (s.replay_left == 0) {
                // the last replay token's logits are the interrupted step's: it samples on
                s.phase = slot_phase::generating;
                s.gen_done++;
                token(s);
            }
        } else {
            if (s.is_new) {
                s.is_new = false;
                r.t_start = t_step_start;
            }
            const int32_t redo = std::min(c, s.redo_left);
            s.redo_left -= redo;
            res.n_recompute_tokens += redo;
            s.prompt_done += c;
            if (s.prompt_done == reqs[s.req].n_prompt) {
                s.phase = slot_phase::generating;
                s.gen_done++;
                if (s.n_tokens == 0) {
                    token(s);
                } else {
                    res.n_tokens_generated++;  // a prompt-phase victim's prompt again: its first token was sent
                }
            }
        }
        if (s.phase == slot_phase::generating && s.gen_done >= reqs[s.req].n_gen) {
            finish(s, sim_outcome::completed);
        }
    }
}

bool sim_server::step(double t_next) {
    admit();
    const bool any = std::any_of(slots.begin(), slots.end(), [](const sim_slot & s) { return s.phase != slot_phase::idle; });
    if (!any) {
        if (t_next == SIM_NEVER) {
            return false;  // all done
        }
        t = std::max(t, t_next);  // idle until the next arrival
        return true;
    }
    plan_here();
    sim_batch b;
    b.chunk.assign(slots.size(), 0);
    if (!fit_batch(b)) {
        return true;
    }
    if (b.n_gen + b.n_prompt == 0) {
        // nothing can run now (only held requests): wait for the next arrival or give up
        if (t_next != SIM_NEVER) {
            t = std::max(t, t_next);
            return true;
        }
        res.hit_step_limit = true;
        return false;
    }
    const double t_step_start = t;
    charge(b);
    advance_slots(b, t_step_start);
    res.peak_cells = std::max(res.peak_cells, cells_used());
    return true;
}

} // namespace llama_preempt
