// llama-preempt: a disk store's files kept across restarts (--cache-persist; preempt-disk.h).
#include "preempt-disk.h"

#include "preempt-disk-io.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace llama_preempt {

std::shared_ptr<disk_file> disk_store::adopt(const std::string & name, std::vector<uint8_t> & meta, std::string & why) {
    unsigned long long n = 0;
    if (!persistent_ || sscanf(name.c_str(), "park-%llu.kv", &n) != 1 || park_file_name(n) != name) {
        why = "not a name the store makes";
        return nullptr;
    }
    // a regular file of ours, never through a link; a read back then opens this very file (dev,
    // ino) and checks its state's checksum
    const int fd = openat(dir_.fd, name.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid()) {
        why = fd < 0 && errno == ELOOP ? "a link, not a file" : "not a regular file of this server's user";
        if (fd >= 0) {
            close(fd);
        }
        return nullptr;
    }
    auto fail = [&](const char * what) {
        why = what;
        close(fd);
        return nullptr;
    };
    uint8_t header[HEADER_BYTES];
    if ((size_t) st.st_size < HEADER_BYTES || !read_all(fd, header, HEADER_BYTES, 0)) {
        return fail("shorter than its header");
    }
    if (memcmp(header, MAGIC_V1, 8) == 0) {
        return fail("written by an older version (LPKVSEQ1: its tokens are not in it)");
    }
    if (memcmp(header, MAGIC, 8) != 0) {
        return fail("no header of this version (a write cut short, or not a file of this server)");
    }
    uint64_t n0 = 0, n1 = 0, sum = 0, n_meta = 0, meta_sum = 0;
    memcpy(&n0, header + 8, 8);
    memcpy(&n1, header + 16, 8);
    memcpy(&sum, header + 24, 8);
    memcpy(&n_meta, header + 32, 8);
    memcpy(&meta_sum, header + 40, 8);
    // the sizes checked one at a time before they are added: a header with huge ones never wraps
    const uint64_t size = (uint64_t) st.st_size - HEADER_BYTES;
    if (n0 > size || n1 > size - n0 || n_meta != size - n0 - n1) {
        return fail("its size is not the one its header gives (cut short, or grown)");
    }
    meta.resize((size_t) n_meta);
    disk_hasher h;
    if (!read_all(fd, meta.data(), meta.size(), (off_t) (HEADER_BYTES + n0 + n1))) {
        return fail("its record cannot be read");
    }
    h.update(meta.data(), meta.size());
    if (h.digest() != meta_sum) {
        return fail("its record does not match its checksum");
    }
    close(fd);
    auto f = std::make_shared<disk_file>();
    f->name       = name;
    f->path       = dir_.path + "/" + name;
    f->n_bytes[0] = (size_t) n0;
    f->n_bytes[1] = (size_t) n1;
    f->st         = disk_file::status::written;
    f->checksum   = sum;
    f->dev        = (uint64_t) st.st_dev;
    f->ino        = (uint64_t) st.st_ino;
    std::lock_guard<std::mutex> lk(mu_);
    f->counted  = true;
    bytes_held_ += f->total();
    n_files_     = std::max<uint64_t>(n_files_, n);  // new files take names after it
    return f;
}

} // namespace llama_preempt
