// llama-preempt: what the disk tier's I/O thread does with one file (disk_store::do_write and
// do_read, preempt-disk.h): its header and checksum, its bytes in chunks (from host buffers, or
// through the staging buffer for a streamed state), and the test faults that strike it.
#include "preempt-disk.h"

#include "preempt-disk-io.h"

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace llama_preempt {

namespace {

constexpr const char * MAGIC = disk_store::MAGIC;  // 8 bytes: version 2, a record after the parts
constexpr size_t HEADER   = disk_store::HEADER_BYTES;
constexpr size_t CHUNK    = disk_store::CHUNK;

} // namespace

disk_error disk_store::do_write(disk_file & f, std::string & why, uint64_t & sum) {
    if (knobs_.fault == disk_fault::write) {
        why = "writing " + f.path + " failed: " + strerror(EIO) + " (LLAMA_SERVER_PREEMPT_DISK_FAIL=write)";
        return disk_error::write;
    }
    // made with its mode, 0600, before a byte is in it; never over anything already at its name
    const int fd = openat(dir_.fd, f.name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) {
        why = "cannot create " + f.path + ": " + strerror(errno);
        const bool full = errno == ENOSPC || errno == EDQUOT;
        if (fd >= 0) {
            close(fd);
        }
        return full ? disk_error::full : disk_error::write;
    }
    f.dev = (uint64_t) st.st_dev;
    f.ino = (uint64_t) st.st_ino;
    disk_hasher h;
    off_t off = HEADER;
    int   err = 0;
    std::string pulled;  // a streamed state that could not be read: why
    for (int part = 0; part < 2 && err == 0; ++part) {
        for (size_t pos = 0; pos < f.n_bytes[part] && err == 0; pos += CHUNK) {
            if (cancelled()) {
                err = ECANCELED;
                break;
            }
            size_t n = std::min(CHUNK, f.n_bytes[part] - pos);
            const size_t done = (size_t) off - HEADER;
            const bool   fill = knobs_.fault == disk_fault::full && done + n > f.total() / 2;
            if (fill) {
                n = f.total() / 2 - std::min(done, f.total() / 2);  // LLAMA_SERVER_PREEMPT_DISK_FAIL=full: the disk fills halfway
            }
            const uint8_t * p = f.src[part] + pos;
            if (f.stream) {
                // a streamed state: this chunk of it through the staging buffer
                staging_.resize(CHUNK);
                if (!f.stream->pull(part, pos, staging_.data(), n, pulled)) {
                    err = EPROTO;
                    break;
                }
                p = staging_.data();
            }
            h.update(p, n);
            if (!write_all(fd, p, n, off)) {
                err = errno ? errno : EIO;
            }
            off += (off_t) n;
            if (fill && err == 0) {
                err = ENOSPC;
            }
        }
    }
    if (err == 0 && !f.meta.empty() && !write_all(fd, f.meta.data(), f.meta.size(), off)) {
        err = errno ? errno : EIO;  // the owner's record after the parts (a cached prompt's tokens)
    }
    if (err == 0) {
        // the header last: a file cut short by a crash has none, and is never taken back
        sum = h.digest();
        uint8_t header[HEADER] = {};
        disk_hasher mh;
        mh.update(f.meta.data(), f.meta.size());
        const uint64_t n_meta = f.meta.size(), meta_sum = mh.digest();
        memcpy(header, MAGIC, 8);
        memcpy(header + 8, &f.n_bytes[0], 8);
        memcpy(header + 16, &f.n_bytes[1], 8);
        memcpy(header + 24, &sum, 8);
        memcpy(header + 32, &n_meta, 8);
        memcpy(header + 40, &meta_sum, 8);
        if (!write_all(fd, header, HEADER, 0)) {
            err = errno ? errno : EIO;
        }
    }
    close(fd);
    if (err == ECANCELED) {
        why = "cancelled";
        return disk_error::cancelled;
    }
    if (err == EPROTO) {
        why = "its state could not be read for " + f.path + ": " + pulled;
        return disk_error::write;
    }
    if (err != 0) {
        why = "writing " + f.path + " failed: " + strerror(err) +
              (knobs_.fault == disk_fault::full ? " (LLAMA_SERVER_PREEMPT_DISK_FAIL=full)" : "");
        return err == ENOSPC || err == EDQUOT ? disk_error::full : disk_error::write;
    }
    // the faults that strike a written file, found when it is read back
    if (knobs_.fault == disk_fault::corrupt) {
        const int cfd = openat(dir_.fd, f.name.c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC);
        uint8_t byte = 0;
        const off_t at = (off_t) (HEADER + f.total() / 2);
        if (cfd >= 0 && pread(cfd, &byte, 1, at) == 1) {
            byte ^= 0x5A;
            (void) !pwrite(cfd, &byte, 1, at);
        }
        if (cfd >= 0) {
            close(cfd);
        }
    } else if (knobs_.fault == disk_fault::truncate) {
        const int tfd = openat(dir_.fd, f.name.c_str(), O_WRONLY | O_NOFOLLOW | O_CLOEXEC);
        if (tfd >= 0) {
            (void) !ftruncate(tfd, (off_t) (HEADER + f.total() / 2));
            close(tfd);
        }
    } else if (knobs_.fault == disk_fault::remove) {
        unlinkat(dir_.fd, f.name.c_str(), 0);
    }
    return disk_error::none;
}

disk_error disk_store::do_read(disk_file & f, std::string & why) {
    if (knobs_.fault == disk_fault::read) {
        why = "reading " + f.path + " failed: " + strerror(EIO) + " (LLAMA_SERVER_PREEMPT_DISK_FAIL=read)";
        return disk_error::read;
    }
    // the file this park wrote, or nothing: a link in its place is not opened, another file is refused
    const int fd = openat(dir_.fd, f.name.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        why = "opening " + f.path + " failed: " + strerror(errno) + (errno == ELOOP ? " (a link in its place)" : "");
        return errno == ENOENT ? disk_error::missing : errno == ELOOP ? disk_error::checksum : disk_error::read;
    }
    auto fail = [&](disk_error e, const std::string & what) {
        why = what;
        close(fd);
        return e;
    };
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || (uint64_t) st.st_dev != f.dev || (uint64_t) st.st_ino != f.ino) {
        return fail(disk_error::checksum, f.path + ": not the file this park wrote (another file is in its place)");
    }
    if ((uint64_t) st.st_size < HEADER + f.total()) {
        // before a byte moves (a streamed read maps the file: a page past its end would be a SIGBUS)
        return fail(disk_error::short_read, f.path + ": short read (the file is shorter than its state)");
    }
    uint8_t header[HEADER];
    if (!read_all(fd, header, HEADER, 0)) {
        return fail(errno == 0 ? disk_error::short_read : disk_error::read, f.path + ": its header cannot be read");
    }
    size_t   n0 = 0, n1 = 0;
    uint64_t sum = 0;
    memcpy(&n0, header + 8, 8);
    memcpy(&n1, header + 16, 8);
    memcpy(&sum, header + 24, 8);
    if (memcmp(header, MAGIC, 8) != 0 || n0 != f.n_bytes[0] || n1 != f.n_bytes[1]) {
        return fail(disk_error::checksum, f.path + ": not the file this park wrote (its header differs)");
    }
    std::string pushed;
    if (f.stream && !f.stream->begin_read(fd, HEADER, pushed)) {
        return fail(disk_error::read, f.path + ": its state cannot be taken back: " + pushed);
    }
    disk_hasher h;
    off_t off = HEADER;
    for (int part = 0; part < 2; ++part) {
        for (size_t pos = 0; pos < f.n_bytes[part]; pos += CHUNK) {
            if (cancelled()) {
                return fail(disk_error::cancelled, "cancelled");
            }
            const size_t n = std::min(CHUNK, f.n_bytes[part] - pos);
            if (f.stream) {
                staging_.resize(CHUNK);  // a streamed state: this chunk of it through the staging buffer
            }
            uint8_t * p = f.stream ? staging_.data() : f.dst[part] + pos;
            if (!read_all(fd, p, n, off)) {
                return errno == 0 ? fail(disk_error::short_read, f.path + ": short read (the file is shorter than its state)")
                                  : fail(disk_error::read, "reading " + f.path + " failed: " + strerror(errno));
            }
            h.update(p, n);
            if (f.stream && !f.stream->push(part, pos, p, n, pushed)) {
                return fail(disk_error::read, f.path + ": its state cannot be taken back: " + pushed);
            }
            off += (off_t) n;
        }
    }
    close(fd);
    if (h.digest() != sum || sum != f.checksum) {
        why = f.path + ": checksum mismatch (the file changed on disk)";
        return disk_error::checksum;
    }
    return disk_error::none;
}

} // namespace llama_preempt
