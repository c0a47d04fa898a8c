// The simulated server's prompt cache as the server runs upstream's (sim_prompts), over the RAM
// cache and prompt files of preempt-sim-cache.h, and the simulated disk tier the prompt files
// share with the parks (sim_disk).
#pragma once

#include "preempt-sim-cache.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

namespace llama_preempt {

// The simulated disk tier (--preempt-disk): its bytes and its one I/O thread (writes and reads run
// one at a time), shared by the parks (preempt-sim-tiers.cpp) and the prompt files (sim_prompts)
struct sim_disk {
    size_t budget    = 0;  // bytes its files may take (0: no disk tier)
    double bytes     = 0;  // in its files now
    double t_io_free = 0;  // its I/O thread is free then
    // a job of `seconds` on that one thread, ready at t_ready: when it is done
    double io(double t_ready, double seconds) { return t_io_free = std::max(t_io_free, t_ready) + seconds; }
    size_t room() const { return ram_left(budget, (size_t) bytes); }
};

struct sim_params;
struct sim_result;

// what prompt_load() found for a slot (sim_prompts::load())
struct sim_prompt_load {
    bool              cleared = false;  // a better prompt was cached but finds no room: the slot is cleared
    bool              loaded  = false;  // `got` replaces what the slot held
    sim_cached_prompt got;
};

// The simulated server's prompt cache as the server's cached_prompts
// (server/preempt-prompt-cache.h, preempt-prompt-cache-disk.cpp) runs upstream's: the RAM cache, and its
// disk side: what leaves RAM is written to a file, read back when a request's prefix matches, read
// ahead for the oldest waiting request, dropped when a park needs the room, each choice the
// policy's (preempt-memory.h) and each byte into host RAM asked of the one host budget. It owns
// the cache and the files; it is handed the server's clock (the loop waits for its copies and
// reads), the results it counts into, the parameters, the host budget and the disk tier it shares
// with the parks, the host RAM the parked slots hold, and the tiers' measured rates.
class sim_prompts {
public:
    sim_prompts(const sim_params & p, double & t, sim_result & res, host_ram & host, sim_disk & disk, const double & parked_bytes,
                std::function<cost_rates()> rates);

    bool on() const { return cache_ != nullptr; }             // a RAM prompt cache (--cache-ram not 0)
    host_cache * cache() { return cache_.get(); }             // what gives way to the host budget (null: none)
    host_held held() const;                                   // what the host budget counts beside the cache
    size_t file_bytes() const { return files_.bytes(); }      // the prompt files' (a park may take them)

    void save(const sim_tokens & tokens);  // prompt_save(): copied to the RAM cache while the loop waits
    // prompt_load(), after the disk lookup: the cached prompt that serves `want` better than the
    // slot's `held` tokens, when it fits `n_room` cells. `room(need)`: the cells a file streamed
    // into the slot may take (as the server's preempt_room_cells(); need > 0 makes that room)
    sim_prompt_load load(const sim_tokens & held, const sim_tokens & want, int32_t n_room,
                         const std::function<int32_t(int32_t)> & room);
    void update();                       // the RAM cache's limits enforced, what left spilled
    void spill();                        // what left the RAM cache goes to disk (or is dropped)
    void step(const sim_tokens * next);  // once a step: spilled, and a file read ahead for `next` (the oldest waiting)
    void drop_files(size_t n_bytes);     // a disk park needs the room: files give way, oldest first

private:
    prompt_read_choice to_read(const sim_tokens & tokens, const std::vector<prompt_file_view> & files, size_t n_slot = 0,
                               size_t stream_cells = 0) const;
    // a file that matches better than RAM and the slot comes back into RAM, or one too large for it
    // straight into the slot (loaded, or cleared when its cells find no room)
    sim_prompt_load lookup(const sim_tokens & held, const sim_tokens & tokens, const std::function<int32_t(int32_t)> & room);
    void stream_out(const sim_tokens & tokens, size_t n_bytes);  // one larger than the RAM cache, to a file now
    double write_file(const sim_tokens & tokens, std::vector<int32_t> ids, size_t n_bytes);  // its write's end (-1: dropped)
    void read_ahead(const sim_tokens * next);

    const sim_params &                p_;
    double &                          t_;
    sim_result &                      res_;
    host_ram &                        host_;
    sim_disk &                        disk_;
    const double &                    parked_bytes_;
    std::function<cost_rates()>       rates_;

    std::unique_ptr<sim_prompt_cache> cache_;  // on the heap: the host budget points at it
    sim_prompt_files                  files_;
    double                            t_write_ = 0;  // the last prompt file's write is done then (one at a time)
    bool                              reading_ = false;  // a file is being read back or ahead: no give-way meanwhile
};

} // namespace llama_preempt
