// Upstream's RAM prompt cache and slot choice in the simulator (preempt-sim-cache.h): prompts as
// token counts, the cache's own rules, the prompt files' bookkeeping, and the simulated server's
// launch of waiting requests into idle slots (what it saves to and loads from the cache, whose disk
// side is sim_prompts, preempt-sim-prompts.cpp).
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

bool sim_prompt_cache::holds(const sim_tokens & tokens) const {
    for (const auto & e : states_) {
        if (e.tokens.common_prefix(tokens) == (size_t) tokens.n) {
            return true;
        }
    }
    return false;
}

bool sim_prompt_cache::save(const sim_tokens & tokens, size_t n_bytes) {
    if (tokens.n == 0 || holds(tokens)) {
        return false;  // nothing, or already held
    }
    if (over_limit(n_bytes)) {
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

// --- the simulated server's side of it: upstream's slot choice and launch ---

// upstream's get_available_slot(): the idle slot whose prompt shares the largest fraction of this
// one's (above --slot-prompt-similarity), else the least recently used; the cache is updated when
// the slot's prompt is mostly lost (or was not chosen for it)
sim_slot * pick_slot(std::vector<sim_slot> & slots, const sim_tokens & tokens, float similarity, bool has_cache,
                     bool & update_cache) {
    sim_slot * ret = nullptr;
    update_cache = false;
    if (similarity != 0.0f) {
        float f_best = 0;
        for (auto & s : slots) {
            if (s.phase != slot_phase::idle || s.tokens.n == 0) {
                continue;
            }
            const float f = float(s.tokens.common_prefix(tokens)) / tokens.n;
            if (f > f_best && f > similarity) {
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
    update_cache = update_cache && has_cache;
    return ret;
}

// the waiting requests take idle slots, as upstream launches its queued tasks
void sim_server::admit() {
    while (!waiting.empty()) {
        const int32_t id = waiting.front();
        const sim_tokens tokens = tokens_of(id);
        bool update_cache = false;
        sim_slot * slot = pick_slot(slots, tokens, p.slot_prompt_similarity, prompts.on(), update_cache);
        if (!slot) {
            return;
        }
        waiting.pop_front();
        const auto & rq = reqs[id];
        auto & s = *slot;
        s.from = sim_prompt_source::slot;
        if (update_cache) {
            // the slot's prompt to the RAM cache, and the entry (or prompt file) that serves this one better into the slot
            prompts.save(s.tokens);
            load_prompt(s, tokens);
            prompts.update();
        }
        s.req = id;
        s.t_arrival = t;
        if (rq.n_prompt + rq.n_gen + 1 > p.n_pool) {
            finish(s, sim_outcome::failed);  // larger than a slot's context: upstream's size check
            continue;
        }
        s.phase  = slot_phase::prompt;
        s.is_new = true;
        if (prompts.on()) {
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

// prompt_load() into the slot: what it held is replaced by the cached prompt that serves `tokens` better
void sim_server::load_prompt(sim_slot & s, const sim_tokens & tokens) {
    // as the server's preempt_room_cells(): the other slots' cells, the idle ones as going (upstream
    // clears them right after the load), cleared now when a file streamed into this one needs them
    const auto room = [&](int32_t need) {
        int32_t held = 0;
        int32_t idle = 0;
        for (const auto & o : slots) {
            if (&o != &s) {
                held += o.cells;
                idle += o.phase == slot_phase::idle ? o.cells : 0;
            }
        }
        if (need > 0 && idle > 0 && held + need > p.n_pool) {
            for (auto & o : slots) {
                if (&o != &s && o.phase == slot_phase::idle) {
                    clear_idle(o);
                }
            }
        }
        return std::max(0, p.n_pool - (held - idle));
    };
    const auto r = prompts.load(s.tokens, tokens, p.n_pool - (cells_used() - s.cells), room);
    if (r.cleared || r.loaded) {
        s.tokens = r.got.tokens;
        s.cells  = r.got.tokens.n;
    }
    if (r.loaded) {
        s.from = r.got.from_disk ? sim_prompt_source::disk : sim_prompt_source::ram;
    }
}

void sim_server::clear_idle(sim_slot & s) {
    if (prompts.on() && s.tokens.n > 0) {
        prompts.save(s.tokens);
        prompts.update();
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

} // namespace llama_preempt
