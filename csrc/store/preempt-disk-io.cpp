// llama-preempt: the disk tier's bytes on disk (preempt-disk-io.h).
#include "preempt-disk-io.h"
#include "preempt-disk.h"

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <unistd.h>

namespace llama_preempt {

bool write_all(int fd, const uint8_t * p, size_t n, off_t off) {
    while (n > 0) {
        const ssize_t w = pwrite(fd, p, n, off);
        if (w < 0 && errno == EINTR) {
            continue;
        }
        if (w <= 0) {
            if (w == 0) {
                errno = ENOSPC;
            }
            return false;
        }
        p += w; n -= (size_t) w; off += w;
    }
    return true;
}

bool read_all(int fd, uint8_t * p, size_t n, off_t off) {
    while (n > 0) {
        const ssize_t r = pread(fd, p, n, off);
        if (r < 0 && errno == EINTR) {
            continue;
        }
        if (r <= 0) {
            if (r == 0) {
                errno = 0;
            }
            return false;
        }
        p += r; n -= (size_t) r; off += r;
    }
    return true;
}

namespace {

uint64_t rotl(uint64_t x, int r) {
    return (x << r) | (x >> (64 - r));
}

// one multiply per word, four independent lanes: fast enough that the checksum costs the disk
// tier little beside the write itself (it guards against a changed or short file, not an attacker)
inline uint64_t mix(uint64_t lane, uint64_t w) {
    return rotl(lane ^ w, 29) * 0x9E3779B185EBCA87ull;
}

void hash_block(uint64_t lane[4], const uint8_t * p) {
    for (int i = 0; i < 4; ++i) {
        uint64_t w;
        memcpy(&w, p + 8 * i, 8);
        lane[i] = mix(lane[i], w);
    }
}

} // namespace

void disk_hasher::update(const uint8_t * p, size_t n) {
    n_total += n;
    if (n_tail > 0) {
        const size_t k = std::min(n, sizeof(tail) - n_tail);
        memcpy(tail + n_tail, p, k);
        n_tail += k; p += k; n -= k;
        if (n_tail < sizeof(tail)) {
            return;
        }
        hash_block(lane, tail);
        n_tail = 0;
    }
    // the lanes in locals: through `p` (bytes, which alias anything) the compiler would reload them
    uint64_t l0 = lane[0], l1 = lane[1], l2 = lane[2], l3 = lane[3];
    for (; n >= 32; p += 32, n -= 32) {
        uint64_t w[4];
        memcpy(w, p, 32);
        l0 = mix(l0, w[0]);
        l1 = mix(l1, w[1]);
        l2 = mix(l2, w[2]);
        l3 = mix(l3, w[3]);
    }
    lane[0] = l0; lane[1] = l1; lane[2] = l2; lane[3] = l3;
    memcpy(tail, p, n);
    n_tail = n;
}

uint64_t disk_hasher::digest() const {
    uint64_t h = n_total * 0x9E3779B185EBCA87ull;
    for (int i = 0; i < 4; ++i) {
        h = rotl(h ^ lane[i], 27) * 0x165667B19E3779F9ull;
    }
    for (size_t i = 0; i < n_tail; ++i) {
        h = rotl(h ^ tail[i], 11) * 0x9E3779B185EBCA87ull;
    }
    return h ^ (h >> 33);
}

const char * disk_fault_name(disk_fault f) {
    switch (f) {
        case disk_fault::none:    return "none";
        case disk_fault::write:   return "write";
        case disk_fault::read:    return "read";
        case disk_fault::remove:  return "remove";
        case disk_fault::corrupt: return "corrupt";
        case disk_fault::truncate: return "truncate";
        case disk_fault::full:    return "full";
    }
    return "?";
}

const char * disk_error_name(disk_error e) {
    switch (e) {
        case disk_error::none:       return "none";
        case disk_error::full:       return "full";
        case disk_error::write:      return "write";
        case disk_error::read:       return "read";
        case disk_error::missing:    return "missing";
        case disk_error::short_read: return "short_read";
        case disk_error::checksum:   return "checksum";
        case disk_error::cancelled:  return "cancelled";
    }
    return "?";
}

} // namespace llama_preempt
