// Preemption's step inside llama-server, over the port (see preempt-server.h).
#include "preempt-server.h"

#include "preempt-hostmem.h"  // return_free_pages(): the host budget hands freed pages back
#include "preempt-decide.h"
#include "preempt-prefix.h"   // prefix_share_off(): whether prompts link a prefix here
#include "preempt-selftest.h"
#include "preempt-version.h"

#include "ggml-backend.h"
#include "log.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

namespace llama_preempt {

preempt_server::preempt_server(const server_ports & ports, server_metrics & metrics, const common_params & params,
                               const int32_t & n_ctx, llama_context * const & ctx_tgt,
                               std::unique_ptr<server_prompt_cache> & prompt_cache, server_queue & queue_tasks)
    : steps(ports.loop, table),
      parked(ports.park, table, metrics, cfg, host, prompts, steps),
      prompts(prompt_cache, metrics, host, parked.swap().rates, queue_tasks, *this),
      drain(ports.loop, table, params.drain_timeout_s),
      batch(ports.batch, table, metrics, steps),
      tiers(parked, ports.park),
      port_(ports.step), metrics_(metrics), params_(params), n_ctx_(n_ctx), ctx_tgt_(ctx_tgt), prompt_cache_(prompt_cache) {}

void preempt_server::init() {
    cfg = make_preempt_config(params_, llama_get_memory(ctx_tgt_) != nullptr);
    batch.set_spans_pool(attention_spans_pool(params_));
    batch.set_width_loss(cfg.sched.width_loss);
    table.init(port_.n_slots());
    parked.init();
    host = host_ram(cfg.host, prompt_cache_ ? &prompts : nullptr, return_free_pages);
    metrics_.preempt.n_pool_cells = n_ctx_;
    metrics_.preempt.host_budget_bytes = cfg.host.total == SIZE_MAX ? 0 : cfg.host.total;
    log_lost_devices();
    log_deterministic_devices(params_);
    log_preempt_config(cfg, (size_t) port_.n_slots(), n_ctx_);
    cfg.share_off = prefix_share_off(params_, llama_get_model(ctx_tgt_), cfg.on);
    if (cfg.share_off.empty()) {
        SRV_INF("%s", "prefix sharing: on (--prefix-share): a new prompt, and a recomputed one coming back, links the "
                "longest prefix another slot holds in the pool\n");
    } else {
        SRV_INF("prefix sharing: off: %s\n", cfg.share_off.c_str());
    }
    parked.open_disk(params_, ctx_tgt_);
    prompts.init(parked.swap().disk, parked.persist_key());
    drain.init();
}

// the policy's view of one slot at a token boundary: upstream's slot as the port translates it, and
// whether a parked one may come back now (not in the step the last resort parked it, nor before
// LLAMA_SERVER_PREEMPT_HOLD_MS)
slot_view preempt_server::view(int32_t id) const {
    slot_view v = port_.view_of(id, table[id]);
    if (v.phase != slot_phase::parked) {
        // cells other slots hold too: charged to their lowest holder, and no park of this one frees them
        const auto & ps = table[id];
        v.n_shared = std::clamp(ps.n_cells - ps.n_cells_first, 0, v.n_cells);
        v.n_linked = std::clamp(ps.n_cells_shared, 0, v.n_cells);
    }
    if (v.is_new) {
        // a new request evaluates only what it cannot link (link_prefix())
        int32_t n_own = 0;
        if (const server_tokens * want = port_.new_prompt(id, n_own)) {
            const prefix_link link = parked.find_link(id, *want, n_own);
            if (link.donor >= 0) {
                v.n_prompt_left = std::min(v.n_prompt_left, (int32_t) want->size() - link.n);
            }
        }
    }
    if (v.phase == slot_phase::parked) {
        const auto & ps = table[id];
        v.can_resume = !batch.parked_last_resort() &&
                       (cfg.knobs.min_parked_us == 0 || ggml_time_us() - ps.t_parked_us >= cfg.knobs.min_parked_us);
    }
    return v;
}

std::vector<slot_view> preempt_server::views() const {
    std::vector<slot_view> out;
    out.reserve(port_.n_slots());
    for (int32_t id = 0; id < port_.n_slots(); ++id) {
        out.push_back(view(id));
    }
    return out;
}

plan_params preempt_server::params() const {
    plan_params p;
    p.park     = !cfg.knobs.reactive;
    p.n_pool   = n_ctx_;
    p.n_batch  = (int32_t) llama_n_batch(ctx_tgt_);
    p.t_now_us = ggml_time_us();
    p.sched    = cfg.sched;
    p.cost       = batch.fit().cost();
    p.cost_ready = batch.fit().ready();
    p.unified    = params_.kv_unified;
    p.width_free = !batch.guard().allow_limit();
    return p;  // park_to_admit: the step sets it from the tiers (policy_step())
}

preempt_gauges preempt_server::gauges() const {
    preempt_gauges g;
    for (int32_t id = 0; id < port_.n_slots(); ++id) {
        const auto & ps = table[id];
        const auto   ph = port_.facts(id).phase;
        g.n_requests_preempted += ph == upstream_phase::parked ? 1 : 0;
        g.ram_bytes            += ps.swap_bytes();
        g.n_copies_in_flight   += ps.swap.copy_in_flight ? 1 : 0;
        g.n_requests_paused    += ps.paused && ph == upstream_phase::generating ? 1 : 0;
    }
    const auto & swap = parked.swap();
    g.decode_width   = batch.width();
    g.cost           = batch.fit().cost();
    g.n_cost_samples = batch.fit().n_samples();
    g.n_width_probes    = batch.guard().n_probes();
    g.n_width_fallbacks = batch.guard().n_fallbacks();
    g.pool_bytes = swap.pool ? swap.pool->bytes_kept() : 0;
    g.prompt_cache_bytes = prompt_cache_ ? prompt_cache_->size() : 0;
    g.prompt_cache_disk_bytes = prompts.disk_bytes();
    g.rates = rates_of(tier_set_now(), swap.rates);  // the copies' measured rates, and each tier's own (the compressed tier's)
    if (swap.disk) {
        g.disk_bytes             = swap.disk->bytes_held();
        g.n_disk_writes_in_flight = swap.disk->n_writes_in_flight();
        g.n_disk_full             = swap.disk->n_full();
        g.n_disk_dir_remade       = (uint64_t) swap.disk->n_remade();
    }
    for (int32_t id = 0; id < port_.n_slots(); ++id) {
        g.n_pool_cells_used  += port_.facts(id).processing() ? charged_cells(view(id)) : 0;
        g.n_pool_cells_saved += std::max(0, table[id].n_cells - table[id].n_cells_first);
    }
    g.draining = drain_level() > 0;
    return g;
}

engine_stats preempt_server::stats() const {
    engine_stats st;
    st.preempt_on        = cfg.on;
    st.n_pool            = n_ctx_;
    st.ram_budget_bytes  = host.limits().parks() == SIZE_MAX ? -1 : (int64_t) host.limits().parks();
    st.disk_budget_bytes = !parked.swap().disk ? 0 : cfg.disk_budget == SIZE_MAX ? -1 : (int64_t) cfg.disk_budget;
    st.mode              = cfg.mode;
    st.series            = metric_items(metrics_.preempt, gauges());
    st.labeled           = labeled_items(metrics_.preempt);
    return st;
}

// the executor interface (policy/preempt-executor.h), bound to this server: the moves of a parked
// slot are the parked slots' (preempt-parked.h), the step's shape the batch hooks' (preempt-batch.h)
struct preempt_server::executor final : plan_executor {
    preempt_server & s;
    explicit executor(preempt_server & s) : s(s) {}

