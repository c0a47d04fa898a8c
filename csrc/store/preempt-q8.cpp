// A parked state's host copy compressed to q8_0 and back (see preempt-q8.h).
#include "preempt-q8.h"

#include "preempt-swap.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstring>

namespace llama_preempt {

namespace {

constexpr size_t QK      = 32;  // values per q8_0 block
constexpr size_t CHUNK   = QK * 256;  // values converted at a time

bool is_float(ggml_type t) { return t == GGML_TYPE_F32 || t == GGML_TYPE_F16 || t == GGML_TYPE_BF16; }

size_t block_bytes() { return ggml_row_size(GGML_TYPE_Q8_0, QK); }

// a run's values: those packed in whole blocks, and the bytes of the rest (kept as they are)
struct run_split {
    size_t n_packed = 0;  // values in whole blocks
    size_t tail     = 0;  // bytes after them
};
run_split split_of(const float_run & r) {
    const size_t elt = ggml_type_size(r.type);
    run_split s;
    s.n_packed = (r.n / elt) / QK * QK;
    s.tail     = r.n - s.n_packed * elt;
    return s;
}

void to_f32(ggml_type t, const uint8_t * src, float * dst, size_t m) {
    switch (t) {
        case GGML_TYPE_F32:  std::memcpy(dst, src, m * sizeof(float)); break;
        case GGML_TYPE_F16:  ggml_fp16_to_fp32_row((const ggml_fp16_t *) src, dst, (int64_t) m); break;
        case GGML_TYPE_BF16: ggml_bf16_to_fp32_row((const ggml_bf16_t *) src, dst, (int64_t) m); break;
        default: GGML_ABORT("q8: not a float type");
    }
}

void from_f32(ggml_type t, const float * src, uint8_t * dst, size_t m) {
    switch (t) {
        case GGML_TYPE_F32:  std::memcpy(dst, src, m * sizeof(float)); break;
        case GGML_TYPE_F16:  ggml_fp32_to_fp16_row(src, (ggml_fp16_t *) dst, (int64_t) m); break;
        case GGML_TYPE_BF16: ggml_fp32_to_bf16_row(src, (ggml_bf16_t *) dst, (int64_t) m); break;
        default: GGML_ABORT("q8: not a float type");
    }
}

// the serializer's slices, kept as runs (nothing copied: the callback says it copied them)
bool keep_runs(const llama_state_seq_slice * slices, size_t n, void * user_data) {
    auto & runs = *static_cast<std::vector<float_run> *>(user_data);
    for (size_t i = 0; i < n; ++i) {
        const auto & s = slices[i];
        if (!is_float(s.tensor->type) || s.size == 0) {
            continue;
        }
        for (size_t j = 0; j < s.n_rows; ++j) {
            runs.push_back({ s.pos + j * s.pos_stride, s.size, s.tensor->type });
        }
    }
    return true;
}

} // namespace

bool float_runs_of(llama_context * ctx, llama_seq_id seq, size_t n, std::vector<float_run> & runs, std::string & why) {
    runs.clear();
    // the records land here; the slices' bytes are never written, so their pages are never touched
    void * at = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (at == MAP_FAILED) {
        why = "cannot reserve address space to lay the state out";
        return false;
    }
    std::vector<float_run> raw;
    const size_t got = llama_state_seq_get_data_cb(ctx, (uint8_t *) at, n, seq, LLAMA_STATE_SEQ_FLAGS_NONE, keep_runs, &raw);
    munmap(at, n);
    if (got != n) {
        why = "the state's layout is not the size of its copy";
        return false;
    }
    std::sort(raw.begin(), raw.end(), [](const float_run & a, const float_run & b) { return a.pos < b.pos; });
    for (const auto & r : raw) {
        if (r.pos + r.n > n || (!runs.empty() && r.pos < runs.back().pos + runs.back().n)) {
            why = "the state's tensor runs overlap";
            runs.clear();
            return false;
        }
        if (!runs.empty() && runs.back().type == r.type && runs.back().pos + runs.back().n == r.pos) {
            runs.back().n += r.n;  // adjacent slices of one type pack as one run
        } else {
            runs.push_back(r);
        }
    }
    return true;
}

size_t q8_packed_size(size_t n, const std::vector<float_run> & runs) {
    size_t out = n;
    for (const auto & r : runs) {
        const run_split s = split_of(r);
        out -= s.n_packed * ggml_type_size(r.type);
        out += s.n_packed / QK * block_bytes();
    }
    return out;
}

void q8_pack(const uint8_t * src, size_t n, const std::vector<float_run> & runs, uint8_t * dst) {
    std::vector<float>   f(CHUNK);
    std::vector<uint8_t> tmp(CHUNK * sizeof(float));
    size_t at = 0;  // into src
    for (const auto & r : runs) {
        std::memcpy(dst, src + at, r.pos - at);  // the records before it
        dst += r.pos - at;
        const run_split s   = split_of(r);
        const size_t    elt = ggml_type_size(r.type);
        for (size_t e = 0; e < s.n_packed; e += CHUNK) {
            const size_t m = std::min(CHUNK, s.n_packed - e);
            std::memcpy(tmp.data(), src + r.pos + e * elt, m * elt);  // a run need not be aligned in the state
            to_f32(r.type, tmp.data(), f.data(), m);
            dst += ggml_quantize_chunk(GGML_TYPE_Q8_0, f.data(), dst, 0, 1, (int64_t) m, nullptr);
        }
        std::memcpy(dst, src + r.pos + s.n_packed * elt, s.tail);
        dst += s.tail;
        at = r.pos + r.n;
    }
    std::memcpy(dst, src + at, n - at);
}

void q8_unpack(const uint8_t * src, const std::vector<float_run> & runs, uint8_t * dst, size_t n) {
    const auto * q8 = ggml_get_type_traits(GGML_TYPE_Q8_0);
    std::vector<float>   f(CHUNK);
    std::vector<uint8_t> tmp(CHUNK * sizeof(float));
    size_t at = 0;  // into dst
    for (const auto & r : runs) {
        std::memcpy(dst + at, src, r.pos - at);
        src += r.pos - at;
        const run_split s   = split_of(r);
        const size_t    elt = ggml_type_size(r.type);
        for (size_t e = 0; e < s.n_packed; e += CHUNK) {
            const size_t m = std::min(CHUNK, s.n_packed - e);
            q8->to_float(src, f.data(), (int64_t) m);
            src += m / QK * block_bytes();
            from_f32(r.type, f.data(), tmp.data(), m);
            std::memcpy(dst + r.pos + e * elt, tmp.data(), m * elt);
        }
        std::memcpy(dst + r.pos + s.n_packed * elt, src, s.tail);
        src += s.tail;
        at = r.pos + r.n;
    }
    std::memcpy(dst + at, src, n - at);
}

bool compress_state(swap_state & st, const seq_contexts & sc, swap_host & host, q8_form & out, std::string & why) {
    settle_copy(st, *host.copier);  // the transfer has landed; a checked park has its verdict
    if (st.tier() != park_tier::ram) {
        why = "the state is not a plain host copy";
        return false;
    }
    q8_form             form;
    host_buffer *       parts[2] = { &st.tgt, &st.dft };
    llama_context *     ctxs[2]  = { sc.tgt, sc.dft };
    host_buffer         packed[2];
    for (int i = 0; i < 2; ++i) {
        if (parts[i]->size == 0) {
            continue;
        }
        if (!float_runs_of(ctxs[i], sc.seq, parts[i]->size, form.runs[i], why)) {
            return false;
        }
        form.full[i] = parts[i]->size;
        // ordinary memory: nothing is ever transferred from it, it is expanded first
        if (!packed[i].alloc(q8_packed_size(parts[i]->size, form.runs[i]), host.pool, nullptr)) {
            why = "cannot allocate host RAM for the compressed copy";
            return false;
        }
        q8_pack(parts[i]->data, parts[i]->size, form.runs[i], packed[i].data);
    }
    for (int i = 0; i < 2; ++i) {
        if (parts[i]->size > 0) {
            *parts[i] = std::move(packed[i]);
        }
    }
    st.held_as = park_tier::ram_q8;
    out = std::move(form);
    return true;
}

bool expand_state(swap_state & st, const q8_form & form, swap_host & host, std::string & why) {
    if (st.held_as != park_tier::ram_q8) {
        return true;
    }
    swap_state full;
    if (!alloc_host_buffers(full, { form.full[0], form.full[1] }, host)) {
        why = "cannot allocate host RAM to expand the compressed copy";
        return false;
    }
    host_buffer * from[2] = { &st.tgt, &st.dft };
    host_buffer * to[2]   = { &full.tgt, &full.dft };
    for (int i = 0; i < 2; ++i) {
        if (form.full[i] > 0) {
            q8_unpack(from[i]->data, form.runs[i], to[i]->data, form.full[i]);
        }
    }
    st.tgt     = std::move(full.tgt);
    st.dft     = std::move(full.dft);
    st.held_as = park_tier::ram;
    return true;
}

} // namespace llama_preempt
