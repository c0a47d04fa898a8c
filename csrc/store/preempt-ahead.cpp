// llama-preempt: restore ahead (see seq_copier::prefetch in preempt-copy.h). While slots are parked,
// the one the policy brings back first has its swap buffer uploaded to the devices its cells came
// from, each device getting the byte ranges its own tensors filled at the park (recorded by the
// park's gathers as placements), so that the restore only scatters on the devices.

#include "preempt-copy.h"

namespace llama_preempt {

bool seq_copier::can_prefetch() const {
    // a device the copies went through; with the bulk route never the CPU, whose tensors are
    // copied by memcpy
    if (route_ == copy_route::per_slice) {
        return false;
    }
    for (const auto & [dev, backend] : backends_) {
        if (backend != nullptr && (route_ == copy_route::graph || ggml_backend_dev_type(dev) != GGML_BACKEND_DEVICE_TYPE_CPU)) {
            return true;
        }
    }
    return false;
}

bool seq_copier::prefetch(const uint8_t * buf, size_t n) {
    if (prefetch_.host == buf && prefetch_.n == n) {
        return true;
    }
    drop_prefetch();
    auto it = placements_.find(buf);
    if (!can_prefetch() || n == 0 || it == placements_.end()) {
        return false;
    }
    // each device's ranges, adjacent ones merged: one upload per stretch of the buffer
    std::map<ggml_backend_t, prefetch_part> parts;
    for (const auto & pl : it->second) {
        if (pl.pos + pl.bytes > n) {
            continue;
        }
        auto & part = parts[pl.backend];
        part.backend = pl.backend;
        if (!part.ranges.empty() && part.ranges.back().pos + part.ranges.back().bytes == pl.pos) {
            part.ranges.back().bytes += pl.bytes;
        } else {
            part.ranges.push_back(pl);
        }
    }
    for (auto & [backend, part] : parts) {
        std::sort(part.ranges.begin(), part.ranges.end(), [](const placement & a, const placement & b) { return a.pos < b.pos; });
        ggml_backend_buffer_type_t buft = ggml_backend_get_default_buffer_type(backend);
        const size_t align = std::max<size_t>(1, ggml_backend_buft_get_alignment(buft));
        size_t total = 0;
        for (const auto & r : part.ranges) {
            part.offsets.push_back(total);
            total += (r.bytes + align - 1) / align * align;
        }
        part.device = ggml_backend_buft_alloc_buffer(buft, total);
        if (part.device == nullptr) {
            continue;  // no room on this device: its runs upload at the restore, as without this
        }
        ggml_init_params params = { part.ranges.size() * ggml_tensor_overhead(), nullptr, true };
        ggml_context * ctx = ggml_init(params);
        auto * base = (uint8_t *) ggml_backend_buffer_get_base(part.device);
        for (size_t i = 0; i < part.ranges.size(); ++i) {
            ggml_tensor * t = ggml_new_tensor_1d(ctx, GGML_TYPE_I8, (int64_t) part.ranges[i].bytes);
            t->buffer = part.device;
            t->data   = base + part.offsets[i];
            // on the copier's stream: before any scatter that reads it
            ggml_backend_tensor_set_async(backend, t, buf + part.ranges[i].pos, 0, part.ranges[i].bytes);
        }
        ggml_free(ctx);
        prefetch_.parts.push_back(std::move(part));
    }
    if (prefetch_.parts.empty()) {
        return false;
    }
    prefetch_.host = buf;
    prefetch_.n    = n;
    return true;
}

uint8_t * seq_copier::prefetched_at(ggml_backend_t backend, size_t pos, size_t bytes, ggml_backend_buffer_t * device) const {
    for (const auto & part : prefetch_.parts) {
        if (part.backend != backend) {
            continue;
        }
        // the last range starting at or before pos
        auto it = std::upper_bound(part.ranges.begin(), part.ranges.end(), pos,
                                   [](size_t p, const placement & r) { return p < r.pos; });
        if (it == part.ranges.begin()) {
            return nullptr;
        }
        --it;
        if (pos + bytes > it->pos + it->bytes) {
            return nullptr;
        }
        *device = part.device;
        return (uint8_t *) ggml_backend_buffer_get_base(part.device) + part.offsets[it - part.ranges.begin()] + (pos - it->pos);
    }
    return nullptr;
}

bool seq_copier::prefetched(const uint8_t * buf) const {
    return buf != nullptr && prefetch_.host == buf;
}

void seq_copier::drop_prefetch() {
    for (auto & part : prefetch_.parts) {
        ggml_backend_synchronize(part.backend);  // the upload may still read the host buffer
        ggml_backend_buffer_free(part.device);
    }
    prefetch_ = {};
}

} // namespace llama_preempt
