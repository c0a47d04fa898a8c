// llama-preempt: the narrow ports from our compiled server units to upstream's server, one per role.
//
// Upstream's server_slot, server_queue and server_response are defined inside
// tools/server/server-context.cpp, so code of ours that touches them had to be pasted into that
// file (the .inc parts). A unit behind a port is compiled on its own instead: it names slots by
// index and asks its port for what it needs, and the ports' one implementation (the adapter,
// preempt-upstream.inc, where upstream's types are complete) answers with upstream's members. Our
// own state of each slot is never read back through a port: preempt_server owns it (slot_table,
// preempt-slot.h) and hands it to the parts that need it. Each
// operation here is one a unit needed, said in the words of what it is for, not of upstream's
// fields. Everything is called on the server loop, except where an operation says otherwise.
#pragma once

#include "preempt-events.h"  // end_stop
#include "preempt-slot.h"
#include "preempt-swap.h"    // seq_contexts

#include "server-task.h"     // server_prompt

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

namespace llama_preempt {

// a slot's phase as upstream's state machine has it
enum class upstream_phase {
    idle,        // no request
    started,     // a request taken, its prompt not begun (its client has seen nothing of it yet)
    prompt,      // its prompt is being processed (a replay too)
    prompt_done, // its prompt's last token is in the batch: its logits give the first token
    generating,  // its answer is being generated
    running,     // waiting for the other slots of its family
    parked,      // preempted (SLOT_STATE_PREEMPTED): out of the pool, still processing
};

// what a unit reads of one slot
struct slot_facts {
    upstream_phase phase    = upstream_phase::idle;
    int32_t        id_task  = -1;     // its request's task (-1: none), for the log
    bool           has_task = false;
    bool           streams  = false;  // its request streams its answer
    bool           family   = false;  // one of an n_cmpl family (a parent or a child task): they wait for each other
    int32_t        id_family = -1;    // its family's parent task (-1: none)
    bool           family_shared = false;  // its family's prompt is in every member's cells (no child waits for it)
    int32_t        priority = 0;      // its request's priority
    int64_t        n_gen    = 0;      // tokens its request has generated
    int32_t        n_prompt = 0;      // its request's prompt tokens
    bool           can_split = true;  // its prompt may be spread over several batches (not a non-causal embedding)

    bool processing() const { return phase != upstream_phase::idle; }
};

// how a request that must end is answered
enum class end_error {
    unavailable,       // a 503's: try another server (the drain)
    context_exceeded,  // the context error upstream gives: the request cannot fit the pool
};

// What every unit reads of the slots: each role below is one of these too.
class slot_port {
public:
    virtual ~slot_port() = default;

