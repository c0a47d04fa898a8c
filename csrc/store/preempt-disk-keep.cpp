// llama-preempt: a disk store's files kept across restarts (--cache-persist; preempt-disk.h).
#include "preempt-disk.h"

#include <algorithm>
#include <cstdio>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace llama_preempt {

std::shared_ptr<disk_file> disk_store::adopt(const std::string & name, size_t n0, size_t n1, uint64_t checksum) {
    unsigned long long n = 0;
    if (!persistent_ || sscanf(name.c_str(), "park-%llu.kv", &n) != 1 || park_file_name(n) != name) {
        return nullptr;  // only a name the store makes, in a kept directory
    }
    // a regular file of ours, of the size its header and parts make, never through a link; a read
    // back then opens this very file (dev, ino) and checks its checksum
    struct stat st;
    if (fstatat(dir_.fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid() ||
        (size_t) st.st_size != HEADER_BYTES + n0 + n1) {
        return nullptr;
    }
    auto f = std::make_shared<disk_file>();
    f->name       = name;
    f->path       = dir_.path + "/" + name;
    f->n_bytes[0] = n0;
    f->n_bytes[1] = n1;
    f->st         = disk_file::status::written;
    f->checksum   = checksum;
    f->dev        = (uint64_t) st.st_dev;
    f->ino        = (uint64_t) st.st_ino;
    std::lock_guard<std::mutex> lk(mu_);
    f->counted  = true;
    bytes_held_ += f->total();
    n_files_     = std::max<uint64_t>(n_files_, n);  // new files take names after it
    return f;
}

} // namespace llama_preempt
