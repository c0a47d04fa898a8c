// The preemption policy: which slot to park, which to resume, and when.
//
// Pure C++ over plain snapshots of the slots, no llama or server types, so that the server,
// the Python engine and the simulator all run this one implementation, and tests can drive it
// without a model (llama_preempt._core exposes it).
#pragma once

#include "preempt-choice.h"  // how each victim is parked: RAM, disk or RECOMPUTE, by measured cost
#include "preempt-park.h"    // why a slot is parked, and where its resume re-enters
#include "preempt-width.h"   // how many slots decode at once, by the measured step cost

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace llama_preempt {

// a slot parked this many times is passed over as a victim while another candidate exists
constexpr int     PREEMPT_N_STARVED = 3;
// cells kept free on top of the next step's reservation, so the decode does not run the pool dry
constexpr int32_t PREEMPT_MARGIN    = 8;
// a request waiting to be admitted or resumed rises one priority level per this much waiting
// (aging), up to the highest priority waiting, so that no priority starves another for ever
constexpr int64_t PREEMPT_AGE_STEP_US = 10 * 1000 * 1000;

enum class slot_phase {
    idle,        // no task; may still hold cells cached from its last task
    waiting,     // a child waiting for its parent's prompt (holds nothing, needs nothing yet)
    prompt,      // processing (or about to process) its prompt, or replaying after a park
    generating,  // sampling one token (plus a draft) per step
    parked,      // preempted: holds no cells, waits to be resumed
};

// What the policy needs to know about one slot at a token boundary.
struct slot_view {
    int32_t    id    = -1;
    slot_phase phase = slot_phase::idle;

    int32_t n_cells  = 0;  // cells the slot holds in the pool now (0 when parked)
    int32_t n_shared = 0;  // of those, cells another slot holds too and is charged for (each cell is charged once)
    int32_t n_linked = 0;  // of those, cells another slot holds too, charged here or there: a park or a purge
                           // frees n_cells - n_linked (a shared prefix stays with its other holders)

    // reservation inputs for the next step
    int32_t n_draft       = 0;  // generating: draft bound of the next step
    int32_t n_prompt_left = 0;  // prompt: tokens still to process (replay included)
    int32_t n_replay_left = 0;  // prompt: of those, tokens being replayed after a park (resuming when > 0)
    bool    is_new        = false;  // prompt: has not started processing yet (a new request)

    // parked slots
    int32_t n_restore   = 0;  // cells it needs to be back where it was when parked
    int64_t t_parked_us = 0;  // when it was parked
    bool    can_resume  = true;  // false: keep it parked this step (a test knob holds it)
    bool    waits_for_unpark = false;  // parked through the API: it waits for unpark, not for room
    bool    was_generating = false;    // parked while generating: it waits for a decode seat (the decode order)

    int32_t n_gen_since_forced = 0;  // generating: tokens since its last forced park (LLAMA_SERVER_PREEMPT_EVERY)
    int64_t t_last_token_us = -1;    // generating or parked: when it last sampled a token (-1: not known)
    int32_t n_gen_left    = -1;      // tokens its request may still generate (-1: not known)

    int32_t priority      = 0;      // the request's priority: higher is parked later and restored sooner
    int64_t arrival       = 0;      // the request's place in arrival order (the server's task id): earlier first
    int64_t t_arrival_us  = -1;     // when the request reached its slot (its wait for admission ages from there; -1: not known)
    int32_t n_preempt     = 0;      // times parked so far
    bool    in_family     = false;  // parent or child of an n_cmpl request before its prompt is in every member's cells: never a victim then
    bool    is_multimodal = false;  // its tokens hold media placeholders: never a victim
    bool    can_park      = true;   // other hard exclusions decided by the mechanics
};

// How the planner shares an overloaded pool (docs/design.md, "Overload"): the knobs the server's
// flags set, the simulator sweeps, and plan_step() reads; one struct for all three.
struct sched_params {
    int32_t n_starved   = PREEMPT_N_STARVED;    // a slot parked this often is spared as a victim
    int64_t age_step_us = PREEMPT_AGE_STEP_US;  // aging: one priority level per this much waiting (0: none)
    // the defaults below were chosen by sweeping them in the simulator over two workload shapes
    // (bench/results/overload.md) and confirmed live
    int32_t n_prompt_budget    = 256;  // prompt and replay tokens a step adds while a slot generates (0: n_batch)
    int32_t n_restore_headroom = 8;    // thrash guard: cells per running slot a resume leaves free
    int32_t n_near_finish      = 16;   // a slot with at most this many tokens left is spared as a victim
    int64_t pass_limit_us      = 5 * 1000 * 1000;  // a new request that does not fit may be passed by later ones this long (0: never)
    // decode width (preempt-width.h): the oldest slots decode, the fewest whose throughput is
    // within this share of the best width's (0: every generating slot decodes, as upstream)
    double  width_loss         = 0.05;
    int32_t n_width            = 0;    // slots that decode at once, fixed (0: from the measured step cost)
    int64_t max_gap_us         = 3 * 1000 * 1000;  // a paused slot decodes a token at least this often (0: no bound)
};

struct plan_params {
    int32_t n_pool    = 0;                  // cells in the unified pool
    int32_t n_batch   = 512;                // prompt chunk a step may add for one slot
    int32_t margin    = PREEMPT_MARGIN;
    bool    park      = true;  // false: the planner never parks, only resumes and admits
                               // (parking is left to the decode's retry ladder; for tests)
    int64_t t_now_us  = 0;     // the planner's clock, for aging
    sched_params sched;
    step_cost cost;            // the step cost fitted from the executor's own steps (step_cost_fit)
    bool      cost_ready = false;  // the fit has seen enough steps: the decode width is limited
    bool      width_free = false;  // the width guard holds the limit off (probing at full width, or after a loss)
    bool      unified    = true;   // one stream for every slot (--kv-unified): a token's attention spans the
                                   // pool's used cells, not only its own (step_cost::span_cell_s)
    bool      park_to_admit = false;  // a paused slot may be parked to let a new request's prompt in (its
                                      // state can be copied out: not RECOMPUTE only, host RAM or disk left)
};

// One step's decisions, applied by the mechanics in this order: purge, fail, park, resume, hold,
// chunks, pause.
// Room goes to running slots first, then to parked slots (restore order), then to new requests.
// Of the generating slots the oldest decode, as many as the decode width; the rest are paused.
struct plan {
    std::vector<int32_t> purge;   // idle slots whose cached cells go first
    std::vector<int32_t> fail;    // parked slots that cannot fit even an empty pool: end with the context error
    std::vector<int32_t> park;    // active slots to park now, in order
    std::vector<int32_t> resume;  // parked slots to resume now, in order
    std::vector<int32_t> hold;    // prompts kept waiting this step: new ones without room, or behind a parked
                                  // slot; admitted ones beyond the step's prompt budget (arrival order)
    std::vector<std::pair<int32_t, int32_t>> chunks;  // (slot, tokens): each prompt's and replay's share of the
                                                      // step's prompt tokens (those not listed, nor held: up to n_batch)
    std::vector<int32_t> pause;   // generating slots that keep their cells but do not decode this step
    int32_t n_decode_width = 0;   // how many generating slots may decode (0: none generates); paused slots
                                  // overdue for a token (max_gap_us) decode beside them
    int32_t restore_next = -1;    // the parked slot that comes back next, after this step: restore ahead
                                  // uploads its state now (-1: none; never one waiting for unpark)
    int32_t n_prompt_budget = 0;  // prompt and replay tokens this step's batch may take (0: up to n_batch)

    int32_t n_used = 0;  // cells held after the plan
    int32_t n_need = 0;  // cells the next step reserves after the plan

    bool has_action() const {
        return !purge.empty() || !fail.empty() || !park.empty() || !resume.empty();
    }
};

// ---- which slot may be parked, and what a parked slot needs to come back ----

// why a slot may never be parked (none: it may); the mechanics, the API and the planner all ask this
enum class park_block {
    none,
    family,          // parent or child of an n_cmpl request: its slots share their prompt cells
    multimodal,      // its prompt holds media, which a replay cannot re-encode
    not_replayable,  // embedding input or an aLoRA adapter: its replay would need what is gone
};
park_block park_blocker(const slot_view & s);
bool may_park(const slot_view & s);
const char * park_block_reason(park_block b);  // the API's words: "its prompt holds media, ..."

// Cells the slot's next step adds to the pool (0 for idle, waiting and parked slots).
//  - generating: one token plus its draft;
//  - prompt: one chunk of at most n_batch, except that a slot replaying after a park is charged
//    its whole remaining replay: otherwise the next step wakes a second slot into cells the first
//    has not claimed yet.
int32_t reservation(const slot_view & s, const plan_params & p);

// Cells the slot holds that the pool must account for (a cell several slots hold is charged once).
int32_t charged_cells(const slot_view & s);

// Cells a park or a purge of the slot gives back to the pool: those no other slot holds.
int32_t freed_cells(const slot_view & s);

// The slot to park next among running slots (new requests are not victims, they wait), or -1
// when no slot may be parked: never the leader (the slot with the most tokens among those of the
// highest priority); never a family, multimodal or excluded slot; among the rest the lowest
// priority first, and within a priority the smallest, passing over starved (parked n_starved
// times) and resuming slots while another candidate of that priority exists. `skip` lists slots
// already chosen this step.
int32_t select_victim(const std::vector<slot_view> & slots, const plan_params & p,
                      const std::vector<int32_t> & skip = {});

// The generating slots (and with `parked`, the slots parked while generating) in the order they get
// a decode seat: highest (aged) priority first, then first come, first served, so that the longest
// answer is never stretched by newcomers.
std::vector<int32_t> decode_order(const std::vector<slot_view> & slots, const plan_params & p, bool parked = false);

// Order in which parked slots are considered for restore: highest priority first (aged by the time
// parked, p.age_step_us), then most-preempted, then longest parked.
std::vector<int32_t> restore_order(const std::vector<slot_view> & slots, const plan_params & p = {});

// The planner: run once per step before the batch is built.
plan plan_step(const std::vector<slot_view> & slots, const plan_params & p);

// whether a list of slot ids (a plan's park, resume, hold, ...) names the slot
inline bool contains_id(const std::vector<int32_t> & ids, int32_t id) {
    return std::find(ids.begin(), ids.end(), id) != ids.end();
}

// A one-line description of a plan for logs.
std::string plan_to_string(const plan & pl);

// Whether the victim, once parked, waits behind another parked slot to come back (the planner's
// restore order): then its file can be read back ahead of its turn.
bool waits_behind_parked(const std::vector<slot_view> & slots, int32_t id_victim);

} // namespace llama_preempt