    virtual int32_t n_slots() const = 0;
    virtual slot_facts facts(int32_t id) const = 0;
    virtual int32_t task_of(int32_t id) const = 0;  // its request's task (-1: none), for the log
    virtual const server_tokens & cached_tokens(int32_t id) const = 0;  // the tokens its cells hold (and those in the batch being built)
};

// A slot leaving the pool and coming back: what the parked slots (preempt-parked.h) and the tiers
// over them need of upstream.
class park_port : public virtual slot_port {
public:
    virtual server_prompt & prompt_of(int32_t id) = 0;      // its tokens (equal to its cells) and checkpoints
    virtual llama_token sampled_of(int32_t id) const = 0;   // the token to decode next (sent to its client already)
    virtual seq_contexts contexts_of(int32_t id) const = 0; // where its sequence's state lives
    virtual void set_phase(int32_t id, upstream_phase phase) = 0;  // started, prompt, generating or parked
    virtual void drop_cells(int32_t id) = 0;    // its sequence leaves the pool (target and draft), its prompt kept
    virtual void clear_prompt(int32_t id) = 0;  // its prompt and cells go, and any draft: the speculator starts over
    virtual void leave_batch(int32_t id) = 0;   // it has no tokens in the batch being built
    // its cells become `donor`'s first `n` cells, shared (seq_cp in one stream), and its cached prompt their tokens
    virtual void link_cells(int32_t id, int32_t donor, int32_t n) = 0;
    // its timings: `t_us` more parked (not generation time), and the parks its response reports
    virtual void count_parked(int32_t id, int64_t t_us, int32_t n_preempt) = 0;
    // a streamed request hears of its park and resume as an SSE comment (preempt-notice.h)
    virtual void notify(int32_t id, const char * kind) = 0;
};

// The batch being built: what the batch hooks (preempt-batch.h) need of upstream.
class batch_port : public virtual slot_port {
public:
    struct batch_token {
        int32_t   id_slot   = -1;
        llama_pos pos       = 0;
        bool      is_prompt = false;
        bool      is_replay = false;
    };
    virtual int32_t n_batch_max() const = 0;  // the batch's size limit (llama_n_batch)
    virtual int32_t batch_size() const = 0;
    virtual batch_token batch_token_at(int32_t i) const = 0;
    virtual void mark_batch_token(int32_t i, bool is_prompt, bool is_replay) = 0;
    // one replayed token into the batch at the slot's next position (and into its prompt); false:
    // the batch had no room
    virtual bool add_replay_token(int32_t id, llama_token token) = 0;
    // its replay's last token is in the batch: its logits are read, and the slot samples next
    // (prompt_done), as the interrupted step would have
    virtual void replay_done(int32_t id) = 0;
    // the batch leads with another slot this one cannot share a batch with; none yet: it leads
    virtual bool can_join_batch(int32_t id) const = 0;
    virtual void lead_batch_if_none(int32_t id) = 0;
    // its last `n` tokens leave its prompt and cells: it is back at a token boundary (a generating
    // slot's draft dropped; a prompt slot processes its prompt again from there)
    virtual void take_back(int32_t id, int32_t n) = 0;
    virtual server_prompt & prompt_of(int32_t id) = 0;  // its tokens (a replay's next ones are appended)
};

// The task queue, the results and the loop: what the drain (preempt-drain-loop.h) and the Engine's
// step recorder (preempt-step-recorder.h) need of upstream.
class loop_port : public virtual slot_port {
public:
    // each slot's release, from now on: `f(id, id_task, n_generated, stop)`, called before upstream's
    // own reset callback (which flushes the slot's metrics)
    using release_fn = std::function<void(int32_t, int32_t, int64_t, end_stop)>;
    virtual void on_release(release_fn f) = 0;
    // its request ends with this error, and the slot is released (a parked slot's buffers go with its state)
    virtual void end_request(int32_t id, const std::string & why, end_error kind) = 0;
    // requests (not slot actions) that wait for a slot are answered with this error (a 503's) at
    // once; how many
    virtual int32_t hand_back_waiting(const std::string & why) = 0;
    // a task is waiting to be taken (one may have arrived since this step began)
    virtual bool task_waiting() = 0;
    virtual size_t n_deferred() const = 0;    // requests deferred for a slot
    virtual size_t n_results_waiting() = 0;   // handlers still waiting for results to write
    // one iteration of upstream's loop (take the queued tasks, run update_slots() once); false
    // once the loop has ended
    virtual bool loop_step() = 0;
    // any thread: the loop wakes for a step; the loop sleeps (--sleep-idle-seconds); the loop ends
    virtual void wake_loop() = 0;
    virtual bool loop_asleep() = 0;
    virtual void end_loop() = 0;
    // what the slots hold is kept in upstream's prompt cache (a drain's end, with --cache-persist)
    virtual void keep_slot_prompts() = 0;
};

// The step itself: what preempt_server (preempt-server.h) needs of upstream beside the roles it
// hands its parts.
class step_port : public virtual slot_port {
public:
    // the policy's view of one slot at a token boundary, translated from upstream's slot (its
    // phase, cells, request, prompt left and draft bound) and our table entry for it, `ps`;
    // whether a parked one may resume now is the caller's to say (can_resume)
    virtual slot_view view_of(int32_t id, const slot_preempt_state & ps) const = 0;
    virtual server_prompt & prompt_of(int32_t id) = 0;
    virtual void clear_prompt(int32_t id) = 0;
    virtual void end_request(int32_t id, const std::string & why, end_error kind) = 0;
    // an idle slot's prompt goes to upstream's prompt cache and its cells are freed (the planner's purge)
    virtual void purge(int32_t id) = 0;
    // `t_us` more paused: not generation time in its timings
    virtual void count_paused(int32_t id, int64_t t_us) = 0;
    // The pool's cells a prompt file streamed into slot `id` may take, its own cells included: what
    // the other slots' prompts do not hold, and what the idle ones hold too where upstream hands their
    // prompts to the cache and clears them right after this load anyway (--cache-idle-slots with one
    // pool). `need` > 0: a stream of that many cells is about to start: when the cells held now leave
    // less, those idle slots' prompts go to the cache now, a moment before upstream would.
    virtual size_t room_cells(int32_t id, size_t need) = 0;
    // a pending context shift runs now (split out of pre_decode(), so the plan sees the counts after it)
    virtual void context_shift() = 0;
    // the prompt of the request slot `id` has taken and not begun (nullptr: none, or one that never
    // links a prefix: media, embeddings, no sampling), and in `n_own` what its own cells keep of it
    virtual const server_tokens * new_prompt(int32_t id, int32_t & n_own) const = 0;

    // the request handlers check whether their clients are still there
    virtual void wake_waiters() = 0;
};

// The roles the adapter (preempt-upstream.inc) plays, each handed to the part that needs it.
struct server_ports {
    step_port &  step;
    park_port &  park;
    batch_port & batch;
    loop_port &  loop;
};

} // namespace llama_preempt

// The server's log line for a slot, as upstream's SLT_* macros print it, from a unit that names the
// slot by index and asks the port for its task
#define PSLT_DBG(port, id, fmt, ...) LOG_DBG("slot %12.*s: id %2d | task %d | " fmt, 12, __func__, (int) (id), (int) (port).task_of(id), __VA_ARGS__)
#define PSLT_INF(port, id, fmt, ...) LOG_INF("slot %12.*s: id %2d | task %d | " fmt, 12, __func__, (int) (id), (int) (port).task_of(id), __VA_ARGS__)
#define PSLT_WRN(port, id, fmt, ...) LOG_WRN("slot %12.*s: id %2d | task %d | " fmt, 12, __func__, (int) (id), (int) (port).task_of(id), __VA_ARGS__)
#define PSLT_ERR(port, id, fmt, ...) LOG_ERR("slot %12.*s: id %2d | task %d | " fmt, 12, __func__, (int) (id), (int) (port).task_of(id), __VA_ARGS__)
