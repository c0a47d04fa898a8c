// llama-preempt: a sequence's state straight between its llama contexts and its file on the disk
// tier, one chunk at a time (disk_stream, preempt-disk.h), never a host copy of the whole state.
// For a state larger than what host RAM may hold: a park that does not fit what parks may hold of
// the host budget, its resume, and a cached prompt larger than --cache-ram.
//
// The bytes are upstream's serialization (llama_state_seq_*_data_cb, patches/0006), so a file
// written here reads back as any other and the other way round. The serializer lays out the state
// and hands its tensor slices to a callback instead of copying them: the small records between
// them (cell positions and sequences, per-layer types and sizes) land in a reserved address range
// of the state's size of which only the touched pages take memory (a write), or are read through
// a read-only map of the file (a read); the tensor slices move through the store's staging buffer
// as the I/O thread writes or reads each chunk. Host memory: one chunk (disk_store::CHUNK), the
// pages the records touch and the slice list (a few words per cell range and tensor).
#pragma once

#include "preempt-disk.h"
#include "preempt-swap.h"

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

struct ggml_tensor;

namespace llama_preempt {

class state_stream final : public disk_stream {
public:
    // the contexts and the state's sizes (size_state()); `tail`: bytes of the caller's own written
    // after the draft part (a cached prompt's checkpoints), its size given for a read
    state_stream(const seq_contexts & sc, const state_sizes & n, std::vector<uint8_t> tail = {});
    ~state_stream() override;

    state_stream(const state_stream &) = delete;
    state_stream & operator=(const state_stream &) = delete;

    // A write: lay the state out now, while its cells are in place (they must stay until the
    // write is done). False with `why` when upstream cannot serialize it at its size.
    bool lay_out(std::string & why);
    // a write, once laid out: where its records lie (for the read back)
    stream_layout layout() const;
    // a read: its tail's size in the file, and where its records lie when known (before the read is queued)
    void expect_tail(size_t n) { tail_.assign(n, 0); }
    void use_layout(stream_layout l) { layout_ = std::move(l); }
    // a read checked by the copy guard: each slice, once in its tensor, is read back and compared
    // with the file's bytes (one chunk at a time); mismatch() says where the first differed
    void check_restore() { check_ = true; }
    const copy_mismatch & mismatch() const { return mismatch_; }

    size_t part_bytes(int part) const { return part == 0 ? n_.tgt : n_.dft + tail_.size(); }
    std::vector<uint8_t> & tail() { return tail_; }
    // a read that failed: the sequence leaves both contexts again (part of it may be in place)
    void undo();

    bool pull(int part, size_t pos, uint8_t * buf, size_t n, std::string & why) override;
    bool begin_read(int fd, size_t at, std::string & why) override;
    bool push(int part, size_t pos, const uint8_t * buf, size_t n, std::string & why) override;

    // A run of the state's bytes that lives in one tensor: [pos, pos + n_rows * row_size) of the
    // part's bytes, row j of it at row_stride * j further in the tensor, each row made of `spans`
    // (a plain slice: one row, one span). One per serializer call, not one per row: a transposed V
    // (flash attention off) is a handful of these per layer, not one per V row.
    struct span {
        size_t in_row;  // bytes into the row
        size_t off;     // bytes into the tensor, for row 0
        size_t size;
    };
    struct block {
        ggml_tensor *     tensor = nullptr;
        size_t            pos = 0, n_rows = 1, row_size = 0, row_stride = 0;
        std::vector<span> spans;
        size_t end() const { return pos + n_rows * row_size; }
    };
    // the devices the state's tensors live on (the copy guard counts a streamed restore by them)
    copy_report devices() const;

private:
    struct part_layout {
        llama_context *    ctx = nullptr;
        size_t             n   = 0;        // the state's bytes in this context
        uint8_t *          records = nullptr;  // the reserved range the records land in (a write)
        std::vector<block> blocks;         // sorted by pos, none overlapping
    };
    void check_slice(ggml_tensor * t, size_t off, size_t len, const uint8_t * want, int part, size_t at);
    // walk bytes [pos, pos + n) of a part in order: records(at, len, d) for the bytes between the
    // tensors' runs, slice(tensor, offset in it, len, d) for those of a run (`d`: into the chunk)
    template <typename R, typename S> void walk(const part_layout & p, size_t pos, size_t n, R && records, S && slice);

    seq_contexts         sc_;
    state_sizes          n_;
    std::vector<uint8_t> tail_;
    part_layout          parts_[2];
    bool                 read_begun_ = false;
    stream_layout        layout_;     // a read: where the records lie, when the write was this server's
    bool read_records(int fd, size_t at, std::string & why);  // into reservations, from layout_
    bool                 check_      = false;
    copy_mismatch        mismatch_;
    std::vector<uint8_t> check_buf_;  // a slice read back for the check (at most one chunk)
};

} // namespace llama_preempt