    std::vector<slot_view> views() const override { return s.views(); }
    void settle() override { s.settle(); }
    plan_params params() override { return s.params(); }
    tier_state tiers() const override { return s.tier_state_now(); }
    kv_tier & tier(park_tier where) override { return s.tier_set_now()[where]; }
    victim_state victim(int32_t id, park_reason reason) override { return s.parked.victim(id, reason); }
    parked_state parked(int32_t id) const override { return s.parked.parked(id); }
    void purge(int32_t id) override { s.port_.purge(id); }
    void fail(int32_t id) override { s.fail(id); }
    void park(const park_order & o) override { s.parked.park_as(o.id, o); }
    void resume(int32_t id, park_tier from, const move_result & restore) override { s.parked.resume_as(id, from, restore); }
    void hold(int32_t id) override { s.batch.hold(id); }
    void chunk(int32_t id, int32_t n) override { s.batch.chunk(id, n); }
    void pause(const std::vector<int32_t> & ids) override { s.set_paused(ids); }
    void planned(const plan & pl) override { s.planned(pl); }
};

// park a slot now (the planner's victims go through apply_plan(); the test knob, the last resort
// and the API come here)
park_order preempt_server::park(int32_t id, park_reason reason) {
    executor ex(*this);
    return park_victim(ex, id, reason);
}

tier_set preempt_server::tier_set_now() const {
    return const_cast<preempt_server *>(this)->tiers.set();  // the policy only prices and sizes them here
}

// the tiers as the policy prices a victim: each one's room and measured rates (preempt-tiers.h)
tier_state preempt_server::tier_state_now() const {
    return tier_state_of(tier_set_now(), parked.ram_room(), cfg.mode, (int32_t) llama_n_batch(ctx_tgt_),
                         cfg.knobs.disk_always ? (int) park_tier::disk : -1);
}

void preempt_server::fail(int32_t id) {
    PSLT_WRN(port_, id, "parked request needs %d cells, more than the whole pool (%d): ending it\n",
             table[id].n_restore, n_ctx_);
    metrics_.preempt.n_fail_total++;
    port_.end_request(id, "Context size has been exceeded.", end_error::context_exceeded);
}

// the plan's pause: these generating slots sit this step out (pre_decode leaves them out of the
// batch, decode_paused()); every other slot is not paused. A pause's time is kept per request.
void preempt_server::set_paused(const std::vector<int32_t> & ids) {
    const int64_t now = ggml_time_us();
    for (int32_t id = 0; id < port_.n_slots(); ++id) {
        auto & ps = table[id];
        const bool p = port_.facts(id).phase == upstream_phase::generating && contains_id(ids, id);
        if (p && !ps.paused) {
            ps.t_paused_us = now;
            metrics_.preempt.n_paused_total++;
        } else if (!p && ps.paused) {
            ps.t_paused_total_us += now - ps.t_paused_us;
            port_.count_paused(id, now - ps.t_paused_us);  // waiting is not generation time
        }
        ps.paused = p;
    }
}

// a resumed slot that is generating again has finished its replay
void preempt_server::end_replays() {
    for (int32_t id = 0; id < port_.n_slots(); ++id) {
        auto & ps = table[id];
        if (ps.resuming && port_.facts(id).phase == upstream_phase::generating) {
            ps.resuming      = false;
            ps.n_replay_done = 0;
            ps.replay.clear();
        }
    }
}

void preempt_server::update() {
    // the request handlers check their should_stop() once a step (at most every 10 ms, so that fast
    // steps do not wake every waiting handler each time): a cancelled request (a closed
    // connection) leaves within a step or two, not at its handler's next 1 s poll
    if (const int64_t now_wake = ggml_time_us(); now_wake - t_wake_us_ >= 10 * 1000) {
        t_wake_us_ = now_wake;
        port_.wake_waiters();
    }
    drain.step();  // a drain runs whether preemption is on or not
    count_cells();
    batch.loop_begin();  // the loop's clock runs whether preemption is on or not (preempt_loop_us_total)
    if (!cfg.on) {
        batch.measure();
        return;
    }
    batch.begin();

    executor ex(*this);
    // settle (settle()), plan, keep what the hooks need (planned()), apply
    const auto [views, pl] = policy_step(ex);

    // the step's cost is measured from here: the plan's copies are not part of it (a retry of the
    // step after the last resort parked is not measured)
    batch.measure();

    // slots parked through the API (or kept parked by LLAMA_SERVER_PREEMPT_HOLD_MS) can leave every processing slot
    // parked on purpose: wait a little instead of spinning the loop hot until that changes
    if (loop_idles(views, pl, cfg.knobs.min_parked_us > 0)) {
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
}

// the plan, before it is carried out: what the step's hooks need from it
void preempt_server::planned(const plan & pl) {
    restore_next_ = pl.restore_next;
    batch.planned(pl);
    if (pl.has_action()) {
        SRV_DBG("preemption plan: %s\n", plan_to_string(pl).c_str());
    }
}

// the step's start, before the plan: the host budget, the prompt files and the copies catch up, a
// pending context shift runs, the test knobs act, and waiting requests are seen arriving
void preempt_server::settle() {
    host.settle(prompts.held());  // parked slots resumed since the last step: the cache may grow into their room
    prompts.step();
    end_replays();
    // transfers started by the last step's parks land and the copy guard counts them; disk writes
    // whose transfer settled start, finished ones free their host copy (but the slot that comes
    // back next keeps it)
    parked.step(restore_next_);

    // the counts below must be the ones after any pending context shift
    port_.context_shift();

    // test knob: park every generating slot every N generated tokens
    if (cfg.knobs.every > 0) {
        for (int32_t id : forced_parks(views(), cfg.knobs.every)) {
            table[id].n_gen_forced = (int32_t) port_.facts(id).n_gen;
            park(id, park_reason::forced);
        }
    }

    // a request's wait for admission starts when it reaches its slot (the planner ages it)
    for (int32_t id = 0; id < port_.n_slots(); ++id) {
        auto & ps = table[id];
        if (port_.facts(id).has_task && ps.t_arrival_us < 0) {
            ps.t_arrival_us = ggml_time_us();
        }
    }
}

// each slot's cells, those another slot holds too and those charged to it (one walk over the pool's
// used cells, on the main loop: the cells change only there). Every step while any cell is shared or
// an n_cmpl family runs (the planner charges a shared cell once and counts what a park frees), else
// at most four times a second, for /slots
void preempt_server::count_cells() {
    const int64_t now = ggml_time_us();
    bool family = false;
    for (int32_t id = 0; id < port_.n_slots() && !family; ++id) {
        family = port_.facts(id).family;
    }
    if (!cells_shared_ && !family && now - t_cells_us_ < 250 * 1000) {
        return;
    }
    t_cells_us_ = now;
    const int32_t n = port_.n_slots();  // a slot's sequence is its id
    std::vector<int32_t> n_cells(n, 0), n_shared(n, 0), n_first(n, 0);
    const int32_t n_used = ctx_tgt_ ? llama_memory_seqs_n_cells(llama_get_memory(ctx_tgt_), n, n_cells.data(),
                                                                n_shared.data(), n_first.data()) : 0;
    cells_shared_ = false;
    for (int32_t id = 0; id < n; ++id) {
        table[id].n_cells        = n_used < 0 ? -1 : n_cells[id];
        table[id].n_cells_shared = n_shared[id];
        table[id].n_cells_first  = n_first[id];
        cells_shared_ |= n_shared[id] > 0;
    }
}

// A new request's prompt links the longest prefix another slot holds (preempt-prefix.h), called
// from upstream's STARTED branch: it then starts after the linked tokens as after its own cached
// prefix. Returns the tokens linked (0: none).
int32_t preempt_server::link_prefix(int32_t id) {
    int32_t n_own = 0;
    const server_tokens * want = port_.new_prompt(id, n_own);
    const int32_t n = want ? parked.link_prefix(id, *want, n_own) : 0;
    cells_shared_ |= n > 0;  // the next step's count walks the cells
    return n;
}

// The bottom of the KV-full retry ladder: the decode failed at n_batch 1. Rather than failing
// every request, take the undecoded tokens [off, end) back out of their slots (back to a token
// boundary, batch_hooks::rewind()) and park a victim; the step is then retried from
// scratch. Returns false when no slot may be parked, and upstream's error path runs.
bool preempt_server::last_resort(int32_t off) {
    if (!cfg.on) {
        return false;
    }
    // children copy their parent's cells after the first sub-batch, so a family in the batch is
    // not rewound and parked: it ends below instead
    if (!batch.rewind(off)) {
        const int32_t victim = select_victim(views(), params());
        if (victim >= 0) {
            park(victim, park_reason::last_resort);
            batch.parked_by_last_resort();
            return true;
        }
    }
    // nothing may be parked: an n_cmpl family, whose slots share cells and are never parked, gets
    // the context error (the one request that cannot wait), not every request as upstream does
    return end_families();
}

// the last resort's last resort: end the n_cmpl requests that hold cells, every slot of them
bool preempt_server::end_families() {
    std::vector<int32_t> ended;
    for (int32_t id = 0; id < port_.n_slots(); ++id) {
        const slot_facts f = port_.facts(id);
        if (!f.processing() || !f.has_task || !f.family) {
            continue;
        }
        if (std::find(ended.begin(), ended.end(), f.id_family) == ended.end()) {
            ended.push_back(f.id_family);
            metrics_.preempt.n_fail_total++;
        }
        PSLT_WRN(port_, id, "%s", "the pool is full and nothing else can be parked: ending this n_cmpl request "
                                  "(its slots share cells, so it cannot be parked)\n");
        port_.end_request(id, "Context size has been exceeded.", end_error::context_exceeded);
        port_.clear_prompt(id);
    }
    return !ended.empty();
}

void preempt_server::observe_final(int32_t n_preempt) {
    metrics_.preempt.observe_request(n_preempt);
    drain.note_finished();
}

std::string preempt_server::queue_refusal(bool queued_before, size_t n_waiting, int32_t id_task) {
    const int32_t max_queue = params_.preempt_max_queue;
    if (queued_before || max_queue < 0 || (int32_t) n_waiting < max_queue) {
        return "";
    }
    const uint64_t n = ++metrics_.preempt.n_queue_full_total;
    if ((n & (n - 1)) == 0) {
        // the 1st, 2nd, 4th, 8th, ... refusal: a server shedding load at thousands a second logs a few lines, not thousands
        SRV_WRN("the queue is full (--max-queue %d requests wait for a slot): task %d refused, %llu refused so far "
                "(llamacpp:n_queue_full_total)\n", max_queue, id_task, (unsigned long long) n);
    }
    return string_format("the server is busy: %d requests already wait for a slot (--max-queue %d); try "
                         "again later or another server", max_queue, max_queue);
}

int preempt_server::selftest(const common_params & params, bool has_draft) {
    selftest_input in;
    in.ctx        = ctx_tgt_;
    in.host       = &parked.swap();
    in.faults     = cfg.knobs.faults;
    in.disk       = cfg.knobs.disk;
    in.has_draft  = has_draft;
    in.build      = version_line();
    in.flags      = {
        "-m " + params.model.path, string_format("-c %u", llama_n_ctx(ctx_tgt_)), string_format("-np %d", params.n_parallel),
        string_format("-ngl %d", params.n_gpu_layers), params.flash_attn_type == LLAMA_FLASH_ATTN_TYPE_ENABLED ? "-fa on" : params.flash_attn_type == LLAMA_FLASH_ATTN_TYPE_DISABLED ? "-fa off" : "-fa auto",
        string_format("-ctk %s -ctv %s", ggml_type_name(params.cache_type_k), ggml_type_name(params.cache_type_v)),
        params.preempt_disk_dir.empty() ? "(no --preempt-disk)" : "--preempt-disk " + params.preempt_disk_dir,
    };
    const auto res = run_selftest(in);
    print_selftest(stdout, in, res);
    fflush(stdout);
    if (const char * path = getenv("LLAMA_PREEMPT_SELFTEST_JSON")) {
        if (FILE * f = fopen(path, "w")) {
            const std::string j = selftest_json(in, res);
            fwrite(j.data(), 1, j.size(), f);
            fclose(f);
        } else {
            fprintf(stderr, "error: cannot write LLAMA_PREEMPT_SELFTEST_JSON=%s: %s\n", path, strerror(errno));
            return 1;
        }
    }
    return res.ok() ? 0 : 1;
}

} // namespace llama_preempt
