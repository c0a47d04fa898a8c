// llama-preempt: the parked slots, a unit of its own behind the port (preempt-port.h). The policy
// decides every park's tier and shape and what a failure falls back to (apply_plan(),
// park_victim(), resume_parked() in policy/preempt-executor.h); this class carries that out on the
// real slots, named by index: a slot's state copied to host RAM and back, through its file on the
// disk tier, the slot moved out of the pool and back (the port's phases), the copy guard's checks
// counted and reacted to, and every park and resume counted, notified and logged. The tiers
// (preempt-tiers.h) are adapters over it.
//
// It owns the copies' state: the copier, its warm host memory, the measured rates and the disk
// tier (swap_host), and the copy guard. It is handed the port (the slots, their prompts and
// phases, the notices), upstream's metrics, the settings (the guard turns SWAP off by rewriting
// the mode), the host budget it reserves through, the prompt cache (whose files give way to parks
// and whose held bytes the budget counts) and the Engine's step log.
// preempt-parked.cpp holds the parks and resumes, preempt-parked-disk.cpp the disk tier's side.
#pragma once

#include "preempt-config.h"
#include "preempt-disk-park.h"
#include "preempt-executor.h"
#include "preempt-host-ram.h"
#include "preempt-port.h"
#include "preempt-prefix.h"  // a prefix another slot holds, linked (a new prompt, a recomputed slot's replay)
#include "preempt-prompt-cache.h"
#include "preempt-step-recorder.h"
#include "preempt-swap.h"
#include "preempt-verify.h"

#include "server-common.h"  // server_metrics

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace llama_preempt {

class parked_slots {
public:
    parked_slots(park_port & port, slot_table & table, server_metrics & metrics, preempt_config & cfg, host_ram & host,
                 cached_prompts & prompts, step_recorder & steps)
        : port_(port), table_(table), metrics_(metrics), cfg_(cfg), host_(host), prompts_(prompts), steps_(steps) {}

    parked_slots(const parked_slots &) = delete;
    parked_slots & operator=(const parked_slots &) = delete;

    // once, after the settings are read: each slot's state, the copier, its host memory, the rates, the guard
    void init() {
        swap_.copier = std::make_shared<seq_copier>(cfg_.knobs.route);
        swap_.copier->set_faults(cfg_.knobs.faults);
        guard_.n_first = cfg_.verify_first;
        swap_.pool  = std::make_shared<host_pool>(cfg_.pool_cap());
        swap_.rates = cfg_.rates;
        swap_.knobs = cfg_.knobs.swap;
    }
    void open_disk(const common_params & params, llama_context * ctx_tgt);  // the disk tier under --preempt-disk (preempt-parked-disk.cpp)
    // the longest prefix of `want` another slot holds that slot `id` would link (preempt-prefix.h), if
    // prefixes are shared here and it beats the `n_own` tokens its own cells keep (donor -1: none)
    prefix_link find_link(int32_t id, const server_tokens & want, int32_t n_own) const;
    // slot `id`'s sequence links that prefix: a new prompt, or a recomputed slot's replay. Returns the
    // tokens linked (0: none)
    int32_t link_prefix(int32_t id, const server_tokens & want, int32_t n_own);

    // a slot's preemption state (the table preempt_server hands it; the tiers read it here)
    slot_preempt_state & state(int32_t id) { return table_[id]; }
    const slot_preempt_state & state(int32_t id) const { return table_[id]; }

    // the copies' state: the copier, its warm host memory, the measured rates, the disk tier
    swap_host & swap() { return swap_; }
    const swap_host & swap() const { return swap_; }
    const std::string & persist_key() const { return persist_key_; }
    const preempt_config & config() const { return cfg_; }
    // host RAM for `bytes` on their way into the pool (a disk park's read back, a compressed
    // state expanded): cached prompts give way; always let in (a parked request's own bytes)
    void reserve_transit(size_t bytes) { host_.reserve(prompts_.held(), bytes, host_use::transit); }

    // bytes parked slots hold in host RAM now, and what parks may still take of it
    size_t ram_held() const {
        size_t n = 0;
        for (int32_t id = 0; id < port_.n_slots(); ++id) {
            n += table_[id].swap_bytes();
        }
        return n;
    }
    size_t ram_room() const { return ram_left(host_.limits().parks(), ram_held()); }
    // bytes a disk park may still take (0: no disk tier); prompt files give way to parks: their bytes count as room
    size_t disk_room() const { return swap_.disk ? swap_.disk->room() + prompts_.disk_bytes() : 0; }

    // --- the executor's moves (preempt_server, preempt-server.cpp, binds them to the interface) ---

    // the victim as the policy sees it; its state is sized only when it may be copied (and kept for
    // that copy, which follows in the same park: nothing moves in between)
    victim_state victim(int32_t id, park_reason reason);

    parked_state parked(int32_t id) const;

    void park_as(int32_t id, const park_order & o);
    void resume_as(int32_t id, park_tier from, const move_result & restore);

    // restore ahead, for the slot the plan brings back next, while others decode (the tiers'
    // read_ahead()): a RAM park's buffer uploaded to the device (where the copier can), a disk
    // park's file read into host RAM
    void upload_ahead(int32_t id);
    void read_file_ahead(int32_t id);

    // --- the tiers' copies (preempt-tiers.h) ---

    bool copy_to_host(int32_t id, host_use use, swap_result & r);
    move_result restore_begin(int32_t id);
    move_result restore_from_host(int32_t id, move_result m, size_t n_bytes, const char * where);
    move_result restore_failed(int32_t id, move_result m, size_t n_bytes, const char * where, const std::string & why);
    disk_result disk_park(int32_t id, swap_result & out);
    bool disk_read_back(int32_t id, std::string & why);
    bool stream_to_disk(int32_t id);
    move_result restore_streamed(int32_t id, move_result m, size_t n_bytes);
    void take_verdict(int32_t id);
    void forget(int32_t id) { table_[id].swap.free(); }  // its file goes first; its tokens stay with the slot, to replay

    // once per step, before the plan: transfers started by the last step's parks have had a decode to
    // overlap with, and the guard's check of a park is decided once its transfer landed; then the
    // disk writes (`keep`: the slot that came back first in the last plan keeps its host copy)
    void step(int32_t keep);

private:
    seq_contexts seq(int32_t id) const { return port_.contexts_of(id); }

    void guard_count(int32_t id, bool park, const swap_result & r);
    void disk_step(int32_t keep);
    void count_disk_failure(int32_t id, const disk_result & r, const char * when, const char * outcome);
    void count_disk_io(const disk_result & r);

    park_port &      port_;
    slot_table &     table_;
    server_metrics & metrics_;
    preempt_config & cfg_;
    host_ram &       host_;
    cached_prompts & prompts_;
    step_recorder &  steps_;

    swap_host    swap_;           // the copier, warm host memory and measured rates of every swap, the disk tier
    verify_guard guard_;          // which swap copies are checked byte for byte (--preempt-verify)
    std::string  persist_key_;    // --cache-persist: the kept directory's key, computed once by open_disk()
    state_sizes  sized_;          // the last victim's state, as victim() sized it for its copy
    int32_t      sized_id_ = -1;  // whose (-1: none)
};

} // namespace llama_preempt
