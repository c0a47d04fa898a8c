// llama-preempt: the in-process engine's view of the loop, a unit of its own behind the port
// (preempt-port.h). A host that owns the main loop (llama_preempt._core, through
// server_context::step() in preempt-upstream.inc) runs one iteration of upstream's loop per step and
// gets what happened in it as typed events (preempt-events.h); the binding turns them into Python
// objects. Nothing is recorded unless such a host runs the loop. It owns the step's log; the
// parked slots and the batch tell it each park, resume, error and decoded token as they happen.
#pragma once

#include "preempt-events.h"
#include "preempt-port.h"

#include <cstddef>
#include <cstdint>
#include <string>

namespace llama_preempt {

class step_recorder {
public:
    step_recorder(loop_port & port, const slot_table & table) : port_(port), table_(table) {}

    void begin();         // once, before the first step: record from now on
    step_report step();   // one iteration of upstream's loop, and what happened in it

    void note_error(int id_task, const std::string & error);
    void note_park(int32_t id, int32_t n_held, size_t bytes, const park_decision & how, double ms);
    void note_resume(int32_t id, park_tier tier, bool fallback, int64_t t_parked_us, int64_t t_restore_us, int32_t n_replay);
    // tokens decoded this step, and of them the prompt and replayed ones
    void count_decoded(int32_t n_tokens) {
        if (log_.recording) {
            log_.n_decoded += n_tokens;
        }
    }
    void count_token(bool is_prompt, bool is_replay) {
        if (log_.recording) {
            log_.n_replay += is_replay ? 1 : 0;
            log_.n_prompt += is_prompt ? 1 : 0;
        }
    }

private:
    loop_port &        port_;
    const slot_table & table_;
    step_log      log_;  // what this step did, while a host drives the loop
};

} // namespace llama_preempt
