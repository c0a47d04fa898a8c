// llama-preempt: the device graphs of a bulk SWAP copy (see preempt-gather.h).

#include "preempt-gather.h"

#include <algorithm>
#include <climits>
#include <numeric>

namespace llama_preempt {

namespace {

// a leaf over bytes of an existing tensor, seen with another type and shape (no copy)
ggml_tensor * alias(ggml_context * ctx, ggml_tensor * t, ggml_type type, int64_t ne0, int64_t ne1, size_t offset) {
    ggml_tensor * a = ggml_new_tensor_2d(ctx, type, ne0, ne1);
    a->data   = (char *) t->data + offset;
    a->buffer = t->buffer;
    return a;
}

bool is_float_type(ggml_type type) {
    return type == GGML_TYPE_F32 || type == GGML_TYPE_F16 || type == GGML_TYPE_BF16;
}

// A transposed V (flash attention off) comes as, for each of `rows` element rows, the same R cell
// ranges, one row stride S apart. Finding that grid lets one transpose + get_rows move the run.
struct slice_grid {
    size_t R = 0, rows = 0, S = 0, base = 0;
};

bool find_grid(const llama_state_seq_slice * s, size_t n, size_t el, size_t tensor_bytes, slice_grid & g) {
    for (size_t r = 1; r <= n / 2; ++r) {
        if (n % r != 0 || s[r].offset <= s[0].offset) {
            continue;
        }
        const size_t S = s[r].offset - s[0].offset;
        if (S % el != 0) {
            continue;
        }
        const size_t base = s[0].offset / S * S;
        if (s[r - 1].offset + s[r - 1].size > base + S) {
            continue;  // the first row does not fit in one stride
        }
        bool ok = true;
        for (size_t i = r; i < n && ok; ++i) {
            ok = s[i].size == s[i - r].size && s[i].offset == s[i - r].offset + S;
        }
        if (!ok) {
            continue;
        }
        const size_t rows = n / r;
        if (base + rows * S > tensor_bytes) {
            continue;
        }
        g = { r, rows, S, base };
        return true;
    }
    return false;
}

size_t run_unit(const llama_state_seq_slice * s, const slice_run & r) {
    size_t u = 0;
    for (size_t i = r.first; i < r.first + r.count; ++i) {
        u = std::gcd(u, std::gcd(s[i].offset, s[i].size));
    }
    return u;
}

} // namespace

ggml_tensor * build_run(ggml_context * ctx, const llama_state_seq_slice * s, const slice_run & r, bool to_host,
                        std::vector<std::pair<ggml_tensor *, std::vector<int32_t>>> & idx_data, ggml_tensor ** staging,
                        std::vector<ggml_tensor *> & more) {
    ggml_tensor * t = r.tensor;
    const size_t t_bytes = ggml_nbytes(t);
    const size_t u = run_unit(s, r);
    if (u == 0) {
        return nullptr;
    }

    auto make_idx = [&](const std::vector<int32_t> & v) {
        ggml_tensor * idx = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, (int64_t) v.size());
        ggml_set_input(idx);
        idx_data.emplace_back(idx, v);
        return idx;
    };

