// llama-preempt: SWAP, one sequence's state between its llama contexts and host RAM.
//
// Swap out, swap in, verify, settle and restore ahead, as functions over the llama contexts, the
// slot's saved state (swap_state), and the host side that serves every slot (swap_host: the bulk
// copier, the pool of warm host memory and the measured rates). No server types: the server's
// parked slots (server/preempt-parked.cpp) call these and log what they report through the slot's logger.
#pragma once

#include "preempt-copy.h"
#include "preempt-disk-copy.h"
#include "preempt-types.h"  // cost_rates, park_tier: plain types, never the planner
#include "preempt-verify.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace llama_preempt {

// host RAM for one context's sequence state: a block from the server's host_pool (warm memory when
// one was freed before; pinned when a device backend offers it), left uninitialised (the copy fills
// it) and allocated without throwing, so a large swap neither zero-fills gigabytes on the main
// loop nor aborts. It is freed through the copier that fills it (`copier`): a transfer into it, or
// an upload from it ahead of its restore, may still be running then.
struct host_buffer {
    uint8_t * data = nullptr;
    size_t    size = 0;  // bytes of state (the block may be larger)
    std::shared_ptr<seq_copier> copier;  // the copier whose transfers may still use it

    host_buffer() = default;
    host_buffer(const host_buffer &) = delete;
    host_buffer & operator=(const host_buffer &) = delete;
    host_buffer(host_buffer && o) noexcept { take(o); }
    host_buffer & operator=(host_buffer && o) noexcept {
        if (this != &o) {
            reset();
            take(o);
        }
        return *this;
    }
    ~host_buffer() { reset(); }

    bool alloc(size_t n, const std::shared_ptr<host_pool> & from, ggml_backend_buffer_type_t pinned_buft);
    void reset();
    bool is_pinned() const { return block.pinned != nullptr; }

private:
    void take(host_buffer & o);

    host_block                 block;
    std::shared_ptr<host_pool> pool;
};

// the contexts one sequence's state lives in
struct seq_contexts {
    llama_context * tgt = nullptr;
    llama_context * dft = nullptr;  // the draft/MTP context, or null
    llama_seq_id    seq = 0;
};

// bytes of a sequence's state per context; zero when it cannot be sized (then it cannot be restored)
struct state_sizes {
    size_t tgt = 0;
    size_t dft = 0;
    size_t total() const { return tgt + dft; }
};
state_sizes size_state(const seq_contexts & sc);

// test knobs that reach into a swap (read once from the environment, preempt-config.h)
struct swap_knobs {
    bool    fail_alloc   = false;  // LLAMA_SERVER_PREEMPT_FAIL_ALLOC: every buffer allocation fails
    bool    fail_restore = false;  // LLAMA_SERVER_PREEMPT_FAIL_RESTORE: every restore fails
    int64_t copy_in_flight_us = 0;      // LLAMA_SERVER_PREEMPT_COPY_HOLD_MS: a park's copy counts as in flight this long
    bool    sync_park    = false;  // LLAMA_SERVER_PREEMPT_SYNC_PARK: a park waits for its transfer to land, so its
                                   // logged time is the whole copy (the bandwidth bench; a device's parks are
                                   // otherwise timed until their cells are free, the transfer landing behind)
};

// the host side every slot's swaps share
struct swap_host {
    std::shared_ptr<seq_copier> copier;
    std::shared_ptr<host_pool>  pool;   // warm host memory for swap buffers
    std::shared_ptr<disk_store> disk;   // the disk tier (--preempt-disk), or null
    cost_rates                  rates;  // measured park, restore, disk and prefill rates (the choice's prices)
    swap_knobs                  knobs;
};

// a swapped slot's state: in host RAM, one buffer per context, and for a disk park its file
// (preempt-disk-park.h), which goes first whenever the state is freed: the I/O thread may still
// be reading or filling the buffers
struct swap_state {
    host_buffer  tgt;
    host_buffer  dft;
    disk_copy    disk;
    park_tier    held_as = park_tier::ram;    // whose form the host buffers hold: the state's own bytes (RAM), or
                                          // another tier's packing of them, set by that tier (a disk park: disk.on())
    bool         copy_in_flight = false;  // the transfer to host RAM may still be running
    int64_t      t_copy_in_flight_until_us = 0;      // LLAMA_SERVER_PREEMPT_COPY_HOLD_MS: in flight until then
    int32_t      n_copy_ranges  = 0;      // cell ranges the state was copied from
    const char * copied_by      = "";     // how the park copied (copy_report::how())
    // the copy guard's check of the park (preempt-verify.h). Upstream's bytes are taken at the park,
    // while the cells are in place; on a device they are compared once the transfer has landed
    // (settle_copy()), so the check does not hold the decode up. A wrong park is never restored.
    struct park_check {
        bool                 pending = false;  // upstream's bytes taken, the transfer not landed yet
        std::vector<uint8_t> ref;
        copy_layout          layouts[2];
        copy_report          report;           // the devices the park moved
    } check;
    copy_check    verified    = copy_check::none;  // the park's check (a wrong one swap_in refuses)
    copy_mismatch mismatch;             //   where it went wrong
    bool          verdict_new = false;  // a verdict settle_copy() reached that the server has not counted yet

