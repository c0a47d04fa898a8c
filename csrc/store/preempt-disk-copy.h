// llama-preempt: a SWAP park's file on the disk tier, as the slot's swap state holds it
// (preempt-swap.h); the store it lives in is preempt-disk.h, what is done with it preempt-disk-park.h.
#pragma once

#include "preempt-disk.h"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace llama_preempt {

// Where a disk park's state is, in the order its life goes: one stage at a time, never two
// flags that could disagree. in_ram(): the slot's host buffers hold the state (or will, once the
// read lands); reading(): a read into them is queued or running.
enum class disk_stage {
    none,           // not a disk park
    write_held,     // its write waits for the park's transfer to host RAM to settle (state in RAM)
    writing,        // its write is queued or running (state in RAM as well)
    written_in_ram, // written, and the host copy kept (the slot is the next back)
    on_disk,        // written, host copy freed: the state is only on disk
    reading_ahead,  // a read into new host buffers is queued or running, ahead of the resume
    reading,        // a read for the resume itself is queued or running
    read_back,      // file removed, the state in RAM again: read back, or its host copy taken as it
};

// A SWAP park's file on the disk tier (a member of the slot's swap_state, preempt-swap.h). While
// its file is written the state is in the slot's host buffers as well; once written they are
// freed and the state is only on disk; a read back fills new ones. Removing it (reset(), also on
// destruction) cancels what the I/O thread does with it and deletes the file.
struct disk_copy {
    std::shared_ptr<disk_store> store;  // set for a disk park (null: the slot is not on the disk tier)
    std::shared_ptr<disk_file>  file;   // null until its write is queued, and after its read
    size_t  n_bytes[2] = { 0, 0 };      // the state's two parts (target, draft)
    disk_stage stage = disk_stage::none;  // where its state is, as its file's life goes on
    bool    streamed = false;           // written straight from the contexts (preempt-stream.h): it comes back the same way, never through host RAM
    stream_layout layout;               //   and where its records lie in the file
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
    bool   in_ram() const { return stage != disk_stage::none && stage != disk_stage::on_disk; }
    bool   reading() const { return stage == disk_stage::reading_ahead || stage == disk_stage::reading; }

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
        stage = disk_stage::none;
        streamed = false;
        layout   = {};
        ref.clear();
        ref.shrink_to_fit();
    }
    void take(disk_copy & o) {
        store      = std::move(o.store);
        file       = std::move(o.file);
        n_bytes[0] = o.n_bytes[0];
        n_bytes[1] = o.n_bytes[1];
        stage      = o.stage;
        streamed   = o.streamed;
        layout     = std::move(o.layout);
        ref          = std::move(o.ref);
        o.clear();
    }
};

} // namespace llama_preempt
