// llama-preempt: checking a SWAP copy byte for byte, and the guard (preempt-verify.h).
#include "preempt-verify.h"

#include "preempt-copy.h"

#include "ggml.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace llama_preempt {

std::string copy_mismatch::describe() const {
    char line[512];
    if (tensor.empty()) {
        snprintf(line, sizeof(line), "%s context, byte %zu of the state's metadata (cell positions and sequence ids)", part.c_str(), pos);
        return line;
    }
    char layer_s[32] = "";
    if (layer >= 0) {
        snprintf(layer_s, sizeof(layer_s), " (layer %d)", layer);
    }
    snprintf(line, sizeof(line), "%s context, tensor %s%s, cell %lld, on %s, byte %zu", part.c_str(), tensor.c_str(), layer_s,
             (long long) cell, device.c_str(), pos);
    return line;
}

// the layer in a cache tensor's name: cache_k_l12 -> 12
static int32_t layer_of(const char * name) {
    const char * l = strrchr(name, 'l');
    if (l == nullptr || l == name || l[-1] != '_' || l[1] < '0' || l[1] > '9') {
        return -1;
    }
    return (int32_t) atoi(l + 1);
}

// the cell a byte at `offset` of tensor t belongs to. A grid (the serializer's rows of a transposed
// V) holds V[cell, element] at (element * cells + cell) * size; every other layout a row per cell.
static int64_t cell_of(const ggml_tensor * t, size_t offset, bool grid) {
    if (grid) {
        return (int64_t) ((offset / ggml_type_size(t->type)) % (size_t) t->ne[1]);
    }
    return t->nb[1] > 0 ? (int64_t) (offset / t->nb[1]) : -1;
}

static copy_mismatch locate(const copy_layout & layout, size_t pos, const char * part) {
    copy_mismatch m;
    m.found = true;
    m.part  = part;
    m.pos   = pos;
    for (const auto & s : layout.slices) {
        const size_t n_rows = std::max<size_t>(1, s.n_rows);
        for (size_t j = 0; j < n_rows; ++j) {
            const size_t at = s.pos + j * s.pos_stride;
            if (pos < at || pos >= at + s.size) {
                continue;
            }
            const size_t offset = s.offset + j * s.row_stride + (pos - at);
            m.tensor = ggml_get_name(s.tensor);
            m.tensor = m.tensor.substr(0, m.tensor.find(' '));  // "cache_k_l0 (view)": the cache tensor's name
            m.layer  = layer_of(m.tensor.c_str());
            m.cell   = cell_of(s.tensor, offset, s.n_rows > 1);
            m.dev    = device_of(s.tensor->buffer);
            m.device = m.dev ? ggml_backend_dev_name(m.dev) : "no device";
            return m;
        }
    }
    return m;  // not in any slice: the metadata between them
}

copy_mismatch first_difference(const uint8_t * want, const uint8_t * got, size_t n, const copy_layout & layout, const char * part) {
    if (memcmp(want, got, n) == 0) {
        return {};
    }
    size_t i = 0;
    while (i < n && want[i] == got[i]) {
        ++i;
    }
    return locate(layout, i, part);
}

copy_mismatch check_restored(const copy_layout & layout, const uint8_t * buf, const char * part) {
    std::vector<uint8_t> back;
    for (const auto & s : layout.slices) {
        back.resize(s.size);
        const size_t n_rows = std::max<size_t>(1, s.n_rows);
        for (size_t j = 0; j < n_rows; ++j) {
            const uint8_t * want = buf + s.pos + j * s.pos_stride;
            ggml_backend_tensor_get(s.tensor, back.data(), s.offset + j * s.row_stride, s.size);
            if (memcmp(want, back.data(), s.size) != 0) {
                size_t i = 0;
                while (want[i] == back[i]) {
                    ++i;
                }
                return locate(layout, s.pos + j * s.pos_stride + i, part);
            }
        }
    }
    return {};
}

bool verify_guard::due(bool park) const {
    if (n_first < 0) {
        return true;
    }
    if (n_first == 0) {
        return false;
    }
    if (seen_.empty()) {
        return true;  // nothing moved yet: the first copy is checked
    }
    const auto & n = park ? n_parks_ : n_restores_;
    for (const auto & d : seen_) {
        auto it = n.find(d);
        if (it == n.end() || it->second < n_first) {
            return true;
        }
    }
    return false;
}

void verify_guard::count(bool park, const std::vector<std::string> & devices) {
    auto & n = park ? n_parks_ : n_restores_;
    for (const auto & d : devices) {
        n[d]++;
        if (std::find(seen_.begin(), seen_.end(), d) == seen_.end()) {
            seen_.push_back(d);
        }
    }
}

void verify_guard::route_changed(const std::string & device) {
    n_parks_.erase(device);
    n_restores_.erase(device);
}

} // namespace llama_preempt
