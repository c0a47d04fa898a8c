// llama-preempt: host memory for swap buffers, and a warm pool of freed blocks (see preempt-copy.h).

#include "preempt-hostmem.h"

#include <cstdlib>
#include <cstring>

#if defined(__GLIBC__)
#include <malloc.h>  // malloc_trim()
#endif

namespace llama_preempt {

void return_free_pages() {
#if defined(__GLIBC__)
    malloc_trim(0);
#endif
}

void host_block::free_delete::operator()(uint8_t * p) const {
    free(p);
}

// Ordinary memory for a swap buffer, without throwing. Fresh memory costs the kernel's page
// faults and zeroing on first touch (about 3 GB/s on the project's machine); the pool's warm blocks
// are what make parks fast. Tried and dropped: transparent huge pages (with the usual
// defrag=madvise a huge-page fault may compact memory on the spot: a first park got 10x slower)
// and MAP_POPULATE (the same zeroing, paid at allocation: no faster).
static uint8_t * alloc_host(size_t n) {
    void * p = nullptr;
    return posix_memalign(&p, 64, n) == 0 ? (uint8_t *) p : nullptr;
}

host_block & host_block::operator=(host_block && o) noexcept {
    if (this != &o) {
        release();
        heap     = std::move(o.heap);
        pinned   = o.pinned;
        data     = o.data;
        capacity = o.capacity;
        o.pinned   = nullptr;
        o.data     = nullptr;
        o.capacity = 0;
    }
    return *this;
}

void host_block::release() {
    heap.reset();
    if (pinned) {
        ggml_backend_buffer_free(pinned);
        pinned = nullptr;
    }
    data     = nullptr;
    capacity = 0;
}

host_block host_pool::take(size_t n, ggml_backend_buffer_type_t pinned_buft) {
    // the smallest kept block that fits, of the same kind, and not much larger than asked
    size_t best = kept_.size();
    for (size_t i = 0; i < kept_.size(); ++i) {
        const auto & b = kept_[i];
        if ((b.pinned != nullptr) == (pinned_buft != nullptr) && b.capacity >= n && b.capacity <= 2 * n + (1 << 20) &&
            (best == kept_.size() || b.capacity < kept_[best].capacity)) {
            best = i;
        }
    }
    if (best < kept_.size()) {
        host_block b = std::move(kept_[best]);
        kept_.erase(kept_.begin() + best);
        kept_bytes_ -= b.capacity;
        return b;
    }
    // a new block, with room to grow: a sequence parked again is usually a little longer
    const size_t capacity = n + n / 4;
    host_block b;
    if (pinned_buft) {
        b.pinned = ggml_backend_buft_alloc_buffer(pinned_buft, capacity);
        b.data   = b.pinned ? (uint8_t *) ggml_backend_buffer_get_base(b.pinned) : nullptr;
    }
    if (b.data == nullptr) {
        b.heap.reset(alloc_host(capacity));
        b.data = b.heap.get();
    }
    b.capacity = b.data ? capacity : 0;
    return b;
}

void host_pool::give(host_block && b) {
    if (b.data == nullptr) {
        return;
    }
    // make room by dropping the oldest kept blocks; a block larger than the cap is not kept
    while (!kept_.empty() && kept_bytes_ + b.capacity > cap_) {
        kept_bytes_ -= kept_.front().capacity;
        kept_.erase(kept_.begin());
    }
    if (b.capacity <= cap_) {
        kept_bytes_ += b.capacity;
        kept_.push_back(std::move(b));
    }
}

} // namespace llama_preempt
