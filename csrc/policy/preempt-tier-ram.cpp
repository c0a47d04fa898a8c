// The RAM tier's model: the state copied to host RAM and back, within what parks may hold.
#include "preempt-tier-model.h"

namespace llama_preempt {

namespace {

struct ram_tier_model final : tier_model {
    park_tier where() const override { return park_tier::ram; }
    bool fits(const quote_input & q, const cost_rates &) const override { return q.bytes <= q.room; }
    // RAM is worth more than its own quote when taking it leaves less than the state's own size: the
    // next victim of that size lands in a later tier and pays a read it cannot hide
    tier_offer quote(const quote_input & q, const cost_rates & r) const override {
        const double ms = host_copy_ms(q, r);
        tier_offer o { where(), true, fits(q, r), ms, ms };
        if (o.fits && q.bytes > q.room - q.bytes) {
            o.rank_ms += q.spill_read_ms;
        }
        return o;
    }
    park_choice label(choice_reason reason) const override {
        return reason == choice_reason::cheapest ? park_choice::swap_cheaper : park_choice::swap_mode;
    }
};

} // namespace

const tier_model & ram_model() {
    static const ram_tier_model m;
    return m;
}

} // namespace llama_preempt
