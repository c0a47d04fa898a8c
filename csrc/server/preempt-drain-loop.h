// llama-preempt: the graceful drain on the server loop (preempt-drain.h says what it does), a unit
// of its own behind the port (preempt-port.h). It owns the drain's progress and the thread that
// wakes the loop on a signal; the port gives it the slots, the queues, how a request that must end
// is answered, and the prompt cache (what the slots hold is kept at the end of a drain with
// --cache-persist).
#pragma once

#include "preempt-drain.h"
#include "preempt-port.h"

#include <cstdint>

namespace llama_preempt {

class server_drain {
public:
    server_drain(loop_port & port, slot_table & table, int32_t timeout_s) : port_(port), table_(table), timeout_s_(timeout_s) {}

    void init();           // in preempt_init(): arm the drain, and let a signal wake the loop
    void step();           // every busy step, before the plan: start the drain, end what is left when it runs out
    void note_finished();  // in send_final_response(): a request that finished during the drain
    void hand_back();      // each drain step: requests that have not started are answered 503 at once
    void idle();           // update_slots() with every slot idle: a drain is done, end the loop

private:
    struct progress {
        bool    started     = false;
        int64_t t_start_us  = 0;
        int64_t deadline_us = 0;
        int32_t n_in_flight = 0;  // requests in slots when the drain began
        int32_t n_finished  = 0;  // requests that finished with their answer during the drain
        int32_t n_ended     = 0;  // requests ended with an error when the drain ran out or was cut
        int32_t n_handed_back = 0;  // requests that had not started, answered 503 at once for another server
        int64_t t_grace_end_us = 0;  // with every slot idle: how long the handlers may take to write their last results
    };

    loop_port &    port_;
    slot_table &   table_;
    int32_t        timeout_s_;
    drain_watcher  watch_;  // wakes the loop when a signal changes the drain (a signal handler may not lock)
    progress       p_;
};

} // namespace llama_preempt
