// The slot API's park and unpark (POST /slots/{id}?action=park|unpark): preempt_server's answer,
// apart from its step (preempt-server.h declares it).
#include "preempt-server.h"

#include "log.h"

namespace llama_preempt {

// POST /slots/{id}?action=park|unpark, on the main loop at a token boundary (tasks are declined
// while a decode runs). A slot parked here stays parked until it is unparked or its request is
// cancelled; unparked, the planner resumes it as soon as it fits.
slot_action_answer preempt_server::slot_action(int32_t id_slot, bool do_park) {
    slot_action_answer a;
    if (id_slot < 0 || id_slot >= port_.n_slots()) {
        // 400 like upstream's "Invalid slot ID" (the HTTP layer answers every 404 with its own page)
        a.error = string_format("Invalid slot ID: no slot %d, this server has slots 0 to %d", id_slot, port_.n_slots() - 1);
        return a;
    }
    if (!cfg.on) {
        a.error = "preemption is off on this server (" + cfg.off_why + "): slots cannot be parked";
        return a;
    }
    auto & ps = table[id_slot];
    const upstream_phase phase = port_.facts(id_slot).phase;
    a.out = { { "id_slot", id_slot }, { "action", do_park ? "park" : "unpark" } };

    if (do_park) {
        if (phase == upstream_phase::idle) {
            a.error = string_format("slot %d is idle: it has no request to park", id_slot);
            return a;
        }
        if (phase == upstream_phase::parked) {
            a.error = string_format("slot %d is already parked (by %s)", id_slot, park_reason_key(ps.reason));
            return a;
        }
        if (const auto block = park_blocker(view(id_slot)); block != park_block::none) {
            a.error = string_format("slot %d cannot be parked: %s", id_slot, park_block_reason(block));
            return a;
        }
        end_replays();
        const int32_t n_held = port_.prompt_of(id_slot).n_tokens();
        park(id_slot, park_reason::api);
        ps.waits_for_unpark = true;
        a.out["preempt_mode"] = ps.tier() == park_tier::recompute ? "recompute" : "swap";
        a.out["n_tokens"]     = n_held;
        a.out["is_preempted"] = true;
    } else {
        if (phase != upstream_phase::parked) {
            a.error = string_format("slot %d is not parked", id_slot);
            return a;
        }
        if (!ps.waits_for_unpark) {
            a.error = string_format("slot %d was parked by the %s, not through the API: it resumes on its own when "
                                    "the pool has room", id_slot, park_reason_key(ps.reason));
            return a;
        }
        ps.waits_for_unpark = false;  // the planner resumes it as soon as it fits
        a.out["is_preempted"] = true;
    }
    PSLT_INF(port_, id_slot, "%s through the API\n", do_park ? "parked" : "unparked");
    return a;
}

} // namespace llama_preempt
