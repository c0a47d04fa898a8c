// llama-preempt: the device graphs of a bulk SWAP copy (see preempt-copy.h). The serializer's slices
// of one tensor, grouped into runs, become a few ggml ops that gather the run's cells into one
// staging tensor (a park) or scatter a staging tensor into the cells (a restore). Internal to the
// copier: preempt-copy.cpp groups the slices and runs the graphs, this unit only builds them.
#pragma once

#include "ggml-backend.h"
#include "ggml.h"
#include "llama.h"

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace llama_preempt {

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

// a transposed V spread over at most this many cell ranges is moved by one strided copy per range;
// beyond, by a transpose of the whole tensor (fewer graph nodes: a graph a fragmented pool would
// otherwise fill with thousands of small copies)
constexpr size_t MAX_VIEW_RANGES = 64;

// the ops that move one run on a device. Gather: returns the contiguous staging tensor holding the
// run's bytes in the buffer's order. Scatter: `staging` is an input holding those bytes; returns the
// last op writing the tensor. `more`: the run's other nodes the graph must include. Null when the
// run's layout is not covered (copied slice by slice).
ggml_tensor * build_run(ggml_context * ctx, const llama_state_seq_slice * s, const slice_run & r, bool to_host,
                        std::vector<std::pair<ggml_tensor *, std::vector<int32_t>>> & idx_data, ggml_tensor ** staging,
                        std::vector<ggml_tensor *> & more);

// every op of a run's graph runs on the backend (a backend that lacks one copies that run slice by
// slice; the other runs still go through the device)
bool run_supported(ggml_backend_t backend, ggml_tensor * t, std::vector<ggml_tensor *> & seen);

} // namespace llama_preempt
