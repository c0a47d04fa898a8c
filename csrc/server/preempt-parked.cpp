// The parked slots' parks and resumes (preempt-parked.h), over the port.
#include "preempt-parked.h"

#include "preempt-memory.h"  // the copy guard's reaction to a wrong copy

#include "ggml.h"

#include <algorithm>
#include <string>
#include <vector>

namespace llama_preempt {

victim_state parked_slots::victim(int32_t id, park_reason reason) {
        const auto & ps = table_[id];
    const slot_facts f = port_.facts(id);
    victim_state v;
    v.id     = id;
    v.reason = reason;
    switch (f.phase) {
        case upstream_phase::generating: v.in.at = parked_from::generating; break;
        case upstream_phase::prompt:     v.in.at = parked_from::prompt;     break;
        case upstream_phase::started:    v.in.at = parked_from::started;    break;
        default: GGML_ABORT("preempt_park: slot %d in phase %d cannot be parked", id, (int) f.phase);
    }
    v.in.replaying = ps.resuming;
    v.in.n_held    = port_.prompt_of(id).n_tokens();
    v.in.n_prompt  = f.n_prompt;
    v.in.n_replay  = (int32_t) ps.replay.size();

    v.t_begin_us = ggml_time_us();
    sized_id_ = -1;
    if (has_swap_state(v.in) && cfg_.mode != preempt_mode::recompute) {
        sized_    = size_state(seq(id));
        sized_id_ = id;
        v.bytes   = sized_.total();
    }
    return v;
}

parked_state parked_slots::parked(int32_t id) const {
    parked_state p;
    const auto & ps = table_[id];
    if (port_.facts(id).phase == upstream_phase::parked && ps.tier() != park_tier::recompute) {
        const auto & st = ps.swap;
        p.tier   = ps.tier();
        p.bytes  = st.state_bytes();
        p.in_ram = p.tier == park_tier::disk && st.disk.in_ram();
    }
    return p;
}

void parked_slots::upload_ahead(int32_t id) {
    if (swap_.copier->can_prefetch()) {
        restore_ahead(table_[id].swap, *swap_.copier);
    }
}

void parked_slots::read_file_ahead(int32_t id) {
    auto & st = table_[id].swap;
    if (st.disk.streamed) {
        return;  // larger than what parks may hold: it comes back straight from its file
    }
    // its bytes come back into host RAM: cached prompts give way
    reserve_transit(st.disk.total());
    if (disk_read_ahead(st, swap_)) {
        metrics_.preempt.n_disk_read_ahead_total++;
        PSLT_DBG(port_, id, "disk park: reading %.2f MiB back ahead of its resume\n", st.disk.total() / 1048576.0);
    }
}

void parked_slots::step(int32_t keep) {
    const int64_t now = ggml_time_us();
    for (int32_t id = 0; id < port_.n_slots(); ++id) {
        settle_copy_if_due(table_[id].swap, *swap_.copier, now);
        take_verdict(id);
    }
    disk_step(keep);
}

// a park's state to host RAM (a RAM tier's place, a disk tier's way to its file), after the host
// budget made room (`use`: a park's share, or bytes only passing through). False: nothing was copied.
bool parked_slots::copy_to_host(int32_t id, host_use use, swap_result & r) {
    // as victim() sized it right before, in this park (sized again only if it did not)
    const auto n_state = sized_id_ == id ? sized_ : size_state(seq(id));
    sized_id_ = -1;
    auto & ps = table_[id];
    if (!host_.reserve(prompts_.held(), n_state.total(), use)) {
        PSLT_WRN(port_, id, "the host budget has no room for this park (%.1f MiB), recomputing instead\n", n_state.total() / 1048576.0);
        return false;
    }
    const bool check = guard_.due(true);
    r = swap_out(ps.swap, seq(id), n_state, swap_, check);
    guard_count(id, true, r);
    if (!r.ok) {
        PSLT_WRN(port_, id, "%s (%.1f MiB), recomputing instead\n", r.why, n_state.total() / 1048576.0);
        return false;
    }
    PSLT_DBG(port_, id, "%s\n", describe_copy("park", cfg_.knobs.route, ps.swap, r).c_str());
    return true;
}

// the slot leaves the pool as the order says: its state copied out, or its tokens kept to replay
void parked_slots::park_as(int32_t id, const park_order & o) {
    auto & ps = table_[id];
    const auto & how = o.how;
    const size_t  n_bytes = how.copies() ? o.bytes : 0;
    const int64_t t0      = o.t_begin_us > 0 ? o.t_begin_us : ggml_time_us();

    // what this park gives back to the pool: a prefix another slot shares stays (the count is the step's)
    const int32_t n_freed = std::max(0, o.in.n_held - std::max(0, ps.n_cells_shared));
    ps.choice    = how.why;
    ps.from      = o.shape.from;
    ps.n_restore = o.shape.n_restore;
    metrics_.preempt.parks_by_choice[(int) how.why]++;
    metrics_.preempt.parks_by_tier[(int) how.tier]++;
    // the state victim() sized for this park (a RECOMPUTE's order carries no bytes)
    const size_t n_state = sized_id_ == id ? sized_.total() : 0;
    if (how.why == park_choice::over_budget && n_state > 0 && swap_.disk && swap_.disk->short_of_disk(n_state, prompts_.disk_bytes())) {
        // no tier had room, and the disk tier's budget did: its filesystem is full (a fault to
        // tell apart from a budget an operator set)
        swap_.disk->count_full(string_format("a park of %.2f MiB found no room", n_state / 1048576.0));
    }

    if (how.copies()) {
        // the prompt (tokens and checkpoints) waits beside the buffers; `sampled` stays the next
        // token to decode, so the slot continues from the same token with the same sampler
        ps.swap_prompt = std::move(port_.prompt_of(id));
        port_.prompt_of(id).clear();
        port_.drop_cells(id);
        metrics_.preempt.n_preempt_swap_total++;
    } else {
        if (port_.facts(id).phase == upstream_phase::generating) {
            // `sampled` was sent to the client but is in neither the cache nor prompt.tokens;
            // any draft (even tokens accepted after a checkpoint rollback) was not sent yet and
            // is simply predicted again
            ps.replay = port_.prompt_of(id).tokens.clone();
            ps.replay.push_back(port_.sampled_of(id));
        }
        // a mid-prompt victim redoes up to its high-water mark: what is left to redo plus this
        ps.n_redo_left += o.shape.n_redo;
        // its cells go from the draft/MTP context too; a draft is a prediction, not a result: the
        // speculator starts over at the resume
        port_.clear_prompt(id);
        metrics_.preempt.n_preempt_recompute_total++;
    }
    ps.resuming      = false;
    ps.n_replay_done = 0;
    // with SWAP, a draft kept after a checkpoint rollback (spec_is_replay, accepted tokens not yet
    // emitted) stays with its checkpoint: it matches the saved state and is verified again after
    // the restore, as upstream does, which keeps the speculator's own state in step
    port_.leave_batch(id);

    port_.set_phase(id, upstream_phase::parked);
    ps.n_preempt    += 1;
    ps.t_parked_us   = ggml_time_us();
    ps.reason        = o.reason;
    port_.count_parked(id, 0, ps.n_preempt);  // the response's timings.n_preempt
    metrics_.preempt.n_preempt_total++;
    port_.notify(id, "preempted");

    const double ms = (ps.t_parked_us - t0) / 1000.0;
    steps_.note_park(id, o.in.n_held, n_bytes, how, ms);
    metrics_.preempt.n_bytes_moved_total += n_bytes;
    // every tier's quote, by name: what the choice weighed (a tier the server does not have is not offered)
    std::string quotes;
    for (const tier_offer & t : how.offers) {
        quotes += string_format("%s%s %.2f ms", quotes.empty() ? "" : ", ", park_tier_name(t.where), t.ms);
    }
    if (how.copies()) {
        const std::string to = how.tier == park_tier::ram ? ""
                             : how.tier != park_tier::disk ? std::string(" to ") + park_tier_name(how.tier)
                             : ps.swap.disk.in_ram() ? " to disk, written in the background" : " to disk, written";
        PSLT_INF(port_, id, "parked by swap%s (%.2f MiB, %d tokens held in %d cell ranges, %d cells freed) in %.2f ms by %s, reason: %s, %s (predicted %s), n_preempt = %d\n",
                to.c_str(), n_bytes / 1048576.0, o.in.n_held, ps.swap.n_copy_ranges, n_freed, ms, ps.swap.copied_by,
                park_reason_name(o.reason), park_choice_name(how.why), quotes.c_str(), ps.n_preempt);
    } else {
        PSLT_INF(port_, id, "parked by recompute (%d tokens held, %d cells freed, %d to restore), reason: %s, %s (predicted %s), n_preempt = %d\n",
                o.in.n_held, n_freed, ps.n_restore, park_reason_name(o.reason), park_choice_name(how.why), quotes.c_str(), ps.n_preempt);
    }
}

// a checked park whose transfer has landed since (settle_copy()): its verdict, counted by the guard.
// A wrong one stays parked until its resume, which refuses it (swap_in) and recomputes.
void parked_slots::take_verdict(int32_t id) {
    auto & st = table_[id].swap;
    if (!st.verdict_new) {
        return;
    }
    st.verdict_new = false;
    swap_result r;
    r.verified = st.verified;
    r.mismatch = st.mismatch;
    r.report   = st.check.report;
    guard_count(id, true, r);
}

// The copy guard (--preempt-verify): a checked park or restore is counted for the devices it moved;
// a wrong one moves the device it went wrong on to the proven route (single slices) or, when that
// was its route already, turns SWAP off. The request itself recomputes (the caller's fallback).
void parked_slots::guard_count(int32_t id, bool park, const swap_result & r) {
    if (r.verified == copy_check::none) {
        return;
    }
    std::vector<std::string> devices;
    for (const auto & d : r.report.devices) {
        devices.push_back(d.device);
    }
    guard_.count(park, devices);
    metrics_.preempt.n_swap_verify_total++;
    if (r.verified == copy_check::right) {
        return;
    }
    metrics_.preempt.n_swap_verify_mismatch_total++;
    auto & copier = *swap_.copier;
    for (const auto & d : r.report.devices) {
        if (r.mismatch.dev != nullptr && d.dev != r.mismatch.dev) {
            continue;  // the byte that differs lives on another device
        }
        metrics_.preempt.n_copy_route_changes_total++;
        const auto reaction = react_to_wrong_copy(copier.route_of(d.dev) == copy_route::per_slice,
                                                                 (d.how & ~how_slices) != 0);
        if (reaction == guard_reaction::per_slice) {
            copier.set_device_route(d.dev, copy_route::per_slice);
            guard_.route_changed(d.device);
            PSLT_ERR(port_, id, "copy guard: the swap %s by %s on %s differs from upstream's copy at %s; %s copies slice by slice from now on "
                    "(checked again for its next %d copies), and this request recomputes\n", park ? "park" : "restore",
                    copy_how_name(d.how), d.device.c_str(), r.mismatch.describe().c_str(), d.device.c_str(),
                    guard_.n_first);
        } else {
            cfg_.mode = preempt_mode::recompute;
            PSLT_ERR(port_, id, "copy guard: the swap %s slice by slice on %s differs from upstream's copy at %s; SWAP is off from now "
                    "on (every park recomputes), and this request recomputes\n", park ? "park" : "restore", d.device.c_str(),
                    r.mismatch.describe().c_str());
        }
    }
}

// a restore begins: the parked time ends here, whatever comes of it; a park checked since its
// transfer landed is counted before the restore refuses it
move_result parked_slots::restore_begin(int32_t id) {
    move_result m;
    m.t_begin_us = ggml_time_us();
    settle_copy(table_[id].swap, *swap_.copier);
    take_verdict(id);
    return m;
}

// a parked state from host RAM back into the pool (`n_bytes` from `where`, for the log). Not ok:
// the state is lost, the policy falls back.
move_result parked_slots::restore_from_host(int32_t id, move_result m, size_t n_bytes,
                                                                    const char * where) {
    auto & ps = table_[id];
    const auto r = swap_in(ps.swap, seq(id), swap_, guard_.due(false));
    guard_count(id, false, r);
    if (!r.ok) {
        return restore_failed(id, m, n_bytes, where, r.why);
    }
    PSLT_DBG(port_, id, "%s\n", describe_copy("restore", cfg_.knobs.route, ps.swap, r).c_str());
    metrics_.preempt.n_restore_ahead_total += r.report.prefetched ? 1 : 0;
    m.ahead = r.report.prefetched;
    return m;
}

move_result parked_slots::restore_failed(int32_t id, move_result m, size_t n_bytes,
                                                                 const char * where, const std::string & why) {
    metrics_.preempt.n_swap_restore_fail_total++;
    PSLT_WRN(port_, id, "restoring %.2f MiB by swap from %s failed (%s), falling back to recompute of %d tokens\n",
            n_bytes / 1048576.0, where, why.c_str(), table_[id].swap_prompt.n_tokens());
    m.failure = move_failure::restore;
    return m;
}

// resume: a restored slot continues from the same token; a recomputed one re-enters prompt
// processing with the replay list (never STARTED once the stream began)
void parked_slots::resume_as(int32_t id, park_tier from, const move_result & restore) {
    auto & ps = table_[id];
    GGML_ASSERT(port_.facts(id).phase == upstream_phase::parked);
    GGML_ASSERT(port_.prompt_of(id).n_tokens() == 0);

    // a restore (successful or not) began in its tier's copy_in(): the parked time ends there
    const bool    fallback = !restore.ok();
    const bool    restored = from != park_tier::recompute || fallback;
    GGML_ASSERT(!restored || restore.t_begin_us > 0);
    const int64_t t0       = restored ? restore.t_begin_us : ggml_time_us();
    const size_t  n_bytes  = ps.swap.state_bytes();
    const int64_t t_parked = t0 - ps.t_parked_us;
    ps.t_parked_total_us += t_parked;
    // time parked is not generation time: timings.predicted_ms and t_max_predict_ms exclude it
    port_.count_parked(id, t_parked, ps.n_preempt);
    port_.notify(id, "resumed");

    if (from != park_tier::recompute) {
        metrics_.preempt.restores_by_tier[(int) from]++;
        metrics_.preempt.n_bytes_moved_total += n_bytes;
        port_.prompt_of(id) = std::move(ps.swap_prompt);
        port_.set_phase(id, ps.from == parked_from::generating ? upstream_phase::generating : upstream_phase::prompt);
        ps.free_swap();
        ps.from = parked_from::none;
        metrics_.preempt.n_resume_total++;
        steps_.note_resume(id, from, false, t_parked, ggml_time_us() - t0, 0);
        PSLT_INF(port_, id, "restored by swap%s (%.2f MiB, %d tokens) in %.2f ms after %.1f ms parked%s\n",
                from == park_tier::disk ? " from disk" : "", n_bytes / 1048576.0,
                port_.prompt_of(id).n_tokens(), (ggml_time_us() - t0) / 1000.0, t_parked / 1000.0,
                restore.ahead ? " (uploaded ahead)" : "");
        return;
    }
    if (fallback) {
        // the request is never lost for lack of RAM or a failed disk: recompute from the tokens
        // kept beside the buffers
        if (ps.from == parked_from::generating) {
            ps.replay = std::move(ps.swap_prompt.tokens);
            ps.replay.push_back(port_.sampled_of(id));
        } else {
            ps.n_redo_left += ps.swap_prompt.n_tokens();
        }
        // its tier forgot the state (resume_parked()): what was kept beside it goes too, and
        // tier() is RECOMPUTE from here
        ps.swap_prompt.clear();
    }

    switch (ps.from) {
        case parked_from::generating:
            port_.set_phase(id, upstream_phase::prompt);
            ps.resuming      = true;
            // a prefix another slot still holds (the text it shared before its park) is linked, not replayed
            ps.n_replay_done = link_prefix(id, ps.replay, 0);
            break;
        case parked_from::prompt:
            port_.set_phase(id, upstream_phase::prompt);  // the prompt loop starts it over from token 0
            break;
        case parked_from::started:
            port_.set_phase(id, upstream_phase::started);  // it never started: nothing was sent yet
            break;
        case parked_from::none:
            GGML_ABORT("preempt_resume: slot %d is not parked", id);
    }
    ps.from = parked_from::none;
    metrics_.preempt.n_resume_total++;
    metrics_.preempt.restores_by_tier[(int) park_tier::recompute]++;
    const int32_t n_replay = ps.resuming ? (int32_t) ps.replay.size() - ps.n_replay_done : ps.n_redo_left;
    steps_.note_resume(id, park_tier::recompute, fallback, t_parked, ggml_time_us() - t0, n_replay);
    PSLT_INF(port_, id, "resumed by recompute after %.1f ms parked, %d tokens to replay\n", t_parked / 1000.0, n_replay);
}

prefix_link parked_slots::find_link(int32_t id, const server_tokens & want, int32_t n_own) const {
    if (!cfg_.share_off.empty()) {
        return {};
    }
    return find_prefix(port_, port_.contexts_of(id).tgt, id, want, n_own);
}

int32_t parked_slots::link_prefix(int32_t id, const server_tokens & want, int32_t n_own) {
    const prefix_link link = find_link(id, want, n_own);
    if (link.donor < 0) {
        return 0;
    }
    port_.link_cells(id, link.donor, link.n);
    metrics_.preempt.n_prefix_links_total++;
    metrics_.preempt.n_prompt_tokens_linked_total += (uint64_t) link.n;
    PSLT_INF(port_, id, "linked the first %d tokens from slot %d's cells (its own kept %d)\n", link.n, link.donor, n_own);
    return link.n;
}

} // namespace llama_preempt