    swap_state() = default;
    swap_state(swap_state && o) noexcept = default;
    swap_state & operator=(swap_state && o) noexcept {
        if (this != &o) {
            free();
            tgt  = std::move(o.tgt);
            dft  = std::move(o.dft);
            disk = std::move(o.disk);
            held_as = o.held_as;
            copy_in_flight = o.copy_in_flight;
            t_copy_in_flight_until_us = o.t_copy_in_flight_until_us;
            n_copy_ranges  = o.n_copy_ranges;
            copied_by      = o.copied_by;
            check          = std::move(o.check);
            verified       = o.verified;
            mismatch       = std::move(o.mismatch);
            verdict_new    = o.verdict_new;
            o.copy_in_flight = false;
            o.check.pending  = false;
            o.verdict_new    = false;
        }
        return *this;
    }
    ~swap_state() { free(); }

    size_t bytes() const { return tgt.size + dft.size; }  // host RAM it holds now
    // the state's size wherever it waits: its file's for a disk park, else the RAM buffers'
    size_t state_bytes() const { return disk.on() ? disk.total() : bytes(); }
    // where its state waits: on disk for a disk park, else in RAM, in the form held there (recompute: not a swap at all)
    park_tier tier() const { return disk.on() ? park_tier::disk : held_as; }
    void free() {
        disk.reset();
        held_as = park_tier::ram;
        tgt.reset();
        dft.reset();
        copy_in_flight = false;
        check       = {};
        verified    = copy_check::none;
        mismatch    = {};
        verdict_new = false;
    }
};

// Each part of a state that holds bytes, the target context's first: f(i, buffer, at), `at` the
// part's offset in the state's bytes (upstream's serialization of both parts in order). Stops at
// the first f() that returns false, and says whether one did not.
template <typename F> bool for_each_part(const swap_state & st, F && f) {
    const host_buffer * parts[2] = { &st.tgt, &st.dft };
    size_t at = 0;
    for (int i = 0; i < 2; ++i) {
        if (parts[i]->size == 0) {
            continue;
        }
        if (!f(i, *parts[i], at)) {
            return false;
        }
        at += parts[i]->size;
    }
    return true;
}

// what one swap did
struct swap_result {
    bool         ok       = false;
    const char * why      = "";  // on failure: what failed, for the log
    bool         check_pending = false;  // a checked park whose verdict comes when its transfer lands
    copy_report  report;
    int64_t      t_us     = 0;
    copy_check   verified = copy_check::none;  // checked (preempt-verify.h): a wrong copy is not ok
    copy_mismatch mismatch;      //   where it first differs
    std::vector<uint8_t> ref;    //   a checked park: upstream's bytes, both parts in order (a disk park's read back is held to them)
};

// Host buffers for a state of these sizes, from the warm pool (pinned where the device offers it),
// freed through the copier; false (and none) when they cannot be had or LLAMA_SERVER_PREEMPT_FAIL_ALLOC.
bool alloc_host_buffers(swap_state & st, const state_sizes & n, swap_host & host);

// Copy the state (sized by size_state) to host RAM. On failure the buffers are freed and the
// caller recomputes instead. On a device the transfer may still be running on return
// (st.copy_in_flight): the cells are free to reuse, the buffer is settled before it is read.
// `verify`: the buffer is compared with upstream's serializer: now when the copy is complete (a
// difference is a failure: verified 0, the mismatch located), else when its transfer lands
// (settle_copy(): st.verified, st.verdict_new).
swap_result swap_out(swap_state & st, const seq_contexts & sc, const state_sizes & n, swap_host & host, bool verify = false);

// Copy the state back into the contexts (non-contiguous cells are fine). On failure the sequence
// is removed again from both contexts and the buffers are kept (the caller falls back on recompute).
// `verify`: the restored cells are read back slice by slice and compared with the buffer; a
// difference is a failure (verified 0, the mismatch located).
swap_result swap_in(swap_state & st, const seq_contexts & sc, swap_host & host, bool verify = false);

// the transfer of a park is done: its buffer may be read or freed (and a pending check is decided)
void settle_copy(swap_state & st, seq_copier & copier);
// once per step: settle a transfer that has had a decode to overlap with (and its test delay, LLAMA_SERVER_PREEMPT_COPY_HOLD_MS, ran out)
void settle_copy_if_due(swap_state & st, seq_copier & copier, int64_t now_us);

// upload a swapped state to the device ahead of its restore, when its park's copy has settled
void restore_ahead(const swap_state & st, seq_copier & copier);

// one line on how a copy went, for the slot's debug log
std::string describe_copy(const char * what, copy_route route, const swap_state & st, const swap_result & r);

} // namespace llama_preempt
