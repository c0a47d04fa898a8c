// The simulator as an executor (preempt-executor.h): what the policy sees of its slots and tiers,
// and what the server's mechanics do to a slot, to host RAM, to the disk and to the clock, in
// simulated time. Every choice is the policy's
// (apply_plan(), park_victim(), disk_hold()); this file only carries it out.
#include "preempt-sim.h"

#include "preempt-policy.h"
#include "preempt-tier-disk.h"

#include <algorithm>
#include <cstdint>

namespace llama_preempt {

// what plan_step() sees, built as the server's preempt_view() builds it
slot_view sim_server::view(const sim_slot & s) const {
    slot_view v;
    v.id        = s.id;
    v.phase     = s.phase;
    v.n_cells   = s.phase == slot_phase::parked ? 0 : s.cells;
    v.n_preempt = s.n_preempt;
    v.is_new    = s.is_new;
    v.arrival   = s.req;
    if (s.req >= 0) {
        v.t_arrival_us = (int64_t) (s.t_arrival * 1e6);
        v.n_gen_left   = reqs[s.req].n_gen - s.gen_done;
    }
    if ((s.phase == slot_phase::generating || s.phase == slot_phase::parked) && s.t_last_token >= 0) {
        v.t_last_token_us = (int64_t) (s.t_last_token * 1e6);
    }
    if (s.phase == slot_phase::prompt) {
        v.n_replay_left = s.replay_left;
        v.n_prompt_left = s.replay_left > 0 ? s.replay_left : reqs[s.req].n_prompt - s.prompt_done;
    }
    if (s.phase == slot_phase::parked) {
        v.was_generating = s.from_gen;
        v.n_restore   = s.n_restore;
        v.t_parked_us = (int64_t) (s.t_parked * 1e6);
    }
    return v;
}

// the planner's knobs at this step: the clock and the step cost fitted so far (kept: the last
// resort's victim is chosen with them too)
plan_params sim_server::params() {
    pp.t_now_us   = (int64_t) (t * 1e6);
    pp.cost       = fit.cost();
    pp.cost_ready = fit.ready();
    pp.width_free = !guard.allow_limit();
    return pp;
}

std::vector<slot_view> sim_server::views() const {
    std::vector<slot_view> v;
    v.reserve(slots.size());
    for (const auto & s : slots) {
        v.push_back(view(s));
    }
    return v;
}

size_t sim_server::ram_budget() const {
    return host.limits().parks();  // the host budget's share for parks
}

size_t sim_server::ram_room() const {
    return ram_left(ram_budget(), (size_t) parked_bytes);
}

tier_set sim_server::all_tiers() const {
    auto * self = const_cast<sim_server *>(this);  // the policy only prices and sizes them here
    return tier_set{ { &self->rec_tier, &self->ram_tier, &self->disk_tier, p.compress_q8 ? &self->q8_tier : nullptr } };
}

tier_state sim_server::tiers() const {
    return tier_state_of(all_tiers(), ram_room(), effective_mode(p.mode, ram_budget(), disk.budget),
                         p.n_batch);
}

kv_tier & sim_server::tier(park_tier where) {
    return all_tiers()[where];
}

victim_state sim_server::victim(int32_t id, park_reason reason) {
    const auto & s = slots[id];
    victim_state v;
    v.id           = id;
    v.reason       = reason;
    v.in.at        = s.phase == slot_phase::generating ? parked_from::generating : s.is_new ? parked_from::started : parked_from::prompt;
    v.in.replaying = s.replay_left > 0;
    v.in.n_held    = s.cells;
    v.in.n_prompt  = reqs[s.req].n_prompt;
    v.in.n_replay  = s.replay_total;
    v.bytes        = (size_t) (p.state_overhead_bytes + s.cells * p.bytes_per_cell);
    return v;
}

parked_state sim_server::parked(int32_t id) const {
    const auto & s = slots[id];
    parked_state st;
    if (s.phase == slot_phase::parked && s.tier != park_tier::recompute) {
        st.tier   = s.tier;
        st.bytes  = (size_t) s.bytes;
        st.in_ram = s.tier == park_tier::disk && s.ram > 0;
    }
    return st;
}

// a parked slot's host RAM, counted against --preempt-ram as the server's store counts it
void sim_server::hold_ram(sim_slot & s, double bytes) {
    s.ram         = bytes;
    parked_bytes += bytes;
    res.peak_parked_bytes = std::max(res.peak_parked_bytes, parked_bytes);
}

void sim_server::free_ram(sim_slot & s) {
    parked_bytes -= s.ram;
    s.ram         = 0;
}

void sim_server::purge(int32_t id) {
    clear_idle(slots[id]);
}

void sim_server::fail(int32_t id) {
    finish(slots[id], sim_outcome::failed);
}

void sim_server::park(const park_order & o) {
    auto & s = slots[o.id];
    res.parks_by_choice[(int) o.how.why]++;
    s.held      = o.in.n_held;
    s.from_gen  = o.shape.from == parked_from::generating;
    s.n_restore = o.shape.n_restore;
    s.reading   = false;
    if (o.how.copies()) {
        s.tier = o.tier();
        res.n_park_disk += s.tier == park_tier::disk;
        res.n_park_ram_q8 += s.tier == park_tier::ram_q8;
        res.n_park_swap++;
    } else {
        s.tier    = park_tier::recompute;
        s.bytes   = 0;
        s.ram     = 0;
        if (s.from_gen && !o.in.replaying) {
            s.replay_total = o.shape.n_restore;  // what it held plus the token it had sampled
        }
        if (o.shape.from == parked_from::prompt) {
            s.redo_left  += o.shape.n_redo;  // starts its prompt over
            s.prompt_done = 0;
        }
        res.n_park_recompute++;
    }
    s.replay_left = 0;
    s.cells       = 0;
    s.phase       = slot_phase::parked;
    s.t_parked    = t;
    s.n_preempt  += 1;
    res.requests[s.req].n_preempt += 1;
}

// the step's start, in the server's order (preempt_settle()): the host budget (the cache grows
// into the room resumed parks left), the prompt files (one read ahead), then the parks' files
void sim_server::settle() {
    host.settle(prompts.held());
    sim_tokens next;
    if (!waiting.empty()) {
        next = tokens_of(waiting.front());
    }
    prompts.step(waiting.empty() ? nullptr : &next);
    settle_disk();
}

// at the start of a step, as the server's disk step: a written file frees its host copy unless the
// slot is the next back, a read ahead is let go when RAM is short and the slot is no longer next
void sim_server::settle_disk() {
    const size_t left = ram_room();
    for (auto & s : slots) {
        if (s.phase != slot_phase::parked || s.tier != park_tier::disk || s.ram == 0 || t < s.t_io_done) {
            continue;
        }
        const disk_keep k = disk_hold(s.id, restore_next, (size_t) s.bytes, left);
        if (s.reading ? !k.keep_read : !k.keep_copy) {
            free_ram(s);  // the state is only on disk now
            s.reading = false;
        }
    }
}



void sim_server::resume(int32_t id, park_tier from, const move_result & restore) {
    (void) restore;  // a simulated copy never fails; the slot keeps when its restore began
    auto & s = slots[id];
    res.requests[s.req].t_parked_s += (s.tier != park_tier::recompute ? s.t_restore0 : t) - s.t_parked;
    res.n_resume++;
    if (from != park_tier::recompute) {
        s.cells   = s.held;
        s.bytes   = 0;
        s.ram     = 0;
        s.tier    = park_tier::recompute;
        s.reading = false;
        s.phase   = s.from_gen ? slot_phase::generating : slot_phase::prompt;
        return;
    }
    s.phase = slot_phase::prompt;
    if (s.from_gen) {
        s.replay_left = s.replay_total;
    }
}

void sim_server::hold(int32_t id) {
    held[id] = 1;
}

void sim_server::chunk(int32_t id, int32_t n) {
    caps[id] = n;
}

void sim_server::pause(const std::vector<int32_t> & ids) {
    for (int32_t id : ids) {
        paused[id] = 1;
    }
}

void sim_server::record(const decision & d) {
    const auto & s = slots[d.id];
    res.trace.push_back({ res.n_steps, d.kind, s.req, d.tier, d.reason, d.why, d.n_held, d.bytes });
}

} // namespace llama_preempt
