// A tier as the policy sees it: a pure model that quotes a victim. Given the victim (its state's
// bytes, the tokens it holds), the tier's own room and the measured rates, a model says whether the
// state fits, what parking it there and bringing it back would cost the loop, and what taking it
// holds back. tier_offers() (preempt-choice.cpp) maps over the models of the tiers an executor has,
// in tier order; nothing else in the policy names a tier that keeps a state (RECOMPUTE, where
// nothing is kept, is every fallback's). The server's executors
// (server/preempt-tiers.h) and the simulator's (sim/preempt-sim-tiers.cpp) move the state; these
// models price it, for both alike.
//
// Adding a tier (docs/contributing.md): its value in park_tier and its name beside it
// (common/preempt-types.h), a model here (one file, preempt-tier-<name>.cpp) and a line in the
// table (preempt-tier-models.cpp), an executor in each executor, a flag that offers it.
#pragma once

#include "preempt-choice.h"

#include <cstddef>
#include <cstdint>
#include <vector>

namespace llama_preempt {

// one victim as a tier's model quotes it
struct quote_input {
    size_t  bytes         = 0;         // state to copy (0: nothing worth copying)
    int64_t n_tokens      = 0;         // tokens a re-prefill replays
    bool    waits_behind  = false;     // another parked slot comes back first: a read back runs ahead of its turn
    size_t  host_left     = SIZE_MAX;  // bytes parks may still hold of host RAM: every copy passes through it
    size_t  room          = 0;         // this tier's own room (its executor's kv_tier::room())
    double  spill_read_ms = 0;         // what a victim of this size pays at its restore once host RAM is short and it
                                       // lands in a later tier: that tier's read back (0: none reads back)
};

class tier_model {
public:
    virtual ~tier_model() = default;

    virtual park_tier where() const = 0;
    // keeps the state (a copy somewhere); a tier that does not re-prefills the tokens instead
    virtual bool copies() const { return true; }
    // the state fits its room now
    virtual bool fits(const quote_input & q, const cost_rates & r) const = 0;
    // its offer: whether it fits, its quote and its rank (the quote, plus what the room it takes is
    // worth to the next victim), and whether its move runs in the background
    virtual tier_offer quote(const quote_input & q, const cost_rates & r) const = 0;
    // its state is read back before the restore, a read that can run ahead of the slot's turn
    virtual bool reads_back() const { return false; }
    virtual double read_back_ms(const quote_input & q, const cost_rates & r) const { (void) q; (void) r; return 0; }
    // the /metrics label of a park taken for a reason any tier can have it for (cheapest, mode, room)
    virtual park_choice label(choice_reason reason) const = 0;

protected:
    // the state copied to host RAM and back (park + restore), the part of every copying tier's quote
    static double host_copy_ms(const quote_input & q, const cost_rates & r) {
        return q.bytes > 0 ? 1e3 * q.bytes / r.park_bps + 1e3 * q.bytes / r.restore_bps : 0;
    }
};

// every tier's model, in tier order: the order --preempt-mode swap prefers them in and ties go to
// (RECOMPUTE, which does not copy, last)
const std::vector<const tier_model *> & tier_models();
const tier_model & model_of(park_tier where);

} // namespace llama_preempt
