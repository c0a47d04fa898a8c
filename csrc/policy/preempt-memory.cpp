// The memory half's choices (preempt-memory.h): pure functions over snapshots.
#include "preempt-memory.h"
#include "preempt-tier-disk.h"  // read_cached_prompt()

#include <algorithm>

namespace llama_preempt {

static size_t common_prefix(const prompt_file_view & f, const std::vector<int32_t> & tokens) {
    const size_t n = std::min(f.n_tokens, tokens.size());
    size_t i = 0;
    while (i < n && f.tokens[i] == tokens[i]) {
        ++i;
    }
    return i;
}

prompt_match match_prompt_file(const std::vector<prompt_file_view> & files, const std::vector<int32_t> & tokens) {
    prompt_match m;
    for (size_t i = 0; i < files.size(); ++i) {
        const size_t n = common_prefix(files[i], tokens);
        if (n * 4 >= files[i].n_tokens && n > m.n_common) {
            m.file     = (int32_t) i;
            m.n_common = n;
        }
    }
    return m;
}

const char * prompt_read_why_name(prompt_read_why w) {
    switch (w) {
        case prompt_read_why::no_match:        return "no_match";
        case prompt_read_why::ram_as_good:     return "ram_as_good";
        case prompt_read_why::prefill_cheaper: return "prefill_cheaper";
        case prompt_read_why::no_room:         return "no_room";
        case prompt_read_why::read_back:       return "read_back";
        case prompt_read_why::stream_back:     return "stream_back";
    }
    return "?";
}

prompt_read_choice choose_prompt_read(const std::vector<prompt_file_view> & files, const std::vector<int32_t> & tokens,
                                      size_t n_ram_common, size_t host_room, const cost_rates & rates, size_t stream_cells) {
    prompt_read_choice c;
    const prompt_match m = match_prompt_file(files, tokens);
    c.file     = m.file;
    c.n_common = m.n_common;
    if (m.file < 0) {
        c.why = prompt_read_why::no_match;
    } else if (m.n_common <= n_ram_common) {
        c.why = prompt_read_why::ram_as_good;
    } else if (!read_cached_prompt(files[m.file].n_bytes, m.n_common - n_ram_common, rates)) {
        c.why = prompt_read_why::prefill_cheaper;
    } else if (files[m.file].n_bytes > host_room) {
        c.why = files[m.file].n_tokens <= stream_cells ? prompt_read_why::stream_back : prompt_read_why::no_room;
    } else {
        c.why = prompt_read_why::read_back;
    }
    return c;
}

read_ahead_action choose_read_ahead(const std::vector<prompt_file_view> & files, const prompt_read_choice & next,
                                    int32_t held) {
    read_ahead_action a;
    // a file still being written has nothing to read yet: it is wanted again at a later step
    a.want = next.read() && next.file >= 0 && (size_t) next.file < files.size() && files[next.file].written ? next.file : -1;
    if (a.want == held) {
        return a;  // what is read ahead is what the waiting request wants (or nothing, and nothing is)
    }
    a.forget = held >= 0;
    a.start  = a.want >= 0;
    return a;
}

size_t prompt_files_to_drop(const std::vector<prompt_file_view> & files, size_t room, size_t n_bytes) {
    size_t n = 0;
    while (n < files.size() && room < n_bytes) {
        room += files[n++].n_bytes;
    }
    return n;
}

bool prompt_files_give_way(size_t n_bytes, size_t room, size_t held, bool reading) {
    return !reading && n_bytes > room && n_bytes <= room + held;
}

const char * guard_reaction_name(guard_reaction r) {
    switch (r) {
        case guard_reaction::per_slice: return "per_slice";
        case guard_reaction::swap_off:  return "swap_off";
    }
    return "?";
}

guard_reaction react_to_wrong_copy(bool per_slice_already, bool used_faster_route) {
    // single slices are upstream's own copy, one tensor slice at a time: the route every device can
    // fall back to. A device already on it (or that copied by single slices anyway) has nowhere to go.
    return !per_slice_already && used_faster_route ? guard_reaction::per_slice : guard_reaction::swap_off;
}

} // namespace llama_preempt
