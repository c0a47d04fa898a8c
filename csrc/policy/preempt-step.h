// plan_step() in phases (preempt-policy.cpp): one step's budget of cells, and the phases that
// spend it in order. Room goes to running slots first, then to parked slots, then to new requests.
// Each phase is a function over the budget, so a test can set a step up and run one phase
// (llama_preempt._core.StepBudget).
#pragma once

#include "preempt-order.h"
#include "preempt-policy.h"

#include <cstdint>
#include <vector>

namespace llama_preempt {

// slot ids are looked up often in a step: index them once
struct slot_index {
    std::vector<const slot_view *> by_id;

    explicit slot_index(const std::vector<slot_view> & slots);
    const slot_view * operator[](int32_t id) const {
        return id >= 0 && id < (int32_t) by_id.size() ? by_id[id] : nullptr;
    }
};

// One step's budget: the cells held and needed as the phases decide, who decodes, the orders the
// phases walk (victims, restores, caches), and the plan they write.
class step_budget {
public:
    // phase 0: who decodes (the decode seats), what the running slots hold and need, and the orders
    step_budget(const std::vector<slot_view> & slots, const plan_params & p);

    const std::vector<slot_view> & slots;
    const plan_params &            p;
    const slot_index               find;
    decode_seats                   seats;

    int32_t used      = 0;  // cells held now
    int32_t need      = 0;  // cells the running slots' next step adds
    int32_t n_running = 0;
    int32_t n_growing = 0;  // running and not paused: the slots whose cells grow
    bool    waiting   = false;  // a parked slot or a new request waits for room this step

    std::vector<uint8_t>           failed;    // by slot id: ended by end_unfittable()
    std::vector<const slot_view *> victims;   // running slots that may be parked, best first (one order a step)
    std::vector<int32_t>           restore;   // parked slots in the order they come back
    plan                           pl;

    // what a running slot's next step adds to the pool: nothing while it is paused
    int32_t need_of(const slot_view & s) const;
    // `extra` cells more fit the pool (the margin is waived when nothing else runs)
    bool fits(int32_t extra) const;
    // with `freed` cells of victims taken out too
    bool fits_freeing(int32_t freed, int32_t extra) const { return used - freed + need + extra + p.margin <= p.n_pool; }
    // the next cache (idle slots first, then new requests' slots, largest first) purged; false: none left
    bool purge_one();
    // caches purged until `extra` cells more fit; whether they do
    bool make_room(int32_t extra);
    // a running slot parked: its cells and its need leave the budget
    void park(const slot_view & s);
    // a parked slot (or a new request) let in with `res` cells of need; `grows`: it counts among
    // the growing slots a later resume leaves headroom for
    void let_in(int32_t res, bool grows);
    // a paused slot parked by choice (to admit a prompt, or to bring a due slot back): not one
    // parked n_starved times already, so that no request is swapped in and out without end
    bool discretionary_victim(const slot_view & v) const;
    // paused victims (those `later_than` allows) parked until `extra` cells fit, only where they are
    // enough: a park that lets nothing in would come back at once into the room it left
    bool park_paused_for(int32_t extra, const slot_view * later_than = nullptr);

private:
    std::vector<const slot_view *> cached_;  // what purge_one() takes, in order
    size_t                         i_cached_ = 0;
};

// 1. a parked sequence that cannot fit even an empty pool would wait forever: end it
void end_unfittable(step_budget & b);
// 2. the running slots' next step does not fit: caches go first, then victims are parked (paused
//    ones before those that decode); a decoding slot parked gives its seat to the oldest paused one
void park_for_running(step_budget & b);
// 3. the due parked slots come back in restore order where they fit (never in a step that parked)
void resume_due(step_budget & b);
// 4. new requests admitted in arrival order while they fit and nobody due waits
void admit_new(step_budget & b);
// 5. with nothing running, the head of the line goes
void ensure_progress(step_budget & b);
// 6. with a limited width, the parked that are not due come back where room is left
void resume_not_due(step_budget & b);
// 7. the parked slot that comes back next, once the plan is applied (restore ahead)
void pick_next_back(step_budget & b);
// 8. the paused slots, and the prompt budget shared among prompts and replays
void share_prompt_tokens(step_budget & b);

} // namespace llama_preempt
