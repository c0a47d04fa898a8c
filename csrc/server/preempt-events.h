// llama-preempt: what one iteration of the server loop did, as typed events, for a host that
// drives the loop one step at a time (the Python Engine's StepReport). The server's mechanics
// record them (preempt-step-recorder.h); the binding (py-core.cpp) hands them to Python as they are.
#pragma once

#include "preempt-policy.h"

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace llama_preempt {

// why a request ended: upstream's stop_type, which this header cannot see ("none": cancelled)
enum class end_stop { none, eos, word, limit };

inline const char * end_stop_name(end_stop s) {
    switch (s) {
        case end_stop::none:  return "none";
        case end_stop::eos:   return "eos";
        case end_stop::word:  return "word";
        case end_stop::limit: return "limit";
    }
    return "none";
}

// The enums below cross into Python as str enums (py-enums.h): a member equals the name the
// server writes in /slots, /metrics and its logs (ParkTier.DISK == "disk").

struct park_event {
    int32_t     slot     = -1;
    int32_t     task     = -1;
    preempt_mode mode = preempt_mode::recompute;  // swap or recompute
    park_tier    tier = park_tier::recompute;     // where its state waits: ram, disk or recompute
    int32_t     n_tokens = 0;      // tokens the slot held
    size_t      bytes    = 0;      // bytes of its state copied out (swap, to RAM or disk)
    park_reason reason = park_reason::pool_full;  // who parked it (park_reason_key(): planner, forced, last_resort, api)
    double      ms       = 0;      // time the park took
    int32_t     priority = 0;      // the request's priority
    park_choice choice = park_choice::no_state;   // why SWAP or RECOMPUTE (park_choice_name())
    double      predicted_ms           = 0;  // what the policy priced the tier it took at (park + restore, and its pack, file ...)
    double      swap_ms_predicted      = 0;  // what the policy priced a swap to RAM at (park + restore)
    double      disk_ms_predicted      = 0;  // a disk park (0: no disk tier)
    double      recompute_ms_predicted = 0;  // and a recompute (re-prefill of the tokens held)
};

struct resume_event {
    int32_t     slot       = -1;
    int32_t     task       = -1;
    preempt_mode mode = preempt_mode::recompute;  // how it came back: swap (restored) or recompute (replays)
    park_tier    tier = park_tier::recompute;     // from where: ram, disk (its file read back) or recompute
    bool        fallback   = false; // a swap restore (from RAM or disk) failed and it recomputes instead
    double      parked_ms  = 0;
    double      restore_ms = 0;
    int32_t     n_replay   = 0;    // tokens to re-prefill (recompute)
};

struct end_event {
    int32_t     slot        = -1;
    int32_t     task        = -1;
    int64_t     n_generated = 0;   // tokens its request generated in all
    end_stop    stop        = end_stop::none;  // eos, word, limit (none: cancelled)
};

struct fail_event {
    int32_t     slot    = -1;      // -1 when the task never had a slot
    int32_t     task    = -1;
    std::string message;
};

struct step_report {
    bool    alive       = true;   // false once the loop was told to terminate
    int32_t busy        = 0;      // slots with a request after the step
    int64_t t_us        = 0;
    int64_t n_decoded   = 0;      // tokens decoded
    int64_t n_prompt    = 0;      //   of those, prompt tokens
    int64_t n_replay    = 0;      //   of those, re-prefilled after a park (recompute)
    int64_t n_generated = 0;      // tokens generated
    std::vector<park_event>   parked;
    std::vector<resume_event> resumed;
    std::vector<end_event>    finished;
    std::vector<fail_event>   failed;
    std::vector<end_event>    cancelled;
};

// what the mechanics record during one step, turned into a step_report at its end
struct step_log {
    bool recording = false;  // only while a host drives the loop: the binary keeps nothing
    std::vector<park_event>    parked;
    std::vector<resume_event>  resumed;
    std::vector<end_event>     ended;   // slots released (n_generated: what the request had then)
    std::map<int, std::string> errors;  // task id -> error sent to it
    int64_t n_decoded = 0;
    int64_t n_prompt  = 0;
    int64_t n_replay  = 0;

    void clear() {
        const bool r = recording;
        *this = {};
        recording = r;
    }
};

} // namespace llama_preempt
