// llama-preempt: a parked state held in host RAM at about half its bytes, for the compressed host
// tier (--preempt-compress q8_0, server/preempt-tiers.h).
//
// The state is upstream's serialization, as a RAM park's host copy holds it. Its float tensors'
// bytes (f32, f16, bf16: the KV cells, a recurrent state) are quantized to q8_0, ggml's blocks of
// 32 values with one f16 scale (34 bytes where f16 takes 64, f32 128); every other byte (the
// records: cell positions, sequences, per-layer types and sizes; a tensor already quantized; a
// run's last values short of a block) is kept as it is. Not byte-exact: each value comes back
// within half a step of its block's scale (1/254 of the block's largest magnitude), so a resumed
// answer may differ from the unparked one after the park; opt-in for that reason.
#pragma once

#include "ggml.h"
#include "llama.h"

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace llama_preempt {

struct seq_contexts;
struct swap_host;
struct swap_state;

// a run of a state's bytes that lives in one float tensor: [pos, pos + n) of one context's part
struct float_run {
    size_t    pos  = 0;
    size_t    n    = 0;  // bytes
    ggml_type type = GGML_TYPE_F32;
};

// how a host copy is held packed, kept by the tier beside the state: per part (target, draft), the
// runs it was packed by and its full size
struct q8_form {
    std::vector<float_run> runs[2];
    size_t                 full[2] = {};

    size_t full_bytes() const { return full[0] + full[1]; }
};

// Where the floats lie in one context's part of a sequence's state (`n`: its bytes, size_state()):
// the serializer lays the state out again over an address reservation of which only the records'
// pages are touched; nothing is copied. The cells must still be in place. False: not laid out.
bool float_runs_of(llama_context * ctx, llama_seq_id seq, size_t n, std::vector<float_run> & runs, std::string & why);

// the bytes `n` bytes take packed by these runs (sorted, apart, within n)
size_t q8_packed_size(size_t n, const std::vector<float_run> & runs);
// `n` bytes packed into dst (q8_packed_size() bytes), and back
void q8_pack(const uint8_t * src, size_t n, const std::vector<float_run> & runs, uint8_t * dst);
void q8_unpack(const uint8_t * src, const std::vector<float_run> & runs, uint8_t * dst, size_t n);

// A RAM park's host copy compressed in place: its transfer settled first (a checked park has its
// verdict), its runs laid out from its contexts (its cells still in place), its buffers replaced by
// smaller ones, held as the compressed tier's (swap_state::held_as); how, into `form`. False with
// `why`: the copy is left as it was, a plain RAM park.
bool compress_state(swap_state & st, const seq_contexts & sc, swap_host & host, q8_form & form, std::string & why);
// A compressed copy back to its full bytes in new buffers (pinned where the device offers), a plain
// host copy again, ready for swap_in(). False with `why`: no host memory for them (the compressed
// copy is kept).
bool expand_state(swap_state & st, const q8_form & form, swap_host & host, std::string & why);

} // namespace llama_preempt
