// The disk tier's own policy beside its model (preempt-tier-disk.cpp): what a parked slot on disk
// keeps in host RAM from one step to the next, and whether a cached prompt's file is read back. The
// server's disk tier and prompt cache, and the simulator's, ask it.
#pragma once

#include "preempt-types.h"  // cost_rates

#include <cstddef>
#include <cstdint>

namespace llama_preempt {

// A parked slot whose state is on disk, at the start of a step: whether its host copy, once its
// file is written, is kept (the next slot back: its file would be read at once), and whether a
// read ahead of it is kept (still next back, or RAM is not short of another state its size).
struct disk_keep {
    bool keep_copy = false;
    bool keep_read = true;
};
disk_keep disk_hold(int32_t id, int32_t restore_next, size_t bytes, size_t ram_left_now);

// A cached prompt on disk against its prefill: read it back when its bytes over the measured disk
// read and restore rates cost less than prefilling the `n_tokens` it saves at the measured rate
bool read_cached_prompt(size_t bytes, size_t n_tokens, const cost_rates & rates);

} // namespace llama_preempt