    // element-sized units (a transposed V): transpose on the device, then move whole cells. The
    // grid comes from a write_tensor_rows call, or is found in slices written one row at a time.
    const ggml_type type = t->type;
    const size_t el = ggml_type_size(type);
    slice_grid g;
    bool is_grid = false;
    if (!r.grid && s[r.first].n_rows > 1) {
        return nullptr;  // rows that do not fill their buffer rows: one at a time
    }
    if (r.grid) {
        const auto & s0 = s[r.first];
        g = { r.count, s0.n_rows, s0.row_stride, s0.row_stride > 0 ? s0.offset / s0.row_stride * s0.row_stride : 0 };
        is_grid = is_float_type(type) && g.S % el == 0 && g.base + g.rows * g.S <= t_bytes &&
                  s[r.first + r.count - 1].offset + s[r.first + r.count - 1].size <= g.base + g.S;
        if (!is_grid) {
            return nullptr;
        }
    } else {
        is_grid = u <= 8 && is_float_type(type) && find_grid(s + r.first, r.count, el, t_bytes, g);
    }
    if (is_grid) {
        std::vector<int32_t> cells;
        for (size_t i = r.first; i < r.first + g.R; ++i) {
            const size_t c0 = (s[i].offset - g.base) / el;
            for (size_t k = 0; k < s[i].size / el; ++k) {
                cells.push_back((int32_t) (c0 + k));
            }
        }
        const int64_t n_cells = (int64_t) cells.size();
        const int64_t n_col   = (int64_t) (g.S / el);
        const int64_t n_row   = (int64_t) g.rows;
        if ((size_t) n_cells * n_row * el != r.bytes || n_col > INT32_MAX) {
            return nullptr;
        }
        ggml_tensor * m   = alias(ctx, t, type, n_col, n_row, g.base);   // [cell, element row]
        if (g.R <= MAX_VIEW_RANGES) {
            // few cell ranges: one strided copy per range, element rows as the second dimension,
            // instead of transposing the whole tensor (a cost that grows with the pool, not the
            // sequence: hundreds of ms a park for a large pool on a CPU-like device)
            ggml_tensor * buf = ggml_new_tensor_2d(ctx, type, n_cells, n_row);  // the bytes in the state buffer's order
            ggml_set_name(buf, to_host ? "preempt_gather" : "preempt_scatter");
            if (to_host) {
                ggml_set_output(buf);  // read back after the graph: not to be reused by the allocator
            } else {
                ggml_set_input(buf);
                *staging = buf;
            }
            ggml_tensor * last = nullptr;
            int64_t done = 0;
            for (size_t i = r.first; i < r.first + g.R; ++i) {
                const int64_t c0  = (int64_t) ((s[i].offset - g.base) / el);
                const int64_t len = (int64_t) (s[i].size / el);
                ggml_tensor * in_pool = ggml_view_2d(ctx, m, len, n_row, m->nb[1], (size_t) c0 * el);
                ggml_tensor * in_buf  = ggml_view_2d(ctx, buf, len, n_row, buf->nb[1], (size_t) done * el);
                if (last != nullptr) {
                    more.push_back(last);
                }
                last = to_host ? ggml_cpy(ctx, in_pool, in_buf) : ggml_cpy(ctx, in_buf, in_pool);
                done += len;
            }
            if (to_host) {
                more.push_back(last);
                return buf;
            }
            return last;
        }
        ggml_tensor * mt  = ggml_cont(ctx, ggml_transpose(ctx, m));     // [element row, cell]: a row per cell
        ggml_tensor * idx = make_idx(cells);
        if (to_host) {
            ggml_tensor * rows = ggml_get_rows(ctx, mt, idx);             // F32 [element row, n_cells]
            ggml_tensor * out  = ggml_new_tensor_2d(ctx, type, n_cells, n_row);
            out = ggml_cpy(ctx, ggml_transpose(ctx, rows), out);          // back to [n_cells, element row]
            ggml_set_output(out);
            return out;
        }
        ggml_tensor * in = ggml_new_tensor_2d(ctx, type, n_cells, n_row);
        ggml_set_input(in);
        *staging = in;
        ggml_tensor * src = ggml_cont(ctx, ggml_transpose(ctx, in));      // a row per cell
        if (type == GGML_TYPE_BF16) {
            src = ggml_cast(ctx, src, GGML_TYPE_F32);                   // set_rows reads F32 or F16
        }
        ggml_tensor * put = ggml_set_rows(ctx, mt, src, idx);
        return ggml_cpy(ctx, ggml_transpose(ctx, put), m);
    }

    // whole units of u bytes: one row per unit, moved as raw words (bit-exact, any tensor type)
    std::vector<int32_t> rows;
    rows.reserve(r.bytes / u);
    if (t_bytes / u > INT32_MAX) {
        return nullptr;
    }
    for (size_t i = r.first; i < r.first + r.count; ++i) {
        for (size_t k = 0; k < s[i].size / u; ++k) {
            rows.push_back((int32_t) (s[i].offset / u + k));
        }
    }
    const int64_t n_rows = (int64_t) rows.size();
    if (to_host) {
        ggml_tensor * src;
        if (u % 4 == 0) {
            src = alias(ctx, t, GGML_TYPE_I32, (int64_t) (u / 4), (int64_t) (t_bytes / u), 0);
        } else if (u % 2 == 0 && (type == GGML_TYPE_F16 || type == GGML_TYPE_BF16)) {
            src = alias(ctx, t, type, (int64_t) (u / 2), (int64_t) (t_bytes / u), 0);
        } else {
            return nullptr;
        }
        ggml_tensor * out = ggml_get_rows(ctx, src, make_idx(rows));
        if (out->type != src->type) {
            out = ggml_cast(ctx, out, src->type);  // F16/BF16 -> F32 -> back: exact
        }
        ggml_set_output(out);
        return out;
    }
    if (u % 2 != 0) {
        return nullptr;
    }
    // F16 to F16 set_rows is a plain copy of the 16-bit words
    ggml_tensor * dst = alias(ctx, t, GGML_TYPE_F16, (int64_t) (u / 2), (int64_t) (t_bytes / u), 0);
    ggml_tensor * in  = ggml_new_tensor_2d(ctx, GGML_TYPE_F16, (int64_t) (u / 2), n_rows);
    ggml_set_input(in);
    *staging = in;
    return ggml_set_rows(ctx, dst, in, make_idx(rows));
}

bool run_supported(ggml_backend_t backend, ggml_tensor * t, std::vector<ggml_tensor *> & seen) {
    if (t == nullptr || std::find(seen.begin(), seen.end(), t) != seen.end()) {
        return true;
    }
    seen.push_back(t);
    for (ggml_tensor * src : t->src) {
        if (!run_supported(backend, src, seen)) {
            return false;
        }
    }
    return t->op == GGML_OP_NONE || ggml_backend_supports_op(backend, t);
}

} // namespace llama_preempt
