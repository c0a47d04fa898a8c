// The compressed tier's model (--preempt-compress q8_0, opt-in): host RAM packed to q8_0. The RAM
// park's copies plus packing and unpacking, for its packed share of the same RAM.
#include "preempt-tier-model.h"

namespace llama_preempt {

namespace {

struct ram_q8_tier_model final : tier_model {
    park_tier where() const override { return park_tier::ram_q8; }
    bool fits(const quote_input & q, const cost_rates & r) const override {
        return q.bytes > 0 && q.bytes * r.own(where()).held_ratio <= q.room;
    }
    tier_offer quote(const quote_input & q, const cost_rates & r) const override {
        const tier_rate & own = r.own(where());
        const double ms = host_copy_ms(q, r) + 1e3 * q.bytes / own.out_bps + 1e3 * q.bytes / own.in_bps;
        return { where(), true, fits(q, r), ms, ms };
    }
    // swap mode reaches it only past a full RAM
    park_choice label(choice_reason reason) const override {
        return reason == choice_reason::cheapest ? park_choice::swap_cheaper : park_choice::ram_full;
    }
};

} // namespace

const tier_model & ram_q8_model() {
    static const ram_q8_tier_model m;
    return m;
}

} // namespace llama_preempt
