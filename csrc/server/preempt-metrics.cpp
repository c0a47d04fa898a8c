#include "preempt-metrics.h"

#include <mutex>
#include <sstream>

namespace llama_preempt {

// the one HTTP front end of the process (a server has one; the Engine none), set and read from
// different threads
static std::mutex g_http_limit_mtx;
static std::function<http_limit_counts()> g_http_limit_source;

void set_http_limit_source(std::function<http_limit_counts()> source) {
    std::lock_guard<std::mutex> lock(g_http_limit_mtx);
    g_http_limit_source = std::move(source);
}

http_limit_counts http_limits_now() {
    std::lock_guard<std::mutex> lock(g_http_limit_mtx);
    return g_http_limit_source ? g_http_limit_source() : http_limit_counts{};
}

std::vector<metric_item> metric_items(const preempt_counters & c, const preempt_gauges & g) {
    const http_limit_counts h = http_limits_now();
    return {
        { "n_preempt_total",           "counter", "Number of times a slot was parked to make room in the KV pool",         c.n_preempt_total },
        { "n_preempt_swap_total",      "counter", "Number of parks that copied the slot's state to host RAM (SWAP)",        c.n_preempt_swap_total },
        { "n_preempt_recompute_total", "counter", "Number of parks that dropped the slot's cells to re-prefill them (RECOMPUTE)", c.n_preempt_recompute_total },
        { "n_resume_total",            "counter", "Number of times a parked slot was resumed",                              c.n_resume_total },
        { "n_recompute_tokens_total",  "counter", "Number of tokens re-prefilled to resume parked slots (RECOMPUTE)",       c.n_recompute_tokens_total },
        { "n_swap_restore_fail_total", "counter", "Number of SWAP restores that failed and fell back to RECOMPUTE",          c.n_swap_restore_fail_total },
        { "n_restore_ahead_total",     "counter", "Number of SWAP restores whose bytes were uploaded to the device ahead of their step", c.n_restore_ahead_total },
        // the name this series had before 0.2: a dashboard may still read it (removed in the next release)
        { "n_swap_restore_ahead_total", "counter", "Deprecated: n_restore_ahead_total under its old name (removed in the next release)", c.n_restore_ahead_total },
        { "n_preempt_fail_total",      "counter", "Number of parked requests ended because they no longer fit the pool",    c.n_fail_total },
        { "n_queue_full_total",        "counter", "Number of requests answered 503 at once because --max-queue requests already waited for a slot", c.n_queue_full_total },
        { "n_preempt_bytes_moved_total", "counter", "Bytes of parked state copied out at parks and back at resumes (SWAP's wasted work; over tokens_predicted_total: bytes moved per token delivered)", c.n_bytes_moved_total },
        { "requests_preempted",        "gauge",   "Number of requests parked now",                                          (uint64_t) g.n_requests_preempted },
        { "preempt_ram_bytes",         "gauge",   "Host RAM held by parked slots now, in bytes",                            g.ram_bytes },
        { "preempt_ram_pool_bytes",    "gauge",   "Idle host RAM kept for the next swap buffers, in bytes (warm memory parks write into)", g.pool_bytes },
        { "preempt_copies_in_flight",  "gauge",   "SWAP parks whose copy to host RAM may still be running",                (uint64_t) g.n_copies_in_flight },
        { "preempt_park_bytes_per_second",    "gauge", "SWAP park bandwidth used to choose SWAP or RECOMPUTE (moving average of measured parks)",    (uint64_t) g.rates.park_bps },
        { "preempt_restore_bytes_per_second", "gauge", "SWAP restore bandwidth used to choose SWAP or RECOMPUTE (moving average of measured restores)", (uint64_t) g.rates.restore_bps },
        { "preempt_prefill_tokens_per_second", "gauge", "Prefill rate used to price a RECOMPUTE (moving average of measured prompt batches)",      (uint64_t) g.rates.prefill_tps },
        { "preempt_disk_write_bytes_per_second", "gauge", "Disk write rate used to price a disk park (moving average of the disk tier's measured writes)", (uint64_t) g.rates.own(park_tier::disk).out_bps },
        { "preempt_disk_read_bytes_per_second",  "gauge", "Disk read rate used to price a disk park (moving average of the disk tier's measured reads)",   (uint64_t) g.rates.own(park_tier::disk).in_bps },
        { "preempt_ram_q8_pack_bytes_per_second",   "gauge", "Packing rate used to price a compressed park (--preempt-compress q8_0; moving average of its measured packs)", (uint64_t) g.rates.own(park_tier::ram_q8).out_bps },
        { "preempt_ram_q8_unpack_bytes_per_second", "gauge", "Unpacking rate used to price a compressed park's restore (moving average of its measured unpacks)", (uint64_t) g.rates.own(park_tier::ram_q8).in_bps },
        { "preempt_ram_q8_packed_percent", "gauge", "A compressed park's packed bytes per 100 bytes of state (moving average; its share of host RAM)", (uint64_t) (100 * g.rates.own(park_tier::ram_q8).held_ratio + 0.5) },
        { "preempt_disk_bytes",        "gauge",   "Bytes in the disk tier's files now: parked slots' state and cached prompts (--preempt-disk)", g.disk_bytes },
        { "preempt_disk_writes_in_flight", "gauge", "Disk parks whose file is still being written (their host copy counts against --preempt-ram)", (uint64_t) g.n_disk_writes_in_flight },
        { "n_disk_write_bytes_total",  "counter", "Bytes written to the disk tier's files",                                  c.n_disk_write_bytes_total },
        { "preempt_disk_full_total",   "counter", "Disk parks and prompt files refused or cut short because the filesystem under --preempt-disk is full (beyond its 64 MiB reserve), not --preempt-disk-mib: parks go to RAM or recompute", g.n_disk_full },
        { "n_disk_dir_remade_total",   "counter", "Times the disk tier's directory was made again after it was removed under the server (its files were lost: those slots recomputed)", g.n_disk_dir_remade },
        { "n_disk_read_bytes_total",   "counter", "Bytes read back from the disk tier's files",                             c.n_disk_read_bytes_total },
        { "n_disk_write_us_total",     "counter", "Microseconds the disk tier's I/O thread spent writing those bytes",  c.n_disk_write_us_total },
        { "n_disk_read_us_total",      "counter", "Microseconds the disk tier's I/O thread spent reading them back",    c.n_disk_read_us_total },
        { "n_disk_read_ahead_total",   "counter", "Disk parks whose file was read back ahead of their resume",              c.n_disk_read_ahead_total },
        { "n_disk_restore_from_memory_total", "counter", "Disk parks resumed from their host copy (their file still being written, or the copy kept as the next slot back)", c.n_disk_restore_from_memory_total },
        { "kv_pool_cells",             "gauge",   "Cells in the KV pool the slots share (-c)",                              (uint64_t) c.n_pool_cells },
        { "kv_pool_cells_used",        "gauge",   "Cells of the KV pool the requests in flight hold now (not idle caches, not parked slots)", (uint64_t) g.n_pool_cells_used },
        { "server_draining",           "gauge",   "1 while the server drains on SIGTERM/SIGINT: it takes no new requests", (uint64_t) g.draining },
        { "n_swap_verify_total",          "counter", "SWAP parks, restores and disk read-backs the copy guard checked byte for byte (--preempt-verify)", c.n_swap_verify_total },
        { "n_swap_verify_mismatch_total", "counter", "Of those, copies that differed (the request recomputed; the device moved to a safer route)", c.n_swap_verify_mismatch_total },
        { "preempt_host_budget_bytes",    "gauge",   "The one host budget for KV off the device (--host-kv-ram): parked slots and cached prompts together (0: no limit)", c.host_budget_bytes },
        { "prompt_cache_bytes",           "gauge",   "Bytes of upstream's prompt cache in host RAM now (it gets what parked slots leave of the host budget)", g.prompt_cache_bytes },
        { "prompt_cache_disk_bytes",      "gauge",   "Bytes of cached prompts in the disk tier's files now (--preempt-disk)", g.prompt_cache_disk_bytes },
        { "n_prompt_cache_spilled_total", "counter", "Cached prompts that left host RAM for the disk tier instead of being dropped", c.n_prompt_cache_spilled_total },
        { "n_prompt_cache_disk_hits_total", "counter", "Cached prompts read back from the disk tier and restored into the slot of a request whose prefix matched", c.n_prompt_cache_disk_hits_total },
        { "n_prompt_cache_read_ahead_total", "counter", "Cached prompts' files read ahead while their request waited for a slot", c.n_prompt_cache_read_ahead_total },
        { "n_prompt_cache_disk_failures_total", "counter", "Prompt files that failed to write or read back (a checksum, a short read, ...): the prompt was prefilled", c.n_prompt_cache_disk_failures_total },
        { "n_prompt_cache_load_failures_total", "counter", "Prompt files read back whose state could not be restored into the slot (llama.cpp refused it): the prompt was prefilled, not counted as a hit", c.n_prompt_cache_load_failures_total },
        { "n_prompt_cache_disk_skipped_total", "counter", "Cached prompts that left host RAM and were dropped, not written (no room on disk, media)", c.n_prompt_cache_disk_skipped_total },
        { "n_prompt_cache_streamed_total", "counter", "Prompts larger than the RAM cache (--cache-ram) streamed from their slot to the disk tier, one chunk at a time", c.n_prompt_cache_streamed_total },
        { "n_prompt_cache_streamed_back_total", "counter", "Prompt files streamed straight into a slot, one chunk at a time (larger than the room the host budget leaves the RAM cache)", c.n_prompt_cache_streamed_back_total },
        { "n_prompt_cache_evicted_total", "counter", "Cached prompts that gave way to parked slots in the host budget (least recently used first)", c.n_prompt_cache_evicted_total },
        { "n_prefix_links_total",      "counter", "New prompts that linked the longest prefix another slot held in the pool instead of evaluating it (--prefix-share)", c.n_prefix_links_total },
        { "n_prompt_tokens_linked_total", "counter", "Prompt tokens linked from another slot's cells instead of evaluated (beside prompt_tokens_total, those evaluated)", c.n_prompt_tokens_linked_total },
        { "kv_pool_cells_saved",       "gauge",   "Cells the slots hold beyond the pool's used cells now: what a copy of each shared prefix per holder would take more (a linked prefix, an n_cmpl family's prompt)", (uint64_t) g.n_pool_cells_saved },
        { "n_paused_total",            "counter", "Times a generating slot was paused: beyond the decode width it kept its cells and waited for a seat", c.n_paused_total },
        { "requests_paused",           "gauge",   "Requests generating but paused now: beyond the decode width, they keep their cells and wait for a seat", (uint64_t) g.n_requests_paused },
        { "preempt_decode_width",      "gauge",   "Generating slots the last step let decode: as many as the measured step cost pays for (--preempt-sched width-loss)", (uint64_t) g.decode_width },
        { "preempt_step_fixed_ns",        "gauge", "Fitted step cost: the fixed part of a step, in ns (fitted from the server's own steps)", (uint64_t) (g.cost.fixed_s * 1e9) },
        { "preempt_step_decode_token_ns", "gauge", "Fitted step cost: per generated token in a step, in ns",           (uint64_t) (g.cost.decode_token_s * 1e9) },
        { "preempt_step_prompt_token_ns", "gauge", "Fitted step cost: per prompt or replayed token in a step, in ns",  (uint64_t) (g.cost.prompt_token_s * 1e9) },
        { "preempt_step_attend_kcell_ns", "gauge", "Fitted step cost: per thousand cells the step's tokens attend (summed over its tokens), in ns", (uint64_t) (g.cost.attend_cell_s * 1e12) },
        { "preempt_step_span_mcell_ns",   "gauge", "Fitted step cost: per million cells the attention spans for the step's tokens (a unified pool: its used cells per token), in ns", (uint64_t) (g.cost.span_cell_s * 1e15) },
        { "preempt_step_cost_samples",    "gauge", "Steps the step cost was fitted from (the width is limited once there are 32)", (uint64_t) g.n_cost_samples },
        { "n_copy_route_changes_total",   "counter", "Devices the copy guard moved to a safer route after a wrong copy (single slices, or SWAP off)", c.n_copy_route_changes_total },
        { "n_loop_steps_total",           "counter", "Steps of the server loop timed in preempt_loop_us_total", c.n_loop_steps_total },
        { "n_width_probes_total",         "counter", "Windows at full width the decode width rule ran to check itself against every slot decoding", (uint64_t) g.n_width_probes },
        { "n_width_fallbacks_total",      "counter", "Of those, windows after which the limited width had delivered less than (1 - width-loss) of full width's tokens a second: the width was left unlimited for a while", (uint64_t) g.n_width_fallbacks },
        { "http_connections_open",        "gauge",   "HTTP connections open now (--max-connections admits at most that many)", h.open },
        { "n_http_refused_total",         "counter", "HTTP connections answered 503 at once and closed: --max-connections were open", h.refused },
        { "n_http_read_timeouts_total",   "counter", "Requests whose line, headers and body did not all arrive within --read-deadline of their first byte: the connection was closed", h.read_deadline },
        { "n_http_stalled_total",         "counter", "Responses ended because their client read nothing for --stall-timeout (a stuck reader): the request was cancelled and its cells freed", h.write_stalled },
        { "n_http_idle_closed_total",     "counter", "HTTP connections closed after --keep-alive-timeout without a request (idle keep-alive, or connected and silent)", h.idle_closed },
    };
}

std::vector<labeled_metric> labeled_items(const preempt_counters & c) {
    labeled_metric by_choice { "preempt_parks_by_choice_total", "choice", "Parks by why SWAP (to RAM or disk) or RECOMPUTE was taken", {} };
    for (int i = 0; i < N_PARK_CHOICES; ++i) {
        by_choice.values.emplace_back(park_choice_name((park_choice) i), c.parks_by_choice[i]);
    }
    labeled_metric parks { "preempt_parks_by_tier_total", "tier", "Parks by where the state went: host RAM, disk, or nowhere (recompute)", {} };
    labeled_metric restores { "preempt_restores_by_tier_total", "tier", "Resumes by where the state came back from (a failed swap restore counts as recompute)", {} };
    for (int i = 0; i < N_PARK_TIERS; ++i) {
        parks.values.emplace_back(park_tier_name((park_tier) i), c.parks_by_tier[i]);
        restores.values.emplace_back(park_tier_name((park_tier) i), c.restores_by_tier[i]);
    }
    labeled_metric failures { "preempt_disk_failures_total", "kind", "Disk park failures by what failed (a file written in the background keeps its host copy: a RAM park; the others recompute)", {} };
    for (int i = 1; i < N_DISK_ERRORS; ++i) {
        failures.values.emplace_back(disk_error_name((disk_error) i), c.disk_failures[i]);
    }
    labeled_metric slot_files { "preempt_slot_file_failures_total", "kind", "Slot API saves and restores refused, by what was wrong: "
                                "a restore's file missing, truncated, corrupt (checksum) or foreign (another model); a save with "
                                "no_space or another write error (nothing is left under the name)", {} };
    for (int i = 1; i < N_SLOT_FILE_FAULTS; ++i) {
        slot_files.values.emplace_back(slot_file_fault_name((slot_file_fault) i), c.slot_file_failures[i]);
    }
    labeled_metric loop { "preempt_loop_us_total", "part", "Microseconds of the server loop's steps by part: plan (parks' and resumes' copies), "
                          "decode (the batch built and computed up to its logits), post (sampling, tokens processed and sent), "
                          "other (the rest of the loop to the next step: requests arriving and ending, the prompt cache)", {} };
    for (int i = 0; i < N_LOOP_PARTS; ++i) {
        loop.values.emplace_back(loop_part_name(i), c.loop_us[i]);
    }
    return { by_choice, parks, restores, failures, slot_files, loop };
}

std::string to_prometheus(const preempt_counters & c, const preempt_gauges & g) {
    std::ostringstream out;
    for (const auto & it : metric_items(c, g)) {
        out << "# HELP llamacpp:" << it.name << " " << it.help << "\n"
            << "# TYPE llamacpp:" << it.name << " " << it.type << "\n"
            << "llamacpp:"        << it.name << " " << it.value << "\n";
    }
    for (const auto & it : labeled_items(c)) {
        out << "# HELP llamacpp:" << it.name << " " << it.help << "\n"
            << "# TYPE llamacpp:" << it.name << " counter\n";
        for (const auto & [value, n] : it.values) {
            out << "llamacpp:" << it.name << "{" << it.label << "=\"" << value << "\"} " << n << "\n";
        }
    }
    out << "# HELP llamacpp:request_preemptions Times each finished request was parked\n"
        << "# TYPE llamacpp:request_preemptions histogram\n";
    uint64_t cumulative = 0;
    for (int b = 0; b < preempt_counters::n_buckets; ++b) {
        cumulative += c.request_preemptions[b];
        const double le = preempt_counters::bucket_le[b];
        out << "llamacpp:request_preemptions_bucket{le=\"" << (le < 0 ? std::string("+Inf") : std::to_string((int) le))
            << "\"} " << cumulative << "\n";
    }
    // an empty label set on _sum and _count: valid Prometheus text, and upstream's own metrics
    // test (tools/server/tests/unit/test_metrics.py) wants a TYPE line for every unlabeled series
    out << "llamacpp:request_preemptions_sum{} "   << c.request_preemptions_sum   << "\n"
        << "llamacpp:request_preemptions_count{} " << c.request_preemptions_count << "\n";
    return out.str();
}

} // namespace llama_preempt
