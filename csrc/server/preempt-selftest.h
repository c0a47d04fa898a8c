// llama-preempt: the self-test of every park route on the user's own machine
// (llama-server --preempt-selftest, llama-preempt doctor).
//
// On the model and flags the server was started with, each route this build and device can take
// parks one sequence and brings it back, with every copy checked byte for byte
// (preempt-verify.h: the park against upstream's serializer, the restore by reading the cells back
// slice by slice), and the answer after the resume compared with the unparked one (greedy tokens):
//  - bulk:          the default (host tensors by memcpy, device tensors by the gather graphs)
//  - graphs:        every tensor by the gather/scatter graphs, host ones too
//  - slices:        upstream's copy, one slice at a time (the route the guard falls back to)
//  - restore ahead: the parked bytes uploaded to the device before the restore (devices only)
//  - disk:          to a file and back (--preempt-disk, or a temporary directory)
//  - ram_q8:        held packed to q8_0 and unpacked (the compressed tier; its answer may differ)
//  - recompute:     the cells dropped and the tokens prefilled again
// The sequence's cells are scattered among other sequences' and restored into other cells, as in
// a busy pool. It prints one table (route, devices, how each device's tensors moved and why,
// bytes, park and restore GB/s against the link's), what it could not try and why, and a report
// to paste into a bug report. No server types: the server passes its context and swap host.
#pragma once

#include "preempt-copy.h"
#include "preempt-swap.h"

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace llama_preempt {

struct selftest_input {
    llama_context * ctx  = nullptr;  // the target context: the model's KV pool
    swap_host     * host = nullptr;  // the server's swap host (its pool, rates, knobs; its disk tier or none)
    copy_faults     faults;          // the test knobs' faults (LLAMA_SERVER_PREEMPT_CORRUPT, _REFUSE_GATHER)
    disk_knobs      disk;         // the disk tier's test knobs
    bool            has_draft = false;  // a draft/MTP context (not exercised: its copies go through the same copier)
    std::vector<std::string> flags;     // the flags that matter, for the report ("-ngl 99", "-fa on", ...)
    std::string     build;              // this build's identity line
};

// one device's part in a route's copies
struct selftest_device {
    std::string device;
    unsigned    how = 0;   // copy_how bits, park and restore together
    std::string why;       // why some slices went one at a time ("" : none did)
    size_t      n_bytes = 0;
};

struct selftest_row {
    std::string route;
    bool        tried = false;
    std::string why_not;               // not tried: why
    std::vector<selftest_device> devices;
    size_t      n_bytes     = 0;       // the state parked
    double      park_gbps   = 0;
    double      restore_gbps = 0;
    copy_check  verified    = copy_check::none;  // right: every copy checked equal; none: nothing to check (recompute)
    std::string mismatch;              // where, and on which copy
    bool        same_answer = false;
    int32_t     first_diff  = -1;      // the first generated token that differs from the unparked answer
    bool        answer_must_match = true;  // false for recompute and ram_q8 (they may differ on some models)
    bool        answer_explained  = false; // every copy exact, and the backend's answers follow the batch (the control)
    std::string note;

    bool ok() const {
        return !tried || (verified != copy_check::wrong && (same_answer || !answer_must_match || answer_explained));
    }
};

// The control: the unparked answer once more, with the sequence's cells placed elsewhere and its
// tokens decoded in other batches, no park. Where the backend's numerics follow the batch (CUDA's
// attention and matrix kernels, the CPU's tiled ones without --deterministic) its logits change bit
// for bit, and so may a parked answer although every copy was exact.
struct selftest_control {
    bool    tried = false;
    bool    batch_invariant = true;
    int32_t first_logits_diff = -1;  // the first generated token whose logits differ from the unparked run's
    int32_t first_token_diff  = -1;  // the first generated token that differs
};

struct selftest_result {
    std::vector<selftest_row> rows;
    std::vector<link_speed>   links;
    std::vector<std::string>  not_tried;  // what the whole test could not do, and why
    std::vector<std::string>  device_notes;  // what a device lacks, and the route it takes instead
    selftest_control          control;
    int32_t n_prompt = 0, n_gen = 0, n_seqs = 0;
    bool ok() const;
};

// run every route; the result says what passed
selftest_result run_selftest(const selftest_input & in);

// the table, what was not tried, and the report for bug reports
void print_selftest(FILE * out, const selftest_input & in, const selftest_result & res);

// the same as JSON (llama-preempt doctor --json reads it)
std::string selftest_json(const selftest_input & in, const selftest_result & res);

} // namespace llama_preempt
