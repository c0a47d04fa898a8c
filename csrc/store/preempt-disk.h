// llama-preempt: the disk tier's files (--preempt-disk DIR). A parked slot's state, once copied to
// host RAM, is written to a file by one background I/O thread and read back (ahead of its turn
// where it can be) on resume. No llama or server types: the disk parks (preempt-disk-park.h) hand
// it bytes and ask what became of them.
//
// The directory holds only this server's files (preempt-disk-dir.h: a subdirectory of its own,
// locked, mode 0700; those of servers that are gone removed at the start): files of mode 0600, all
// removed when the store closes. Files are made, read and removed relative to the directory's
// descriptor, never through a link. Every file carries a checksum of its bytes, and a read back
// opens the very file (inode) that was written, so a short read, a file changed or replaced on
// disk is caught and the slot recomputes instead.
#pragma once

#include "preempt-disk-dir.h"

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace llama_preempt {

// LLAMA_SERVER_PREEMPT_DISK_FAIL (tests): the failure every disk park meets
enum class disk_fault {
    none,
    write,    // every write fails (EIO)
    read,     // every read fails (EIO)
    remove,   // the file is gone when it is read back
    corrupt,  // a byte of the file changes after it is written: the checksum catches it
    truncate, // the file loses its second half after it is written: a short read
    full,     // the disk is full (ENOSPC) halfway through the write
};
const char * disk_fault_name(disk_fault f);

// what went wrong with a file (the label of preempt_disk_failures_total)
enum class disk_error { none, full, write, read, missing, short_read, checksum, cancelled };
constexpr int N_DISK_ERRORS = 7;  // none .. checksum: the ones /metrics counts (cancelled is not a failure)
const char * disk_error_name(disk_error e);
// a failure /metrics counts (preempt_disk_failures_total{kind})
inline bool is_disk_failure(disk_error e) { return e != disk_error::none && (int) e < N_DISK_ERRORS; }

// A state that moves through the I/O thread one chunk at a time (disk_store::CHUNK) instead of
// from or into host buffers the size of the state (preempt-stream.h: a sequence's state straight
// between its llama contexts and its file). The loop waits for the file meanwhile (settle()), so
// the I/O thread may touch the contexts. Each call says why it failed in `why`.
struct disk_stream {
    virtual ~disk_stream() = default;
    // a write: bytes [pos, pos + n) of part `part` into `buf`
    virtual bool pull(int part, size_t pos, uint8_t * buf, size_t n, std::string & why) = 0;
    // a read: the file is open as `fd`, checked to be the one written, its first part at byte
    // `at`; called before any chunk is pushed
    virtual bool begin_read(int fd, size_t at, std::string & why) = 0;
    // a read: bytes [pos, pos + n) of part `part`, in file order (checked against the file's
    // checksum only once the last one is pushed: a failed read leaves what it pushed to undo)
    virtual bool push(int part, size_t pos, const uint8_t * buf, size_t n, std::string & why) = 0;
};

// Where a written state's records lie in each part (the byte ranges between its tensors' runs),
// kept beside its file: a read places exactly those pages. Without it (a file taken back after a
// restart) a read finds them through a read-only map of the file, whose faults may bring in the
// page cache's large folios around each record: more resident memory for the parse's moment.
struct stream_layout {
    std::vector<std::pair<size_t, size_t>> records[2];  // (pos, len), in order
    bool known = false;
};

// One parked slot's file, shared between the main loop and the I/O thread. The loop owns the
// memory `src` and `dst` point at and never frees it while the file is busy (remove() and
// settle() wait for the I/O thread to let go).
struct disk_file {
    enum class status { queued_write, writing, written, queued_read, reading, read, failed, removed };

    std::string name;                   // in the store's directory
    std::string path;                   // the store's directory and name, for messages
    size_t      n_bytes[2] = { 0, 0 };  // the two parts (target and draft context), in file order
    std::vector<uint8_t> meta;          // the owner's record of the file (a cached prompt's tokens), written
                                        // after the parts with a checksum of its own; empty for a park

    // the I/O thread reads from `src` (a write) or fills `dst` (a read), or moves the bytes
    // through `stream` one chunk at a time (then both are null)
    const uint8_t * src[2] = { nullptr, nullptr };
    uint8_t *       dst[2] = { nullptr, nullptr };
    disk_stream *   stream = nullptr;

    // guarded by the store's mutex
    status      st       = status::queued_write;
    bool        busy     = false;  // queued or in the I/O thread's hands
    bool        held     = false;  // a queued write that waits for start() (its host copy is still arriving)
    bool        counted  = false;  // its bytes count in the store's bytes_held()
    bool        unwritten = false; //   and, until its write ends, among the bytes not on the disk yet
    disk_error  error    = disk_error::none;
    std::string why;               // failed: what failed, for the log
    int64_t     t_us     = 0;      // the last write or read took this long (its rate)
    uint64_t    checksum = 0;      // of the bytes written
    uint64_t    dev = 0, ino = 0;  // the file written: a read back opens this one, or fails

    size_t total() const { return n_bytes[0] + n_bytes[1]; }
};

struct disk_knobs {
    disk_fault fault   = disk_fault::none;  // LLAMA_SERVER_PREEMPT_DISK_FAIL
    int64_t    hold_us = 0;                 // LLAMA_SERVER_PREEMPT_DISK_HOLD_MS: a write stays in flight this long
    std::string first_name;                 // LLAMA_SERVER_PREEMPT_DISK_NAME: the store's directory name tried first
};

// where a store's notes go (the server logs them): `warn` a warning, else information
using disk_log = std::function<void(bool warn, const std::string & msg)>;

class disk_store {
public:
    // Creates DIR/llama-preempt-<pid>-<random> (mode 0700) and locks it; removes the directories
    // of servers that no longer run. `budget` bytes of files at once (SIZE_MAX: no limit but the
    // disk's free space). Null and `err` set when the directory cannot be used.
    // `cache_key` (--cache-persist): the directory is DIR/llama-preempt-cache-<key>, kept across
    // restarts (preempt-disk-dir.h); when it cannot be had, `cache_note` says why and the store
    // falls back to a directory of its own.
    static std::shared_ptr<disk_store> open(const std::string & dir, size_t budget, const disk_knobs & knobs, std::string & err,
                                            const std::string & cache_key = "", std::string * cache_note = nullptr);
    ~disk_store();  // stops the I/O thread; removes every file and the directory (a kept directory: all but keep_at_close());
                    // what could not be removed is named in a warning (set_log())

    // Where the store's notes go, set once right after open(): its directory made again after it
    // was removed, the filesystem full (once per episode) and room again, files left at exit.
    // Called from the loop's thread or the I/O thread.
    void set_log(disk_log log) { log_ = std::move(log); }

    // --cache-persist (preempt-disk-keep.cpp): a file an earlier run wrote, taken back from its own
    // header: a regular file of ours (never through a link) of this version, of the size its header
    // gives, whose record (`meta`, returned) matches its checksum; its state's checksum is checked
    // when it is read. Null with `why` otherwise. And the files to keep at close.
    std::shared_ptr<disk_file> adopt(const std::string & name, std::vector<uint8_t> & meta, std::string & why);
    void keep_at_close(std::vector<std::string> names) { keep_ = std::move(names); }
    bool persistent() const { return persistent_; }
    int  dir_fd() const { return dir_.fd; }
    std::vector<std::string> file_names() const { return store_files(dir_); }  // its park-<n>.kv files now

    disk_store(const disk_store &) = delete;
    disk_store & operator=(const disk_store &) = delete;

    // Queue a write of the two parts (either may be empty); `held`: it waits for start() (its bytes
    // are taken from the budget now). Null, with `why` and `error`, when the budget or the disk has
    // no room for it. The memory must stay until the file settles.
    std::shared_ptr<disk_file> write(const uint8_t * a, size_t n_a, const uint8_t * b, size_t n_b, bool held,
                                     std::string & why, disk_error & error, std::vector<uint8_t> meta = {});
    // Queue a write whose bytes the I/O thread pulls from `from` one chunk at a time (never held);
    // the caller waits for it (settle()) and keeps `from` until then. As write() otherwise.
    std::shared_ptr<disk_file> write(disk_stream & from, size_t n_a, size_t n_b, std::string & why, disk_error & error,
                                     std::vector<uint8_t> meta = {});
    // A held write may start.
    void start(const std::shared_ptr<disk_file> & f);
    // The buffers a file was read into were dropped: it is only written again (it can be read
    // again). False when it was not read.
    bool unread(const std::shared_ptr<disk_file> & f);
    // Queue a read of a written file into `a` and `b` (its part sizes). False when it is not written.
    bool read(const std::shared_ptr<disk_file> & f, uint8_t * a, uint8_t * b);
    // Queue a read of a written file pushed into `into` one chunk at a time; the caller waits for
    // it (settle()) and keeps `into` until then. False when it is not written.
    bool read(const std::shared_ptr<disk_file> & f, disk_stream & into);
    // Wait until the I/O thread is done with the file; its status then.
    disk_file::status settle(const std::shared_ptr<disk_file> & f);
    // Whether the I/O thread is done with it, without waiting.
    bool is_settled(const std::shared_ptr<disk_file> & f) const;
    // Cancel whatever runs on the file, wait for the I/O thread to let go of it, remove it.
    void remove(const std::shared_ptr<disk_file> & f);

    size_t  bytes_held() const;  // bytes of this server's files now (written or being written)
    size_t  room() const;        // bytes of state a new file may take: what is left of the budget and of the disk
    // Whether `bytes` of state find no room because the filesystem is full (beyond RESERVE) while
    // the budget (--preempt-disk-mib) has room for them; `give_way`: bytes of files that would
    // make way (cached prompts' files give way to a park).
    bool    short_of_disk(size_t bytes, size_t give_way) const;
    // A write refused, or cut short, because the filesystem is full: counted (n_full()), and
    // logged once per episode; the episode ends when a write succeeds again.
    void    count_full(const std::string & what);
    uint64_t n_full() const;
    int32_t  n_remade() const;   // times its directory was made again after it was removed under it
    int32_t n_writes_in_flight() const;
    const std::string & dir() const { return dir_.path; }
    size_t budget() const { return budget_; }
    int32_t n_stale_removed() const { return n_stale_removed_; }  // for open()'s log line

    // free space kept on the disk for everything else
    static constexpr size_t RESERVE = (size_t) 64 << 20;
    // a file's header: magic (LPKVSEQ2), two part sizes, their checksum, the record's size and
    // checksum, padding; the record follows the parts (version 1, LPKVSEQ1, had none)
    static constexpr size_t HEADER_BYTES = 64;
    static constexpr char   MAGIC[9]    = "LPKVSEQ2";  // this version's files
    static constexpr char   MAGIC_V1[9] = "LPKVSEQ1";  // an older version's: no record, never taken back
    // one pwrite/pread, checksummed while it is in the cache: a cancel waits for one at most, and a
    // streamed state (disk_stream) passes through one staging buffer of this size
    static constexpr size_t CHUNK = (size_t) 1 << 20;

private:
    disk_store() = default;
    void run();  // the I/O thread
    disk_error do_write(disk_file & f, std::string & why, uint64_t & sum);
    disk_error do_read(disk_file & f, std::string & why);
    void uncount(disk_file & f);           // under mu_: its bytes leave bytes_held_ (and bytes_unwritten_)
    void settle_unwritten(disk_file & f);  // under mu_: its bytes are on the disk, or gone
    size_t   budget_left_locked() const;
    uint64_t disk_left_locked() const;
    size_t   room_locked() const;
    void   count_full_locked(const std::string & what);
    void   remake_if_gone_locked();
    void   note(bool warn, const std::string & msg) const {
        if (log_) {
            log_(warn, msg);
        }
    }
    std::shared_ptr<disk_file> queue_write(std::shared_ptr<disk_file> f, bool held, std::string & why, disk_error & error);
    bool queue_read(const std::shared_ptr<disk_file> & f);
    std::deque<std::shared_ptr<disk_file>>::iterator next_job();
    bool cancelled() const;

    own_dir     dir_;
    bool        persistent_ = false;  // a --cache-persist directory
    std::vector<std::string> keep_;   //   and the files it keeps at close
    size_t      budget_  = 0;
    disk_knobs  knobs_;
    uint64_t    n_files_ = 0;
    int32_t     n_stale_removed_ = 0;
    disk_log    log_;

    mutable std::mutex      mu_;
    std::condition_variable cv_work_;  // the I/O thread waits for work (and a held write for a cancel)
    std::condition_variable cv_done_;  // the loop waits for a file to settle
    std::deque<std::shared_ptr<disk_file>> queue_;
    size_t  bytes_held_      = 0;
    size_t  bytes_unwritten_ = 0;  // queued or being written: the disk's free space does not show them yet
    int32_t n_writing_       = 0;
    uint64_t n_full_         = 0;      // writes refused or cut short by a full filesystem
    bool    full_episode_    = false;  //   and said so: until a write succeeds again
    int32_t n_remade_        = 0;      // its directory made again after it was removed
    bool    said_dir_lost_   = false;  //   or said that it could not be (once)
    bool    stop_       = false;
    bool    cancel_     = false;  // the file in the I/O thread's hands is being removed
    std::shared_ptr<disk_file> current_;
    std::vector<uint8_t> staging_;  // the I/O thread's: a streamed file's chunk (CHUNK bytes, allocated at its first)
    std::thread worker_;
};

} // namespace llama_preempt
