// llama-preempt: the disk tier's directory. Each store (preempt-disk.h) keeps its files in a
// subdirectory of --preempt-disk of its own, llama-preempt-<pid>-<n> (mode 0700), locked (flock)
// for its life; at the next start, any such subdirectory whose lock nobody holds (its server
// crashed or was killed) is removed. No llama types.
#pragma once

#include <string>

namespace llama_preempt {

// a store's own directory and the descriptor that holds its lock (closing it drops the lock)
struct own_dir {
    std::string path;
    int         lock_fd = -1;
};

// Makes a directory of our own in `dir`, locked, under a name no other server scans for until it
// is renamed into place: no other server ever sees it unlocked. False with `err`.
bool make_own_dir(const std::string & dir, own_dir & out, std::string & err);

// Removes the subdirectories of `dir` that servers which are gone left behind; how many.
int remove_stale_dirs(const std::string & dir);

// Every file of a directory removed, then the directory (ours hold no subdirectories).
void remove_dir(const std::string & path);

} // namespace llama_preempt
