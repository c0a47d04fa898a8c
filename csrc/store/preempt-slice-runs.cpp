// llama-preempt: a sequence's slices cut into runs, and the host-side copies of a run
// (see preempt-slice-runs.h).
#include "preempt-slice-runs.h"

#include <algorithm>
#include <cstring>

namespace llama_preempt {

std::vector<slice_run> split_runs(const llama_state_seq_slice * s, size_t n) {
    std::vector<slice_run> runs;
    for (size_t i = 0; i < n; ++i) {
        if (s[i].n_rows > 1) {
            // the spans of one row, in order, fill one row of the buffer
            size_t j = i, in_row = 0;
            while (j < n && s[j].tensor == s[i].tensor && s[j].n_rows == s[i].n_rows && s[j].row_stride == s[i].row_stride &&
                   s[j].pos_stride == s[i].pos_stride && s[j].pos == s[i].pos + in_row && in_row + s[j].size <= s[i].pos_stride) {
                in_row += s[j].size;
                ++j;
            }
            runs.push_back({ s[i].tensor, i, j - i, s[i].pos, s[i].n_rows * s[i].pos_stride, in_row == s[i].pos_stride });
            i = j - 1;
            continue;
        }
        if (!runs.empty() && !runs.back().grid) {
            auto & r = runs.back();
            if (r.tensor == s[i].tensor && r.pos + r.bytes == s[i].pos) {
                r.count++;
                r.bytes += s[i].size;
                continue;
            }
        }
        runs.push_back({ s[i].tensor, i, 1, s[i].pos, s[i].size });
    }
    return runs;
}

// small copies (a transposed V moves a few cells of one element row at a time): 16-byte moves the
// compiler inlines, rather than a call into the C library per piece
static inline void copy_bytes(uint8_t * dst, const uint8_t * src, size_t n) {
    if (n < 16 || n > 256) {
        memcpy(dst, src, n);
        return;
    }
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        memcpy(dst + i, src + i, 16);
    }
    if (i < n) {
        memcpy(dst + n - 16, src + n - 16, 16);  // the tail, overlapping what was copied
    }
}

// host tensors: one memcpy per stretch of adjacent slices
size_t memcpy_run(const llama_state_seq_slice * s, const slice_run & r, uint8_t * buf, bool to_host) {
    size_t n_memcpy = 0;
    auto * base = (uint8_t *) r.tensor->data;
    const size_t n_rows = s[r.first].n_rows;
    if (n_rows > 1) {
        for (size_t j = 0; j < n_rows; ++j) {
            for (size_t i = r.first; i < r.first + r.count; ++i) {
                uint8_t * host   = buf + s[i].pos + j * s[i].pos_stride;
                uint8_t * tensor = base + s[i].offset + j * s[i].row_stride;
                if (to_host) {
                    copy_bytes(host, tensor, s[i].size);
                } else {
                    copy_bytes(tensor, host, s[i].size);
                }
            }
        }
        return n_rows * r.count;
    }
    for (size_t i = r.first; i < r.first + r.count;) {
        size_t off  = s[i].offset;
        size_t pos  = s[i].pos;
        size_t size = s[i].size;
        size_t j = i + 1;
        while (j < r.first + r.count && s[j].offset == off + size && s[j].pos == pos + size) {
            size += s[j].size;
            ++j;
        }
        if (to_host) {
            memcpy(buf + pos, base + off, size);
        } else {
            memcpy(base + off, buf + pos, size);
        }
        ++n_memcpy;
        i = j;
    }
    return n_memcpy;
}

void per_slice_run(const llama_state_seq_slice * s, const slice_run & r, uint8_t * buf, bool to_host) {
    for (size_t i = r.first; i < r.first + r.count; ++i) {
        for (size_t j = 0; j < std::max<size_t>(1, s[i].n_rows); ++j) {
            uint8_t * host = buf + s[i].pos + j * s[i].pos_stride;
            const size_t offset = s[i].offset + j * s[i].row_stride;
            if (to_host) {
                ggml_backend_tensor_get(s[i].tensor, host, offset, s[i].size);
            } else {
                ggml_backend_tensor_set(s[i].tensor, host, offset, s[i].size);
            }
        }
    }
}

size_t n_pieces(const llama_state_seq_slice * s, const slice_run & r) {
    size_t n = 0;
    for (size_t i = r.first; i < r.first + r.count; ++i) {
        n += std::max<size_t>(1, s[i].n_rows);
    }
    return n;
}

} // namespace llama_preempt
