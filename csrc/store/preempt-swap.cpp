// llama-preempt: SWAP, one sequence's state between its llama contexts and host RAM (preempt-swap.h).
#include "preempt-swap.h"

#include "preempt-verify.h"

#include "ggml.h"

#include <chrono>

#include <cstring>
#include <vector>

namespace llama_preempt {

bool host_buffer::alloc(size_t n, const std::shared_ptr<host_pool> & from, ggml_backend_buffer_type_t pinned_buft) {
    reset();
    if (n == 0) {
        return true;
    }
    pool  = from;
    block = pool->take(n, pinned_buft);
    data  = block.data;
    size  = data ? n : 0;
    return data != nullptr;
}

void host_buffer::reset() {
    if (copier) {
        copier->release(data);  // a transfer into it, or an upload from it, may still run
        copier.reset();
    }
    if (pool) {
        pool->give(std::move(block));
        pool.reset();
    }
    block.release();
    data = nullptr;
    size = 0;
}

void host_buffer::take(host_buffer & o) {
    block  = std::move(o.block);
    pool   = std::move(o.pool);
    copier = std::move(o.copier);
    data   = o.data;
    size   = o.size;
    o.data = nullptr;
    o.size = 0;
}

state_sizes size_state(const seq_contexts & sc) {
    state_sizes n;
    n.tgt = llama_state_seq_get_size_ext(sc.tgt, sc.seq, LLAMA_STATE_SEQ_FLAGS_NONE);
    n.dft = sc.dft ? llama_state_seq_get_size_ext(sc.dft, sc.seq, LLAMA_STATE_SEQ_FLAGS_NONE) : 0;
    if (n.tgt == 0 || (sc.dft && n.dft == 0)) {
        return {};  // a state that cannot be sized cannot be restored: recompute instead
    }
    return n;
}

// the user_data of the llama_state_seq_*_data_cb callbacks
struct copy_call {
    seq_copier * copier;
    uint8_t    * buf;
    bool         to_host;
    copy_report  report;
    bool         ok = true;
    copy_layout * layout = nullptr;  // where to keep the slices (to check the copy), or null
};

// llama_state_seq_copy_fn for a copy_call: the serializer's slices, through the bulk copier
static bool copy_slices_fn(const llama_state_seq_slice * slices, size_t n_slices, void * user_data) {
    auto * call = (copy_call *) user_data;
    const auto t0 = std::chrono::steady_clock::now();
    struct timer {
        copy_call * call;
        std::chrono::steady_clock::time_point t0;
        ~timer() { call->report.t_copy_us += std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t0).count(); }
    } t { call, t0 };
    if (call->layout != nullptr) {
        call->layout->add(slices, n_slices);
    }
    try {
        call->ok = call->to_host ? call->copier->gather(slices, n_slices, call->buf, call->report)
                                 : call->copier->scatter(slices, n_slices, call->buf, call->report);
    } catch (const std::exception &) {
        call->ok = false;
    }
    return call->ok;
}

// the state of the target context, and of the draft/MTP context where there is one, between the
// buffers and the pool, through the bulk copier (preempt-copy.h). False on any failure.
// `layouts`: where to keep each part's slices (to check the copy), or null.
static bool copy_state(swap_state & st, const seq_contexts & sc, seq_copier & copier, bool to_host, copy_report & report,
                       copy_layout * layouts = nullptr) {
    return for_each_part(st, [&](int i, const host_buffer & buf, size_t) {
        llama_context * ctx = i == 0 ? sc.tgt : sc.dft;
        if (ctx == nullptr) {
            return true;
        }
        copy_call call { &copier, buf.data, to_host, {} };
        call.layout = layouts ? &layouts[i] : nullptr;
        const size_t n = to_host
            ? llama_state_seq_get_data_cb(ctx, buf.data, buf.size, sc.seq, LLAMA_STATE_SEQ_FLAGS_NONE, copy_slices_fn, &call)
            : llama_state_seq_set_data_cb(ctx, buf.data, buf.size, sc.seq, LLAMA_STATE_SEQ_FLAGS_NONE, copy_slices_fn, &call);
        report.merge(call.report);
        return call.ok && (to_host ? n == buf.size : n != 0);
    });
}

