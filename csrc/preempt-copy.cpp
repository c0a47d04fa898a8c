// llama-preempt: bulk copies of a sequence's state (see preempt-copy.h).

#include "preempt-copy.h"

#include "ggml-alloc.h"
#include "ggml.h"

#include <chrono>
#include <climits>
#include <cstring>
#include <cstdlib>
#include <numeric>

namespace llama_preempt {

const char * copy_route_name(copy_route route) {
    switch (route) {
        case copy_route::bulk:      return "bulk";
        case copy_route::graph:     return "graph";
        case copy_route::per_slice: return "slice";
    }
    return "?";
}

struct copy_pending {
    ggml_backend_t backend = nullptr;
    ggml_context * ctx     = nullptr;
    ggml_gallocr_t galloc  = nullptr;
    std::vector<std::pair<ggml_tensor *, std::vector<int32_t>>> idx;  // row indices, uploaded asynchronously: kept until synchronized

    ~copy_pending() {
        if (galloc) {
            ggml_gallocr_free(galloc);
        }
        if (ctx) {
            ggml_free(ctx);
        }
    }
};

namespace {

// consecutive slices of one tensor that fill one contiguous stretch of the state buffer; or a grid:
// the slices of one write_tensor_rows call (same rows, one span each, a row of the buffer between them)
struct slice_run {
    ggml_tensor * tensor;
    size_t first;  // index of its first slice
    size_t count;
    size_t pos;    // in the state buffer
    size_t bytes;
    bool   grid = false;
};

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
inline void copy_bytes(uint8_t * dst, const uint8_t * src, size_t n) {
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

// a transposed V spread over at most this many cell ranges is moved by one strided copy per range;
// beyond, by a transpose of the whole tensor (fewer graph nodes: a graph a fragmented pool would
// otherwise fill with thousands of small copies)
constexpr size_t MAX_VIEW_RANGES = 64;

// the ops that move one run on a device. Gather: returns the contiguous staging tensor holding the
// run's bytes in the buffer's order. Scatter: `staging` is an input holding those bytes; returns the
// last op writing the tensor. Null when the run's layout is not covered (copied slice by slice).
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

// every op of a run's graph runs on the backend (a backend that lacks one copies that run slice by
// slice; the other runs still go through the device)
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

// what the device can do, from its caps: a backend without them still copies, synchronously
ggml_backend_dev_caps device_caps(ggml_backend_t backend) {
    ggml_backend_dev_props props;
    ggml_backend_dev_get_props(ggml_backend_get_device(backend), &props);
    return props.caps;
}

} // namespace

seq_copier::seq_copier(copy_route route) : route_(route) {}

seq_copier::~seq_copier() {
    wait();
    drop_prefetch();
    for (auto & [dev, backend] : backends_) {
        ggml_backend_free(backend);
    }
}

ggml_backend_t seq_copier::backend_for(ggml_backend_buffer_t buf) {
    ggml_backend_dev_t dev = ggml_backend_buft_get_device(ggml_backend_buffer_get_type(buf));
    if (dev == nullptr && ggml_backend_buffer_is_host(buf)) {
        dev = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);  // the CPU buffer type names no device
    }
    if (dev == nullptr) {
        return nullptr;
    }
    auto it = backends_.find(dev);
    if (it != backends_.end()) {
        return it->second;
    }
    // our own backend on the device: its own stream, so transfers overlap the context's decodes
    ggml_backend_t backend = ggml_backend_dev_init(dev, nullptr);
    backends_[dev] = backend;
    if (backend && host_buft_ == nullptr && ggml_backend_dev_type(dev) != GGML_BACKEND_DEVICE_TYPE_CPU) {
        host_buft_ = ggml_backend_dev_host_buffer_type(dev);
    }
    return backend;
}

void seq_copier::wait() {
    for (auto & p : pending_) {
        ggml_backend_synchronize(p->backend);
    }
    pending_.clear();
}

void seq_copier::release(const uint8_t * buf) {
    wait();
    if (prefetched(buf)) {
        drop_prefetch();
    }
    placements_.erase(buf);
}

// one device: a graph moves every covered run, then one transfer per run to host RAM
bool seq_copier::run_group(ggml_backend_t backend, const llama_state_seq_slice * s, const std::vector<const void *> & group,
                           uint8_t * buf, bool to_host, copy_report & report) {
    auto p = std::make_unique<copy_pending>();
    p->backend = backend;

    // graph size: a few nodes a run, three a cell range where a run copies range by range
    size_t n_max = 16;
    for (const void * g : group) {
        n_max += 16 + 4 * std::min(((const slice_run *) g)->count, MAX_VIEW_RANGES);
    }
    ggml_init_params params = {
        /*.mem_size   =*/ n_max * ggml_tensor_overhead() + ggml_graph_overhead_custom(n_max, false),
        /*.mem_buffer =*/ nullptr,
        /*.no_alloc   =*/ true,
    };
    p->ctx = ggml_init(params);
    if (p->ctx == nullptr) {
        return false;
    }
    ggml_cgraph * gf = ggml_new_graph_custom(p->ctx, n_max, false);

    struct moved_run {
        ggml_tensor *     staging;  // the gather's output, or the scatter's input
        const slice_run * run;
        bool              ahead;    // a scatter input already on the device (restore ahead)
    };
    std::vector<moved_run> moved;
    std::vector<const slice_run *> left;  // runs the graphs do not cover
    std::vector<ggml_tensor *> seen;
    std::vector<ggml_tensor *> more;  // other nodes of the run, besides the one build_run returns
    for (const void * g : group) {
        const auto * r = (const slice_run *) g;
        ggml_tensor * staging = nullptr;
        more.clear();
        ggml_tensor * node = build_run(p->ctx, s, *r, to_host, p->idx, &staging, more);
        if (node == nullptr) {
            report.why_fallback = "a layout the gather does not cover";
            left.push_back(r);
            continue;
        }
        seen.clear();
        bool supported = run_supported(backend, node, seen);
        for (ggml_tensor * t : more) {
            supported = supported && run_supported(backend, t, seen);
        }
        if (!supported) {
            report.why_fallback = "an op the device does not support";
            left.push_back(r);
            continue;
        }
        bool ahead = false;
        if (!to_host && prefetch_.host == buf) {
            // a restore whose bytes were uploaded ahead reads them where they are
            ggml_backend_buffer_t device = nullptr;
            if (uint8_t * at = prefetched_at(backend, r->pos, r->bytes, &device)) {
                staging->data   = at;
                staging->buffer = device;
                ahead = true;
            }
        }
        for (ggml_tensor * t : more) {
            ggml_build_forward_expand(gf, t);
        }
        ggml_build_forward_expand(gf, node);
        moved.push_back({ to_host ? node : staging, r, ahead });
    }

    if (!moved.empty()) {
        p->galloc = ggml_gallocr_new(ggml_backend_get_default_buffer_type(backend));
        if (!ggml_gallocr_alloc_graph(p->galloc, gf)) {
            report.why_fallback = "no device memory for the staging tensors";
            return false;
        }
        for (auto & [t, v] : p->idx) {
            ggml_backend_tensor_set_async(backend, t, v.data(), 0, v.size() * sizeof(int32_t));
        }
        for (const auto & m : moved) {
            if (!to_host && !m.ahead) {
                ggml_backend_tensor_set_async(backend, m.staging, buf + m.run->pos, 0, m.run->bytes);
            }
            report.prefetched |= m.ahead;
        }
        if (ggml_backend_graph_compute_async(backend, gf) != GGML_STATUS_SUCCESS) {
            ggml_backend_synchronize(backend);
            report.why_fallback = "the device graph failed";
            return false;
        }
        report.n_gathered += moved.size();
    }

    for (const auto * r : left) {
        per_slice_run(s, *r, buf, to_host);
        report.n_fallback += n_pieces(s, *r);
    }

    if (!to_host || moved.empty()) {
        ggml_backend_synchronize(backend);  // a restore is complete before the next decode reads it
        return true;
    }

    // where this device's bytes sit in the buffer, for restore ahead
    auto & where = placements_[buf];
    for (const auto & m : moved) {
        where.push_back({ backend, m.run->pos, m.run->bytes });
    }

    // A park: the gather must have read the cells before the caller frees them, but the transfers
    // to host RAM can run on while the next decode computes. An event marks the end of the gather.
    // A device without events or asynchronous copies is waited for here (RPC has both, and runs
    // every command of one connection in order).
    const ggml_backend_dev_caps caps = device_caps(backend);
    ggml_backend_event_t gathered = caps.events && caps.async ? ggml_backend_event_new(ggml_backend_get_device(backend)) : nullptr;
    if (gathered) {
        ggml_backend_event_record(gathered, backend);
    }
    for (const auto & m : moved) {
        ggml_backend_tensor_get_async(backend, m.staging, buf + m.run->pos, 0, m.run->bytes);
    }
    if (gathered) {
        ggml_backend_event_synchronize(gathered);
        ggml_backend_event_free(gathered);
        report.in_flight = true;
        pending_.push_back(std::move(p));
    } else {
        ggml_backend_synchronize(backend);
    }
    return true;
}

bool seq_copier::copy(const llama_state_seq_slice * s, size_t n, uint8_t * buf, bool to_host, copy_report & report) {
    report.n_slices += n;
    const std::vector<slice_run> runs = split_runs(s, n);

    std::map<ggml_backend_t, std::vector<const void *>> groups;  // runs per device backend
    for (const auto & r : runs) {
        report.n_bytes += r.bytes;
        report.n_ranges = std::max<size_t>(report.n_ranges, 1);
        if (r.count > 1 && (report.n_ranges == 1 || r.count < report.n_ranges)) {
            report.n_ranges = r.count;
        }
        const bool on_host = r.tensor->buffer != nullptr && ggml_backend_buffer_is_host(r.tensor->buffer);
        if (route_ == copy_route::bulk && on_host) {
            report.n_memcpy += memcpy_run(s, r, buf, to_host);
            continue;
        }
        ggml_backend_t backend = route_ != copy_route::per_slice && r.tensor->buffer ? backend_for(r.tensor->buffer) : nullptr;
        if (backend == nullptr) {
            if (route_ != copy_route::per_slice) {
                report.why_fallback = "a tensor on a buffer with no device";
            }
            per_slice_run(s, r, buf, to_host);
            report.n_fallback += n_pieces(s, r);
            continue;
        }
        groups[backend].push_back(&r);
    }
    for (auto & [backend, group] : groups) {
        if (!run_group(backend, s, group, buf, to_host, report)) {
            for (const void * g : group) {
                const auto * r = (const slice_run *) g;
                per_slice_run(s, *r, buf, to_host);
                report.n_fallback += n_pieces(s, *r);
            }
        }
    }
    return true;
}

bool seq_copier::gather(const llama_state_seq_slice * slices, size_t n, uint8_t * buf, copy_report & report) {
    return copy(slices, n, buf, true, report);
}

bool seq_copier::scatter(const llama_state_seq_slice * slices, size_t n, const uint8_t * buf, copy_report & report) {
    return copy(slices, n, const_cast<uint8_t *>(buf), false, report);
}

bool copy_slices_fn(const llama_state_seq_slice * slices, size_t n_slices, void * user_data) {
    auto * call = (copy_call *) user_data;
    const auto t0 = std::chrono::steady_clock::now();
    struct timer {
        copy_call * call;
        std::chrono::steady_clock::time_point t0;
        ~timer() { call->report.t_copy_us += std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t0).count(); }
    } t { call, t0 };
    try {
        call->ok = call->to_host ? call->copier->gather(slices, n_slices, call->buf, call->report)
                                 : call->copier->scatter(slices, n_slices, call->buf, call->report);
    } catch (const std::exception &) {
        call->ok = false;
    }
    return call->ok;
}

} // namespace llama_preempt
