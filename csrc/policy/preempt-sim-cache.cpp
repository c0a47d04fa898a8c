// The simulated server's prompt cache (preempt-sim-cache.h): upstream's RAM cache and slot choice,
// and the disk side as csrc/server/preempt-prompt-disk.inc runs it, each choice the policy's
// (policy/preempt-memory.h) and each byte into host RAM asked of the one host budget (host_ram).
#include "preempt-sim.h"

#include <algorithm>
#include <cstdint>

namespace llama_preempt {

// --- prompts as token counts ---

size_t sim_tokens::common_prefix(const sim_tokens & o) const {
    if (key == o.key && n_shared == o.n_shared) {
        return (size_t) std::min(n, o.n);
    }
    return (size_t) std::min({ n, o.n, n_shared, o.n_shared });
}

std::vector<int32_t> sim_tokens::ids() const {
    std::vector<int32_t> out((size_t) std::max(0, n));
    for (int32_t i = 0; i < n; ++i) {
        if (i < n_shared) {
            out[i] = i;  // the common system prompt's
            continue;
        }
        // the chat's own: a mix of its key and position, above every shared id
        uint64_t z = (uint64_t) key * 0x9E3779B97F4A7C15ull + (uint64_t) i + 0x632BE59BD9B4E019ull;
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        out[i] = (int32_t) (0x40000000u | (uint32_t) ((z ^ (z >> 31)) & 0x3fffffffu));
    }
    return out;
}

const char * sim_prompt_source_name(sim_prompt_source s) {
    switch (s) {
        case sim_prompt_source::none: return "none";
        case sim_prompt_source::slot: return "slot";
        case sim_prompt_source::ram:  return "ram";
        case sim_prompt_source::disk: return "disk";
    }
    return "?";
}

// --- upstream's RAM cache (server_prompt_cache, tools/server/server-task.cpp) ---

size_t sim_prompt_cache::bytes() const {
    size_t n = 0;
    for (const auto & e : states_) {
        n += e.bytes;
    }
    return n;
}

size_t sim_prompt_cache::n_tokens() const {
    size_t n = 0;
    for (const auto & e : states_) {
        n += (size_t) e.tokens.n;
    }
    return n;
}

void sim_prompt_cache::evict_front() {
    evicted_.push_back(states_.front());
    states_.pop_front();
}

std::vector<sim_cached_prompt> sim_prompt_cache::take_evicted() {
    std::vector<sim_cached_prompt> out;
    out.swap(evicted_);
    return out;
}

bool sim_prompt_cache::cap(size_t limit) {
    // upstream reads a limit of 0 as "no limit": no room at all is one byte, which every entry exceeds
    limit_bytes_ = limit == SIZE_MAX ? 0 : std::max<size_t>(limit, 1);
    if (limit_bytes_ == 0 || bytes() <= limit_bytes_) {
        return false;
    }
    const size_t n_before = states_.size();
    update();
    n_evicted += n_before - states_.size();
    return true;
}

bool sim_prompt_cache::save(const sim_tokens & tokens, size_t n_bytes) {
    if (tokens.n == 0) {
        return false;
    }
    for (const auto & e : states_) {
        if (e.tokens.common_prefix(tokens) == (size_t) tokens.n) {
            return false;  // already held
        }
    }
    if (limit_bytes_ > 0 && n_bytes > limit_bytes_) {
        return false;  // over the limit: skipped, not to disturb the cache
    }
    // the cached prompts it contains are obsolete (dropped, not evicted)
    states_.erase(std::remove_if(states_.begin(), states_.end(), [&](const sim_cached_prompt & e) {
        return e.tokens.common_prefix(tokens) == (size_t) e.tokens.n;
    }), states_.end());
    while (limit_bytes_ > 0 && !states_.empty() && bytes() + n_bytes > limit_bytes_) {
        evict_front();
    }
    states_.push_back({ tokens, n_bytes });
    return true;
}

int32_t sim_prompt_cache::best_for(const sim_tokens & slot, const sim_tokens & request) const {
    const size_t lcp_best = slot.common_prefix(request);
    float f_keep_best = slot.n > 0 ? float(lcp_best) / slot.n : -1.0f;  // an empty slot: any entry wins
    float f_sim_best  = float(lcp_best) / request.n;
    int32_t best = -1;
    for (size_t i = 0; i < states_.size(); ++i) {
        const auto & e = states_[i];
        const size_t lcp = e.tokens.common_prefix(request);
        const float f_keep = float(lcp) / e.tokens.n;
        const float f_sim  = float(lcp) / request.n;
        if (f_keep < 0.25f) {
            continue;  // do not trash a long prompt
        }
        if (f_keep_best < f_keep && f_sim_best < f_sim) {
            f_keep_best = f_keep;
            f_sim_best  = f_sim;
            best = (int32_t) i;
        }
    }
    return best;
}

sim_cached_prompt sim_prompt_cache::take(int32_t i) {
    const sim_cached_prompt e = states_[i];
    states_.erase(states_.begin() + i);
    return e;
}

void sim_prompt_cache::update() {
    while (limit_bytes_ > 0 && !states_.empty() && bytes() > limit_bytes_) {
        evict_front();
    }
    // the token limit, raised to what the size limit allows at the entries' mean size per token
    const double per_token = std::max(1.0, double(bytes()) / std::max<size_t>(1, n_tokens()));
    const size_t limit_tokens = limit_bytes_ > 0 ? std::max(limit_tokens_, (size_t) (limit_bytes_ / per_token)) : limit_tokens_;
    while (limit_tokens_ > 0 && !states_.empty() && n_tokens() > limit_tokens) {
        evict_front();
    }
}

size_t sim_prompt_cache::n_common_best(const sim_tokens & request) const {
    size_t n = 0;
    for (const auto & e : states_) {
        n = std::max(n, e.tokens.common_prefix(request));
    }
    return n;
}

// --- the disk side's files ---

std::vector<prompt_file_view> sim_prompt_files::views(double t_now) const {
    std::vector<prompt_file_view> v;
    v.reserve(files.size());
    for (const auto & f : files) {
        v.push_back({ f.ids.data(), f.ids.size(), f.bytes, t_now >= f.t_written });
    }
    return v;
}

int32_t sim_prompt_files::ahead() const {
    for (size_t i = 0; i < files.size(); ++i) {
        if (files[i].ahead) {
            return (int32_t) i;
        }
    }
    return -1;
}

size_t sim_prompt_files::bytes_ahead() const {
    const int32_t i = ahead();
    return i >= 0 ? files[i].bytes : 0;
}

int32_t sim_prompt_files::find(const sim_tokens & tokens) const {
    for (size_t i = 0; i < files.size(); ++i) {
        if (files[i].tokens == tokens) {
            return (int32_t) i;
        }
    }
    return -1;
}

size_t sim_prompt_files::bytes() const {
    size_t n = 0;
    for (const auto & f : files) {
        n += f.bytes;
    }
    return n;
}

// --- the simulated server's side of it ---

// the waiting requests take idle slots, as upstream launches its queued tasks
void sim_server::admit() {
    while (!waiting.empty()) {
        const int32_t id = waiting.front();
        const sim_tokens tokens = tokens_of(id);
        bool update_cache = false;
        sim_slot * slot = pick_slot(tokens, update_cache);
        if (!slot) {
            return;
        }
        waiting.pop_front();
        const auto & rq = reqs[id];
        auto & s = *slot;
        s.from = sim_prompt_source::slot;
        if (update_cache) {
            // the slot's prompt to the RAM cache, and the entry (or prompt file) that serves this one better into the slot
            save_prompt(s);
            load_prompt(s, tokens);
            cache->update();
            spill_evicted();
        }
        s.req = id;
        s.t_arrival = t;
        if (rq.n_prompt + rq.n_gen + 1 > p.n_pool) {
            finish(s, sim_outcome::failed);  // larger than a slot's context: upstream's size check
            continue;
        }
        s.phase  = slot_phase::prompt;
        s.is_new = true;
        if (cache) {
            // --cache-idle-slots (upstream's default with a cache): the other idle slots' prompts go
            // to the cache and, the pool being unified, their cells are freed
            for (auto & o : slots) {
                if (o.phase == slot_phase::idle) {
                    clear_idle(o);
                }
            }
        }
    }
}

void sim_server::clear_idle(sim_slot & s) {
    if (cache && s.tokens.n > 0) {
        save_prompt(s);
        cache->update();
        spill_evicted();
    }
    s.cells  = 0;
    s.tokens = {};
}

// the first chunk of a new slot's prompt: the cells it holds that its prompt starts with are kept
// (at least its last token is computed, for its logits)
void sim_server::start_prompt(sim_slot & s) {
    s.started = true;
    const sim_tokens tokens = tokens_of(s.req);
    const int32_t n_past = std::min((int32_t) s.tokens.common_prefix(tokens), tokens.n - 1);
    s.cells       = std::max(0, n_past);
    s.prompt_done = s.cells;
    s.tokens      = {};
    auto & r = res.requests[s.req];
    r.n_prompt_cached = s.cells;
    r.cached_from     = s.cells > 0 ? s.from : sim_prompt_source::none;
    res.n_prompt_tokens_computed += tokens.n - s.cells;
}


sim_tokens sim_server::tokens_of(int32_t req) const {
    const auto & rq = reqs[req];
    // a request of no chat has a key of its own (above every conversation's)
    const int64_t key = rq.conversation >= 0 ? rq.conversation : (int64_t(1) << 40) + req;
    return { key, rq.n_prompt, std::min(rq.n_shared, rq.n_prompt) };
}

size_t sim_server::state_bytes(int32_t n_tokens) const {
    return (size_t) (p.state_overhead_bytes + n_tokens * p.bytes_per_cell);
}

host_held sim_server::host_held_now() const {
    return { (size_t) parked_bytes, prompt_files.bytes_ahead() };
}

// upstream's get_available_slot(): the idle slot whose prompt shares the largest fraction of this
// one's (above --slot-prompt-similarity), else the least recently used; the cache is updated when
// the slot's prompt is mostly lost (or was not chosen for it)
sim_slot * sim_server::pick_slot(const sim_tokens & tokens, bool & update_cache) {
    sim_slot * ret = nullptr;
    update_cache = false;
    if (p.slot_prompt_similarity != 0.0f) {
        float f_best = 0;
        for (auto & s : slots) {
            if (s.phase != slot_phase::idle || s.tokens.n == 0) {
                continue;
            }
            const float f = float(s.tokens.common_prefix(tokens)) / tokens.n;
            if (f > f_best && f > p.slot_prompt_similarity) {
                f_best = f;
                ret = &s;
            }
        }
        if (ret && f_best * tokens.n / ret->tokens.n < 0.5f) {
            update_cache = true;
        }
    }
    if (!ret) {
        for (auto & s : slots) {
            if (s.phase == slot_phase::idle && (!ret || s.t_last_used < ret->t_last_used)) {
                ret = &s;
            }
        }
        update_cache = ret != nullptr;
    }
    update_cache = update_cache && cache;
    return ret;
}

void sim_server::save_prompt(const sim_slot & s) {
    const size_t n_bytes = state_bytes(s.tokens.n);
    if (cache->save(s.tokens, n_bytes)) {
        t += n_bytes / p.swap_out_bps;  // the state copied to host RAM while the loop waits
        res.peak_cache_bytes = std::max(res.peak_cache_bytes, (double) cache->bytes());
    }
    spill_evicted();
}

void sim_server::load_prompt(sim_slot & s, const sim_tokens & tokens) {
    if (!prompt_files.files.empty()) {
        lookup_prompt(tokens);  // the hook before upstream searches its RAM cache
    }
    const int32_t i = cache->best_for(s.tokens, tokens);
    if (i < 0) {
        return;
    }
    const auto & e = cache->states()[i];
    if (cells_used() - s.cells + e.tokens.n > p.n_pool) {
        s.cells  = 0;  // the restore finds no room: the load fails and the slot is cleared
        s.tokens = {};
        return;
    }
    const sim_cached_prompt got = cache->take(i);
    t += got.bytes / p.swap_in_bps;
    s.tokens = got.tokens;
    s.cells  = got.tokens.n;
    s.from   = got.from_disk ? sim_prompt_source::disk : sim_prompt_source::ram;
    res.n_prompt_cache_ram_hits += !got.from_disk;
}

void sim_server::spill_evicted() {
    for (auto & e : cache->take_evicted()) {
        if (disk_budget() == 0) {
            host.pages_freed_later();
            continue;
        }
        // the write before this one finishes first: one prompt's bytes at most wait outside the cache
        t = std::max(t, t_prompt_write);
        if (e.bytes > ram_left(disk_budget(), (size_t) disk_bytes)) {
            res.n_prompt_cache_disk_skipped++;
            continue;
        }
        sim_prompt_file f;
        f.tokens = e.tokens;
        f.ids    = e.tokens.ids();
        f.bytes  = e.bytes;
        f.t_written = t_prompt_write = disk_io(t, e.bytes / p.disk_write_bps);
        disk_bytes += e.bytes;
        res.peak_disk_bytes = std::max(res.peak_disk_bytes, disk_bytes);
        prompt_files.files.push_back(std::move(f));
        res.n_prompt_cache_spilled++;
    }
}

prompt_read_choice sim_server::prompt_to_read(const sim_tokens & tokens, const std::vector<prompt_file_view> & files) const {
    return choose_prompt_read(files, tokens.ids(), cache->n_common_best(tokens), host.limits().cache_room(host_held_now().parked),
                              tiers().rates);
}

void sim_server::lookup_prompt(const sim_tokens & tokens) {
    const auto choice = prompt_to_read(tokens, prompt_files.views(t));
    const int32_t i = choice.read() ? choice.file : -1;
    const int32_t ahead = prompt_files.ahead();
    const bool was_ahead = i >= 0 && i == ahead;
    if (ahead >= 0 && !was_ahead) {
        prompt_files.files[ahead].ahead = false;  // the waiting request went another way: its bytes go
        host.pages_freed();
    }
    if (i < 0) {
        return;
    }
    const size_t n_bytes = prompt_files.files[i].bytes;
    const sim_tokens want = prompt_files.files[i].tokens;
    if (!was_ahead && !host.reserve(host_held_now(), n_bytes, host_use::prompt_read)) {
        return;
    }
    spill_evicted();  // what gave way went to disk: the files may have moved
    const int32_t j = prompt_files.find(want);
    if (j < 0) {
        return;
    }
    const auto it = prompt_files.files.begin() + j;
    // its write lands, then its read (or the rest of the read ahead), while the loop waits
    t = std::max(t, it->t_written);
    if (it->ahead) {
        t = std::max(t, it->t_ahead);
    } else {
        t = disk_io(t, n_bytes / p.disk_read_bps);
    }
    disk_bytes -= n_bytes;
    cache->push({ it->tokens, n_bytes, true });
    prompt_files.files.erase(it);
    res.n_prompt_cache_disk_hits++;
    res.peak_cache_bytes = std::max(res.peak_cache_bytes, (double) cache->bytes());
    host.release(host_held_now());
    spill_evicted();
}

void sim_server::read_ahead_prompt() {
    if (!cache || prompt_files.files.empty()) {
        return;
    }
    const auto files = prompt_files.views(t);
    prompt_read_choice next;
    if (!waiting.empty()) {
        next = prompt_to_read(tokens_of(waiting.front()), files);
    }
    const auto act = choose_read_ahead(files, next, prompt_files.ahead());
    if (act.forget) {
        prompt_files.files[prompt_files.ahead()].ahead = false;
        host.pages_freed();
    }
    if (!act.start) {
        return;
    }
    const sim_tokens want = prompt_files.files[act.want].tokens;
    const size_t n_bytes = prompt_files.files[act.want].bytes;
    if (!host.reserve(host_held_now(), n_bytes, host_use::prompt_ahead)) {
        spill_evicted();
        return;
    }
    spill_evicted();  // the files may have moved
    const int32_t j = prompt_files.find(want);
    if (j >= 0) {
        auto & f  = prompt_files.files[j];
        f.ahead   = true;
        f.t_ahead = disk_io(std::max(t, f.t_written), n_bytes / p.disk_read_bps);
        res.n_prompt_cache_read_ahead++;
    }
}

void sim_server::drop_prompt_files(size_t n_bytes) {
    if (prompt_files.files.empty()) {
        return;
    }
    const size_t room = ram_left(disk_budget(), (size_t) disk_bytes);
    const size_t n = prompt_files_to_drop(prompt_files.views(t), room, n_bytes);
    for (size_t i = 0; i < n && !prompt_files.files.empty(); ++i) {
        disk_bytes -= prompt_files.files.front().bytes;
        prompt_files.files.erase(prompt_files.files.begin());
    }
}

} // namespace llama_preempt
