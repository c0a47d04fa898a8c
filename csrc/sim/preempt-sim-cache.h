// The simulated server's prompt cache: upstream's RAM cache (server_prompt_cache: alloc, load,
// update) and its disk side (store/preempt-prompt-disk.h), over prompts that are token counts, not
// tokens. The server's choices about it are the policy's own functions (policy/preempt-memory.h:
// which file matches, read back or prefill, read ahead, which files give way), called by the
// simulator (sim_prompts, preempt-sim-prompts.cpp) as csrc/server/preempt-prompt-cache-disk.cpp calls them; the RAM
// cache's own rules (its size and token limits, oldest out first, "do not trash a long prompt")
// are upstream's, modelled here as preempt-sim.cpp models upstream's loop.
#pragma once

#include "preempt-host-ram.h"
#include "preempt-memory.h"

#include <cstddef>
#include <cstdint>
#include <deque>
#include <vector>

namespace llama_preempt {

// where the prompt tokens a request did not compute came from
enum class sim_prompt_source : int32_t {
    none,  // it computed its whole prompt
    slot,  // the cells its slot still held (upstream's cache_prompt)
    ram,   // the RAM prompt cache
    disk,  // a prompt file read back from the disk tier into the RAM cache
};
const char * sim_prompt_source_name(sim_prompt_source s);

// A simulated prompt's tokens, without the tokens: the first `n_shared` are the same in every
// request (a common system prompt), the rest belong to its chat (`key`), so two turns of one chat
// share all of the shorter one, and two chats share their common system prompt.
struct sim_tokens {
    int64_t key      = -1;
    int32_t n        = 0;
    int32_t n_shared = 0;

    size_t common_prefix(const sim_tokens & o) const;
    bool operator==(const sim_tokens & o) const { return key == o.key && n == o.n && n_shared == o.n_shared; }
    // token ids with the same common prefixes, for the policy's choices (match_prompt_file())
    std::vector<int32_t> ids() const;
};

// a cached prompt in RAM (upstream's server_prompt_cache_state)
struct sim_cached_prompt {
    sim_tokens tokens;
    size_t     bytes     = 0;
    bool       from_disk = false;  // read back from a prompt file
};

// Upstream's RAM prompt cache: a list, oldest first, with a size limit (--cache-ram, which the host
// budget lowers: cap()) and a token limit (the context's size, raised by what the size limit
// allows). What leaves it waits in evicted() for the disk side (as patches/0003's on_evict hook
// hands it over), which the simulator drains after every call that can evict.
class sim_prompt_cache final : public host_cache {
public:
    sim_prompt_cache(size_t limit_bytes, size_t limit_tokens) : limit_bytes_(limit_bytes), limit_tokens_(limit_tokens) {}

    // the host budget's cap (as the server's prompt_cache_port): true when entries had to go
    bool cap(size_t limit) override;

    // prompt_save(): a slot's prompt in; false when it is skipped (already held, or larger than the limit)
    bool save(const sim_tokens & tokens, size_t bytes);
    // prompt_load(): the entry that would replace a slot holding `slot` for a request of `request`
    // (upstream's f_keep / f_sim rule; -1: none is better than what the slot holds)
    int32_t best_for(const sim_tokens & slot, const sim_tokens & request) const;
    sim_cached_prompt take(int32_t i);
    void push(const sim_cached_prompt & e) { states_.push_back(e); }  // a prompt read back from disk
    void update();  // the limits enforced, the oldest out first

    size_t bytes() const;
    size_t n_common_best(const sim_tokens & request) const;  // the longest prefix RAM holds for it
    bool   holds(const sim_tokens & tokens) const;            // an entry holds all of them
    bool   over_limit(size_t bytes) const { return limit_bytes_ > 0 && bytes > limit_bytes_; }  // save() skips it
    const std::deque<sim_cached_prompt> & states() const { return states_; }

    std::vector<sim_cached_prompt> take_evicted();  // what left since the last call, oldest first

    uint64_t n_evicted = 0;  // entries the limits made leave (the server's n_prompt_cache_evicted_total counts the cap's)

private:
    void evict_front();
    size_t n_tokens() const;

    size_t limit_bytes_;   // 0: no limit (upstream's reading)
    size_t limit_tokens_;
    std::deque<sim_cached_prompt> states_;
    std::vector<sim_cached_prompt> evicted_;
};

// a cached prompt's file on the simulated disk tier
struct sim_prompt_file {
    sim_tokens           tokens;
    std::vector<int32_t> ids;          // tokens.ids(), kept for the views
    size_t               bytes = 0;
    double               t_written = 0;  // its write is done then
    bool                 ahead = false;  // being read ahead (its bytes in host RAM)
    double               t_ahead = 0;    // the read ahead lands then
};

// The disk tier's prompt files, oldest first (store/preempt-prompt-disk.h in simulated time).
struct sim_prompt_files {
    std::vector<sim_prompt_file> files;

    std::vector<prompt_file_view> views(double t_now) const;
    int32_t find(const sim_tokens & tokens) const;  // the file of these tokens (-1: none), after files moved
    int32_t ahead() const;
    size_t  bytes_ahead() const;
    size_t  bytes() const;
};

} // namespace llama_preempt
