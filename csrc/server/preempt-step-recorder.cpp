// The in-process engine's view of the loop (preempt-step-recorder.h), over the port.
#include "preempt-step-recorder.h"

#include "ggml.h"  // ggml_time_us()

#include <vector>

namespace llama_preempt {

// in send_error(): which task got an error this step
void step_recorder::note_error(int id_task, const std::string & error) {
    if (log_.recording) {
        log_.errors[id_task] = error;
    }
}

void step_recorder::note_park(int32_t id, int32_t n_held, size_t bytes, const park_decision & how, double ms) {
    if (!log_.recording) {
        return;
    }
    const slot_facts f = port_.facts(id);
    park_event e;
    e.slot     = id;
    e.task     = f.id_task;
    e.mode     = how.copies() ? preempt_mode::swap : preempt_mode::recompute;
    e.tier     = how.tier;
    e.n_tokens = n_held;
    e.bytes    = bytes;
    e.reason   = table_[id].reason;
    e.ms       = ms;
    e.priority = f.priority;
    e.choice   = how.why;
    e.predicted_ms           = how.quote_of(how.tier);
    e.swap_ms_predicted      = how.quote_of(park_tier::ram);
    e.disk_ms_predicted      = how.quote_of(park_tier::disk);
    e.recompute_ms_predicted = how.quote_of(park_tier::recompute);
    log_.parked.push_back(std::move(e));
}

// a resume: restored from RAM or disk (tier), or re-prefilling its tokens (recompute)
void step_recorder::note_resume(int32_t id, park_tier tier, bool fallback, int64_t t_parked_us, int64_t t_restore_us,
                                int32_t n_replay) {
    if (!log_.recording) {
        return;
    }
    const auto mode = tier == park_tier::recompute ? preempt_mode::recompute : preempt_mode::swap;
    log_.resumed.push_back({ id, port_.facts(id).id_task, mode, tier, fallback, t_parked_us / 1000.0,
                             t_restore_us / 1000.0, n_replay });
}

// once, before the first step: record what each step does, and which slots a step releases
void step_recorder::begin() {
    log_.recording = true;
    port_.on_release([this](int32_t id, int32_t id_task, int64_t n_gen, end_stop stop) {
        log_.ended.push_back({ id, id_task, n_gen, stop });
    });
}

// one iteration of upstream's loop (take the queued tasks, run update_slots() once) and what
// happened in it
step_report step_recorder::step() {
    struct seen {
        int     task  = -1;
        int64_t n_gen = 0;
    };
    std::vector<seen> before(port_.n_slots());
    for (int32_t id = 0; id < port_.n_slots(); ++id) {
        const slot_facts f = port_.facts(id);
        if (f.processing() && f.has_task) {
            before[id] = { f.id_task, f.n_gen };
        }
    }
    log_.clear();

    step_report rep;
    const int64_t t0 = ggml_time_us();
    rep.alive        = port_.loop_step();
    rep.t_us         = ggml_time_us() - t0;

    // tokens generated this step: what each task has now (or had when it ended) minus what it
    // had before the step
    auto n_before = [&](int id_slot, int id_task) -> int64_t {
        return id_slot >= 0 && (size_t) id_slot < before.size() && before[id_slot].task == id_task ? before[id_slot].n_gen : 0;
    };
    for (auto & e : log_.ended) {
        rep.n_generated += e.n_generated - n_before(e.slot, e.task);
        const auto err = log_.errors.find(e.task);
        if (err != log_.errors.end()) {
            rep.failed.push_back({ e.slot, e.task, err->second });
            log_.errors.erase(err);
        } else if (e.stop == end_stop::none) {
            rep.cancelled.push_back(std::move(e));
        } else {
            rep.finished.push_back(std::move(e));
        }
    }
    for (const auto & [id_task, msg] : log_.errors) {
        rep.failed.push_back({ -1, id_task, msg });  // rejected before it had a slot
    }
    for (int32_t id = 0; id < port_.n_slots(); ++id) {
        const slot_facts f = port_.facts(id);
        if (f.processing() && f.has_task) {
            rep.n_generated += f.n_gen - n_before(id, f.id_task);
            rep.busy++;
        }
    }
    rep.n_decoded = log_.n_decoded;
    rep.n_prompt  = log_.n_prompt;
    rep.n_replay  = log_.n_replay;
    rep.parked    = std::move(log_.parked);
    rep.resumed   = std::move(log_.resumed);
    return rep;
}

} // namespace llama_preempt
