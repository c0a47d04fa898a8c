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
void cost_rates::observe_disk_write(size_t bytes, int64_t t_us) { observe_bps(fixed, disk_write_bps, n_disk_write_samples, bytes, t_us); }
void cost_rates::observe_disk_read(size_t bytes, int64_t t_us)  { observe_bps(fixed, disk_read_bps, n_disk_read_samples, bytes, t_us); }

void cost_rates::observe_prefill(int64_t n_tokens, int64_t t_us) {
    if (!fixed && n_tokens >= MIN_PREFILL_TOKENS && t_us > 0) {
        ema(prefill_tps, n_prefill_samples, n_tokens * 1e6 / t_us);
    }
}

} // namespace llama_preempt
