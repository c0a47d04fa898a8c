// llama-preempt: what the disk tier says of what it cannot do (preempt-disk.h): its directory removed
// under it and made again, a full filesystem counted and logged once per episode.
#include "preempt-disk.h"

#include <string>

namespace llama_preempt {

// under mu_: the directory removed under the store (`rm -rf DIR/*`) is made again, once per
// removal, before a write that would fail in it; the files it held are gone (their reads fail)
void disk_store::remake_if_gone_locked() {
    if (!own_dir_gone(dir_)) {
        return;
    }
    const std::string old = dir_.path;
    std::string err;
    if (!remake_own_dir(dir_, persistent_, err)) {
        if (!said_dir_lost_) {
            said_dir_lost_ = true;
            note(true, "preemption: the disk tier's directory " + old + " was removed, and cannot be made again: " + err +
                           "; parks go to RAM or recompute");
        }
        return;
    }
    n_remade_++;
    said_dir_lost_ = false;
    note(true, "preemption: the disk tier's directory " + old + " was removed under the server; made again as " + dir_.path +
                   " (the files it held are lost: their slots recompute)");
}

void disk_store::count_full_locked(const std::string & what) {
    n_full_++;
    if (!full_episode_) {
        full_episode_ = true;
        note(true, "preemption: the filesystem of the disk tier (" + dir_.path + ") is full: " + what +
                       "; parks go to RAM or recompute until a write succeeds again (counted in preempt_disk_full_total)");
    }
}

void disk_store::count_full(const std::string & what) {
    std::lock_guard<std::mutex> lk(mu_);
    count_full_locked(what);
}

bool disk_store::short_of_disk(size_t bytes, size_t give_way) const {
    std::lock_guard<std::mutex> lk(mu_);
    const uint64_t need = bytes + HEADER_BYTES;
    if (need > budget_left_locked() + give_way) {
        return false;  // the budget is short first
    }
    return need > give_way && disk_left_locked() < need - give_way;
}

uint64_t disk_store::n_full() const {
    std::lock_guard<std::mutex> lk(mu_);
    return n_full_;
}

int32_t disk_store::n_remade() const {
    std::lock_guard<std::mutex> lk(mu_);
    return n_remade_;
}

} // namespace llama_preempt
