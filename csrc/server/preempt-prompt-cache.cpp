// Upstream's prompt cache as preemption sees it (preempt-prompt-cache.h): the disk tier's
// taking over at start, and the prompts kept at a clean exit (--cache-persist).
#include "preempt-prompt-cache.h"

#include <algorithm>

namespace llama_preempt {

// once, after the disk tier opened (`disk` null: none): cached prompts that leave RAM go to it;
// with --cache-persist (`persist_key`), the last run's files are taken back
void cached_prompts::init(const std::shared_ptr<disk_store> & disk, const std::string & persist_key) {
    if (!cache_) {
        return;
    }
    if (!disk) {
        // no tier below: a prompt upstream drops is freed, and its pages go back to the system at
        // the next step (glibc keeps a freed ~30 MiB state otherwise: RSS above the host budget)
        cache_->on_evict = [this](server_prompt_cache_state &) { host_.pages_freed_later(); };
        return;
    }
    disk_ = std::make_unique<prompt_disk>(disk);
    persistent_ = disk->persistent();
    if (persistent_) {
        const auto r = disk_->load_index(persist_key);
        disk_->keep_at_exit(persist_key);
        SRV_INF("preemption: --cache-persist: %d cached prompts of the last run taken back (%.2f MiB of the disk tier's "
                "%.0f MiB)%s%s\n", r.n_taken, r.bytes / 1048576.0, disk->budget() / 1048576.0,
                r.n_over > 0 ? string_format(", %d older ones removed (%.2f MiB) to fit --preempt-disk-mib", r.n_over,
                                             r.bytes_over / 1048576.0).c_str() : "",
                r.n_unlisted > 0 ? string_format(", %d parked slots' files of a run that ended removed", r.n_unlisted).c_str() : "");
        if (r.n_rebuilt > 0 || r.n_dropped > 0) {
            // the index lost (a crash, a damaged disk, a hand) or files that do not check out: the
            // prompts are taken back from the files themselves, and what is dropped is said
            SRV_WRN("preemption: --cache-persist: the index of the kept prompts was %s: %d prompt files rebuilt from their "
                    "own tokens, %d dropped%s%s\n", r.index_ok ? "read" : r.index_why.c_str(), r.n_rebuilt, r.n_dropped,
                    r.n_dropped > 0 ? " (" : "", r.n_dropped > 0 ? (r.why_dropped + ")").c_str() : "");
        }
    }
    cache_->on_evict  = [this](server_prompt_cache_state & state) { spill(state); };
    cache_->on_lookup = [this](server_prompt & prompt, const server_tokens & tokens, llama_context * tgt, llama_context * dft,
                               int32_t id) { lookup(prompt, tokens, { tgt, dft, id }); };
    cache_->on_skip   = [this](const server_prompt & prompt, llama_context * tgt, llama_context * dft, int32_t id) {
        save_skipped(prompt, { tgt, dft, id });
    };
    SRV_INF("%s", "preemption: cached prompts that leave host RAM go to the disk tier, and come back when a request's "
                  "prefix matches (parked slots first on disk too); one larger than the RAM cache is streamed to it and "
                  "back, one chunk at a time\n");
}

// --cache-persist, at a clean exit (the drain is done, every slot idle; the Engine's close): the
// prompts still in the slots' cells are streamed to disk after the RAM cache's, so the
// conversations served last, the likeliest to come back, are kept with the rest
void cached_prompts::keep_slot_prompts(std::vector<slot_prompt> idle) {
    if (!persists()) {
        return;
    }
    // the RAM cache first, oldest first, then the slots' prompts (the conversations answered
    // last), least recently used first, each streamed from its cells: at the disk tier's limit
    // the oldest files give way, so the newest are the ones kept
    const size_t n_cached = spill_all();
    std::stable_sort(idle.begin(), idle.end(), [](const slot_prompt & a, const slot_prompt & b) {
        return a.t_last_used < b.t_last_used;
    });
    int32_t n = 0;
    for (const slot_prompt & s : idle) {
        n += s.prompt->n_tokens() > 0 && stream_prompt(*s.prompt, s.sc, size_state(s.sc), "at exit") ? 1 : 0;
    }
    SRV_INF("preemption: --cache-persist: prompts still in the slots at exit written to the disk tier: %d (and %zu cached "
            "prompts from RAM)\n", n, n_cached);
}

} // namespace llama_preempt