static const char * part_names[2] = { "target", "draft" };

// A checked park: upstream's own bytes of the state, both parts in order, read while the cells are
// still in place (the caller frees them after this). A disk park's read back is compared with them
// too (preempt-disk-park.cpp). False when upstream cannot serialize it at this size.
static bool upstream_bytes(const swap_state & st, const seq_contexts & sc, std::vector<uint8_t> & ref) {
    ref.assign(st.bytes(), 0);
    return for_each_part(st, [&](int i, const host_buffer & buf, size_t at) {
        llama_context * ctx = i == 0 ? sc.tgt : sc.dft;
        return ctx == nullptr ||
               llama_state_seq_get_data_ext(ctx, ref.data() + at, buf.size, sc.seq, LLAMA_STATE_SEQ_FLAGS_NONE) == buf.size;
    });
}

// the parked buffers against upstream's bytes: the first difference, located
static copy_mismatch compare_park(const swap_state & st, const std::vector<uint8_t> & ref, const copy_layout * layouts) {
    copy_mismatch m;
    for_each_part(st, [&](int i, const host_buffer & buf, size_t at) {
        m = first_difference(ref.data() + at, buf.data, buf.size, layouts[i], part_names[i]);
        return !m.found;
    });
    return m;
}

bool alloc_host_buffers(swap_state & st, const state_sizes & n, swap_host & host) {
    ggml_backend_buffer_type_t pinned = host.copier->host_buft();
    if (host.knobs.fail_alloc || !st.tgt.alloc(n.tgt, host.pool, pinned) || !st.dft.alloc(n.dft, host.pool, pinned)) {
        st.tgt.reset();
        st.dft.reset();
        return false;
    }
    // the buffers are freed through the copier: a transfer into them, or an upload ahead of their
    // restore, may still be running then
    st.tgt.copier = host.copier;
    st.dft.copier = host.copier;
    return true;
}

swap_result swap_out(swap_state & st, const seq_contexts & sc, const state_sizes & n, swap_host & host, bool verify) {
    swap_result r;
    const int64_t t0 = ggml_time_us();
    // a budget can promise more than the machine has: an allocation that fails means recompute
    if (!alloc_host_buffers(st, n, host)) {
        st.free();
        r.why = "cannot allocate host RAM to swap";
        return r;
    }
    copy_layout layouts[2];
    if (!copy_state(st, sc, *host.copier, true, r.report, verify ? layouts : nullptr)) {
        st.free();
        r.why = "copying the sequence state to host RAM failed";
        return r;
    }
    r.ok   = true;
    if (host.knobs.sync_park && r.report.in_flight) {
        host.copier->wait();
        r.report.in_flight = false;
    }
    r.t_us = ggml_time_us() - t0;
    host.rates.observe_park(n.total(), r.t_us);

    st.copy_in_flight = r.report.in_flight || host.knobs.copy_in_flight_us > 0;
    st.t_copy_in_flight_until_us = host.knobs.copy_in_flight_us > 0 ? ggml_time_us() + host.knobs.copy_in_flight_us : 0;
    st.n_copy_ranges  = (int32_t) r.report.n_ranges;
    st.copied_by      = r.report.how();
    if (!verify) {
        return r;
    }
    if (!upstream_bytes(st, sc, r.ref)) {
        r.mismatch.found = true;
        r.mismatch.part  = "target";
    } else if (r.report.in_flight) {
        // on a device: compared when the transfer lands, while the next decodes run
        st.check.pending = true;
        st.check.ref     = r.ref;
        st.check.report  = r.report;
        for (int i = 0; i < 2; ++i) {
            st.check.layouts[i] = std::move(layouts[i]);
        }
        r.check_pending = true;
        return r;
    } else {
        r.mismatch = compare_park(st, r.ref, layouts);
    }
    r.verified = r.mismatch.found ? copy_check::wrong : copy_check::right;
    if (r.mismatch.found) {
        st.free();
        r.ref.clear();
        r.ok  = false;
        r.why = "the copy differs from upstream's serializer";
    }
    return r;
}

