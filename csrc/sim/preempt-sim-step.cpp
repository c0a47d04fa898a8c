// The simulator's step, one update_slots(): the plan (the server's policy_step()), the batch fitted
// to the pool as upstream's retry ladder does, the step's time from the step cost, and each slot
// after it (see preempt-sim.h).
#include "preempt-sim.h"

#include "preempt-policy.h"

#include <algorithm>
#include <cstdint>

namespace llama_preempt {

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
