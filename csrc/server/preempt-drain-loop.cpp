// The graceful drain on the server loop (preempt-drain-loop.h), over the port.
#include "preempt-drain-loop.h"

#include "server-common.h"  // SRV_* (and the LOG_* the port's PSLT_* use)

#include "ggml.h"  // ggml_time_us()

#include <chrono>
#include <string>
#include <thread>

namespace llama_preempt {

void server_drain::init() {
    loop_port & port = port_;
    watch_.start([&port](bool changed) {
        if (port.loop_asleep()) {
            // asleep (--sleep-idle-seconds) means idle: nothing to drain, and a task would not
            // wake the loop (only a request that needs the model does); checked every tick, as
            // the loop may fall asleep right after a signal
            SRV_INF("%s", "drained: the server was asleep with nothing in flight; exiting\n");
            port.end_loop();
            return;
        }
        if (changed) {
            port.wake_loop();
        }
    });
    drain_arm(timeout_s_);
}

void server_drain::step() {
    const int level = drain_level();
    if (level == 0) {
        return;
    }
    const int64_t now = ggml_time_us();
    if (!p_.started) {
        p_.started     = true;
        p_.t_start_us  = now;
        p_.deadline_us = now + (int64_t) drain_timeout_s() * 1000000;
        hand_back();
        int32_t n_parked = 0;
        for (int32_t id = 0; id < port_.n_slots(); ++id) {
            const slot_facts f = port_.facts(id);
            p_.n_in_flight += f.processing() ? 1 : 0;
            n_parked += f.phase == upstream_phase::parked ? 1 : 0;
        }
        SRV_INF("draining: %d requests in flight (%d parked) may finish within %d s (--drain-timeout); %d that had not "
                "started were handed back (503 with Retry-After, for another server); new requests get 503 and /health "
                "answers 503 \"draining\"; a second signal ends the drain at once\n",
                p_.n_in_flight, n_parked, drain_timeout_s(), p_.n_handed_back);
        // a slot parked through the API would wait for an unpark that may never come: it finishes
        // like the others
        for (int32_t id = 0; id < port_.n_slots(); ++id) {
            table_[id].waits_for_unpark = false;
        }
    }
    if (level < 2 && now < p_.deadline_us) {
        hand_back();  // a task let in just before the drain may have been deferred since
        return;
    }
    const std::string why = level >= 2
        ? "the server is shutting down: a second signal ended the drain before this request finished"
        : string_format("the server is shutting down: this request did not finish within --drain-timeout %d s",
                        drain_timeout_s());
    for (int32_t id = 0; id < port_.n_slots(); ++id) {
        const slot_facts f = port_.facts(id);
        if (!f.processing()) {
            continue;
        }
        PSLT_WRN(port_, id, "%s\n", why.c_str());
        port_.end_request(id, why, end_error::unavailable);
        p_.n_ended++;
    }
}

// A request that has not started (waiting for a slot, or in one but not begun: its client has seen
// nothing) would only wait out the drain window; a balancer can send it to another server now.
// Running requests, parked ones that had begun included, keep the window.
void server_drain::hand_back() {
    const std::string why = "the server is shutting down: this request had not started; send it to another server";
    // requests only: a slot action waiting for its slot is no work another server could take
    p_.n_handed_back += port_.hand_back_waiting(why);
    for (int32_t id = 0; id < port_.n_slots(); ++id) {
        const slot_facts f = port_.facts(id);
        const slot_preempt_state & ps = table_[id];
        const bool not_begun = f.phase == upstream_phase::started ||
                               (f.phase == upstream_phase::parked && ps.from == parked_from::started);
        // its client has seen nothing: a stream that heard of a park has its 200 and its stream already;
        // an n_cmpl family's slots wait for each other (they run in the window instead)
        const bool unseen = f.has_task && (!f.streams || ps.n_preempt == 0) && !f.family;
        if (!not_begun || !unseen) {
            continue;
        }
        PSLT_INF(port_, id, "%s\n", "handed back: the server is draining and this request had not started");
        port_.end_request(id, why, end_error::unavailable);
        p_.n_handed_back++;
    }
}

void server_drain::note_finished() {
    if (p_.started) {
        p_.n_finished++;
    }
}

// llama-server then exits 0
void server_drain::idle() {
    if (drain_level() == 0) {
        return;
    }
    if (port_.task_waiting() || port_.n_deferred() > 0) {
        return;  // a task queued since this step began (a scrape, a request let in just before): answer it first
    }
    if (!p_.started) {
        step();  // a drain that began with nothing in flight
    }
    // every answer is sent, but a handler may still be writing its last result: the HTTP server's
    // stop at exit would cut a stream before its end. Give them a moment (2 s at most), answering
    // any task that arrives meanwhile (a scrape) before coming back here
    if (p_.t_grace_end_us == 0) {
        p_.t_grace_end_us = ggml_time_us() + 2000000;
    }
    while (port_.n_results_waiting() > 0 && ggml_time_us() < p_.t_grace_end_us) {
        if (port_.task_waiting()) {
            return;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    SRV_INF("drained in %.1f s: %d requests finished with their answer, %d ended with an error, %d handed back before "
            "they started; exiting\n", (ggml_time_us() - p_.t_start_us) / 1e6, p_.n_finished, p_.n_ended, p_.n_handed_back);
    port_.keep_slot_prompts();
    port_.end_loop();
}

} // namespace llama_preempt
