// llama-preempt: the disk tier's directory. Each store (preempt-disk.h) keeps its files in a
// subdirectory of --preempt-disk of its own, llama-preempt-<pid>-<random> (mode 0700), locked
// (flock) for its life; at the next start, any such subdirectory whose lock nobody holds (its
// server crashed or was killed) is removed. No llama types.
//
// DIR may be shared with other users (a /var/tmp), so no name in it is trusted: everything works
// from descriptors (openat, fstatat and O_NOFOLLOW: a link is never followed), and only a real
// directory of this server's own user, with our name and no write bits for others, is ever
// emptied, and only of the files a store makes. A store's name is random and made with mkdir's
// O_EXCL semantics, so a link or a directory planted at it is skipped, never used.
#pragma once

#include <string>
#include <vector>

namespace llama_preempt {

// a store's own directory: the descriptors it works from, and the one that holds its lock
// (closing it drops the lock)
struct own_dir {
    std::string path;            // DIR/name, for messages
    std::string name;            // its name in DIR
    int         parent_fd = -1;  // DIR, opened once: never looked up by name again
    int         fd        = -1;  // the store's directory: its files are made, read and removed relative to it
    int         lock_fd   = -1;
};

// Why DIR may not hold the disk tier ("" when it may): not a directory, writable by other users
// without the sticky bit (they could rename the store away and put theirs in its place), or owned
// by another user than this server's or root (who could do the same). Names --preempt-disk.
std::string disk_dir_unsafe(const std::string & dir);

// Makes a directory of our own in `dir` (a random name, 0700, locked before anyone may judge it
// stale). `first_name`, when not empty, is the first name tried (LLAMA_SERVER_PREEMPT_DISK_NAME:
// tests plant things there). False with `err`.
bool make_own_dir(const std::string & dir, const std::string & first_name, own_dir & out, std::string & err);

// Removes the stores in `dir` that servers which are gone left behind; how many.
int remove_stale_dirs(const own_dir & own);

// Removes the store's files and its directory, and closes its descriptors (the lock last).
// Returns what stays, each "name: why" (empty when everything went).
std::vector<std::string> remove_own_dir(own_dir & own);

// Whether the store's directory was removed under it (`rm -rf DIR/*`): its descriptor is left
// with no link to it, and every file made there fails.
bool own_dir_gone(const own_dir & own);

// A store's directory removed under it, made again in DIR (the descriptor DIR was opened and
// checked with at the start), as make_own_dir() makes one: a new random name, or the cache
// directory's own name when `cache`, mode 0700, locked. The new directory takes the old one's
// descriptor numbers. False with `err`.
bool remake_own_dir(own_dir & own, bool cache, std::string & err);

// --cache-persist: the directory a server keeps its cached prompts in across restarts,
// DIR/llama-preempt-cache-<key> (`key`: the fingerprint of the model and the KV-relevant flags).
// Made, or opened when it is there and ours alone (a real directory of this user that nobody else
// may write in, on DIR's file system; never through a link), and locked: a second server with the
// same key, or anything planted at the name, gets false with `err` (the caller falls back to a
// directory of its own, not kept). Then the caches of other keys that no running server holds are
// removed (a different model or flags: they can never be used).
bool open_cache_dir(const std::string & dir, const std::string & key, own_dir & out, std::string & err, int & n_removed);

// Closes a cache directory, keeping the files named in `keep` (and the index); the rest of what a
// store makes goes. The directory stays when anything is kept. Returns what could not be removed.
std::vector<std::string> close_cache_dir(own_dir & own, const std::vector<std::string> & keep);

// --cache-persist: the bytes on disk of the files kept in DIR's cache directories (ours alone, a
// store's files only, none a running server holds; never through a link). A new server takes them back or removes them, so its
// disk limit's rule counts them as free space.
unsigned long long kept_cache_bytes(const std::string & dir);

// the names of the park-<n>.kv files in a store's directory (a cache directory's leftovers)
std::vector<std::string> store_files(const own_dir & own);

// The name of a store's file for park number n ("park-<n>.kv"), the only names a store makes
// beside its lock.
std::string park_file_name(unsigned long long n);

} // namespace llama_preempt
