// RECOMPUTE's model: nothing is copied; the tokens held are re-prefilled at the measured rate.
#include "preempt-tier-model.h"

namespace llama_preempt {

namespace {

struct recompute_tier_model final : tier_model {
    park_tier where() const override { return park_tier::recompute; }
    bool copies() const override { return false; }
    bool fits(const quote_input &, const cost_rates &) const override { return true; }
    tier_offer quote(const quote_input & q, const cost_rates & r) const override {
        const double ms = 1e3 * q.n_tokens / r.prefill_tps;
        return { where(), false, true, ms, ms };
    }
    park_choice label(choice_reason reason) const override {
        return reason == choice_reason::cheapest ? park_choice::recompute_cheaper : park_choice::recompute_mode;
    }
};

} // namespace

const tier_model & recompute_model() {
    static const recompute_tier_model m;
    return m;
}

} // namespace llama_preempt
