// Preemption counters: one place that every front end (/metrics, /slots, the Python layer) reads.
#pragma once

#include "preempt-disk.h"
#include "preempt-policy.h"
#include "preempt-slot-file.h"

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace llama_preempt {

// Where the server loop's time goes, a step at a time: the plan (its parks' and resumes' copies),
// the decode (the batch built and computed up to its logits: on a GPU the wait for the device), the
// post-decode (sampling, each token processed and sent to its handler) and the rest of the loop up
// to the next step (new and finished requests, the prompt cache, the task queue).
enum loop_part : int { LOOP_PLAN, LOOP_DECODE, LOOP_POST, LOOP_OTHER, N_LOOP_PARTS };
inline const char * loop_part_name(int part) {
    static const char * names[N_LOOP_PARTS] = { "plan", "decode", "post", "other" };
    return part >= 0 && part < N_LOOP_PARTS ? names[part] : "?";
}

// cumulative since the server started; lives inside upstream's server_metrics
struct preempt_counters {
    uint64_t n_preempt_total           = 0;  // slots parked
    uint64_t n_preempt_swap_total      = 0;  //   of those, parked by SWAP (state copied to host RAM)
    uint64_t n_preempt_recompute_total = 0;  //   of those, parked by RECOMPUTE (cells dropped)
    uint64_t n_resume_total            = 0;  // parked slots resumed
    uint64_t n_recompute_tokens_total  = 0;  // tokens re-prefilled after a park (decoded successfully)
    uint64_t n_swap_restore_fail_total = 0;  // SWAP restores that failed and fell back to RECOMPUTE
    uint64_t n_restore_ahead_total     = 0;  // SWAP restores whose bytes were uploaded to the device ahead
    uint64_t n_fail_total              = 0;  // parked requests ended because they no longer fit the pool
    uint64_t n_queue_full_total        = 0;  // requests answered 503 at once: --max-queue requests waited for a slot
    uint64_t n_bytes_moved_total       = 0;  // wasted work by SWAP: state bytes copied out at parks and back at resumes
    uint64_t n_paused_total            = 0;  // times a generating slot was paused (beyond the decode width; it kept its cells)
    uint64_t n_prefix_links_total      = 0;  // new prompts that linked a prefix another slot held (--prefix-share)
    uint64_t n_prompt_tokens_linked_total = 0;  //   the prompt tokens they linked instead of evaluating
    uint64_t n_loop_steps_total        = 0;  // steps the loop timed (loop_us)
    uint64_t loop_us[N_LOOP_PARTS]     = {};  // where those steps' time went (loop_part), in microseconds
    uint64_t parks_by_choice[N_PARK_CHOICES] = {};  // parks by why SWAP or RECOMPUTE was taken (park_choice)
    uint64_t parks_by_tier[N_PARK_TIERS]     = {};  // parks by where the state went: RAM, disk, nowhere (park_tier)
    uint64_t restores_by_tier[N_PARK_TIERS]  = {};  // resumes by where the state came from (a failed swap restore: recompute)
    uint64_t disk_failures[N_DISK_ERRORS]    = {};  // disk park failures by what failed (disk_error)
    uint64_t slot_file_failures[N_SLOT_FILE_FAULTS] = {};  // the slot API's saves and restores refused, by what was wrong (slot_file_fault)
    uint64_t n_disk_write_bytes_total  = 0;  // bytes written to the disk tier's files
    uint64_t n_disk_read_bytes_total   = 0;  // bytes read back from them
    uint64_t n_disk_write_us_total     = 0;  // time the I/O thread took for those writes (their rate: bytes over time)
    uint64_t n_disk_read_us_total      = 0;  //   and for the reads
    uint64_t n_disk_read_ahead_total   = 0;  // files read back ahead of their resume
    uint64_t n_disk_restore_from_memory_total = 0;  // disk parks resumed from their host copy (file still being written, or kept as next back)
    uint64_t n_swap_verify_total          = 0;  // the copy guard (--preempt-verify): swap parks, restores and disk read-backs checked byte for byte
    uint64_t n_swap_verify_mismatch_total = 0;  //   of those, not byte-identical
    uint64_t n_copy_route_changes_total   = 0;  // devices the guard moved to a safer route (single slices, or SWAP off)
    uint64_t n_prompt_cache_evicted_total = 0;  // cached prompts that gave way to parked slots in the host budget
    uint64_t n_prompt_cache_spilled_total = 0;  // cached prompts that left host RAM for the disk tier
    uint64_t n_prompt_cache_disk_hits_total = 0;      // of those, read back for a request whose prefix matched
    uint64_t n_prompt_cache_read_ahead_total = 0;     // prompt files read ahead while their request waited for a slot
    uint64_t n_prompt_cache_disk_failures_total = 0;  // prompt files that failed to write or read back (prefilled instead)
    uint64_t n_prompt_cache_load_failures_total = 0;  // prompt files read back whose state the slot refused (prefilled, not hits)
    uint64_t n_prompt_cache_disk_skipped_total = 0;   // cached prompts dropped, not written (no room, media)
    uint64_t n_prompt_cache_streamed_total = 0;       // prompts larger than the RAM cache streamed from their slot to the disk tier
    uint64_t n_prompt_cache_streamed_back_total = 0;  // prompt files streamed straight into a slot (too large for the RAM cache's room)
    // the pool's size, set once: kept here, with what /metrics keeps while the server sleeps
    // (its model unloaded), so kv_pool_cells reads the same asleep and awake
    int32_t  n_pool_cells = 0;
    uint64_t host_budget_bytes = 0;  // --host-kv-ram: parked slots and cached prompts together (0: no limit), set once as n_pool_cells

    // per finished request: how many times it was parked (a Prometheus histogram)
    static constexpr int    n_buckets = 8;
    static constexpr double bucket_le[n_buckets] = { 0, 1, 2, 3, 5, 10, 20, -1 };  // -1: +Inf
    uint64_t request_preemptions[n_buckets] = {};  // per bucket, not cumulative
    uint64_t request_preemptions_sum   = 0;
    uint64_t request_preemptions_count = 0;

    void observe_request(int32_t n_preempt) {
        int b = 0;
        while (b < n_buckets - 1 && n_preempt > bucket_le[b]) {
            b++;
        }
        request_preemptions[b]++;
        request_preemptions_sum += (uint64_t) n_preempt;
        request_preemptions_count++;
    }
};

// read when /metrics is asked: what is parked right now
struct preempt_gauges {
    int32_t  n_requests_preempted = 0;  // slots parked now
    uint64_t ram_bytes            = 0;  // host RAM held by parked slots now (SWAP buffers)
    int32_t  n_copies_in_flight   = 0;  // SWAP parks whose transfer to host RAM may still be running
    uint64_t pool_bytes           = 0;  // idle host RAM kept for the next swap buffers (warm memory)
    uint64_t prompt_cache_bytes   = 0;  // upstream's prompt cache now (its states in host RAM)
    uint64_t prompt_cache_disk_bytes = 0;  // cached prompts in the disk tier's files now
    cost_rates rates;                   // the rates SWAP-or-RECOMPUTE is chosen with now
    uint64_t disk_bytes           = 0;  // bytes in the disk tier's files now (written or being written)
    int32_t  n_disk_writes_in_flight = 0;  // disk parks whose file is still being written (their host copy held)
    uint64_t n_disk_full          = 0;  // disk writes refused or cut short by a full filesystem (the store counts them)
    uint64_t n_disk_dir_remade    = 0;  // times the disk tier's directory was made again after it was removed
    int32_t  n_pool_cells_used    = 0;  // cells the requests in flight hold now (idle caches are reclaimable: not counted)
    int32_t  n_pool_cells_saved   = 0;  // cells the slots hold beyond the pool's used ones: shared cells, counted once per extra holder
    bool     draining             = false;  // SIGTERM/SIGINT: finishing what it has, taking nothing new
    int32_t  n_requests_paused    = 0;  // generating slots beyond the decode width now: they keep their cells and wait
    int32_t  decode_width         = 0;  // generating slots the last step let decode
    step_cost cost;                     // what a step costs, as fitted from the server's own steps
    int64_t  n_cost_samples       = 0;  // steps the fit has seen
    int64_t  n_width_probes       = 0;  // windows at full width the width rule ran to check itself (width_guard)
    int64_t  n_width_fallbacks    = 0;  //   of those, after which the limited width had lost more than width-loss
};

// What the HTTP front end's connection limits did (preempt-http-limits.h): the listeners register
// where to read them at start; the in-process Engine has no listener, so they read 0 there.
struct http_limit_counts {
    uint64_t open          = 0;  // connections open now
    uint64_t refused       = 0;  // refused at once: --max-connections were open
    uint64_t read_deadline = 0;  // requests not in by --read-deadline: closed
    uint64_t write_stalled = 0;  // responses ended: the client read nothing for --stall-timeout
    uint64_t idle_closed   = 0;  // connections closed after --keep-alive-timeout without a request
};
void set_http_limit_source(std::function<http_limit_counts()> source);  // nullptr: none (at stop)
http_limit_counts http_limits_now();

// One series: the same name, type and value reach /metrics and the in-process Engine's stats().
struct metric_item {
    const char * name;   // without the "llamacpp:" prefix
    const char * type;   // counter | gauge
    const char * help;
    uint64_t     value;  // all integers: printed in full, not as 6-digit doubles
};

std::vector<metric_item> metric_items(const preempt_counters & c, const preempt_gauges & g);

// One counter with one label: NAME{LABEL="value"} per value, for /metrics and the Engine's stats().
struct labeled_metric {
    const char * name;   // without the "llamacpp:" prefix
    const char * label;
    const char * help;
    std::vector<std::pair<std::string, uint64_t>> values;  // label value -> count, every value listed
};

std::vector<labeled_metric> labeled_items(const preempt_counters & c);

// Prometheus text in upstream's "# HELP llamacpp:<name> ... / # TYPE ... / llamacpp:<name> <v>" form.
std::string to_prometheus(const preempt_counters & c, const preempt_gauges & g);

} // namespace llama_preempt
