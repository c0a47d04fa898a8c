// The shared plain types' few functions (preempt-types.h): the rates' averages.
#include "preempt-types.h"

namespace llama_preempt {

static void ema(double & avg, int64_t & n, double sample) {
    avg = n == 0 ? sample : (1 - cost_rates::ALPHA) * avg + cost_rates::ALPHA * sample;
    n++;
}

// a copy or a file too small to time (its fixed cost only) would teach the average nothing
static void observe_bps(bool fixed, double & bps, int64_t & n, size_t bytes, int64_t t_us) {
    if (!fixed && bytes >= cost_rates::MIN_COPY_BYTES && t_us > 0) {
        ema(bps, n, bytes * 1e6 / t_us);
    }
}

void cost_rates::observe_park(size_t bytes, int64_t t_us)       { observe_bps(fixed, park_bps, n_park_samples, bytes, t_us); }
void cost_rates::observe_restore(size_t bytes, int64_t t_us)    { observe_bps(fixed, restore_bps, n_restore_samples, bytes, t_us); }
void cost_rates::observe_out(park_tier t, size_t bytes, int64_t t_us) { observe_bps(fixed, own(t).out_bps, own(t).n_out_samples, bytes, t_us); }
void cost_rates::observe_in(park_tier t, size_t bytes, int64_t t_us)  { observe_bps(fixed, own(t).in_bps, own(t).n_in_samples, bytes, t_us); }

// the tiers' own moves until the first measurement: the disk tier's file written and read, the
// compressed tier's packing and unpacking and its packed share
cost_rates::cost_rates() {
    own(park_tier::disk)   = { DEFAULT_DISK_WRITE_BPS, DEFAULT_DISK_READ_BPS, 1, 0, 0 };
    own(park_tier::ram_q8) = { DEFAULT_PACK_BPS, DEFAULT_UNPACK_BPS, DEFAULT_PACK_RATIO, 0, 0 };
}

void cost_rates::observe_prefill(int64_t n_tokens, int64_t t_us) {
    if (!fixed && n_tokens >= MIN_PREFILL_TOKENS && t_us > 0) {
        ema(prefill_tps, n_prefill_samples, n_tokens * 1e6 / t_us);
    }
}

} // namespace llama_preempt
