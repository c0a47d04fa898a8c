// The disk tier's model (--preempt-disk): through host RAM to a file, read back before its restore.
#include "preempt-tier-disk.h"
#include "preempt-tier-model.h"

namespace llama_preempt {

namespace {

struct disk_tier_model final : tier_model {
    park_tier where() const override { return park_tier::disk; }
    bool fits(const quote_input & q, const cost_rates &) const override { return q.room > 0 && q.bytes <= q.room; }
    // the host copies, plus the file's write when the host copy does not fit what parks may still
    // hold (then the loop waits for it; otherwise it is written in the background), plus the read
    // back unless it runs ahead of the slot's turn (the victim waits behind another parked slot)
    tier_offer quote(const quote_input & q, const cost_rates & r) const override {
        tier_offer o { where(), true, fits(q, r), 0, 0 };
        o.background = q.bytes <= q.host_left;
        if (o.fits && q.bytes > 0) {
            const double write_ms = 1e3 * q.bytes / r.own(where()).out_bps;
            o.ms = o.rank_ms = host_copy_ms(q, r) + (o.background ? 0 : write_ms) + (q.waits_behind ? 0 : read_back_ms(q, r));
        }
        return o;
    }
    bool reads_back() const override { return true; }
    double read_back_ms(const quote_input & q, const cost_rates & r) const override { return 1e3 * q.bytes / r.own(where()).in_bps; }
    // swap mode reaches it only past a full RAM
    park_choice label(choice_reason reason) const override {
        return reason == choice_reason::cheapest ? park_choice::disk_cheaper : park_choice::ram_full;
    }
};

} // namespace

const tier_model & disk_model() {
    static const disk_tier_model m;
    return m;
}

bool read_cached_prompt(size_t bytes, size_t n_tokens, const cost_rates & rates) {
    const double read_s    = bytes / rates.own(park_tier::disk).in_bps + bytes / rates.restore_bps;
    const double prefill_s = n_tokens / rates.prefill_tps;
    return read_s < prefill_s;
}

disk_keep disk_hold(int32_t id, int32_t restore_next, size_t bytes, size_t ram_left_now) {
    disk_keep k;
    k.keep_copy = id == restore_next;
    k.keep_read = id == restore_next || ram_left_now >= bytes;
    return k;
}

} // namespace llama_preempt
