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

} // namespace llama_preempt
