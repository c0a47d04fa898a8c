// llama-preempt: a sequence's state straight between its contexts and its file (preempt-stream.h).
#include "preempt-stream.h"

#include "ggml-backend.h"

#include <algorithm>
#include <cstring>

#include <sys/mman.h>

namespace llama_preempt {

namespace {

// llama_state_seq_copy_fn: the serializer's slices kept (one piece per row), none copied; the
// stream moves them chunk by chunk later
bool keep_slices(const llama_state_seq_slice * slices, size_t n_slices, void * user_data) {
    auto * out = (std::vector<state_stream::piece> *) user_data;
    for (size_t i = 0; i < n_slices; ++i) {
        const auto & s = slices[i];
        for (size_t j = 0; j < std::max<size_t>(1, s.n_rows); ++j) {
            out->push_back({ s.tensor, s.offset + j * s.row_stride, s.size, s.pos + j * s.pos_stride });
        }
    }
    return true;
}

// the slices in the order of the bytes, each inside the part and none over another: false when
// the serializer laid out something else
bool in_order(std::vector<state_stream::piece> & pieces, size_t n) {
    std::sort(pieces.begin(), pieces.end(), [](const auto & a, const auto & b) { return a.pos < b.pos; });
    size_t end = 0;
    for (const auto & p : pieces) {
        if (p.pos < end || p.size > n || p.pos > n - p.size) {
            return false;
        }
        end = p.pos + p.size;
    }
    return true;
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
    for (int i = 0; i < 2; ++i) {
        auto & p = parts_[i];
        if (p.ctx == nullptr || p.n == 0) {
            continue;
        }
        // an address range of the state's size, never filled: only the pages the records touch take memory
        void * at = mmap(nullptr, p.n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (at == MAP_FAILED) {
            why = std::string("cannot reserve an address range for its records: ") + strerror(errno);
            return false;
        }
        p.records = (uint8_t *) at;
#ifdef MADV_NOHUGEPAGE
        madvise(at, p.n, MADV_NOHUGEPAGE);  // a touched record is a page, not 2 MiB
#endif
        p.pieces.clear();
        const size_t got = llama_state_seq_get_data_cb(p.ctx, p.records, p.n, sc_.seq, LLAMA_STATE_SEQ_FLAGS_NONE,
                                                       keep_slices, &p.pieces);
        if (got != p.n) {
            why = "upstream's serializer did not lay out the state at its size";
            return false;
        }
        if (!in_order(p.pieces, p.n)) {
            why = "upstream's serializer laid out slices that overlap";
            return false;
        }
    }
    return true;
}

template <typename R, typename S> bool state_stream::walk(part_layout & p, size_t pos, size_t n, R && records, S && slice) {
    const size_t end = pos + n;
    size_t at = pos;
    // the first piece that ends after `at`
    auto it = std::upper_bound(p.pieces.begin(), p.pieces.end(), at, [](size_t v, const piece & q) { return v < q.pos; });
    if (it != p.pieces.begin() && std::prev(it)->pos + std::prev(it)->size > at) {
        --it;
    }
    while (at < end) {
        if (it == p.pieces.end() || it->pos >= end) {
            records(at, end - at, at - pos);
            break;
        }
        if (it->pos > at) {
            records(at, it->pos - at, at - pos);
            at = it->pos;
        }
        const size_t in  = at - it->pos;
        const size_t len = std::min(it->size - in, end - at);
        if (!slice(*it, in, len, at - pos)) {
            return false;
        }
        at += len;
        ++it;
    }
    return true;
}

bool state_stream::pull(int part, size_t pos, uint8_t * buf, size_t n, std::string & why) {
    auto & p = parts_[part];
    const size_t n_state = std::min(n, p.n > pos ? p.n - pos : 0);
    if (n_state > 0) {
        if (p.records == nullptr) {
            why = "its state was not laid out";
            return false;
        }
        walk(p, pos, n_state,
             [&](size_t at, size_t len, size_t d) { memcpy(buf + d, p.records + at, len); },
             [&](const piece & q, size_t in, size_t len, size_t d) {
                 ggml_backend_tensor_get(q.tensor, buf + d, q.off + in, len);
                 return true;
             });
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

bool state_stream::begin_read(int fd, size_t at, std::string & why) {
    const size_t len = at + part_bytes(0) + part_bytes(1);
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
            p.pieces.clear();
            const size_t got = llama_state_seq_set_data_cb(p.ctx, (const uint8_t *) map + off, p.n, sc_.seq,
                                                           LLAMA_STATE_SEQ_FLAGS_NONE, keep_slices, &p.pieces);
            if (got == 0) {
                why = "the pool has no room for its cells now";  // (the file is this model's: the cache key says so)
                ok  = false;
            } else if (!in_order(p.pieces, p.n)) {
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
    auto & p = parts_[part];
    const size_t n_state = std::min(n, p.n > pos ? p.n - pos : 0);
    if (n_state > 0) {
        // the records were read through the map by begin_read(); the slices go into the tensors
        walk(p, pos, n_state, [](size_t, size_t, size_t) {},
             [&](const piece & q, size_t in, size_t len, size_t d) {
                 ggml_backend_tensor_set(q.tensor, buf + d, q.off + in, len);
                 if (check_ && !mismatch_.found) {
                     check_slice(q, in, len, buf + d, part, pos + d);
                 }
                 return true;
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
void state_stream::check_slice(const piece & q, size_t in, size_t len, const uint8_t * want, int part, size_t at) {
    check_buf_.resize(len);
    ggml_backend_tensor_get(q.tensor, check_buf_.data(), q.off + in, len);
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
    mismatch_.tensor = ggml_get_name(q.tensor);
    mismatch_.device = q.tensor->buffer ? ggml_backend_buffer_name(q.tensor->buffer) : "";
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
