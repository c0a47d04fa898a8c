// llama-preempt: the disk tier's bytes on disk: whole reads and writes of a range, and the
// checksum a file carries of its bytes (preempt-disk.h writes and reads its files with them).
// No llama types.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include <sys/types.h>

namespace llama_preempt {

// all n bytes at `off`; false with errno (ENOSPC for a write that wrote nothing)
bool write_all(int fd, const uint8_t * p, size_t n, off_t off);
// false with errno, or with errno 0 for a file shorter than asked (a short read)
bool read_all(int fd, uint8_t * p, size_t n, off_t off);

// a 64-bit checksum of a byte range, fed in order across calls, fast enough to run beside the disk
// (four lanes of 8-byte words)
struct disk_hasher {
    uint64_t lane[4] = { 0x9E3779B97F4A7C15ull, 0xC2B2AE3D27D4EB4Full, 0x165667B19E3779F9ull, 0x27D4EB2F165667C5ull };
    uint8_t  tail[32];
    size_t   n_tail  = 0;
    uint64_t n_total = 0;

    void     update(const uint8_t * p, size_t n);
    uint64_t digest() const;
};

// the small records kept beside the files (the prompt cache's index, a prompt's checkpoints):
// values appended in order, read back in the same order by byte_reader
inline void put_bytes(std::vector<uint8_t> & out, const void * p, size_t n) {
    out.insert(out.end(), (const uint8_t *) p, (const uint8_t *) p + n);
}

template <typename T> void put_value(std::vector<uint8_t> & out, T v) {
    put_bytes(out, &v, sizeof(v));
}

// reads what put_bytes() / put_value() wrote; false past the end
struct byte_reader {
    const std::vector<uint8_t> & in;
    size_t at = 0;
    bool get(void * p, size_t n) {
        if (n > in.size() - at) {
            return false;
        }
        memcpy(p, in.data() + at, n);
        at += n;
        return true;
    }
    template <typename T> bool get(T & v) { return get(&v, sizeof(v)); }
    size_t left() const { return in.size() - at; }
};

} // namespace llama_preempt
