// llama-preempt: how the serializer's slices of a sequence's state group into runs (stretches of
// one tensor that fill one stretch of the state buffer), and the copies of a run that need no
// device graph: plain memcpy for host tensors, one get/set per slice for any backend. Internal to
// the copier (preempt-copy.cpp), which picks the route per run.
#pragma once

#include "preempt-gather.h"

#include <cstddef>
#include <cstdint>
#include <vector>

namespace llama_preempt {

// the runs of `n` slices, in order (a write_tensor_rows call becomes one grid run)
std::vector<slice_run> split_runs(const llama_state_seq_slice * s, size_t n);

// host tensors: one memcpy per stretch of adjacent slices; returns the memcpy calls made
size_t memcpy_run(const llama_state_seq_slice * s, const slice_run & r, uint8_t * buf, bool to_host);

// any backend: ggml_backend_tensor_get/set per slice (and per row of a grid)
void per_slice_run(const llama_state_seq_slice * s, const slice_run & r, uint8_t * buf, bool to_host);

// the pieces (slice rows) a run moves
size_t n_pieces(const llama_state_seq_slice * s, const slice_run & r);

} // namespace llama_preempt
