// llama-preempt: disk parks, a SWAP park's state taken from host RAM to a file and back
// (--preempt-disk). The park itself is a swap_out() as for RAM (preempt-swap.h); these functions
// then move the host copy to the disk tier (preempt-disk.h) and bring it back before swap_in().
// No server types: the parked slots (server/preempt-parked-disk.cpp) call them and log and count what they report.
//
// A disk park's life, in its swap_state:
//   1. park: the host copy is written in the background when it fits what is left of
//      --preempt-ram (its RAM counts against the budget until the file is written), else the park
//      waits for the write; on a device, the write starts once the park's transfer has settled;
//   2. each step (disk_step): a finished write frees the host copy (the state is only on disk now),
//      unless the slot is the next one back; a failed one keeps it (a RAM park from then on); a
//      write that cannot be had at the park (no room) keeps it too, when it fits the RAM;
//   3. restore ahead (disk_read_ahead): the slot that comes back next has its file read into new
//      host buffers while other slots decode;
//   4. resume (disk_read_back): a file still being written (or kept) is dropped and the host copy used; else
//      the read ahead is awaited, or the file is read now; the bytes are checked against the
//      file's checksum (and with LLAMA_SERVER_PREEMPT_VERIFY byte for byte against upstream's serialization),
//      then swap_in() copies them back as for any SWAP park.
#pragma once

#include "preempt-stream.h"
#include "preempt-swap.h"

#include <cstdint>
#include <string>

namespace llama_preempt {

// what a disk park's write, step or read back came to
enum class disk_outcome {
    none,         // nothing to report: a write queued or still running, nothing due this step
    written,      // its file was written (bytes, t_us: the write)
    kept_in_ram,  // its file could not be had, but the host copy holds the state: a RAM park from now on
    lost,         // it failed and the state is gone (or must not be restored): the slot recomputes
    dropped,      // a read ahead was let go (the slot is no longer the next back)
    read,         // read back from its file at the resume (bytes, t_us: the read)
    read_ahead,   // read back, from a read queued ahead of the resume
    from_memory,  // read back: the host copy was used (its write still running, or kept)
};

// what a disk step or read did, for the mechanics to log and count
struct disk_result {
    disk_outcome outcome = disk_outcome::none;
    disk_error   error = disk_error::none;  // a failure, by kind (/metrics label); also a background
                                            // write that failed before a resume from memory
    std::string  why;                       // what failed, for the log
    size_t       bytes = 0;                 // bytes written or read
    int64_t      t_us  = 0;                 // the I/O thread's time for them
    copy_check   verified = copy_check::none;  // LLAMA_SERVER_PREEMPT_VERIFY: the bytes read back against upstream's
    copy_mismatch mismatch;                     //   a streamed restore's check: where the cells first differ from the file's bytes
    copy_report   report;                       //   and the devices its tensors live on (the guard counts it by them)

    bool ok() const { return outcome != disk_outcome::kept_in_ram && outcome != disk_outcome::lost; }
};

// Right after a successful swap_out(): the state goes to a file. In the background when
// `background` (the host copy fits what is left of the RAM budget: none, the write queued), else
// before this returns (written). Not ok: nothing is on disk; in the background the host copy is
// kept (kept_in_ram: a RAM park), else it is freed (lost: the caller recomputes instead).
// `ref`: upstream's bytes of the state when LLAMA_SERVER_PREEMPT_VERIFY compared the park
// (swap_result::ref; empty otherwise), kept to compare the read back with.
disk_result disk_park(swap_state & st, swap_host & host, bool background, std::vector<uint8_t> && ref);

// Once per step, for a disk-parked slot: start a write whose transfer has settled, and see to a
// write that finished: its host copy is freed, unless `keep` (the slot is the next one back: its
// file would only be read back at once). A finished read ahead is let go unless `keep_read` (the
// slot is the next one back, or RAM is not short: dropped otherwise). written: a write finished
// this step. kept_in_ram: the write failed; the host copy is kept and the slot is a RAM park from
// now on.
disk_result disk_step(swap_state & st, swap_host & host, bool keep, bool keep_read);

// A park whose state does not fit what parks may hold of the host budget: streamed from the
// contexts to its file now, one chunk at a time (preempt-stream.h), no host copy; the cells must
// still be in place. written (the state only on disk, st.disk.streamed), or lost.
disk_result disk_park_streamed(swap_state & st, const seq_contexts & sc, const state_sizes & n, swap_host & host);

// The resume of a streamed park: its file straight back into the contexts, one chunk at a time.
// read, or lost (the sequence is removed from the contexts again, the file is gone). `verify`
// (the copy guard): each slice is read back from its tensor and compared with the file's bytes.
// A streamed park itself is not checked: it is upstream's own serializer and per-slice copy
// (ggml_backend_tensor_get), the reference the guard holds the bulk copier to.
disk_result disk_restore_streamed(swap_state & st, const seq_contexts & sc, swap_host & host, bool verify);

// Read the slot's file into new host buffers ahead of its resume. False when there is nothing to
// read (still in RAM, already reading) or its buffers cannot be had.
bool disk_read_ahead(swap_state & st, swap_host & host);

// Before swap_in(): the host buffers get the state back (see 4. above). Not ok: the state is lost
// (the file failed or changed); the buffers and the file are freed and the caller recomputes.
disk_result disk_read_back(swap_state & st, swap_host & host);

} // namespace llama_preempt
