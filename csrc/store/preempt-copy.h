// llama-preempt: bulk copies of a sequence's state between its memory (KV cache, recurrent state)
// and host RAM, for SWAP parks and restores.
//
// llama.cpp's serializer (llama_state_seq_get_data_cb / set_data_cb, patches/0006-state-seq-bulk-copy.patch) lays out a
// sequence's state and hands us every tensor slice it would copy: one per cell range and layer,
// and one per V element row when V is stored transposed (flash attention off). Copied one by one
// these are thousands of small synchronous copies for a sequence whose cells are scattered through
// a shared pool. Here they are grouped per tensor and copied in bulk:
//  - a tensor in host memory: one memcpy per run of adjacent cells;
//  - a tensor on a device: one small graph per device gathers the slices of every tensor into
//    contiguous staging tensors (get_rows over the cells; for a transposed V, a transpose on the
//    device first), and each staging tensor goes to host RAM in one asynchronous transfer, which
//    overlaps the next decode; a restore uploads each run in one transfer and scatters it with
//    set_rows.
// The bytes are exactly the serializer's format: a park through here and one through upstream's
// own copy produce the same buffer (LLAMA_SERVER_PREEMPT_VERIFY checks this on every park).
#pragma once

#include "ggml-backend.h"
#include "llama.h"
#include "preempt-hostmem.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace llama_preempt {

// which way a copy goes
enum class copy_route {
    bulk,       // host tensors by memcpy, device tensors by gather/scatter graphs (the default)
    graph,      // every tensor by the graphs, host ones too (LLAMA_SERVER_PREEMPT_COPY=graph: tests the device path on a CPU)
    per_slice,  // upstream's copy, one slice at a time (LLAMA_SERVER_PREEMPT_COPY=slice: the baseline)
};

const char * copy_route_name(copy_route route);

// how bytes moved, as bits (a copy may use several): the routes the guard and the doctor name
enum copy_how : unsigned {
    how_memcpy = 1,  // host tensors, by memcpy
    how_graphs = 2,  // device tensors, by the gather/scatter graphs
    how_slices = 4,  // one slice at a time, by ggml_backend_tensor_get/set (upstream's copy)
};
const char * copy_how_name(unsigned how);  // "memcpy", "device graphs", "device graphs and memcpy", ...

// how one device's tensors moved in a copy
struct device_move {
    ggml_backend_dev_t dev = nullptr;
    std::string  device;                  // the device's name ("CPU" for host memory)
    unsigned     how     = 0;             // copy_how bits
    size_t       n_bytes = 0;
    const char * why_slices = nullptr;    // why some of its slices went one at a time

    void note(unsigned by, size_t n, const char * why = nullptr) {
        how     |= by;
        n_bytes += n;
        why_slices = why ? why : why_slices;
    }
};

// Faults a copy can be made to meet (test knobs, preempt-config.h), to prove that the guard and
// the doctor catch them: a device that refuses the gather graph, and a byte flipped after a copy.
struct copy_faults {
    bool     refuse_gather   = false;  // LLAMA_SERVER_PREEMPT_REFUSE_GATHER: every device lacks the gather's ops
    // LLAMA_SERVER_PREEMPT_CORRUPT=ROUTE: the copies a copier of that route makes by the means the route
    // itself uses on each device (bulk: memcpy on the host, device graphs on a GPU) get one byte flipped;
    // a device the guard moved to single slices is no longer hit
    unsigned corrupt_how     = 0;      // copy_how bits of the route's own means
    int      corrupt_route   = -1;     // the copy_route hit (-1: none)
    bool     corrupt_restore = false;  //   ROUTE:restore flips a restored byte in the tensor, else a parked byte in the buffer

    bool corrupts(copy_route route, unsigned how) const { return (int) route == corrupt_route && (corrupt_how & how); }
};

// what one gather or scatter did, for the logs and the bench
struct copy_report {
    size_t  n_slices   = 0;  // slices handed over by the serializer
    size_t  n_memcpy   = 0;  // host memcpy calls (after merging adjacent slices)
    size_t  n_gathered = 0;  // tensor runs moved by a device graph
    size_t  n_fallback = 0;  // slices copied one at a time (a tensor the graphs do not cover)
    bool    prefetched = false;  // a restore that found its bytes already on the device
    size_t  n_bytes    = 0;
    size_t  n_ranges   = 0;  // cell ranges of the sequence (the fewest slices a tensor took, where more than one)
    int64_t t_copy_us  = 0;  // time spent copying (inside the serializer's callback)
    const char * why_fallback = nullptr;  // why some slices were copied one at a time
    bool    in_flight  = false;  // transfers to host RAM still running (wait() before reading the buffer)
    std::vector<device_move> devices;    // per device: how its tensors moved

    // the device's entry, made on first use
    device_move & on(ggml_backend_dev_t dev);

    // how the bytes moved, for the park's log line
    const char * how() const {
        return copy_how_name((n_memcpy > 0 ? how_memcpy : 0) | (n_gathered > 0 ? how_graphs : 0) | (n_fallback > 0 ? how_slices : 0));
    }

