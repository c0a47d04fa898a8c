// The plain types the policy and the mechanics share: where a parked state waits (park_tier),
// the measured rates a park is priced with (cost_rates) and a cached prompt's file as the memory
// half's choices see it (prompt_file_view). No decisions here: the planner and the choices
// (policy/) read these, the mechanics (store/) fill them, and neither includes the other.
#pragma once

#include <cstddef>
#include <cstdint>

namespace llama_preempt {

// where a parked slot's state waits: nowhere (its tokens are re-prefilled), host RAM, a file, or
// host RAM compressed to q8_0 (--preempt-compress q8_0, opt-in: not byte-exact)
enum class park_tier { recompute, ram, disk, ram_q8 };
constexpr int N_PARK_TIERS = 4;
// "recompute", "ram", "disk", "ram_q8": spelled once, beside the enum (/slots, /metrics, the events, Python)
inline const char * park_tier_name(park_tier t) {
    static const char * const names[N_PARK_TIERS] = { "recompute", "ram", "disk", "ram_q8" };
    const int i = (int) t;
    return i >= 0 && i < N_PARK_TIERS ? names[i] : "?";
}

// One tier's own moves beyond the host copies every copying tier makes, as measured: its state out
// to where it waits and back in (a disk park's file written and read; a compressed park packed and
// unpacked), and the bytes it holds per byte of state. Each tier's model reads its own
// (cost_rates::own()); a tier with no moves of its own keeps the zeros.
struct tier_rate {
    double  out_bps       = 0;
    double  in_bps        = 0;
    double  held_ratio    = 1;
    int64_t n_out_samples = 0;
    int64_t n_in_samples  = 0;
};

// The rates the choice is made with: exponential moving averages of what the server's own parks,
// restores, tiers' moves and prompt batches took, with defaults until the first measurement.
// Samples too small to time (fixed overhead only) are left out.
struct cost_rates {
    static constexpr double DEFAULT_PARK_BPS       = 2e9;   // bytes/s, a park (device to host)
    static constexpr double DEFAULT_RESTORE_BPS    = 4e9;   // bytes/s, a restore (host to device)
    static constexpr double DEFAULT_PREFILL_TPS    = 1000;  // tokens/s re-prefilled
    static constexpr double DEFAULT_DISK_WRITE_BPS = 5e8;   // bytes/s, a disk park's file written (--preempt-disk)
    static constexpr double DEFAULT_DISK_READ_BPS  = 1e9;   // bytes/s, a disk park's file read back
    static constexpr double DEFAULT_PACK_BPS       = 3e8;   // bytes/s of state packed to q8_0 (--preempt-compress; measured: bench/compressed_tier.py)
    static constexpr double DEFAULT_UNPACK_BPS     = 6e8;   // bytes/s of state unpacked from q8_0
    static constexpr double DEFAULT_PACK_RATIO     = 34.0 / 64;  // packed bytes per byte of state: q8_0 of f16 KV
    static constexpr double ALPHA                  = 0.25;  // weight of a new sample
    static constexpr size_t MIN_COPY_BYTES         = 64 * 1024;
    static constexpr int64_t MIN_PREFILL_TOKENS    = 32;

    // the host copies every copying tier makes, and RECOMPUTE's prefill
    double park_bps       = DEFAULT_PARK_BPS;
    double restore_bps    = DEFAULT_RESTORE_BPS;
    double prefill_tps    = DEFAULT_PREFILL_TPS;
    tier_rate tiers[N_PARK_TIERS];  // by park_tier: each tier's own moves (defaults beside the names above)
    int64_t n_park_samples       = 0;
    int64_t n_restore_samples    = 0;
    int64_t n_prefill_samples    = 0;
    bool    fixed = false;  // set by a test knob: samples no longer move the rates

    cost_rates();

    tier_rate &       own(park_tier t)       { return tiers[(int) t]; }
    const tier_rate & own(park_tier t) const { return tiers[(int) t]; }

    void observe_park(size_t bytes, int64_t t_us);
    void observe_restore(size_t bytes, int64_t t_us);
    void observe_prefill(int64_t n_tokens, int64_t t_us);
    // a tier's own move of `bytes` out to where it waits, or back in
    void observe_out(park_tier t, size_t bytes, int64_t t_us);
    void observe_in(park_tier t, size_t bytes, int64_t t_us);
};

// one cached prompt's file on the disk tier, as the choices see it (oldest first in a list)
struct prompt_file_view {
    const int32_t * tokens   = nullptr;  // its tokens (the store's own, read only for the call)
    size_t          n_tokens = 0;
    size_t          n_bytes  = 0;  // its file's bytes: what reading it back brings into host RAM
    bool            written  = false;  // its write finished (a file still being written cannot be read ahead)
};

} // namespace llama_preempt
