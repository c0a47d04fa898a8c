#include "preempt-metrics.h"

#include <sstream>

namespace llama_preempt {

std::string to_prometheus(const preempt_counters & c, int n_requests_preempted) {
    struct item {
        const char * name;
        const char * type;
        const char * help;
        double       value;
    };
    const item items[] = {
        { "n_preempt_total",          "counter", "Number of times a slot was parked to make room in the KV pool",   (double) c.n_preempt_total },
        { "n_resume_total",           "counter", "Number of times a parked slot was resumed",                        (double) c.n_resume_total },
        { "n_recompute_tokens_total", "counter", "Number of tokens re-prefilled to resume parked slots (RECOMPUTE)", (double) c.n_recompute_tokens_total },
        { "n_preempt_fail_total",     "counter", "Number of parked requests ended because they no longer fit the pool", (double) c.n_fail_total },
        { "requests_preempted",       "gauge",   "Number of requests parked now",                                    (double) n_requests_preempted },
    };
    std::ostringstream out;
    for (const auto & it : items) {
        out << "# HELP llamacpp:" << it.name << " " << it.help << "\n"
            << "# TYPE llamacpp:" << it.name << " " << it.type << "\n"
            << "llamacpp:"        << it.name << " " << it.value << "\n";
    }
    return out.str();
}

} // namespace llama_preempt