    // the report of two copies (a target and a draft context) as one
    void merge(const copy_report & o) {
        n_slices   += o.n_slices;
        n_memcpy   += o.n_memcpy;
        n_gathered += o.n_gathered;
        n_fallback += o.n_fallback;
        n_bytes    += o.n_bytes;
        t_copy_us  += o.t_copy_us;
        n_ranges    = std::max(n_ranges, o.n_ranges);
        prefetched |= o.prefetched;
        in_flight  |= o.in_flight;
        if (why_fallback == nullptr) {
            why_fallback = o.why_fallback;
        }
        for (const auto & d : o.devices) {
            auto & m = on(d.dev);
            m.how     |= d.how;
            m.n_bytes += d.n_bytes;
            if (m.why_slices == nullptr) {
                m.why_slices = d.why_slices;
            }
        }
    }
};

// a pending gather: what must live until its transfers to host RAM finish
struct copy_pending;

class seq_copier {
public:
    explicit seq_copier(copy_route route = copy_route::bulk);
    ~seq_copier();

    seq_copier(const seq_copier &) = delete;
    seq_copier & operator=(const seq_copier &) = delete;

    copy_route route() const { return route_; }

    // A device's own route, where it differs from the copier's: the guard moves a device whose
    // copies went wrong to the per-slice route (preempt-verify.h)
    void set_device_route(ggml_backend_dev_t dev, copy_route route) { dev_routes_[dev] = route; }
    copy_route route_of(ggml_backend_dev_t dev) const {
        auto it = dev_routes_.find(dev);
        return it == dev_routes_.end() ? route_ : it->second;
    }

    void set_faults(const copy_faults & f) { faults_ = f; }

    // copy the slices from their tensors into buf; transfers from a device may still be running on
    // return (report.in_flight): the slices' cells may be reused at once, buf only after wait()
    bool gather(const llama_state_seq_slice * slices, size_t n, uint8_t * buf, copy_report & report);

    // copy the slices from buf into their tensors; complete on return
    bool scatter(const llama_state_seq_slice * slices, size_t n, const uint8_t * buf, copy_report & report);

    // finish every transfer in flight and free its staging memory
    void wait();

    // Restore ahead: start uploading a parked sequence's buffer to the devices its cells came from
    // (each device gets the bytes of its own tensors, as the park's gathers placed them), so that its
    // restore only scatters on the devices, with the transfers overlapping the decodes before it.
    // One buffer at a time (a new one replaces the old); false when no part of it came through a
    // device. The buffer must stay as it is until release(buf) or the restore.
    bool prefetch(const uint8_t * buf, size_t n);
    bool can_prefetch() const;  // a device to upload to (none where every copy is a host memcpy)
    bool prefetched(const uint8_t * buf) const;
    // everything that may still read or write buf is finished, a prefetch of it dropped and its
    // record of placements forgotten
    void release(const uint8_t * buf);

    // pinned host memory for the devices the copies have seen (null: ordinary memory will do)
    ggml_backend_buffer_type_t host_buft() const { return host_buft_; }

private:
    ggml_backend_t backend_for(ggml_backend_buffer_t buf);
    bool copy(const llama_state_seq_slice * slices, size_t n, uint8_t * buf, bool to_host, copy_report & report);
    bool run_group(ggml_backend_t backend, const llama_state_seq_slice * slices, const std::vector<const void *> & group,
                   uint8_t * buf, bool to_host, copy_report & report);

    // where a park's gathers put the bytes of each device: [pos, pos + bytes) of the host buffer
    struct placement {
        ggml_backend_t backend;
        size_t         pos;
        size_t         bytes;
    };
    // one device's part of a buffer uploaded ahead: its ranges packed one after another
    struct prefetch_part {
        ggml_backend_t        backend = nullptr;
        ggml_backend_buffer_t device  = nullptr;
        std::vector<placement> ranges;   // pos and bytes in the host buffer, in order
        std::vector<size_t>    offsets;  // where each range starts in `device`
    };
    struct prefetch_state {
        const uint8_t *            host = nullptr;
        size_t                     n    = 0;
        std::vector<prefetch_part> parts;
    };
    void drop_prefetch();
    // the device copy of host bytes [pos, pos + bytes) uploaded ahead to `backend`, or null
    uint8_t * prefetched_at(ggml_backend_t backend, size_t pos, size_t bytes, ggml_backend_buffer_t * device) const;

    // LLAMA_SERVER_PREEMPT_CORRUPT: one byte of this copy flipped (at most one per copy)
    void corrupt(const llama_state_seq_slice * s, const void * run, uint8_t * buf, bool to_host, unsigned how, bool & done);

    copy_route route_;
    copy_faults faults_;
    bool flipped_ = false;  // this copy had its byte flipped
    std::map<ggml_backend_dev_t, copy_route> dev_routes_;
    prefetch_state prefetch_;
    std::map<const uint8_t *, std::vector<placement>> placements_;  // per parked host buffer
    std::map<ggml_backend_dev_t, ggml_backend_t> backends_;
    std::vector<std::unique_ptr<copy_pending>> pending_;
    ggml_backend_buffer_type_t host_buft_ = nullptr;
};


// the device a buffer lives on (the CPU device for host memory), or null
ggml_backend_dev_t device_of(ggml_backend_buffer_t buf);

} // namespace llama_preempt
