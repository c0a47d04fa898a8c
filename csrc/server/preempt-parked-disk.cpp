// llama-preempt: the parked slots' disk tier, the out-of-line part of parked_slots
// (preempt-parked.h): the server's directory under --preempt-disk, a disk park's file written from
// its host copy and read back, and a state larger than what parks may hold streamed to its file
// and back one chunk at a time (store/preempt-stream.h).
#include "preempt-parked.h"

#include "preempt-disk-io.h"   // disk_hasher
#include "preempt-slot-file.h"   // model_state_identity()
#include "preempt-tier-disk.h"   // disk_hold()
#include "preempt-version.h"   // version_line()

#include "llama.h"

#include <algorithm>
#include <string>
#include <vector>

namespace llama_preempt {

// --cache-persist: the key of the kept directory, a fingerprint of what a cached state's bytes depend
// on: the model's identity for its states (the one a slot file carries) and the other KV-relevant flags
static std::string preempt_cache_key(const common_params & params, llama_context * ctx) {
    disk_hasher h;
    const std::string key = string_format("%s|%s|n_ctx=%u|fa=%d|swa_full=%d|unified=%d", version_line(),
                                          model_state_identity(params, ctx).c_str(), llama_n_ctx(ctx),
                                          (int) params.flash_attn_type, (int) params.swa_full, (int) params.kv_unified);
    h.update((const uint8_t *) key.data(), key.size());
    return string_format("%016llx", (unsigned long long) h.digest());
}

// once, from preempt_init(): the server's own directory under --preempt-disk
void parked_slots::open_disk(const common_params & params, llama_context * ctx_tgt) {
    if (!cfg_.on || cfg_.disk_budget == 0 || cfg_.mode == preempt_mode::recompute) {
        return;
    }
    std::string err, note;
    // --cache-persist: a directory kept across restarts, named by the model and the KV-relevant flags
    persist_key_ = params.preempt_cache_persist ? preempt_cache_key(params, ctx_tgt) : "";
    swap_.disk = disk_store::open(cfg_.disk_dir, cfg_.disk_budget, cfg_.knobs.disk, err,
                                                 persist_key_, &note);
    if (!note.empty()) {
        SRV_WRN("preemption: the prompt cache is not kept across restarts: %s\n", note.c_str());
    }
    if (!swap_.disk) {
        // checked before the model loaded (preempt_disk_error()): only a directory changed since lands here
        SRV_ERR("preemption: no disk tier, %s\n", err.c_str());
        return;
    }
    // the store's own notes (its directory made again, a full filesystem, files left at exit)
    swap_.disk->set_log([](bool warn, const std::string & msg) {
        if (warn) {
            SRV_WRN("%s\n", msg.c_str());
        } else {
            SRV_INF("%s\n", msg.c_str());
        }
    });
    SRV_INF("preemption: disk tier in %s (mode 0700, %s)%s\n", swap_.disk->dir().c_str(),
            swap_.disk->persistent() ? "its cached prompts kept at a clean exit" : "removed at exit",
            swap_.disk->n_stale_removed() > 0
                ? string_format(", removed %d left by servers that are gone", swap_.disk->n_stale_removed()).c_str()
                : "");
}

void parked_slots::count_disk_failure(int32_t id, const disk_result & r, const char * when,
                                              const char * outcome) {
    if (is_disk_failure(r.error)) {
        metrics_.preempt.disk_failures[(int) r.error]++;
    }
    PSLT_WRN(port_, id, "disk park: %s failed (%s): %s; %s\n", when, disk_error_name(r.error), r.why.c_str(), outcome);
}

// a file's write or read in the disk tier's counters (its bytes and time: the rates /metrics shows)
void parked_slots::count_disk_io(const disk_result & r) {
    const bool write = r.outcome == disk_outcome::written;
    (write ? metrics_.preempt.n_disk_write_bytes_total : metrics_.preempt.n_disk_read_bytes_total) += r.bytes;
    (write ? metrics_.preempt.n_disk_write_us_total : metrics_.preempt.n_disk_read_us_total) += (uint64_t) r.t_us;
}

// right after the park's swap_out(), its host copy within what parks may hold: its file is written
// in the background (a state that does not fit is streamed instead: stream_to_disk()). Not ok:
// nothing is on disk; the host copy is kept (kept_in_ram: a RAM park).
disk_result parked_slots::disk_park(int32_t id, swap_result & out) {
    prompts_.make_room(table_[id].swap.bytes(), swap_.disk->room());  // parks first on disk
    const auto r = llama_preempt::disk_park(table_[id].swap, swap_, true, std::move(out.ref));
    if (!r.ok()) {
        count_disk_failure(id, r, "writing its file",
                           r.outcome == disk_outcome::kept_in_ram ? "kept in host RAM" : "the slot recomputes instead");
    }
    return r;
}

// once per step: writes that may start (their transfer settled) or that finished; `keep`: the slot
// that came back first in the last plan keeps its host copy (its file would be read back at once)
void parked_slots::disk_step(int32_t keep) {
    if (!swap_.disk) {
        return;
    }
    // a read ahead holds RAM another victim may want: it is let go when what is left (at the start
    // of the step) is short of another state of its size, unless it is still the next one back
    const size_t left = ram_room();
    for (int32_t id = 0; id < port_.n_slots(); ++id) {
        auto & st = table_[id].swap;
        if (port_.facts(id).phase != upstream_phase::parked || !st.disk.on()) {
            continue;
        }
        const auto hold = disk_hold(id, keep, st.disk.total(), left);
        const auto r = llama_preempt::disk_step(st, swap_, hold.keep_copy, hold.keep_read);
        if (!r.ok()) {
            count_disk_failure(id, r, "writing its file in the background", "kept in host RAM");
        } else if (r.outcome == disk_outcome::written) {
            count_disk_io(r);
            PSLT_DBG(port_, id, "disk park: %.2f MiB written in the background in %.2f ms%s\n", r.bytes / 1048576.0,
                    r.t_us / 1000.0, id == keep ? ", host copy kept: it comes back next" : ", host RAM freed");
        } else if (r.outcome == disk_outcome::dropped) {
            PSLT_DBG(port_, id, "%s", "disk park: its read ahead is let go, another slot comes back first\n");
        }
    }
}

// at the resume, before swap_in(): the state back in host RAM (cached prompts give way to its
// bytes). False with `why`: the state is lost and the slot recomputes (the failure is counted here).
bool parked_slots::disk_read_back(int32_t id, std::string & why) {
    host_.reserve(prompts_.held(), table_[id].swap.disk.total(), host_use::transit);
    const auto r = llama_preempt::disk_read_back(table_[id].swap, swap_);
    if (r.verified != copy_check::none) {
        metrics_.preempt.n_swap_verify_total++;
        if (r.verified == copy_check::wrong) {
            metrics_.preempt.n_swap_verify_mismatch_total++;
            PSLT_ERR(port_, id, "%s", "copy guard: the state read back from disk differs from upstream's bytes taken at the park\n");
        }
    }
    if (r.error != disk_error::none) {
        count_disk_failure(id, r, r.ok() ? "writing its file in the background" : "reading its file back",
                       r.ok() ? "restored from the host copy" : "the slot recomputes instead");
    }
    if (!r.ok()) {
        why = r.why;
        return false;
    }
    if (r.outcome == disk_outcome::from_memory) {
        metrics_.preempt.n_disk_restore_from_memory_total++;
        PSLT_DBG(port_, id, "%s", "disk park: restored from the host copy (its file still being written, or kept)\n");
    } else {
        count_disk_io(r);
        PSLT_DBG(port_, id, "disk park: %.2f MiB read back in %.2f ms%s\n", r.bytes / 1048576.0, r.t_us / 1000.0,
                r.outcome == disk_outcome::read_ahead ? " (ahead of its resume)" : "");
    }
    return true;
}

// A park whose state does not fit what parks may hold of the host budget: straight from the pool
// to its file, one chunk at a time (store/preempt-stream.h), never a host copy of the whole state.
// The loop waits for the write. False: nothing is on disk, the slot recomputes (counted here).
bool parked_slots::stream_to_disk(int32_t id) {
    const auto n_state = sized_id_ == id ? sized_ : size_state(seq(id));
    sized_id_ = -1;
    auto & st = table_[id].swap;
    prompts_.make_room(n_state.total(), swap_.disk->room());  // parks first on disk
    const auto r = disk_park_streamed(st, seq(id), n_state, swap_);
    if (!r.ok()) {
        count_disk_failure(id, r, "streaming its state to its file", "the slot recomputes instead");
        return false;
    }
    st.copied_by = "a stream to its file";
    count_disk_io(r);
    PSLT_DBG(port_, id, "disk park: %.2f MiB streamed to its file in %.2f ms through %zu KiB (it does not fit what parks may hold "
                  "of the host budget)\n", r.bytes / 1048576.0, r.t_us / 1000.0, disk_store::CHUNK >> 10);
    return true;
}

// the resume of a streamed park: its file straight back into the pool. Not ok: the state is lost,
// the policy falls back on recompute.
move_result parked_slots::restore_streamed(int32_t id, move_result m, size_t n_bytes) {
    const auto r = disk_restore_streamed(table_[id].swap, seq(id), swap_, guard_.due(false));
    if (r.verified != copy_check::none) {
        swap_result check;  // counted as any restore's check, by the devices its slices moved one at a time
        check.verified = r.verified;
        check.mismatch = r.mismatch;
        check.report   = r.report;
        guard_count(id, false, check);
        if (r.verified == copy_check::wrong) {
            PSLT_ERR(port_, id, "copy guard: the cells streamed back differ from its file at %s\n", r.mismatch.describe().c_str());
        }
    }
    if (!r.ok()) {
        if (r.verified != copy_check::wrong) {
            count_disk_failure(id, r, "streaming its file back", "the slot recomputes instead");
        }
        return restore_failed(id, m, n_bytes, "disk", r.why);
    }
    count_disk_io(r);
    PSLT_DBG(port_, id, "disk park: %.2f MiB streamed back from its file in %.2f ms\n", r.bytes / 1048576.0, r.t_us / 1000.0);
    return m;
}

} // namespace llama_preempt
