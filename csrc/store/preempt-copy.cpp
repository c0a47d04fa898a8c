// llama-preempt: bulk copies of a sequence's state (see preempt-copy.h).

#include "preempt-copy.h"
#include "preempt-gather.h"
#include "preempt-slice-runs.h"

#include "ggml-alloc.h"
#include "ggml.h"

#include <cstring>
#include <cstdlib>

namespace llama_preempt {

const char * copy_route_name(copy_route route) {
    switch (route) {
        case copy_route::bulk:      return "bulk";
        case copy_route::graph:     return "graph";
        case copy_route::per_slice: return "slice";
    }
    return "?";
}

const char * copy_how_name(unsigned how) {
    static const char * names[8] = {
        "nothing", "memcpy", "device graphs", "device graphs and memcpy", "single slices",
        "memcpy and single slices", "device graphs and single slices", "device graphs, memcpy and single slices",
    };
    return names[how & 7];
}

ggml_backend_dev_t device_of(ggml_backend_buffer_t buf) {
    if (buf == nullptr) {
        return nullptr;
    }
    ggml_backend_dev_t dev = ggml_backend_buft_get_device(ggml_backend_buffer_get_type(buf));
    if (dev == nullptr && ggml_backend_buffer_is_host(buf)) {
        dev = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);  // the CPU buffer type names no device
    }
    return dev;
}

device_move & copy_report::on(ggml_backend_dev_t dev) {
    for (auto & d : devices) {
        if (d.dev == dev) {
            return d;
        }
    }
    device_move d;
    d.dev    = dev;
    d.device = dev ? ggml_backend_dev_name(dev) : "no device";
    devices.push_back(d);
    return devices.back();
}

struct copy_pending {
    ggml_backend_t backend = nullptr;
    std::vector<uint8_t *> flips;  // LLAMA_SERVER_PREEMPT_CORRUPT: bytes to flip once the transfers landed
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
    ggml_backend_dev_t dev = device_of(buf);
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

// a run the bulk routes do not take: upstream's copy, one slice at a time, counted for its device
// (`why`: the reason to show for its device, null when the route says it)
static void one_slice_at_a_time(const llama_state_seq_slice * s, const slice_run & r, uint8_t * buf, bool to_host,
                                copy_report & report, device_move & dm, const char * why) {
    per_slice_run(s, r, buf, to_host);
    report.n_fallback += n_pieces(s, r);
    dm.note(how_slices, r.bytes, why);
}

void seq_copier::wait() {
    for (auto & p : pending_) {
        ggml_backend_synchronize(p->backend);
        for (uint8_t * b : p->flips) {
            *b ^= 0xff;
        }
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
        if (!supported || faults_.refuse_gather) {
            report.why_fallback = faults_.refuse_gather ? "an op the device does not support (LLAMA_SERVER_PREEMPT_REFUSE_GATHER)"
                                                        : "an op the device does not support";
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

    auto & dm = report.on(ggml_backend_get_device(backend));
    for (const auto & m : moved) {
        dm.note(how_graphs, m.run->bytes);
    }
    for (const auto * r : left) {
        one_slice_at_a_time(s, *r, buf, to_host, report, dm, report.why_fallback);
    }
    // LLAMA_SERVER_PREEMPT_CORRUPT on the graphs: a park's byte is flipped once its transfer landed
    const bool flip = to_host && !moved.empty() && faults_.corrupts(route_, how_graphs) && !faults_.corrupt_restore && !flipped_;
    flipped_ |= flip;

    if (!to_host || moved.empty()) {
        ggml_backend_synchronize(backend);  // a restore is complete before the next decode reads it
        return true;
    }
    if (flip) {
        p->flips.push_back(buf + moved.front().run->pos);
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
        for (uint8_t * b : p->flips) {
            *b ^= 0xff;
        }
    }
    return true;
}

void seq_copier::corrupt(const llama_state_seq_slice * s, const void * run, uint8_t * buf, bool to_host, unsigned how, bool & done) {
    if (done || !faults_.corrupts(route_, how) || to_host == faults_.corrupt_restore) {
        return;
    }
    const auto * r = (const slice_run *) run;
    done = true;
    if (to_host) {
        buf[r->pos] ^= 0xff;
        return;
    }
    // a restore: the first byte the run wrote into its tensor
    uint8_t b = 0;
    ggml_backend_tensor_get(r->tensor, &b, s[r->first].offset, 1);
    b ^= 0xff;
    ggml_backend_tensor_set(r->tensor, &b, s[r->first].offset, 1);
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
        ggml_backend_dev_t dev = device_of(r.tensor->buffer);
        const copy_route route = route_of(dev);
        auto & dm = report.on(dev);
        if (route == copy_route::bulk && on_host) {
            report.n_memcpy += memcpy_run(s, r, buf, to_host);
            dm.note(how_memcpy, r.bytes);
            corrupt(s, &r, buf, to_host, how_memcpy, flipped_);
            continue;
        }
        ggml_backend_t backend = route != copy_route::per_slice && r.tensor->buffer ? backend_for(r.tensor->buffer) : nullptr;
        if (backend == nullptr) {
            if (route != copy_route::per_slice) {
                report.why_fallback = "a tensor on a buffer with no device";
            }
            one_slice_at_a_time(s, r, buf, to_host, report, dm, route != copy_route::per_slice ? report.why_fallback : nullptr);
            corrupt(s, &r, buf, to_host, how_slices, flipped_);
            continue;
        }
        groups[backend].push_back(&r);
    }
    for (auto & [backend, group] : groups) {
        if (!run_group(backend, s, group, buf, to_host, report)) {
            auto & dm = report.on(ggml_backend_get_device(backend));
            for (const void * g : group) {
                one_slice_at_a_time(s, *(const slice_run *) g, buf, to_host, report, dm, report.why_fallback);
            }
        } else if (!to_host) {
            // a restore by the graphs is complete here: LLAMA_SERVER_PREEMPT_CORRUPT flips a byte it wrote
            corrupt(s, group.front(), buf, to_host, how_graphs, flipped_);
        }
    }
    return true;
}

bool seq_copier::gather(const llama_state_seq_slice * slices, size_t n, uint8_t * buf, copy_report & report) {
    flipped_ = false;
    return copy(slices, n, buf, true, report);
}

bool seq_copier::scatter(const llama_state_seq_slice * slices, size_t n, const uint8_t * buf, copy_report & report) {
    flipped_ = false;
    return copy(slices, n, const_cast<uint8_t *>(buf), false, report);
}

} // namespace llama_preempt
