// The step's batch as preemption shapes it (preempt-batch.h), over the port.
#include "preempt-batch.h"

#include "ggml.h"  // ggml_time_us()

#include <algorithm>

namespace llama_preempt {

void batch_hooks::measure() {
    const int64_t now = ggml_time_us();
    if (t_plan0_ > 0) {
        metrics_.preempt.loop_us[llama_preempt::LOOP_PLAN] += (uint64_t) (now - t_plan0_);
    }
    t_plan0_    = 0;
    step_clean_ = true;
    step_now_   = {};
    t_step0_    = now;
    t_mark_     = now;
    // the cells the slots hold as the step begins: what each token's attention spans in a unified pool
    n_pool_used_ = 0;
    for (int32_t id = 0; id < port_.n_slots(); ++id) {
        n_pool_used_ += port_.facts(id).phase == upstream_phase::parked ? 0 : port_.prompt_of(id).n_tokens();
    }
}


// add the next chunk of a resuming slot's replay list to the batch
bool batch_hooks::add_replay(int32_t id, int32_t n_batch) {
    auto & ps = table_[id];
    bool add_ok = true;

    const int32_t n_prev = port_.batch_size();
    while (ps.n_replay_done < (int32_t) ps.replay.size() && port_.batch_size() < n_batch) {
        const llama_token tok = ps.replay[ps.n_replay_done];
        add_ok &= port_.add_replay_token(id, tok);
        if (!add_ok) {
            break;
        }
        ps.n_replay_done++;
    }

    if (port_.batch_size() > n_prev && ps.n_replay_done == (int32_t) ps.replay.size()) {
        // the last replay token is `sampled`: its logits are what the interrupted step was about
        // to read, so DONE_PROMPT -> GENERATING samples the token that step would have sampled
        port_.replay_done(id);
    }
    return add_ok;
}

// hook at the top of pre_decode()'s prompt loop, for each processing slot: true when preemption
// owns the slot this step. `n_batch` is the loop's own limit, which the loop checks right after:
// for a prompt or a replay it is set to what the batch holds plus the slot's share of the step's
// prompt tokens (the plan's chunks: the prompt budget while slots decode, shared in arrival order),
// so a long prompt is spread over steps instead of stalling their decode, and the prompts are
// served in the plan's order whatever slots they sit in.
bool batch_hooks::prompt_hook(int32_t id, int32_t & n_batch, bool & add_ok) {
    const slot_facts f = port_.facts(id);
    if (f.phase == upstream_phase::parked) {
        return true;  // parked: never in a batch, never the batch's lead slot
    }
    if ((size_t) id < hold_.size() && hold_[id]) {
        return true;  // a prompt waiting: behind parked ones, for room, or for its turn at the budget
    }
    const bool replaying = table_[id].resuming && f.phase == upstream_phase::prompt;
    if (replaying || f.phase == upstream_phase::started || f.phase == upstream_phase::prompt) {
        const int32_t n_max = port_.n_batch_max();
        const int32_t share = (size_t) id < chunk_.size() ? chunk_[id] : -1;
        // a prompt that cannot be split (a non-causal embedding) takes its batch whole, as upstream's
        if (share >= 0 && (replaying || f.can_split)) {
            n_batch = std::min(n_max, port_.batch_size() + share);
        } else {
            // no share (resumed in this step): the step's prompt budget beside the generated tokens
            int32_t n_gen = 0;
            for (int32_t i = 0; i < port_.batch_size(); ++i) {
                const auto t = port_.batch_token_at(i);
                n_gen += !t.is_prompt && !t.is_replay ? 1 : 0;
            }
            n_batch = n_gen > 0 && prompt_budget_ > 0 ? std::min(n_max, n_gen + prompt_budget_) : n_max;
        }
    }
    if (replaying) {
        if (!add_ok || port_.batch_size() >= n_batch) {
            return true;  // the batch is full
        }
        if (!port_.can_join_batch(id)) {
            return true;
        }
        add_ok &= add_replay(id, n_batch);
        port_.lead_batch_if_none(id);
        return true;
    }
    return false;
}

// in metrics_post_decode(), before upstream counts prompt tokens: replayed tokens are recompute,
// not prompt tokens, and count only once their decode succeeded
void batch_hooks::count_decoded(int32_t off, int32_t n_tokens) {
    if (t_mark_ > 0) {  // the batch built and computed up to its logits (the caller synchronized)
        const int64_t now = ggml_time_us();
        metrics_.preempt.loop_us[LOOP_DECODE] += (uint64_t) (now - t_mark_);
        t_mark_ = now;
    }
    steps_.count_decoded(n_tokens);
    for (int32_t i = off; i < off + n_tokens; ++i) {
        auto t = port_.batch_token_at(i);
        if (t.id_slot < 0 || t.id_slot >= port_.n_slots()) {
            continue;
        }
        auto & ps = table_[t.id_slot];
        // the step's shape, for the step cost's fit: a token at position p reads p + 1 cells
        (t.is_prompt || t.is_replay || ps.n_redo_left > 0 ? step_now_.n_prompt : step_now_.n_decode)++;
        step_now_.n_attended += (int64_t) t.pos + 1;
        step_now_.n_spanned  += spanned_cells(spans_pool_, n_pool_used_ + n_tokens, t.pos);
        if (!t.is_replay && t.is_prompt && ps.n_redo_left > 0) {
            // a prompt-phase victim processing again what it had processed before the park
            ps.n_redo_left--;
            t.is_prompt = false;
            t.is_replay = true;
            port_.mark_batch_token(i, t.is_prompt, t.is_replay);
        }
        if (t.is_replay) {
            ps.n_recompute++;
            metrics_.preempt.n_recompute_tokens_total++;
        }
        steps_.count_token(t.is_prompt, t.is_replay);
    }
}

// the last resort's first half: the undecoded tokens [off, end) taken back out of their slots, each
// back at a token boundary. True when a slot of an n_cmpl family whose prompt is not shared yet
// was among them (children copy their parent's cells after the first sub-batch: such a family is
// not rewound into a park; once shared, its members' tokens are generated ones like any slot's).
bool batch_hooks::rewind(int32_t off) {
    std::vector<int32_t> n_undo(port_.n_slots(), 0);
    for (int32_t i = off; i < port_.batch_size(); ++i) {
        n_undo[port_.batch_token_at(i).id_slot]++;
    }
    bool family_in_batch = false;
    for (int32_t id = 0; id < port_.n_slots(); ++id) {
        family_in_batch |= n_undo[id] > 0 && port_.facts(id).family && !port_.facts(id).family_shared;
    }
    for (int32_t id = 0; id < port_.n_slots(); ++id) {
        const int32_t n = n_undo[id];
        if (n == 0) {
            continue;
        }
        const upstream_phase phase = port_.facts(id).phase;
        auto & ps = table_[id];
        if ((phase == upstream_phase::prompt_done || phase == upstream_phase::prompt) && ps.resuming) {
            ps.n_replay_done -= n;
        }
        // `sampled` stays the next token to decode, as at any token boundary
        port_.take_back(id, n);
    }
    return family_in_batch;
}

} // namespace llama_preempt
