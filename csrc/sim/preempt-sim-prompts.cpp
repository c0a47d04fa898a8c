// The simulated server's prompt cache (preempt-sim-prompts.h): upstream's RAM cache and the disk
// side as csrc/server/preempt-prompt-cache-disk.cpp runs it, each choice the policy's
// (policy/preempt-memory.h) and each byte into host RAM asked of the one host budget (host_ram).
#include "preempt-sim.h"

#include <algorithm>
#include <cstdint>

namespace llama_preempt {

sim_prompts::sim_prompts(const sim_params & p, double & t, sim_result & res, host_ram & host, sim_disk & disk,
                         const double & parked_bytes, std::function<cost_rates()> rates)
    : p_(p), t_(t), res_(res), host_(host), disk_(disk), parked_bytes_(parked_bytes), rates_(std::move(rates)) {
    if (p.cache_ram_mib != 0) {
        // upstream's limits: --cache-ram (-1: none) and the context's tokens
        cache_ = std::make_unique<sim_prompt_cache>(p.cache_ram_mib < 0 ? 0 : (size_t) p.cache_ram_mib << 20, (size_t) p.n_pool);
    }
}

host_held sim_prompts::held() const {
    return { (size_t) parked_bytes_, files_.bytes_ahead() };
}

void sim_prompts::save(const sim_tokens & tokens) {
    const size_t n_bytes = (size_t) (p_.state_overhead_bytes + tokens.n * p_.bytes_per_cell);
    if (cache_->save(tokens, n_bytes)) {
        t_ += n_bytes / p_.swap_out_bps;  // the state copied to host RAM while the loop waits
        res_.peak_cache_bytes = std::max(res_.peak_cache_bytes, (double) cache_->bytes());
    } else if (tokens.n > 0 && cache_->over_limit(n_bytes) && !cache_->holds(tokens) && disk_.budget != 0) {
        stream_out(tokens, n_bytes);  // upstream skips it: as the server's on_skip hook, it goes to disk
    }
    spill();
}

// as the server's stream_prompt(): from the slot's cells to a file, the loop waiting for the write
void sim_prompts::stream_out(const sim_tokens & tokens, size_t n_bytes) {
    const auto ids = tokens.ids();
    for (const auto & f : files_.files) {
        if (f.ids.size() >= ids.size() && std::equal(ids.begin(), ids.end(), f.ids.begin())) {
            return;  // a file holds it already
        }
    }
    const double t_written = write_file(tokens, ids, n_bytes);
    if (t_written >= 0) {
        t_ = t_written;  // the loop waits for a streamed write
        res_.n_prompt_cache_streamed++;
    }
}

sim_prompt_load sim_prompts::load(const sim_tokens & held, const sim_tokens & want, int32_t n_room,
                                  const std::function<int32_t(int32_t)> & room) {
    sim_prompt_load r;
    if (!files_.files.empty()) {
        r = lookup(held, want, room);  // the hook before upstream searches its RAM cache
        if (r.loaded || r.cleared) {
            return r;  // streamed into the slot: nothing in RAM serves it better
        }
    }
    const int32_t i = cache_->best_for(held, want);
    if (i < 0) {
        return r;
    }
    if (cache_->states()[i].tokens.n > n_room) {
        r.cleared = true;  // the restore finds no room: the load fails and the slot is cleared
        return r;
    }
    r.loaded = true;
    r.got = cache_->take(i);
    t_ += r.got.bytes / p_.swap_in_bps;
    res_.n_prompt_cache_ram_hits += !r.got.from_disk;
    return r;
}

void sim_prompts::update() {
    cache_->update();
    spill();
}

void sim_prompts::spill() {
    if (!cache_) {
        return;
    }
    for (auto & e : cache_->take_evicted()) {
        if (disk_.budget == 0) {
            host_.pages_freed_later();
            continue;
        }
        write_file(e.tokens, e.tokens.ids(), e.bytes);
    }
}

// a prompt's file on the disk tier, as the server's prompt_disk writes one: the write before it
// finishes first (one prompt's bytes at most wait outside the cache), the oldest files give way at
// the tier's limit (the policy's choice), and one with no room even so is dropped. When it was
// written: its write is done then (-1: dropped).
double sim_prompts::write_file(const sim_tokens & tokens, std::vector<int32_t> ids, size_t n_bytes) {
    t_ = std::max(t_, t_write_);
    if (prompt_files_give_way(n_bytes, disk_.room(), files_.bytes(), reading_ || files_.ahead() >= 0)) {
        drop_files(n_bytes);
    }
    if (n_bytes > disk_.room()) {
        res_.n_prompt_cache_disk_skipped++;
        return -1;
    }
    sim_prompt_file f;
    f.tokens = tokens;
    f.ids    = std::move(ids);
    f.bytes  = n_bytes;
    f.t_written = t_write_ = disk_.io(t_, n_bytes / p_.disk_write_bps);
    disk_.bytes += n_bytes;
    res_.peak_disk_bytes = std::max(res_.peak_disk_bytes, disk_.bytes);
    files_.files.push_back(std::move(f));
    res_.n_prompt_cache_spilled++;
    return t_write_;
}

void sim_prompts::step(const sim_tokens * next) {
    if (cache_) {
        spill();
        read_ahead(next);
    }
}

prompt_read_choice sim_prompts::to_read(const sim_tokens & tokens, const std::vector<prompt_file_view> & files,
                                        size_t n_slot, size_t stream_cells) const {
    return choose_prompt_read(files, tokens.ids(), std::max(cache_->n_common_best(tokens), n_slot),
                              host_.limits().cache_room(held().parked), rates_(), stream_cells);
}

sim_prompt_load sim_prompts::lookup(const sim_tokens & held_tokens, const sim_tokens & tokens,
                                    const std::function<int32_t(int32_t)> & room) {
    sim_prompt_load r;
    const auto choice = to_read(tokens, files_.views(t_), held_tokens.common_prefix(tokens), (size_t) std::max(0, room(0)));
    if (choice.stream()) {
        // as the server's stream_back(): straight into the slot in place of what it held, the loop
        // waiting for the read; a read ahead of another file is let go
        const int32_t ahead = files_.ahead();
        if (ahead >= 0) {
            files_.files[ahead].ahead = false;
            host_.pages_freed();
        }
        // the idle slots' prompts go to the cache first if its cells need their room: the files may move
        const sim_tokens want = files_.files[choice.file].tokens;
        room(want.n);
        const int32_t j = files_.find(want);
        if (j < 0) {
            return r;
        }
        const auto it = files_.files.begin() + j;
        r.cleared = true;  // the slot's cells give way first
        t_ = std::max(t_, it->t_written);
        t_ = disk_.io(t_, it->bytes / p_.disk_read_bps);
        disk_.bytes -= it->bytes;
        r.loaded = true;
        r.got    = { it->tokens, it->bytes, true };
        res_.n_prompt_cache_disk_hits++;
        res_.n_prompt_cache_streamed_back++;
        files_.files.erase(it);
        return r;
    }
    const int32_t i = choice.read() ? choice.file : -1;
    const int32_t ahead = files_.ahead();
    const bool was_ahead = i >= 0 && i == ahead;
    if (ahead >= 0 && !was_ahead) {
        files_.files[ahead].ahead = false;  // the waiting request went another way: its bytes go
        host_.pages_freed();
    }
    if (i < 0) {
        return r;
    }
    const size_t n_bytes = files_.files[i].bytes;
    const sim_tokens want = files_.files[i].tokens;
    reading_ = true;  // what the reservation evicts is written without giving way to this file
    const bool fits = was_ahead || host_.reserve(held(), n_bytes, host_use::prompt_read);
    reading_ = false;
    if (!fits) {
        return r;
    }
    spill();  // what gave way went to disk: the files may have moved
    const int32_t j = files_.find(want);
    if (j < 0) {
        return r;
    }
    const auto it = files_.files.begin() + j;
    // its write lands, then its read (or the rest of the read ahead), while the loop waits
    t_ = std::max(t_, it->t_written);
    if (it->ahead) {
        t_ = std::max(t_, it->t_ahead);
    } else {
        t_ = disk_.io(t_, n_bytes / p_.disk_read_bps);
    }
    disk_.bytes -= n_bytes;
    cache_->push({ it->tokens, n_bytes, true });
    files_.files.erase(it);
    res_.n_prompt_cache_disk_hits++;
    res_.peak_cache_bytes = std::max(res_.peak_cache_bytes, (double) cache_->bytes());
    host_.release(held());
    spill();
    return r;
}

void sim_prompts::read_ahead(const sim_tokens * next) {
    if (files_.files.empty()) {
        return;
    }
    const auto files = files_.views(t_);
    prompt_read_choice choice;
    if (next) {
        choice = to_read(*next, files);
    }
    const auto act = choose_read_ahead(files, choice, files_.ahead());
    if (act.forget) {
        files_.files[files_.ahead()].ahead = false;
        host_.pages_freed();
    }
    if (!act.start) {
        return;
    }
    const sim_tokens want = files_.files[act.want].tokens;
    const size_t n_bytes = files_.files[act.want].bytes;
    reading_ = true;
    const bool room = host_.reserve(held(), n_bytes, host_use::prompt_ahead);
    reading_ = false;
    if (!room) {
        spill();
        return;
    }
    spill();  // the files may have moved
    const int32_t j = files_.find(want);
    if (j >= 0) {
        auto & f  = files_.files[j];
        f.ahead   = true;
        f.t_ahead = disk_.io(std::max(t_, f.t_written), n_bytes / p_.disk_read_bps);
        res_.n_prompt_cache_read_ahead++;
    }
}

void sim_prompts::drop_files(size_t n_bytes) {
    if (files_.files.empty()) {
        return;
    }
    const size_t n = prompt_files_to_drop(files_.views(t_), disk_.room(), n_bytes);
    for (size_t i = 0; i < n && !files_.files.empty(); ++i) {
        disk_.bytes -= files_.files.front().bytes;
        files_.files.erase(files_.files.begin());
    }
}

} // namespace llama_preempt
