// The one host budget as the object that makes room in host RAM (preempt-host-ram.h).
#include "preempt-host-ram.h"

namespace llama_preempt {

bool host_ram::reserve(const host_held & held, size_t bytes, host_use use) {
    fit(held, bytes);  // cached prompts give way to what comes in, whatever it is
    switch (use) {
        case host_use::park:
            return bytes <= ram_left(limits_.parks(), held.parked);
        case host_use::transit:
            return true;
        case host_use::prompt_read:
        case host_use::prompt_ahead:
            return bytes <= limits_.cache_room(held.parked);
    }
    return false;
}

void host_ram::settle(const host_held & held) {
    fit(held, 0);
    if (trim_due_) {
        trim();
    }
}

void host_ram::fit(const host_held & held, size_t extra) {
    if (!cache_) {
        return;
    }
    if (cache_->cap(cache_room(held, extra))) {
        trim();  // the prompts that gave way go back to the system, not to the allocator's free lists
    }
}

void host_ram::trim() {
    trim_due_ = false;
    n_trims_++;
    if (give_back_) {
        give_back_();
    }
}

} // namespace llama_preempt
