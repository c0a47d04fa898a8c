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

    // how the bytes moved, for the park's log line
    const char * how() const {
        static const char * names[8] = {
            "nothing", "memcpy", "device graphs", "device graphs and memcpy", "single slices",
            "memcpy and single slices", "device graphs and single slices", "device graphs, memcpy and single slices",
        };
        return names[(n_memcpy > 0 ? 1 : 0) | (n_gathered > 0 ? 2 : 0) | (n_fallback > 0 ? 4 : 0)];
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

    copy_route route_;
    prefetch_state prefetch_;
    std::map<const uint8_t *, std::vector<placement>> placements_;  // per parked host buffer
    std::map<ggml_backend_dev_t, ggml_backend_t> backends_;
    std::vector<std::unique_ptr<copy_pending>> pending_;
    ggml_backend_buffer_type_t host_buft_ = nullptr;
};

// Host memory for swap buffers. Freshly allocated memory costs a page fault per 4 KiB on first
// touch, which on a CPU makes a park several times slower than the copy itself; pinned memory
// costs a page-locking call. So freed buffers are kept (up to `cap` bytes idle) and handed out
// again: under repeated preemption parks write into warm memory.
struct host_block {
    struct free_delete {
        void operator()(uint8_t * p) const;
    };
    std::unique_ptr<uint8_t, free_delete> heap;
    ggml_backend_buffer_t      pinned   = nullptr;
    uint8_t *                  data     = nullptr;
    size_t                     capacity = 0;

    host_block() = default;
    host_block(host_block && o) noexcept { *this = std::move(o); }
    host_block & operator=(host_block && o) noexcept;
    ~host_block() { release(); }
    void release();
};

class host_pool {
public:
    explicit host_pool(size_t cap) : cap_(cap) {}

    // a block of at least n bytes (pinned when pinned_buft is set and can allocate), or an empty one
    host_block take(size_t n, ggml_backend_buffer_type_t pinned_buft);
    // keep the block for reuse while the pool holds less than its cap, else free it
    void give(host_block && b);

    size_t bytes_kept() const { return kept_bytes_; }

private:
    size_t cap_;
    size_t kept_bytes_ = 0;
    std::vector<host_block> kept_;
};

// The machine's own copy speeds, the yardstick for SWAP's: host memcpy between warm buffers, and
// for each device pinned host<->device transfers. One entry per measurement, in GB/s.
struct link_speed {
    std::string device;  // "host" for memcpy, else the device's name
    std::string what;    // "memcpy", "device_to_host", "host_to_device"
    double      gbps = 0;
    bool        pinned = false;
};
std::vector<link_speed> measure_link_speeds(size_t n_bytes, int n_reps);

// on a lost RPC device (llama.cpp aborts), say in one line what it means for the requests
void log_lost_devices();

// the user_data of the llama_state_seq_*_data_cb callbacks
struct copy_call {
    seq_copier * copier;
    uint8_t    * buf;
    bool         to_host;
    copy_report  report;
    bool         ok = true;
};

// llama_state_seq_copy_fn for a copy_call
bool copy_slices_fn(const llama_state_seq_slice * slices, size_t n_slices, void * user_data);

} // namespace llama_preempt
