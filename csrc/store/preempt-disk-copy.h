// llama-preempt: a SWAP park's file on the disk tier, as the slot's swap state holds it
// (preempt-swap.h); the store it lives in is preempt-disk.h, what is done with it preempt-disk-park.h.
#pragma once

#include "preempt-disk.h"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace llama_preempt {

// A SWAP park's file on the disk tier (a member of the slot's swap_state, preempt-swap.h). While
// its file is written the state is in the slot's host buffers as well; once written they are
// freed and the state is only on disk; a read back fills new ones. Removing it (reset(), also on
// destruction) cancels what the I/O thread does with it and deletes the file.
struct disk_copy {
    std::shared_ptr<disk_store> store;  // set for a disk park (null: the slot is not on the disk tier)
    std::shared_ptr<disk_file>  file;   // null until its write is queued, and after its read
    size_t  n_bytes[2] = { 0, 0 };      // the state's two parts (target, draft)
    bool    pending = false;            // its write waits for the park's transfer to host RAM to settle
    bool    in_ram  = false;            // the slot's host buffers hold the state
    bool    reading = false;            // a read into them is queued or running (ahead of its turn)
    bool    read_ahead = false;         // the last read was queued ahead of the resume
    bool    write_seen = false;         // its write was seen written (counted once)
    std::vector<uint8_t> ref;           // LLAMA_SERVER_PREEMPT_VERIFY: upstream's serialization at the park (else empty)

    disk_copy() = default;
    disk_copy(const disk_copy &) = delete;
    disk_copy & operator=(const disk_copy &) = delete;
    disk_copy(disk_copy && o) noexcept { take(o); }
    disk_copy & operator=(disk_copy && o) noexcept {
        if (this != &o) {
            reset();
            take(o);
        }
        return *this;
    }
    ~disk_copy() { reset(); }

    bool   on() const { return store != nullptr; }
    size_t total() const { return n_bytes[0] + n_bytes[1]; }
    // bytes its file holds on disk now (written or being written)
    size_t bytes_on_disk() const { return file ? total() : 0; }

    void reset() {
        if (store && file) {
            store->remove(file);
        }
        clear();
    }

private:
    void clear() {
        store.reset();
        file.reset();
        n_bytes[0] = n_bytes[1] = 0;
        pending = in_ram = reading = read_ahead = write_seen = false;
        ref.clear();
        ref.shrink_to_fit();
    }
    void take(disk_copy & o) {
        store      = std::move(o.store);
        file       = std::move(o.file);
        n_bytes[0] = o.n_bytes[0];
        n_bytes[1] = o.n_bytes[1];
        pending    = o.pending;
        in_ram     = o.in_ram;
        reading    = o.reading;
        read_ahead = o.read_ahead;
        write_seen = o.write_seen;
        ref          = std::move(o.ref);
        o.clear();
    }
};

} // namespace llama_preempt
