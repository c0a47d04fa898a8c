// llama-preempt: upstream's prompt cache as preemption sees it, a unit of its own (compiled on its
// own: upstream's prompt cache, tokens, tasks and queue are in its headers). It owns what gives way
// to the host budget (the cache's cap: host_cache) and the cache's disk side: prompts that leave
// host RAM go to files (store/preempt-prompt-disk.h, no server types) and come back when a
// request's prefix matches, by the policy's choices (policy/preempt-memory.h). It hooks into
// upstream's server_prompt_cache (on_evict, on_lookup, on_skip: patches/0003).
//
// What it is handed, and keeps: upstream's prompt cache and metrics (references), the host budget
// it reserves through, the measured rates (read, and a read back observed), the queue whose oldest
// waiting task a file is read ahead for, and how to ask the bytes parked slots hold in host RAM now
// (the server's to count; upstream's lookups come between steps, after parks and resumes).
// preempt-prompt-cache.cpp holds the RAM side and the exit, preempt-prompt-cache-disk.cpp the disk side.
#pragma once

#include "preempt-host-ram.h"
#include "preempt-memory.h"  // the policy's choices over the prompt files
#include "preempt-prompt-disk.h"
#include "preempt-swap.h"  // seq_contexts, state_sizes

#include "server-common.h"
#include "server-queue.h"
#include "server-task.h"

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace llama_preempt {

// a slot's prompt still in its cells, as --cache-persist keeps it at exit (the port hands the idle ones)
struct slot_prompt {
    const server_prompt * prompt = nullptr;
    seq_contexts          sc;
    int64_t               t_last_used = -1;
};

// What the prompt cache asks of the server beside it, as one interface (preempt_server answers):
// the host RAM parked slots hold now (the host budget gives cached prompts what parks leave), and
// the pool's cells a prompt file streamed into a slot may take (step_port::room_cells()).
class cache_neighbours {
public:
    virtual ~cache_neighbours() = default;
    virtual size_t parked_bytes() const = 0;
    virtual size_t room_cells(int32_t id, size_t need) = 0;
};

class cached_prompts final : public host_cache {
public:
    cached_prompts(std::unique_ptr<server_prompt_cache> & cache, server_metrics & metrics, host_ram & host,
                   cost_rates & rates, server_queue & queue, cache_neighbours & near)
        : cache_(cache), metrics_(metrics), host_(host), rates_(rates), queue_(queue), near_(near) {}

    // --cache-persist: at a clean exit the prompts still in the RAM cache go to disk too, so the
    // next server finds them (upstream's cache, a member of server_context_impl, outlives this)
    ~cached_prompts() override { spill_ram_cache(); }

    cached_prompts(const cached_prompts &) = delete;
    cached_prompts & operator=(const cached_prompts &) = delete;

    // the host budget's cap: upstream's limit, its evictions counted
    bool cap(size_t limit) override {
        auto & pc = *cache_;
        // upstream reads a limit of 0 as "no limit": no room at all is one byte, which every entry exceeds
        pc.limit_size = limit == SIZE_MAX ? 0 : std::max<size_t>(limit, 1);
        if (pc.limit_size == 0 || pc.size() <= pc.limit_size) {
            return false;
        }
        const size_t n_before = pc.states.size();
        pc.update();
        metrics_.preempt.n_prompt_cache_evicted_total += n_before - pc.states.size();
        return true;
    }

    // once, after the disk tier opened (`disk` null: none): cached prompts that leave RAM go to it;
    // with --cache-persist (`persist_key`), the last run's files are taken back
    void init(const std::shared_ptr<disk_store> & disk, const std::string & persist_key);

    bool on_disk() const { return disk_ != nullptr; }
    bool persists() const { return disk_ && cache_ && persistent_; }

    // once per step: finished writes free their host bytes, and the oldest waiting request's file is read ahead
    void step() {
        if (disk_) {
            count_writes(disk_->step());
            read_ahead();
        }
    }

    // --cache-persist, at a clean exit (the drain is done, every slot idle; the Engine's close): the
    // prompts still in the slots' cells are streamed to disk after the RAM cache's, so the
    // conversations served last, the likeliest to come back, are kept with the rest
    void keep_slot_prompts(std::vector<slot_prompt> idle);

    // before a disk park's write (`room`: what the disk tier has now): parks first on disk, the
    // oldest prompt files give way
    void make_room(size_t n_bytes, size_t room, const char * to = "a park") {
        if (!disk_) {
            return;
        }
        const size_t n = prompt_files_to_drop(disk_->views(), room, n_bytes);
        if (disk_->drop_oldest(n) > 0) {
            SRV_DBG("preemption: %zu older prompt files gave way on disk to %s\n", n, to);
        }
    }

    size_t disk_bytes() const { return disk_ ? disk_->bytes_held() : 0; }      // prompt files' bytes (a park may take them)
    size_t ahead_bytes() const { return disk_ ? disk_->bytes_ahead() : 0; }    // a file read ahead: in the host budget

private:
    // every prompt of the RAM cache to the disk tier (one write in flight at a time); how many
    size_t spill_all() {
        const size_t n = cache_->states.size();
        for (auto & state : cache_->states) {
            spill(state);
        }
        cache_->states.clear();
        return n;
    }

    void spill_ram_cache() {
        if (persists()) {
            const size_t n = spill_all();
            SRV_INF("preemption: --cache-persist: %zu cached prompts in RAM written to the disk tier at exit\n", n);
        }
    }

    void spill(server_prompt_cache_state & state);
    void save_skipped(const server_prompt & prompt, const seq_contexts & sc);
    bool stream_prompt(const server_prompt & prompt, const seq_contexts & sc, const state_sizes & n, const char * why);
    prompt_read_choice to_read(const server_tokens & tokens, const std::vector<prompt_file_view> & files,
                               size_t n_slot = 0, size_t stream_cells = 0) const;
    void read_ahead();
    void lookup(server_prompt & prompt, const server_tokens & tokens, const seq_contexts & sc);
    void stream_back(int32_t i, size_t n_common, server_prompt & prompt, const seq_contexts & sc);
    void forget_ahead(bool say);
    void count_failure(disk_error error);
    void count_read(size_t n_bytes, int64_t t_us);
    bool restore_into(const seq_contexts & sc, const prompt_read & got);

    // finished prompt writes: their host copies' pages go back to the system (not to the
    // allocator's free lists), failed ones are counted
    void count_writes(const prompt_disk::step_result & st) {
        metrics_.preempt.n_prompt_cache_disk_failures_total += (uint64_t) st.n_failed;
        if (st.n_freed > 0) {
            host_.pages_freed();
        }
    }

public:
    // what the host budget counts that lives in the slots and the prompt files
    host_held held() const { return { near_.parked_bytes(), ahead_bytes() }; }

private:
    std::unique_ptr<server_prompt_cache> &       cache_;    // upstream's (null: --cache-ram 0)
    server_metrics &                             metrics_;
    host_ram &                    host_;
    cost_rates &                  rates_;
    server_queue &                               queue_;
    cache_neighbours &                           near_;     // the parked slots' host RAM, the pool's room for a slot
    std::unique_ptr<prompt_disk>  disk_;     // null without a disk tier or a prompt cache
    bool persistent_ = false;
    bool said_skip_  = false;
    bool reading_    = false;  // a file is being read back or ahead: a spill does not make others give way
};

} // namespace llama_preempt
