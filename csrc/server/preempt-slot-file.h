// llama-preempt: the files of upstream's slot API (POST /slots/{id}?action=save|restore), written
// whole or not at all and checked before a byte of them reaches a context.
//
// A slot file is upstream's sequence-state file (llama_state_seq_save_file(): magic, version, the
// tokens, the state) followed by a trailer of TRAILER_BYTES, so upstream's reader still reads it (it
// stops where the state ends):
//
//   "LPSLOT\0\1" | trailer version u32 | 0 u32 | bytes before the trailer u64 | their checksum u64 |
//   the model's identity (16 hex digits) | 16 zero bytes
//
// A save writes a temporary name beside the requested one, appends the trailer, fsyncs and renames
// it, so a full disk, a file-size limit or a crash never leaves a partial file under the name. A
// restore refuses, with the reason, a file that is cut short, damaged, of another model, or has no
// trailer (another program's, or cut before it), before upstream's reader runs.
#pragma once

#include "llama.h"

#include <cstddef>
#include <cstdint>
#include <string>

struct common_params;

namespace llama_preempt {

// what went wrong with a slot file (the label of llamacpp:preempt_slot_file_failures_total)
enum class slot_file_fault : uint8_t {
    none,
    missing,    // restore: no such file (or not a regular file)
    truncated,  // restore: shorter than its trailer says, or no trailer at its end
    corrupt,    // restore: its bytes do not match their checksum, or not a sequence state
    foreign,    // restore: saved with another model or other KV cache types
    no_space,   // save: the filesystem is full, or the file-size limit is below the file
    write,      // save: any other write error
    n_faults,
};
constexpr int N_SLOT_FILE_FAULTS = (int) slot_file_fault::n_faults;

const char * slot_file_fault_name(slot_file_fault f);

struct slot_file_outcome {
    slot_file_fault fault   = slot_file_fault::none;
    std::string     why;          // for the client: what is wrong and, where it helps, what to do
    size_t          n_bytes = 0;  // save: the file's size
    bool ok() const { return fault == slot_file_fault::none; }
};

// A model's identity for its states: what a sequence state's bytes depend on (the model file: its
// size, its first and last MiB, its description; the layer and embedding sizes; the KV cache types).
// 16 hex digits. The --cache-persist key builds on it.
std::string model_state_identity(const common_params & params, llama_context * ctx);

class slot_files {
public:
    static constexpr size_t TRAILER_BYTES = 64;

    explicit slot_files(std::string model_identity) : model_(std::move(model_identity)) {}

    // Sequence `seq` of `ctx` with its tokens, as a whole file at `path`, or nothing there (any file
    // already at `path` stays as it was when the save fails).
    slot_file_outcome save(llama_context * ctx, llama_seq_id seq, const std::string & path, const llama_token * tokens,
                           size_t n_tokens);

    // Whether the file at `path` is a whole, undamaged slot file of this model; read through once.
    slot_file_outcome check(const std::string & path) const;

private:
    std::string model_;
    uint64_t    n_saved_ = 0;  // names the temporary files
};

} // namespace llama_preempt
