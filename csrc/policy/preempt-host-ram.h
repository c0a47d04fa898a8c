// The one host budget for KV that leaves the device (--host-kv-ram) as the one object that makes
// room in host RAM. Parked states come first (they are requests in flight), up to their own cap
// (--preempt-ram); upstream's prompt cache gets what they leave, up to its own (--cache-ram), and
// gives way, least recently used first (to the disk tier where there is one), when bytes come in.
// Every path that brings KV bytes into host RAM asks reserve() first and release() once they are
// where the budget counts them; nothing else caps the prompt cache or gives pages back to the
// system (trim). The numbers are the policy's (host_budget, policy/preempt-choice.h); the bytes
// held live in the slots and files, so each call is handed what is held now (host_held).
#pragma once

#include "preempt-choice.h"

#include <cstddef>
#include <cstdint>

namespace llama_preempt {

// what the budget counts that lives elsewhere: handed in on each call
struct host_held {
    size_t parked = 0;  // parked slots' states in host RAM
    size_t ahead  = 0;  // a cached prompt's file read ahead for a waiting request
};

// why bytes come into host RAM
enum class host_use {
    park,          // a slot's state to RAM (its tier): within the parks' cap
    transit,       // a disk park's state on its way to or from its file: a parked request's own bytes, always let in
    prompt_read,   // a cached prompt's file read back into the RAM cache: within what parks leave
    prompt_ahead,  // a cached prompt's file read ahead for a waiting request: within what parks leave
};

// What gives way: upstream's prompt cache, adapted by the server (its types stay there).
class host_cache {
public:
    virtual ~host_cache() = default;
    // Cap the cache at `limit` bytes (SIZE_MAX: no limit), the least recently used out first.
    // True when it had to shrink (its freed pages may go back to the system).
    virtual bool cap(size_t limit) = 0;
};

// hands freed host pages back to the system (store/preempt-hostmem.h: return_free_pages())
using page_releaser = void (*)();

class host_ram {
public:
    host_ram() = default;
    // `give_back`: the bytes are real host memory, whose freed pages it hands back to the system;
    // null where they are not (the simulator's), and the trims are only counted
    host_ram(const host_budget & limits, host_cache * cache, page_releaser give_back = nullptr)
        : limits_(limits), cache_(cache), give_back_(give_back) {}

    // Room for `bytes` more of `use` beside what is `held`: cached prompts give way first. True when
    // the bytes are within the budget's share for that use (see host_use); false: they are not,
    // and the caller keeps them out (a park recomputes, a prompt file is prefilled).
    bool reserve(const host_held & held, size_t bytes, host_use use);
    // the reserved bytes are where `held` counts them now (or were let go): the cache may grow back
    void release(const host_held & held) { fit(held, 0); }
    // once a step: the cache may grow into the room resumed slots left; pages freed since go back
    void settle(const host_held & held);

    // host pages were freed outside the cache (a prompt file's write finished, a read ahead let
    // go): they go back to the system now, not to the allocator's free lists
    void pages_freed() { trim(); }
    // upstream dropped a cached prompt on its own: its pages go back at the next step
    void pages_freed_later() { trim_due_ = true; }

    // what cached prompts may hold beside what is held (and `extra` bytes about to come in)
    size_t cache_room(const host_held & held, size_t extra = 0) const {
        return limits_.cache_room(held.parked, extra + held.ahead);
    }

    const host_budget & limits() const { return limits_; }
    uint64_t n_trims() const { return n_trims_; }  // times freed pages went back to the system

private:
    void fit(const host_held & held, size_t extra);
    void trim();

    host_budget  limits_;
    host_cache * cache_    = nullptr;  // null: no prompt cache (--cache-ram 0)
    page_releaser give_back_ = nullptr;
    bool         trim_due_ = false;
    uint64_t     n_trims_  = 0;
};

} // namespace llama_preempt
