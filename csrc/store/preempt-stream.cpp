// llama-preempt: a sequence's state straight between its contexts and its file (preempt-stream.h).
#include "preempt-stream.h"

#include "preempt-disk-io.h"

#include "ggml-backend.h"

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <sys/mman.h>

namespace llama_preempt {

namespace {

using block = state_stream::block;

// llama_state_seq_copy_fn: the serializer's slices kept as blocks, none copied (the stream moves
// them chunk by chunk later). The spans of one write_tensor_rows() call come in a row, sharing the
// tensor, the row count and the strides, each starting inside the first one's row: one block.
bool keep_slices(const llama_state_seq_slice * slices, size_t n_slices, void * user_data) {
    auto * out = (std::vector<block> *) user_data;
    for (size_t i = 0; i < n_slices; ++i) {
        const auto & s = slices[i];
        const size_t n_rows = std::max<size_t>(1, s.n_rows);
        if (n_rows > 1 && !out->empty()) {
            auto & b = out->back();
            if (b.tensor == s.tensor && b.n_rows == n_rows && b.row_stride == s.row_stride && b.row_size == s.pos_stride &&
                s.pos >= b.pos && s.pos + s.size <= b.pos + b.row_size) {
                b.spans.push_back({ s.pos - b.pos, s.offset, s.size });
                continue;
            }
        }
        block b;
        b.tensor     = s.tensor;
        b.pos        = s.pos;
        b.n_rows     = n_rows;
        b.row_size   = n_rows > 1 ? s.pos_stride : s.size;
        b.row_stride = s.row_stride;
        b.spans.push_back({ 0, s.offset, s.size });
        out->push_back(std::move(b));
    }
    return true;
}

// the blocks in the order of the bytes, each inside the part and none over another, each row's
// spans inside the row: false when the serializer laid out something else
bool in_order(std::vector<block> & blocks, size_t n) {
    std::sort(blocks.begin(), blocks.end(), [](const block & a, const block & b) { return a.pos < b.pos; });
    size_t end = 0;
    for (const auto & b : blocks) {
        if (b.pos < end || b.row_size == 0 || b.n_rows > (n - b.pos) / b.row_size) {
            return false;
        }
        for (const auto & sp : b.spans) {
            if (sp.in_row + sp.size > b.row_size) {
                return false;
            }
        }
        end = b.end();
    }
    return true;
}

// An address range of `n` bytes for a state's records, never filled: only the pages they touch
// take memory (MAP_NORESERVE; under vm.overcommit_memory=2 the reservation may fail: the caller
// recomputes, or prefills, instead). Null with `why` when it cannot be had.
uint8_t * reserve_records(size_t n, std::string & why) {
    void * at = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (at == MAP_FAILED) {
        why = std::string("cannot reserve an address range for its records: ") + strerror(errno);
        return nullptr;
    }
#ifdef MADV_NOHUGEPAGE
    madvise(at, n, MADV_NOHUGEPAGE);  // a touched record is a page, not 2 MiB
#endif
    return (uint8_t *) at;
}

} // namespace

state_stream::state_stream(const seq_contexts & sc, const state_sizes & n, std::vector<uint8_t> tail)
    : sc_(sc), n_(n), tail_(std::move(tail)) {
    parts_[0].ctx = sc.tgt;
    parts_[0].n   = n.tgt;
    parts_[1].ctx = n.dft > 0 ? sc.dft : nullptr;
    parts_[1].n   = parts_[1].ctx ? n.dft : 0;
}

state_stream::~state_stream() {
    for (auto & p : parts_) {
        if (p.records != nullptr) {
            munmap(p.records, p.n);
        }
    }
}

bool state_stream::lay_out(std::string & why) {
    for (auto & p : parts_) {
        if (p.ctx == nullptr || p.n == 0) {
            continue;
        }
        if ((p.records = reserve_records(p.n, why)) == nullptr) {
            return false;
        }
        p.blocks.clear();
        const size_t got = llama_state_seq_get_data_cb(p.ctx, p.records, p.n, sc_.seq, LLAMA_STATE_SEQ_FLAGS_NONE,
                                                       keep_slices, &p.blocks);
        if (got != p.n) {
            why = "upstream's serializer did not lay out the state at its size";
            return false;
        }
        if (!in_order(p.blocks, p.n)) {
            why = "upstream's serializer laid out slices that overlap";
            return false;
        }
    }
    return true;
}

template <typename R, typename S> void state_stream::walk(const part_layout & p, size_t pos, size_t n, R && records, S && slice) {
    const size_t end = pos + n;
    size_t at = pos;
    // the first block that ends after `at`
    auto it = std::upper_bound(p.blocks.begin(), p.blocks.end(), at, [](size_t v, const block & b) { return v < b.pos; });
    if (it != p.blocks.begin() && std::prev(it)->end() > at) {
        --it;
    }
    for (; at < end; ++it) {
        if (it == p.blocks.end() || it->pos >= end) {
            records(at, end - at, at - pos);
            return;
        }
        if (it->pos > at) {
            records(at, it->pos - at, at - pos);
            at = it->pos;
        }
        // the block's rows that [at, end) covers, and in each the spans it covers
        const size_t stop = std::min(end, it->end());
        for (size_t j = (at - it->pos) / it->row_size; j < it->n_rows && it->pos + j * it->row_size < stop; ++j) {
            const size_t row = it->pos + j * it->row_size;
            for (const auto & sp : it->spans) {
                const size_t a = std::max(at, row + sp.in_row);
                const size_t b = std::min(stop, row + sp.in_row + sp.size);
                if (a < b) {
                    slice(it->tensor, sp.off + j * it->row_stride + (a - row - sp.in_row), b - a, a - pos);
                }
            }
        }
        at = stop;
    }
}

bool state_stream::pull(int part, size_t pos, uint8_t * buf, size_t n, std::string & why) {
    const auto & p = parts_[part];
    const size_t n_state = std::min(n, p.n > pos ? p.n - pos : 0);
    if (n_state > 0) {
        if (p.records == nullptr) {
            why = "its state was not laid out";
            return false;
        }
        walk(p, pos, n_state,
             [&](size_t at, size_t len, size_t d) { memcpy(buf + d, p.records + at, len); },
             [&](ggml_tensor * t, size_t off, size_t len, size_t d) { ggml_backend_tensor_get(t, buf + d, off, len); });
    }
    if (n_state < n) {  // the caller's tail, after the draft part
        const size_t t = pos + n_state - p.n;
        if (part != 1 || t + (n - n_state) > tail_.size()) {
            why = "a chunk beyond the state";
            return false;
        }
        memcpy(buf + n_state, tail_.data() + t, n - n_state);
    }
    return true;
}

stream_layout state_stream::layout() const {
    stream_layout l;
    for (int i = 0; i < 2; ++i) {
        size_t at = 0;
        for (const auto & b : parts_[i].blocks) {
            if (b.pos > at) {
                l.records[i].push_back({ at, b.pos - at });
            }
            at = b.end();
        }
        if (parts_[i].n > at) {
            l.records[i].push_back({ at, parts_[i].n - at });
        }
    }
    l.known = true;
    return l;
}

// the records read into reservations of each part's size (only their pages are touched), then the
// serializer places the cells from them as from the file
bool state_stream::read_records(int fd, size_t at, std::string & why) {
    size_t off = at;
    for (int i = 0; i < 2; ++i) {
        auto & p = parts_[i];
        if (p.ctx == nullptr || p.n == 0) {
            off += p.n;
            continue;
        }
        if ((p.records = reserve_records(p.n, why)) == nullptr) {
            return false;
        }
        for (const auto & [pos, len] : layout_.records[i]) {
            if (pos + len > p.n || !read_all(fd, p.records + pos, len, (off_t) (off + pos))) {
                why = "its records cannot be read";
                return false;
            }
        }
        read_begun_ = true;
        p.blocks.clear();
        const size_t got = llama_state_seq_set_data_cb(p.ctx, p.records, p.n, sc_.seq, LLAMA_STATE_SEQ_FLAGS_NONE, keep_slices,
                                                       &p.blocks);
        munmap(p.records, p.n);
        p.records = nullptr;
        if (got == 0) {
            why = "its records do not restore (no room for its cells, or they changed on disk)";
            return false;
        }
        if (!in_order(p.blocks, p.n)) {
            why = "upstream's serializer listed slices that overlap";
            return false;
        }
        off += p.n;
    }
    return true;
}

bool state_stream::begin_read(int fd, size_t at, std::string & why) {
    if (layout_.known) {
        return read_records(fd, at, why);
    }
    const size_t len = at + part_bytes(0) + part_bytes(1);
    // (the store checked the file's size first: no page of the map lies past its end)
    void * map = mmap(nullptr, len, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED) {
        why = std::string("cannot map its file: ") + strerror(errno);
        return false;
    }
    madvise(map, len, MADV_RANDOM);  // only the pages of the records are read through the map: no read-around
    read_begun_ = true;
    bool ok = true;
    size_t off = at;
    for (int i = 0; i < 2 && ok; ++i) {
        auto & p = parts_[i];
        if (p.ctx != nullptr && p.n > 0) {
            // the cells are placed and the records read; the slices are only listed (moved by push())
            p.blocks.clear();
            const size_t got = llama_state_seq_set_data_cb(p.ctx, (const uint8_t *) map + off, p.n, sc_.seq,
                                                           LLAMA_STATE_SEQ_FLAGS_NONE, keep_slices, &p.blocks);
            if (got == 0) {
                why = "its records do not restore (no room for its cells, or they changed on disk)";
                ok  = false;
            } else if (!in_order(p.blocks, p.n)) {
                why = "upstream's serializer listed slices that overlap";
                ok  = false;
            }
        }
        off += p.n;
    }
    munmap(map, len);
    return ok;
}

bool state_stream::push(int part, size_t pos, const uint8_t * buf, size_t n, std::string & why) {
    const auto & p = parts_[part];
    const size_t n_state = std::min(n, p.n > pos ? p.n - pos : 0);
    if (n_state > 0) {
        // the records were read through the map by begin_read(); the slices go into the tensors
        walk(p, pos, n_state, [](size_t, size_t, size_t) {},
             [&](ggml_tensor * t, size_t off, size_t len, size_t d) {
                 ggml_backend_tensor_set(t, buf + d, off, len);
                 if (check_ && !mismatch_.found) {
                     check_slice(t, off, len, buf + d, part, pos + d);
                 }
             });
    }
    if (n_state < n) {
        const size_t t = pos + n_state - p.n;
        if (part != 1 || t + (n - n_state) > tail_.size()) {
            why = "a chunk beyond the state";
            return false;
        }
        memcpy(tail_.data() + t, buf + n_state, n - n_state);
    }
    return true;
}

// the copy guard's check of a restore: the slice read back from its tensor equals the bytes set
void state_stream::check_slice(ggml_tensor * t, size_t off, size_t len, const uint8_t * want, int part, size_t at) {
    check_buf_.resize(len);
    ggml_backend_tensor_get(t, check_buf_.data(), off, len);
    if (memcmp(check_buf_.data(), want, len) == 0) {
        return;
    }
    size_t i = 0;
    while (i < len && check_buf_[i] == want[i]) {
        ++i;
    }
    mismatch_.found  = true;
    mismatch_.part   = part == 0 ? "target" : "draft";
    mismatch_.pos    = at + i;
    mismatch_.tensor = ggml_get_name(t);
    mismatch_.dev    = t->buffer ? ggml_backend_buft_get_device(ggml_backend_buffer_get_type(t->buffer)) : nullptr;
    mismatch_.device = mismatch_.dev ? ggml_backend_dev_name(mismatch_.dev) : "";
}

copy_report state_stream::devices() const {
    copy_report r;
    for (const auto & p : parts_) {
        for (const auto & b : p.blocks) {
            const auto dev = b.tensor->buffer ? ggml_backend_buft_get_device(ggml_backend_buffer_get_type(b.tensor->buffer)) : nullptr;
            r.on(dev).note(how_slices, b.n_rows * b.row_size);
        }
    }
    return r;
}

void state_stream::undo() {
    if (!read_begun_) {
        return;
    }
    for (llama_context * ctx : { sc_.tgt, sc_.dft }) {
        if (ctx != nullptr) {
            llama_memory_seq_rm(llama_get_memory(ctx), sc_.seq, -1, -1);
        }
    }
}

} // namespace llama_preempt