swap_result swap_in(swap_state & st, const seq_contexts & sc, swap_host & host, bool verify) {
    swap_result r;
    settle_copy(st, *host.copier);
    if (st.verified == copy_check::wrong) {
        r.why = "its park's copy differed from upstream's serializer";
        return r;
    }
    if (host.knobs.fail_restore) {
        r.why = "LLAMA_SERVER_PREEMPT_FAIL_RESTORE";
        return r;
    }
    const int64_t t0 = ggml_time_us();
    auto drop = [&] {
        for (llama_context * ctx : { sc.tgt, sc.dft }) {
            if (ctx != nullptr) {
                llama_memory_seq_rm(llama_get_memory(ctx), sc.seq, -1, -1);
            }
        }
    };
    copy_layout layouts[2];
    if (!copy_state(st, sc, *host.copier, false, r.report, verify ? layouts : nullptr)) {
        drop();
        r.why = "copying the state back failed";
        return r;
    }
    r.t_us = ggml_time_us() - t0;
    if (verify) {
        const host_buffer * bufs[2] = { &st.tgt, &st.dft };
        for (int i = 0; i < 2 && !r.mismatch.found; ++i) {
            r.mismatch = check_restored(layouts[i], bufs[i]->data, part_names[i]);
        }
        r.verified = r.mismatch.found ? copy_check::wrong : copy_check::right;
        if (r.mismatch.found) {
            drop();  // never resume on cells that differ from what was parked
            r.why = "the restored cells differ from the parked bytes";
            return r;
        }
    }
    r.ok = true;
    host.rates.observe_restore(st.bytes(), r.t_us);
    return r;
}

void settle_copy(swap_state & st, seq_copier & copier) {
    if (st.copy_in_flight) {
        copier.wait();
        st.copy_in_flight = false;
    }
    if (st.check.pending) {
        copier.wait();  // the knob's hold may have settled it before its transfer did
        st.mismatch    = compare_park(st, st.check.ref, st.check.layouts);
        st.verified    = st.mismatch.found ? copy_check::wrong : copy_check::right;
        st.verdict_new = true;
        st.check.pending = false;
        st.check.ref.clear();
        st.check.ref.shrink_to_fit();
    }
}

void settle_copy_if_due(swap_state & st, seq_copier & copier, int64_t now_us) {
    if (st.copy_in_flight && now_us >= st.t_copy_in_flight_until_us) {
        settle_copy(st, copier);
    }
}

void restore_ahead(const swap_state & st, seq_copier & copier) {
    if (!st.copy_in_flight && st.tgt.data) {
        copier.prefetch(st.tgt.data, st.tgt.size);
    }
}

std::string describe_copy(const char * what, copy_route route, const swap_state & st, const swap_result & res) {
    const auto & r = res.report;
    char line[512];
    snprintf(line, sizeof(line), "swap %s (%s): %zu slices, %zu memcpy, %zu by device graphs, %zu one by one%s%s, "
             "%.2f MiB in %.3f ms (copies %.3f ms)%s%s%s", what, copy_route_name(route),
             r.n_slices, r.n_memcpy, r.n_gathered, r.n_fallback, r.why_fallback ? " because of " : "",
             r.why_fallback ? r.why_fallback : "", r.n_bytes / 1048576.0, res.t_us / 1000.0, r.t_copy_us / 1000.0,
             st.tgt.is_pinned() ? ", pinned" : "", r.in_flight ? ", transfer in flight" : "",
             r.prefetched ? ", uploaded ahead" : "");
    return line;
}

} // namespace llama_preempt
