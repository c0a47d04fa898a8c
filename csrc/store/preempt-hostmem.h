// llama-preempt: host memory for swap buffers (a pool of warm blocks, pinned where a device offers
// it), the machine's own copy speeds that SWAP's are measured against, and what a lost RPC device
// means for the requests. Implemented in preempt-hostmem.cpp and preempt-device.cpp.
#pragma once

#include "ggml-backend.h"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace llama_preempt {

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

// Freed host pages go back to the system now rather than stay on the allocator's free lists (glibc's
// malloc_trim(); nothing elsewhere). The host budget (policy/preempt-host-ram.h) is handed this
// when its bytes are real memory: the OS call lives with the memory, not in the policy.
void return_free_pages();

// on a lost RPC device (llama.cpp aborts), say in one line what it means for the requests
void log_lost_devices();

} // namespace llama_preempt
