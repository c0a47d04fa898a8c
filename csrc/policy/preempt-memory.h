// The memory half's choices: the prompt cache's disk side (which file matches a request, whether it
// is read back or its tokens prefilled, whose file is read ahead, which files give way to a park)
// and the copy guard's reaction to a wrong copy. Pure C++ over snapshots, like the planner
// (preempt-policy.h): the server's mechanics and the simulator hand it sizes and tokens and carry
// its answer out (csrc/server/preempt-prompt-cache-disk.cpp, store/preempt-prompt-disk.cpp,
// server/preempt-parked.cpp).
#pragma once

#include "preempt-choice.h"

#include <cstddef>
#include <cstdint>
#include <vector>

namespace llama_preempt {

// The file whose tokens share the longest prefix with `tokens`, at least a quarter of its own
// (upstream's rule for its RAM cache: a long prompt is not trashed for a short match).
struct prompt_match {
    int32_t file     = -1;  // -1: none
    size_t  n_common = 0;
};
prompt_match match_prompt_file(const std::vector<prompt_file_view> & files, const std::vector<int32_t> & tokens);

// why a request's cached prompt is read back from disk or its tokens prefilled
enum class prompt_read_why {
    no_match,         // no file shares enough of its prefix
    ram_as_good,      // the RAM cache already holds as long a prefix
    prefill_cheaper,  // reading the file would take longer than prefilling what it saves (measured rates)
    no_room,          // its bytes do not fit what parked slots leave of the host budget, nor its cells the pool's room now
    read_back,        // read it back into the RAM cache
    stream_back,      // larger than what the host budget leaves cached prompts: streamed straight into the slot
};
const char * prompt_read_why_name(prompt_read_why w);

struct prompt_read_choice {
    prompt_read_why why  = prompt_read_why::no_match;
    int32_t         file = -1;  // the matching file (also when it is not read back)
    size_t          n_common = 0;

    bool read() const { return why == prompt_read_why::read_back; }
    bool stream() const { return why == prompt_read_why::stream_back; }
};

// For a request's tokens: read back the best matching file when it saves more than the RAM cache's
// best prefix and the slot's own (`n_ram_common` tokens) and costs less than the prefill it saves
// by the measured rates: into the RAM cache when it fits `host_room` (the bytes the host budget
// leaves cached prompts), else streamed straight into the slot (one chunk of host RAM) when its
// tokens fit `stream_cells`, the cells the pool has for the slot now, its own included (the other
// slots' cells are still held while upstream loads; 0: no slot to stream into, as for a read ahead).
prompt_read_choice choose_prompt_read(const std::vector<prompt_file_view> & files, const std::vector<int32_t> & tokens,
                                      size_t n_ram_common, size_t host_room, const cost_rates & rates,
                                      size_t stream_cells = SIZE_MAX);

// What to read ahead this step, for the oldest request waiting for a slot (whose choice is `next`;
// a default choice when none waits): at most one file's bytes in host memory at a time.
struct read_ahead_action {
    int32_t want   = -1;     // the file to hold read ahead after this step (-1: none)
    bool    forget = false;  // let the file read ahead now go (the waiting request wants another, or none)
    bool    start  = false;  // start reading `want`
};
read_ahead_action choose_read_ahead(const std::vector<prompt_file_view> & files, const prompt_read_choice & next,
                                    int32_t held);

// Parks first on disk: how many of the oldest prompt files give way so that a park's `n_bytes`
// fit the `room` the disk tier has now (all of them when even that is not enough).
size_t prompt_files_to_drop(const std::vector<prompt_file_view> & files, size_t room, size_t n_bytes);
// A cached prompt of `n_bytes` leaving RAM for a disk tier at its limit (`room` left, `held` in
// prompt files): do the oldest files give way to it? When it fits only with them gone, and no file
// is being read back or ahead (`reading`: it may be one of the oldest; the newer prompt is written
// if it fits as things are, else dropped).
bool prompt_files_give_way(size_t n_bytes, size_t room, size_t held, bool reading);

// The copy guard (--preempt-verify), on a copy that differs from upstream's for one device: move that
// device to the proven route (single slices), or, when that was its route already, turn SWAP off.
// The request itself recomputes either way.
enum class guard_reaction {
    per_slice,  // copy that device slice by slice from now on (checked again for its next copies)
    swap_off,   // every park recomputes from now on
};
const char * guard_reaction_name(guard_reaction r);
guard_reaction react_to_wrong_copy(bool per_slice_already, bool used_faster_route);

} // namespace llama_preempt
