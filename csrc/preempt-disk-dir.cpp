// llama-preempt: the disk tier's directory (preempt-disk-dir.h).
#include "preempt-disk-dir.h"

#include <atomic>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <vector>

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

namespace llama_preempt {

namespace {

constexpr char PREFIX[]     = "llama-preempt-";
constexpr char NEW_PREFIX[] = ".new-llama-preempt-";  // one being made, not locked in place yet

bool older_than_a_minute(const std::string & path) {
    struct stat st;
    return stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode) && time(nullptr) - st.st_mtime > 60;
}

// A directory of ours whose lock nobody holds belongs to a server that is gone. One being made
// (NEW_PREFIX) is not locked yet, for a moment: it is left from a crash once a minute old.
bool is_stale(const std::string & path, bool being_made) {
    if (being_made) {
        return older_than_a_minute(path);
    }
    const int fd = ::open((path + "/lock").c_str(), O_RDWR | O_CLOEXEC);
    if (fd < 0) {
        return older_than_a_minute(path);
    }
    const bool free = flock(fd, LOCK_EX | LOCK_NB) == 0;
    close(fd);  // closing drops the lock we may have taken
    return free;
}

} // namespace

void remove_dir(const std::string & path) {
    if (DIR * d = opendir(path.c_str())) {
        while (dirent * e = readdir(d)) {
            if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) {
                unlink((path + "/" + e->d_name).c_str());
            }
        }
        closedir(d);
    }
    rmdir(path.c_str());
}

int remove_stale_dirs(const std::string & dir) {
    std::vector<std::string> stale;
    if (DIR * d = opendir(dir.c_str())) {
        while (dirent * e = readdir(d)) {
            const bool made       = strncmp(e->d_name, PREFIX, sizeof(PREFIX) - 1) == 0;
            const bool being_made = strncmp(e->d_name, NEW_PREFIX, sizeof(NEW_PREFIX) - 1) == 0;
            if ((made || being_made) && is_stale(dir + "/" + e->d_name, being_made)) {
                stale.push_back(dir + "/" + e->d_name);
            }
        }
        closedir(d);
    }
    for (const auto & path : stale) {
        remove_dir(path);
    }
    return (int) stale.size();
}

bool make_own_dir(const std::string & dir, own_dir & out, std::string & err) {
    // <n> tells apart two stores of one process (Engines)
    static std::atomic<int> n_made{0};
    const std::string base = PREFIX + std::to_string(getpid()) + "-" + std::to_string(n_made++);
    const std::string name = dir + "/" + base;
    const std::string tmp  = dir + "/" + NEW_PREFIX + base;
    remove_dir(tmp);
    if (mkdir(tmp.c_str(), 0700) != 0) {
        err = "--preempt-disk: cannot create a directory in '" + dir + "': " + strerror(errno);
        return false;
    }
    const int fd = ::open((tmp + "/lock").c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0 || flock(fd, LOCK_EX | LOCK_NB) != 0 || rename(tmp.c_str(), name.c_str()) != 0) {
        err = "--preempt-disk: cannot lock a directory in '" + dir + "': " + strerror(errno);
        if (fd >= 0) {
            close(fd);
        }
        remove_dir(tmp);
        return false;
    }
    out.path    = name;
    out.lock_fd = fd;
    return true;
}

} // namespace llama_preempt
