// llama-preempt: checking a SWAP copy byte for byte, and the guard that decides which copies to
// check in production.
//
// A wrong copy does not crash: it resumes a request on corrupted KV and the answer silently goes
// wrong. So a park's buffer is compared with upstream's own serializer (llama_state_seq_get_data_ext,
// while the cells are still in place), and a restore's cells are read back slice by slice with
// ggml_backend_tensor_get (upstream's own per-slice copy) and compared with the buffer they came
// from. A difference is located: the part (target or draft context), the tensor, its layer, the
// cell, and the device the tensor lives on. The guard checks the first parks and restores on each
// device, and again after a device's route changes; llama-server --preempt-selftest checks every one.
#pragma once

#include "ggml-backend.h"
#include "llama.h"

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace llama_preempt {

// a copy checked against upstream's own bytes (--preempt-verify, the doctor)
enum class copy_check {
    none,   // not checked
    right,  // the bytes equal upstream's
    wrong,  // they differ (the copy is refused: its request recomputes)
};
// the doctor's JSON and older reports: 1 right, 0 wrong, -1 not checked
inline int copy_check_number(copy_check c) { return c == copy_check::right ? 1 : c == copy_check::wrong ? 0 : -1; }

// a copy's slices as the serializer handed them over: where each byte of the buffer came from
struct copy_layout {
    std::vector<llama_state_seq_slice> slices;
    void add(const llama_state_seq_slice * s, size_t n) { slices.insert(slices.end(), s, s + n); }
};

// where a copy first differs from its reference
struct copy_mismatch {
    bool               found = false;
    std::string        part;          // "target" or "draft" (the context)
    size_t             pos   = 0;     // byte of that part's buffer
    std::string        tensor;        // the tensor's name ("" : the state's metadata, not a tensor's data)
    int32_t            layer = -1;    // from the tensor's name (cache_k_l3: 3), -1 when it has none
    int64_t            cell  = -1;    // the KV cell (or recurrent slot) of that byte
    ggml_backend_dev_t dev   = nullptr;
    std::string        device;        // the device the tensor lives on

    std::string describe() const;     // "target context, tensor cache_k_l3 (layer 3), cell 97, on CPU, byte 1234"
};

// the first byte where `got` differs from `want` (n bytes of one part's buffer), located in `layout`
copy_mismatch first_difference(const uint8_t * want, const uint8_t * got, size_t n, const copy_layout & layout, const char * part);

// A restore's check: every slice of `layout` read back from its tensor by ggml_backend_tensor_get and
// compared with `buf`, the bytes the restore wrote there. Not found: the cells hold the buffer's bytes.
copy_mismatch check_restored(const copy_layout & layout, const uint8_t * buf, const char * part);

// Which copies to check in production (--preempt-verify N): the first N parks and the first N
// restores on each device, counted again from zero when the device's route changes; -1 checks every
// copy, 0 none. A copy is checked when any device it moves is still due.
struct verify_guard {
    int32_t n_first = 3;

    // a park (or restore) is checked while any device the copies have moved so far is due (the
    // first copy, before any device is known, is)
    bool due(bool park) const;
    void count(bool park, const std::vector<std::string> & devices);
    void route_changed(const std::string & device);  // its copies are checked again from the first

private:
    std::map<std::string, int32_t> n_parks_, n_restores_;
    std::vector<std::string>       seen_;
};

} // namespace llama_preempt
