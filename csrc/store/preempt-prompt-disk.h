// llama-preempt: upstream's prompt cache, one tier down. A cached prompt that leaves host RAM (it
// gave way to a park, or the cache's own least-recently-used limit) is written to the disk tier's
// store (preempt-disk.h: the same I/O thread, checksums, private files in the hardened directory)
// instead of being dropped, and read back into the RAM cache when a request's prefix matches it
// better than anything in RAM. Parked slots come first on disk too: drop_oldest() drops the oldest
// prompt files for a park. Which file matches, whether it comes back or is read ahead and how many
// give way are the policy's choices (policy/preempt-memory.h) over views(). No server types: the server hands it tokens and bytes
// (csrc/server/preempt-prompt-cache-disk.cpp).
#pragma once

#include "preempt-disk.h"
#include "preempt-types.h"  // prompt_file_view: a plain type, never the choices

#include "llama.h"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace llama_preempt {

// a cached prompt read back: its tokens, the two contexts' states, and the server's own bytes kept
// with them (`tail`: its context checkpoints, packed by the server)
struct prompt_read {
    std::vector<llama_token> tokens;
    std::vector<uint8_t>     tgt, dft, tail;
    int64_t                  t_us = 0;  // the I/O thread's read time
};

class prompt_disk {
public:
    explicit prompt_disk(std::shared_ptr<disk_store> store) : store_(std::move(store)) {}
    ~prompt_disk();  // its files removed (the store removes its directory at exit)

    prompt_disk(const prompt_disk &) = delete;
    prompt_disk & operator=(const prompt_disk &) = delete;

    // A prompt leaving RAM: its file is written in the background (the bytes are kept until it is).
    // One at a time: the caller first waits for the write before it (finish_writes()), so the host
    // bytes outside the RAM cache are at most one prompt's. `tail` (opaque, may be empty) goes in the file after `dft` and
    // comes back as prompt_read::tail. False, with `why`, when the store has no room for it.
    bool spill(std::vector<llama_token> tokens, std::vector<uint8_t> && tgt, std::vector<uint8_t> && dft,
               std::vector<uint8_t> && tail, std::string & why);

    // A prompt too large for the RAM cache: its file written now (the loop waits), its bytes pulled
    // from `from` one chunk at a time (preempt-stream.h), never held in host RAM whole. The last
    // `n_tail` bytes of the second part are the caller's tail. False, with `why` and `error`
    // (full: the store has no room for it), when it is not written.
    bool write_streamed(std::vector<llama_token> tokens, disk_stream & from, size_t n0, size_t n1, size_t n_tail,
                        stream_layout layout, std::string & why, disk_error & error);
    // Read file i straight into `into` (the slot's contexts; a read ahead of it is let go first),
    // then remove it from the disk. Not ok: `why` and `error`; the file is gone and the caller
    // undoes what was pushed.
    bool take_streamed(int32_t i, disk_stream & into, std::vector<llama_token> & tokens, int64_t & t_us, std::string & why,
                       disk_error & error);
    size_t tail_bytes(int32_t i) const { return files_[i].n_tail; }
    const stream_layout & layout_of(int32_t i) const { return files_[i].layout; }  // known for a file streamed out in this run

    // the files as the policy's choices see them (oldest first; valid until the next call that adds
    // or drops a file): which matches a request, whether to read it back or ahead, which give way
    std::vector<prompt_file_view> views() const;
    // a file's handle, and its index again after calls that may drop or add files (-1: gone)
    std::shared_ptr<disk_file> handle(int32_t i) const { return files_[i].file; }
    int32_t find(const std::shared_ptr<disk_file> & f) const;

    // Read file i back (waiting for its write, then its read) and remove it from the disk. Not ok:
    // `why` and `error` (a checksum, a short read, ...): the file is gone and the prompt recomputes.
    bool take(int32_t i, prompt_read & out, std::string & why, disk_error & error);

    // Start reading file i into host memory in the background, for a request that waits for a slot:
    // take() then finds its bytes read (or waits only for the rest). One file at a time; false when
    // file i is not written yet. forget_ahead() lets its host copy go (the request went another way;
    // the caller gives the pages back); a file whose read failed is dropped then (true: count it as a failure).
    bool    read_ahead(int32_t i);
    int32_t ahead() const;  // the file read ahead (-1: none)
    size_t  bytes_ahead() const;
    bool    forget_ahead();

    // once per step: finished writes free their host copies (n_freed: how many; the caller gives the
    // pages back, host_ram::pages_freed()); failed ones are dropped (n_failed)
    struct step_result {
        int32_t n_freed  = 0;
        int32_t n_failed = 0;
    };
    step_result step();
    // every write still running finishes, then step()
    step_result finish_writes();

    // Parks first: the `n` oldest prompt files go (prompt_files_to_drop() says how many). Returns
    // the bytes removed.
    size_t drop_oldest(size_t n);

    size_t  bytes_held() const;  // bytes of prompt files now
    size_t  room() const { return store_->room(); }  // bytes a new file may take now (the store's)
    int32_t n_files() const { return (int32_t) files_.size(); }

    // --cache-persist (the store's directory is kept across restarts: disk_store::persistent()).
    // At start: the prompt files in the directory taken back, each from its own header and tokens
    // (a regular file of ours of this version and of its size; its state's checksum is checked when
    // it is read), in the order the last run's index under this `key` lists them, then the others
    // it does not list (the index damaged or missing: rebuilt from the files) by the order they were
    // written in; the index then removed, and any other file a store makes removed; of those taken
    // back, the oldest beyond the store's budget (--preempt-disk-mib) removed too. At close (from
    // the destructor, after keep_at_exit()): the written files listed, in order, in a new index.
    struct load_result {
        bool        index_ok = false;  // the last run's index was read
        std::string index_why;         //   or why not (missing, damaged, of an older version, ...)
        int32_t n_taken    = 0;  // files taken back and kept
        size_t  bytes      = 0;  // their bytes
        int32_t n_rebuilt  = 0;  // of those, taken back from their own tokens: no index listed them
        int32_t n_dropped  = 0;  // prompt files that did not check out (header, size, tokens, an older version), removed
        std::string why_dropped;  //   what was wrong with them, by file, each reason once
        int32_t n_unlisted = 0;  // parked slots' files (a crashed run's: no tokens), removed
        int32_t n_over     = 0;  // files taken back, then removed (oldest first) to fit the budget
        size_t  bytes_over = 0;  // their bytes
    };
    load_result load_index(const std::string & key);
    void    keep_at_exit(const std::string & key) { keep_key_ = key; }

private:
    struct entry {
        std::vector<llama_token>   tokens;
        std::shared_ptr<disk_file> file;
        std::vector<uint8_t>       tgt, dft;  // held while the write runs (dft with the tail after it)
        size_t                     n_tail = 0;  // the tail's bytes at the end of the file's second part
        stream_layout              layout;      // a streamed write's: where its records lie
        prompt_read                ahead;  // read ahead: the buffers its read fills (tokens unused)
        bool                       reading_ahead = false;
        bool                       written = false;
    };
    void drop(size_t i);
    bool save_index();

    std::shared_ptr<disk_store> store_;
    std::string                 keep_key_;  // --cache-persist: the index's key at close ("" : nothing kept)
    std::vector<entry>          files_;  // oldest first
};

} // namespace llama_preempt
