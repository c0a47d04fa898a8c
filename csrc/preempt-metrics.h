// Preemption counters: one place that every front end (/metrics, /slots, the Python layer) reads.
#pragma once

#include <cstdint>
#include <string>

namespace llama_preempt {

// cumulative since the server started; lives inside upstream's server_metrics
struct preempt_counters {
    uint64_t n_preempt_total          = 0;  // slots parked
    uint64_t n_resume_total           = 0;  // parked slots resumed
    uint64_t n_recompute_tokens_total = 0;  // tokens re-prefilled after a park (decoded successfully)
    uint64_t n_fail_total             = 0;  // parked requests ended because they no longer fit the pool
};

// Prometheus text for the counters plus the gauge of requests parked right now, in upstream's
// "# HELP llamacpp:<name> ... / # TYPE ... / llamacpp:<name> <value>" form.
std::string to_prometheus(const preempt_counters & c, int n_requests_preempted);

} // namespace llama_preempt
