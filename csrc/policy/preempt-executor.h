// One way to carry a decision out: the interface a plan is applied through.
//
// The policy decides (plan_step(), decide_park(), the fallbacks); an executor only reads its state
// out and moves memory. apply_plan() walks a plan in the one order both executors share (purge,
// fail, park, resume, hold, read ahead), asking the policy for each victim's tier as it goes, so
// the server (server/preempt-server.cpp and preempt-parked.cpp, the real slots and copies) and the simulator
// (preempt-sim.h, simulated time) cannot drift apart: they differ only in what a move costs.
// Each decision is recorded through record(), the trace a test compares between the two.
#pragma once

#include "preempt-decide.h"
#include "preempt-tier.h"

#include <cstddef>
#include <cstdint>
#include <vector>

namespace llama_preempt {

// a parked slot's state as the executor holds it
struct parked_state {
    park_tier tier   = park_tier::recompute;  // where it waits
    size_t    bytes  = 0;                     // its size
    bool      in_ram = false;                 // a disk park whose host copy is in RAM (being written, kept, or read ahead)
};

enum class decision_kind { park, resume, fail };

// one decision as carried out: the decision trace
struct decision {
    decision_kind kind     = decision_kind::park;
    int32_t       id       = -1;                    // the slot
    park_tier     tier     = park_tier::recompute;  // park: where its state went; resume: where it came back from
    park_reason   reason   = park_reason::pool_full;  // park
    park_choice   why      = park_choice::no_state;   // park
    bool          fallback = false;                 // park: its move failed; resume: its restore failed (it recomputes)
    int32_t       n_held   = 0;                     // park: the tokens it held
    size_t        bytes    = 0;                     // park: its state copied out (0: RECOMPUTE)
};

struct plan_executor {
    virtual ~plan_executor() = default;

    // the step's start: the tiers catch up (copies that landed, files written, the host budget)
    // and the slots are ready to be seen (the server: a pending context shift, its test knobs)
    virtual void settle() = 0;
    // what the policy reads
    virtual plan_params params() = 0;  // the pool, the batch, the clock, the knobs, the step cost (after settle())
    virtual std::vector<slot_view> views() const = 0;
    virtual tier_state tiers() const = 0;  // the tiers' rates and room (tier_state_of() over tier())
    virtual kv_tier & tier(park_tier where) = 0;  // a tier, to move a state through
    virtual victim_state victim(int32_t id, park_reason reason) = 0;  // begins its park: sizes its state
    virtual parked_state parked(int32_t id) const = 0;

    // what it carries out
    virtual void purge(int32_t id) = 0;  // an idle slot's cached cells go
    virtual void fail(int32_t id) = 0;   // a parked slot that cannot fit even an empty pool ends (the context error)
    virtual void park(const park_order & o) = 0;  // the slot leaves the pool as the order says (its state copied out first)
    // the slot re-enters: restored (its state copied back by `restore`), or to replay; a failed
    // restore (`restore` not ok) replays what it held
    virtual void resume(int32_t id, park_tier from, const move_result & restore) = 0;
    virtual void hold(int32_t id) = 0;        // a prompt waits this step
    virtual void chunk(int32_t id, int32_t n) = 0;  // a prompt (or replay) adds at most n tokens this step
    virtual void pause(const std::vector<int32_t> & ids) = 0;  // these generating slots sit the step out, the rest decode

    virtual void record(const decision & d) { (void) d; }
    // the plan, before it is carried out (the server keeps what the step's hooks need from it)
    virtual void planned(const plan & pl) { (void) pl; }
};

// One victim parked: the policy decides its tier and shape, the chosen tier copies its state out,
// a failed copy falls back (park_fallback()) and the slot is parked as finally decided.
park_order park_victim(plan_executor & ex, int32_t id, park_reason reason);

// One parked slot resumed: its tier copies its state back (RAM or disk), or it replays by
// RECOMPUTE (also when a restore fails: the tier forgets the state).
void resume_parked(plan_executor & ex, int32_t id);

// A plan carried out, in the order every executor shares: purge, fail, park, resume, hold, chunks,
// pause, read ahead.
void apply_plan(const plan & pl, plan_executor & ex);

// One step of the policy, the same for the server and the simulator: the executor settles, the
// planner plans over what it shows (a paused slot may make room for a new prompt only where the
// tiers can keep its state), and the plan is carried out. Returns the views it planned over, and
// the plan.
struct policy_step_result {
    std::vector<slot_view> views;
    plan                   pl;
};
policy_step_result policy_step(plan_executor & ex);

} // namespace llama_preempt
