// llama-preempt: the disk tier's directory (preempt-disk-dir.h).
#include "preempt-disk-dir.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <random>
#include <vector>

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

namespace llama_preempt {

namespace {

constexpr char PREFIX[]     = "llama-preempt-";
constexpr char NEW_PREFIX[] = ".new-llama-preempt-";  // made by earlier versions before they renamed it into place
constexpr char LOCK[]       = "lock";
constexpr char NEW_LOCK[]   = "lock.new";                // locked before it is renamed to LOCK
constexpr int  N_TRIES      = 64;                      // names tried before giving up

bool starts_with(const char * s, const char * prefix) {
    return strncmp(s, prefix, strlen(prefix)) == 0;
}

// past a run of at least one character of `set` at p; null when there is none
const char * skip_run(const char * p, const char * set) {
    const char * start = p;
    while (*p && strchr(set, *p)) {
        ++p;
    }
    return p > start ? p : nullptr;
}

// a name a store's directory has: llama-preempt-<pid>-<hex> (earlier versions: <pid>-<n>, and
// while being made, .new-llama-preempt-<pid>-<n>)
bool is_store_name(const char * name) {
    const char * p = starts_with(name, PREFIX) ? name + strlen(PREFIX)
                   : starts_with(name, NEW_PREFIX) ? name + strlen(NEW_PREFIX) : nullptr;
    if (p == nullptr || (p = skip_run(p, "0123456789")) == nullptr || *p++ != '-') {
        return false;
    }
    p = skip_run(p, "0123456789abcdef");
    return p != nullptr && *p == '\0';
}

constexpr char CACHE_PREFIX[] = "llama-preempt-cache-";  // --cache-persist: llama-preempt-cache-<hex key>

// a cache directory's name: llama-preempt-cache-<hex>
bool is_cache_name(const char * name) {
    if (!starts_with(name, CACHE_PREFIX)) {
        return false;
    }
    const char * p = skip_run(name + strlen(CACHE_PREFIX), "0123456789abcdef");
    return p != nullptr && *p == '\0';
}

// a file name a store makes: its lock, park-<digits>.kv, or a cache directory's index
bool is_store_file(const char * name) {
    if (strcmp(name, LOCK) == 0 || strcmp(name, NEW_LOCK) == 0 || strcmp(name, "index") == 0 || strcmp(name, "index.new") == 0) {
        return true;
    }
    const char * p = starts_with(name, "park-") ? skip_run(name + strlen("park-"), "0123456789") : nullptr;
    return p != nullptr && strcmp(p, ".kv") == 0;
}

// what others could do to entries of a directory with this mode and owner: "" when nothing
std::string others_may_write(const struct stat & st) {
    char mode[8];
    snprintf(mode, sizeof(mode), "%04o", (unsigned) (st.st_mode & 07777));
    if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0 && (st.st_mode & S_ISVTX) == 0) {
        return std::string("other users may write in it (mode ") + mode + ") and it has no sticky bit: they could "
               "rename this server's files away and put their own in their place; use a directory only this server's "
               "user may write in (chmod go-w), or set the sticky bit as /tmp has (chmod +t)";
    }
    if (st.st_uid != geteuid() && st.st_uid != 0) {
        return "it belongs to another user (uid " + std::to_string(st.st_uid) + "), who could replace this server's "
               "files in it; use a directory of this server's user (uid " + std::to_string(geteuid()) + ") or of root";
    }
    return "";
}

// a directory only we could have filled: ours, and nobody else may write in it
bool ours_alone(const struct stat & st) {
    return S_ISDIR(st.st_mode) && st.st_uid == geteuid() && (st.st_mode & (S_IWGRP | S_IWOTH)) == 0;
}

// The names in the directory `fd`, read through a descriptor of its own (its own offset,
// close-on-exec), so `fd` is left as it was.
std::vector<std::string> entries(int fd) {
    std::vector<std::string> out;
    const int it_fd = openat(fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DIR * d = it_fd >= 0 ? fdopendir(it_fd) : nullptr;
    if (d == nullptr) {
        if (it_fd >= 0) {
            close(it_fd);
        }
        return out;
    }
    while (dirent * e = readdir(d)) {
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) {
            out.emplace_back(e->d_name);
        }
    }
    closedir(d);
    return out;
}

// Removes what a store makes (its lock and park files; a link among them is unlinked, never
// followed) from the directory `fd`, but those in `keep`. Anything else stays, and so does the
// directory then. Returns what of its own could not be removed, and why ("name: why").
std::vector<std::string> empty_store(int fd, const std::vector<std::string> & keep = {}) {
    std::vector<std::string> left;
    std::vector<std::string> names;
    for (const auto & name : entries(fd)) {
        if (is_store_file(name.c_str()) && std::find(keep.begin(), keep.end(), name) == keep.end()) {
            names.push_back(name);
        }
    }
    for (const auto & name : names) {
        struct stat st;
        if (fstatat(fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && (S_ISREG(st.st_mode) || S_ISLNK(st.st_mode)) &&
            unlinkat(fd, name.c_str(), 0) != 0 && errno != ENOENT) {
            left.push_back(name + ": " + strerror(errno));
        }
    }
    return left;
}

// `name` in `parent_fd`, removed if it is a store of a server that is gone: a real directory of
// ours that nobody else may write in, whose lock (a regular file of ours) nobody holds. A store
// without a lock is one whose server died between its mkdir and its lock: stale once a minute
// old (its own age, never a link's target's). False, and nothing touched, for anything else.
bool remove_if_stale(int parent_fd, const char * name) {
    struct stat pst;
    if (fstat(parent_fd, &pst) != 0) {
        return false;
    }
    const int fd = openat(parent_fd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        return false;  // a link (ELOOP, ENOTDIR), not a directory, or gone
    }
    struct stat st;
    // on DIR's own file system: a mount point planted at a store's name is not a store
    bool stale = fstat(fd, &st) == 0 && ours_alone(st) && st.st_dev == pst.st_dev;
    int lock = -1;
    if (stale) {
        lock = openat(fd, LOCK, O_RDWR | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
        if (lock >= 0) {
            struct stat ls;
            // held while we empty it: another server that scans now sees it locked and keeps off
            stale = fstat(lock, &ls) == 0 && S_ISREG(ls.st_mode) && ls.st_uid == geteuid() &&
                    flock(lock, LOCK_EX | LOCK_NB) == 0;
        } else {
            stale = errno == ENOENT && time(nullptr) - st.st_mtime > 60;
        }
    }
    bool removed = false;
    if (stale) {
        empty_store(fd);
        // still the directory we opened (the entry cannot be swapped by others: DIR is checked
        // to be ours or sticky), and rmdir never follows a link
        struct stat again;
        removed = fstatat(parent_fd, name, &again, AT_SYMLINK_NOFOLLOW) == 0 && again.st_dev == st.st_dev &&
                  again.st_ino == st.st_ino && unlinkat(parent_fd, name, AT_REMOVEDIR) == 0;
    }
    if (lock >= 0) {
        close(lock);
    }
    close(fd);
    return removed;
}

std::string random_name() {
    std::random_device rd;  // the kernel's randomness: nobody can guess the name ahead
    char buf[17];
    snprintf(buf, sizeof(buf), "%08x%08x", (unsigned) rd(), (unsigned) rd());
    return std::string(PREFIX) + std::to_string(getpid()) + "-" + buf;
}

} // namespace

std::string park_file_name(unsigned long long n) {
    return "park-" + std::to_string(n) + ".kv";
}

std::string disk_dir_unsafe(const std::string & dir) {
    struct stat st;
    if (stat(dir.c_str(), &st) != 0) {
        return "--preempt-disk: no directory at '" + dir + "' (create it first)";
    }
    if (!S_ISDIR(st.st_mode)) {
        return "--preempt-disk: '" + dir + "' is not a directory";
    }
    const std::string why = others_may_write(st);
    return why.empty() ? "" : "--preempt-disk: '" + dir + "' is not safe for the disk tier: " + why;
}

namespace {

// DIR, opened once (it is the operator's choice and may be a link; nothing below it is followed),
// and checked again on what was opened; -1 with `err`
int open_parent(const std::string & dir, std::string & err) {
    const int parent = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    struct stat pst;
    if (parent < 0 || fstat(parent, &pst) != 0) {
        err = "--preempt-disk: cannot open '" + dir + "': " + strerror(errno);
        if (parent >= 0) {
            close(parent);
        }
        return -1;
    }
    if (const std::string why = others_may_write(pst); !why.empty()) {  // checked before the model loaded; again, on what we opened
        err = "--preempt-disk: '" + dir + "' is not safe for the disk tier: " + why;
        close(parent);
        return -1;
    }
    return parent;
}

} // namespace

bool open_cache_dir(const std::string & dir, const std::string & key, own_dir & out, std::string & err, int & n_removed) {
    n_removed = 0;
    const int parent = open_parent(dir, err);
    if (parent < 0) {
        return false;
    }
    const std::string name = CACHE_PREFIX + key;
    struct stat pst;
    fstat(parent, &pst);
    if (mkdirat(parent, name.c_str(), 0700) != 0 && errno != EEXIST) {
        err = "--cache-persist: cannot create '" + name + "' in '" + dir + "': " + strerror(errno);
        close(parent);
        return false;
    }
    const int fd = openat(parent, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0 || !ours_alone(st) || st.st_dev != pst.st_dev) {
        err = "--cache-persist: '" + dir + "/" + name + "' is not a directory of this server's user that only it may write in";
        if (fd >= 0) {
            close(fd);
        }
        close(parent);
        return false;
    }
    const int lock = openat(fd, LOCK, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
    struct stat ls;
    if (lock < 0 || fstat(lock, &ls) != 0 || !S_ISREG(ls.st_mode) || ls.st_uid != geteuid() || flock(lock, LOCK_EX | LOCK_NB) != 0) {
        err = "--cache-persist: '" + dir + "/" + name + "' is in use by another server (or its lock is not ours)";
        if (lock >= 0) {
            close(lock);
        }
        close(fd);
        close(parent);
        return false;
    }
    out = { dir + "/" + name, name, parent, fd, lock };
    // the caches of other models or flags, that no running server holds, can never be used
    for (const auto & other : entries(parent)) {
        if (is_cache_name(other.c_str()) && other != name) {
            n_removed += remove_if_stale(parent, other.c_str()) ? 1 : 0;
        }
    }
    return true;
}

std::vector<std::string> close_cache_dir(own_dir & own, const std::vector<std::string> & keep) {
    if (keep.empty()) {
        return remove_own_dir(own);  // nothing kept: the directory goes, its lock file and index with it
    }
    std::vector<std::string> kept = keep;
    kept.push_back(LOCK);  // the lock file stays with the directory; the lock itself goes with its descriptor
    kept.push_back("index");
    std::vector<std::string> left;
    if (own.fd >= 0) {
        left = empty_store(own.fd, kept);
    }
    for (int * fd : { &own.fd, &own.parent_fd, &own.lock_fd }) {  // the lock file last: the lock goes with it
        if (*fd >= 0) {
            close(*fd);
            *fd = -1;
        }
    }
    return left;
}

unsigned long long kept_cache_bytes(const std::string & dir) {
    unsigned long long n = 0;
    const int parent = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (parent < 0) {
        return 0;
    }
    for (const auto & name : entries(parent)) {
        if (!is_cache_name(name.c_str())) {
            continue;
        }
        const int fd = openat(parent, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        struct stat st;
        // one a running server holds (its lock taken) is not ours to take back or remove: not free
        const int lock = fd >= 0 ? openat(fd, LOCK, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC) : -1;
        const bool held = lock >= 0 && flock(lock, LOCK_SH | LOCK_NB) != 0;
        if (lock >= 0) {
            close(lock);  // (a shared lock taken here goes with the descriptor)
        }
        if (fd >= 0 && !held && fstat(fd, &st) == 0 && ours_alone(st)) {
            for (const auto & file : entries(fd)) {
                struct stat fs;
                if (is_store_file(file.c_str()) && fstatat(fd, file.c_str(), &fs, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(fs.st_mode)) {
                    n += (unsigned long long) fs.st_blocks * 512;  // what the file system counts as used
                }
            }
        }
        if (fd >= 0) {
            close(fd);
        }
    }
    close(parent);
    return n;
}

std::vector<std::string> store_files(const own_dir & own) {
    std::vector<std::string> out;
    for (const auto & name : entries(own.fd)) {
        if (name.rfind("park-", 0) == 0 && is_store_file(name.c_str())) {
            out.push_back(name);
        }
    }
    return out;
}

namespace {

// Makes `name` in `parent` (0700) and locks it, as a store's own directory; false with `err`
// (errno EEXIST: somebody's entry at that name, never ours to use). `dir` names DIR in messages.
bool make_locked_dir(int parent, const std::string & dir, const std::string & name, own_dir & out, std::string & err) {
    if (mkdirat(parent, name.c_str(), 0700) != 0) {
        err = "--preempt-disk: cannot create a directory in '" + dir + "': " + strerror(errno);
        return false;
    }
    const int fd = openat(parent, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0 || fchmod(fd, 0700) != 0) {
        err = "--preempt-disk: cannot open the directory made in '" + dir + "': " + strerror(errno);
        if (fd >= 0) {
            close(fd);
        }
        unlinkat(parent, name.c_str(), AT_REMOVEDIR);
        errno = EIO;
        return false;
    }
    // locked before it is named `lock`: a server that scans now finds no lock (a store that
    // young is never stale) or a held one, never a free one to take
    const int lock = openat(fd, NEW_LOCK, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (lock < 0 || flock(lock, LOCK_EX | LOCK_NB) != 0 || renameat(fd, NEW_LOCK, fd, LOCK) != 0) {
        err = "--preempt-disk: cannot lock a directory in '" + dir + "': " + strerror(errno);
        if (lock >= 0) {
            close(lock);
        }
        unlinkat(fd, NEW_LOCK, 0);
        close(fd);
        unlinkat(parent, name.c_str(), AT_REMOVEDIR);
        errno = EIO;
        return false;
    }
    out = { dir + "/" + name, name, parent, fd, lock };
    return true;
}

} // namespace

bool make_own_dir(const std::string & dir, const std::string & first_name, own_dir & out, std::string & err) {
    const int parent = open_parent(dir, err);
    if (parent < 0) {
        return false;
    }
    if (first_name.find('/') != std::string::npos || first_name == "." || first_name == "..") {
        err = "LLAMA_SERVER_PREEMPT_DISK_NAME: '" + first_name + "' is not a name within --preempt-disk";
        close(parent);
        return false;
    }
    for (int i = 0; i < N_TRIES; ++i) {
        const std::string name = i == 0 && !first_name.empty() ? first_name : random_name();
        if (make_locked_dir(parent, dir, name, out, err)) {
            return true;
        }
        if (errno != EEXIST) {
            break;
        }
        err.clear();  // somebody's entry (a link, a directory) at that name: never ours to use
    }
    if (err.empty()) {
        err = "--preempt-disk: no free name for a directory in '" + dir + "' after " + std::to_string(N_TRIES) + " tries";
    }
    close(parent);
    return false;
}

bool own_dir_gone(const own_dir & own) {
    struct stat st;
    // a directory removed while open keeps its descriptor, with no link left to it
    return own.fd >= 0 && fstat(own.fd, &st) == 0 && st.st_nlink == 0;
}

bool remake_own_dir(own_dir & own, bool cache, std::string & err) {
    const std::string dir = own.path.substr(0, own.path.size() - own.name.size() - 1);
    own_dir made;
    bool ok = false;
    // a cache directory keeps its name (the next run finds it by its key); ours takes a new random
    // one, made as at the start: a link or a directory planted at the old name is never used
    for (int i = 0; i < (cache ? 1 : N_TRIES) && !ok; ++i) {
        err.clear();
        ok = make_locked_dir(own.parent_fd, dir, cache ? own.name : random_name(), made, err);
        if (!ok && errno != EEXIST) {
            break;
        }
    }
    if (!ok) {
        if (err.empty() || errno == EEXIST) {
            err = "--preempt-disk: no free name for a directory in '" + dir + "'" + (cache ? " (an entry is at its name)" : "");
        }
        return false;
    }
    // onto the same descriptor numbers: the I/O thread, which works from them, sees the new directory
    dup2(made.fd, own.fd);
    dup2(made.lock_fd, own.lock_fd);
    close(made.fd);
    close(made.lock_fd);
    own.path = made.path;
    own.name = made.name;
    return true;
}

int remove_stale_dirs(const own_dir & own) {
    // this process's other stores (Engines) are live: skipped without asking their locks, which
    // some file systems (NFS) emulate per process, so that they would look free to us
    const std::string ours = std::string(PREFIX) + std::to_string(getpid()) + "-";
    int n = 0;
    for (const auto & name : entries(own.parent_fd)) {
        if (is_store_name(name.c_str()) && name != own.name && name.rfind(ours, 0) != 0) {
            n += remove_if_stale(own.parent_fd, name.c_str()) ? 1 : 0;
        }
    }
    return n;
}

std::vector<std::string> remove_own_dir(own_dir & own) {
    std::vector<std::string> left;
    const bool gone = own_dir_gone(own);  // removed under it already: nothing to remove, and its name may be another's now
    if (own.fd >= 0) {
        left = empty_store(own.fd);  // the lock file too: the lock goes with its descriptor below
        if (!gone) {
            // what else is in it keeps it: named, so that an operator knows why it stays
            for (const auto & name : entries(own.fd)) {
                if (!is_store_file(name.c_str())) {
                    left.push_back(name + ": not a file this server makes, left as it is");
                }
            }
        }
        close(own.fd);
        own.fd = -1;
    }
    if (own.parent_fd >= 0) {
        if (!gone && unlinkat(own.parent_fd, own.name.c_str(), AT_REMOVEDIR) != 0 && errno != ENOENT) {
            left.push_back("the directory itself: " + std::string(strerror(errno)));
        }
        close(own.parent_fd);
        own.parent_fd = -1;
    }
    if (own.lock_fd >= 0) {
        close(own.lock_fd);
        own.lock_fd = -1;
    }
    return left;
}

} // namespace llama_preempt
