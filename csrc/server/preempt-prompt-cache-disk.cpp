// llama-preempt: the prompt cache's disk side, the out-of-line part of cached_prompts
// (preempt-prompt-cache.h): a prompt upstream drops goes to a file, a file
// that matches a request better than RAM comes back, and the oldest waiting request's file is read
// ahead. Every choice is the policy's (policy/preempt-memory.h); every byte into host RAM is asked
// of the host budget first.

#include "preempt-prompt-cache.h"

#include "preempt-disk-io.h"  // put_bytes, byte_reader
#include "preempt-memory.h"   // the policy's choices over the prompt files
#include "preempt-stream.h"   // state_stream

#include <algorithm>
#include <list>

namespace llama_preempt {

// A cached prompt's context checkpoints (a recurrent or SWA model keeps them to resume inside the
// prompt), packed after its state in the file: each one's positions, then its three byte strings.
static std::vector<uint8_t> preempt_pack_checkpoints(const std::list<common_prompt_checkpoint> & checkpoints) {
    std::vector<uint8_t> out;
    for (const auto & c : checkpoints) {
        const int64_t  head[3]  = { c.n_tokens, c.pos_min, c.pos_max };
        const uint64_t sizes[3] = { c.data_tgt.size(), c.data_dft.size(), c.data_spec.size() };
        put_bytes(out, head, sizeof(head));
        put_bytes(out, sizes, sizeof(sizes));
        for (const auto * v : { &c.data_tgt, &c.data_dft, &c.data_spec }) {
            put_bytes(out, v->data(), v->size());
        }
    }
    return out;
}

// false when the bytes are not what preempt_pack_checkpoints() wrote (the file's checksum passed,
// so only a file of another layout gets here)
static bool preempt_unpack_checkpoints(const std::vector<uint8_t> & in, std::list<common_prompt_checkpoint> & out) {
    byte_reader r { in };
    while (r.left() > 0) {
        int64_t  head[3];
        uint64_t sizes[3];
        if (!r.get(head, sizeof(head)) || !r.get(sizes, sizeof(sizes))) {
            return false;
        }
        common_prompt_checkpoint c;
        c.update_pos(head[0], (llama_pos) head[1], (llama_pos) head[2]);
        int k = 0;
        for (auto * v : { &c.data_tgt, &c.data_dft, &c.data_spec }) {
            if (sizes[k] > r.left()) {
                return false;  // checked before the resize: a wrong size never allocates
            }
            v->resize(sizes[k]);
            r.get(v->data(), sizes[k++]);
        }
        out.push_back(std::move(c));
    }
    return true;
}

// A cached prompt's file read back (`ok`) with its checkpoints: false, with `why` and `error`, when
// the read failed or the checkpoints do not parse
static bool preempt_checkpoints_of(bool ok, const std::vector<uint8_t> & tail, std::list<common_prompt_checkpoint> & out,
                                   std::string & why, disk_error & error) {
    if (ok && !preempt_unpack_checkpoints(tail, out)) {
        why   = "its context checkpoints do not parse";
        error = disk_error::checksum;
        return false;
    }
    return ok;
}

// a prompt file that failed to write or read back: counted, by kind as for parks
// (preempt_disk_failures_total{kind})
void cached_prompts::count_failure(disk_error error) {
    metrics_.preempt.n_prompt_cache_disk_failures_total++;
    if (is_disk_failure(error)) {
        metrics_.preempt.disk_failures[(int) error]++;
    }
}

// a prompt file read back for a request (into RAM, or a slot): a hit, its bytes and time, the measured rate
void cached_prompts::count_read(size_t n_bytes, int64_t t_us) {
    metrics_.preempt.n_prompt_cache_disk_hits_total++;
    metrics_.preempt.n_disk_read_bytes_total += n_bytes;
    metrics_.preempt.n_disk_read_us_total    += (uint64_t) t_us;
    rates_.observe_in(park_tier::disk, n_bytes, t_us);  // the disk tier's files, its rates
}

// upstream drops a cached prompt for room: its state (and its checkpoints) go to a file instead
void cached_prompts::spill(server_prompt_cache_state & state) {
    const auto & toks = state.prompt.tokens.get_tokens();
    const bool media  = std::find(toks.begin(), toks.end(), LLAMA_TOKEN_NULL) != toks.end();
    if (media || state.data.main.empty()) {
        metrics_.preempt.n_prompt_cache_disk_skipped_total++;
        if (!said_skip_) {
            said_skip_ = true;
            SRV_INF("%s", "preemption: a cached prompt with media is dropped, not written to disk (not supported yet)\n");
        }
        return;
    }
    // the write before this one finishes first: one prompt's bytes at most wait outside the RAM cache
    count_writes(disk_->finish_writes());
    std::string why;
    const size_t n_bytes = state.size();
    // the disk tier's limit: the oldest prompts give way (the policy's choice)
    if (const size_t room = disk_->room();
        prompt_files_give_way(n_bytes, room, disk_->bytes_held(), reading_ || disk_->ahead() >= 0)) {
        make_room(n_bytes, room, "a newer prompt");
    }
    if (!disk_->spill(toks, std::move(state.data.main), std::move(state.data.drft),
                                    preempt_pack_checkpoints(state.prompt.checkpoints), why)) {
        metrics_.preempt.n_prompt_cache_disk_skipped_total++;
        SRV_DBG("preemption: a cached prompt of %d tokens is dropped, the disk tier has no room (%s)\n",
                state.prompt.n_tokens(), why.c_str());
        return;
    }
    metrics_.preempt.n_prompt_cache_spilled_total++;
    SRV_DBG("preemption: a cached prompt of %d tokens (%.2f MiB) left host RAM for the disk tier\n", state.prompt.n_tokens(),
            n_bytes / 1048576.0);
}

// upstream skips a prompt larger than its RAM cache (and one it holds already, or cannot allocate
// for): the first goes to the disk tier instead, streamed from the slot's cells
void cached_prompts::save_skipped(const server_prompt & prompt, const seq_contexts & sc) {
    if (!disk_ || cache_->limit_size == 0) {
        return;
    }
    const auto n = size_state(sc);
    size_t n_ckpt = 0;
    for (const auto & c : prompt.checkpoints) {
        n_ckpt += c.size();
    }
    if (n.total() == 0 || n.total() + n_ckpt <= cache_->limit_size) {
        return;  // not one too large: upstream holds it already, or could not allocate for it
    }
    for (const auto & st : cache_->states) {
        if (st.prompt.tokens.get_common_prefix(prompt.tokens) == prompt.tokens.size()) {
            return;  // held already
        }
    }
    stream_prompt(prompt, sc, n, "larger than the RAM cache");
}

// A slot's prompt to the disk tier now, streamed from its cells one chunk at a time
// (store/preempt-stream.h): never a host copy of the whole state. False when it is not written
// (media, held on disk already, no room, a failed write).
bool cached_prompts::stream_prompt(const server_prompt & prompt, const seq_contexts & sc,
                                         const state_sizes & n, const char * why) {
    const auto & toks = prompt.tokens.get_tokens();
    if (n.total() == 0 || std::find(toks.begin(), toks.end(), LLAMA_TOKEN_NULL) != toks.end()) {
        metrics_.preempt.n_prompt_cache_disk_skipped_total++;
        return false;
    }
    for (const auto & f : disk_->views()) {
        if (f.n_tokens >= toks.size() && std::equal(toks.begin(), toks.end(), f.tokens)) {
            return false;  // a file holds it (or more) already
        }
    }
    count_writes(disk_->finish_writes());  // one write at a time, as a spill's
    state_stream from(sc, n, preempt_pack_checkpoints(prompt.checkpoints));
    const size_t n_bytes = from.part_bytes(0) + from.part_bytes(1);
    if (const size_t room = disk_->room();
        prompt_files_give_way(n_bytes, room, disk_->bytes_held(), reading_ || disk_->ahead() >= 0)) {
        make_room(n_bytes, room, "a newer prompt");
    }
    std::string err;
    disk_error error = disk_error::none;
    const int64_t t0 = ggml_time_us();
    if (!from.lay_out(err) ||
        !disk_->write_streamed(toks, from, from.part_bytes(0), from.part_bytes(1), from.tail().size(), from.layout(), err, error)) {
        if (error == disk_error::none || error == disk_error::full) {
            metrics_.preempt.n_prompt_cache_disk_skipped_total++;  // no room, or not laid out: dropped, as a spill without room
        } else {
            count_failure(error);
        }
        SRV_WRN("preemption: a prompt of %d tokens (%.2f MiB) %s is dropped, not streamed to the disk tier: %s\n",
                prompt.n_tokens(), n_bytes / 1048576.0, why, err.c_str());
        return false;
    }
    metrics_.preempt.n_prompt_cache_spilled_total++;
    metrics_.preempt.n_prompt_cache_streamed_total++;
    SRV_INF("preemption: a prompt of %d tokens (%.2f MiB) %s streamed to the disk tier in %.2f ms, through %zu KiB of host RAM\n",
            prompt.n_tokens(), n_bytes / 1048576.0, why, (ggml_time_us() - t0) / 1000.0,
            disk_store::CHUNK >> 10);
    return true;
}

// The policy's choice for a request's tokens (choose_prompt_read): the prompt file sharing the
// longest prefix is read back when it saves more than the RAM cache and the slot (`n_slot`
// tokens) have and costs less than the prefill by the measured rates: into the RAM cache when it
// fits what parked slots leave of the host budget, else streamed into the slot when its tokens
// fit the `stream_cells` the pool has for it now (0: no slot, as for a read ahead).
// `files`: the prompt files' views (prompt_disk::views()).
prompt_read_choice cached_prompts::to_read(const server_tokens & tokens,
                                                                const std::vector<prompt_file_view> & files,
                                                                size_t n_slot, size_t stream_cells) const {
    size_t n_ram = n_slot;
    for (const auto & st : cache_->states) {
        n_ram = std::max(n_ram, st.prompt.tokens.get_common_prefix(tokens));
    }
    return choose_prompt_read(files, tokens.get_tokens(), n_ram, host_.limits().cache_room(near_.parked_bytes()), rates_,
                                             stream_cells);
}

// Once per step: the file the oldest waiting request (no slot free yet) will want is read in the
// background while it waits, so its lookup finds the bytes in host memory (choose_read_ahead). Its
// bytes count in the host budget from now (held()); a read ahead that no waiting request
// wants any more goes.
void cached_prompts::read_ahead() {
    const auto files = disk_->views();
    prompt_read_choice next;
    queue_.peek_deferred([&](const server_task & task) {
        if (task.type != SERVER_TASK_TYPE_COMPLETION || task.tokens.empty()) {
            return false;  // upstream caches prompts for completions only: the next waiting task
        }
        next = to_read(task.tokens, files);
        return true;
    });
    const auto act = choose_read_ahead(files, next, disk_->ahead());
    const auto file = act.start ? disk_->handle(act.want) : nullptr;
    if (act.forget) {
        forget_ahead(true);
    }
    // room in the host budget first: older prompts give way (to disk)
    reading_ = file != nullptr;  // what the reservation evicts is written without giving way to it
    const bool room = file && host_.reserve(held(), file->total(), host_use::prompt_ahead);
    reading_ = false;
    if (room) {
        const int32_t i = disk_->find(file);  // the fit may have written or dropped files: the index may move
        if (i >= 0 && disk_->read_ahead(i)) {
            metrics_.preempt.n_prompt_cache_read_ahead_total++;
        }
    }
}

// before upstream searches its RAM cache for a request: a file that matches better comes back
// into it, or one too large for it straight into the slot
void cached_prompts::lookup(server_prompt & prompt, const server_tokens & tokens, const seq_contexts & sc) {
    const auto choice = to_read(tokens, disk_->views(), prompt.tokens.get_common_prefix(tokens), near_.room_cells(sc.seq, 0));
    const size_t n_common = choice.n_common;
    if (choice.stream()) {
        stream_back(choice.file, n_common, prompt, sc);
        return;
    }
    int32_t i = choice.read() ? choice.file : -1;
    const int32_t ahead = disk_->ahead();
    const bool was_ahead = i >= 0 && i == ahead;
    const auto file = i >= 0 ? disk_->handle(i) : nullptr;
    if (ahead >= 0 && !was_ahead) {
        forget_ahead(false);
    }
    if (!file) {
        return;
    }
    const size_t n_bytes = file->total();
    // its cells must all fit the pool at once (idle slots' prompts go to the cache first if they
    // need to): a file read back without that room would be refused by the restore, its read
    // wasted; it stays on disk for a later request and this one prefills
    const size_t n_file = disk_->views()[i].n_tokens;
    if (near_.room_cells(sc.seq, n_file) < n_file) {
        SRV_DBG("preemption: a cached prompt of %zu tokens stays on disk, the pool has no room for its cells now\n", n_file);
        if (was_ahead) {
            forget_ahead(true);
        }
        return;
    }
    i = disk_->find(file);  // the idle slots' prompts spilled meanwhile may move the indices
    if (i < 0) {
        return;
    }
    // room in the host budget before its bytes come back: older prompts give way
    reading_ = true;  // what the reservation evicts is written without giving way to this file
    const bool room = was_ahead || host_.reserve(held(), n_bytes, host_use::prompt_read);
    reading_ = false;
    if (!room) {
        return;
    }
    i = disk_->find(file);  // a file dropped or spilled meanwhile moves the indices
    if (i < 0) {
        return;
    }
    prompt_read got;
    std::string why;
    disk_error error = disk_error::none;
    std::list<common_prompt_checkpoint> checkpoints;
    if (!preempt_checkpoints_of(disk_->take(i, got, why, error), got.tail, checkpoints, why, error)) {
        count_failure(error);
        host_.release(held());
        SRV_WRN("preemption: a cached prompt's file failed to read back (%s): %s; its tokens are prefilled instead\n",
                disk_error_name(error), why.c_str());
        return;
    }
    // restored into the slot here, as upstream's load() would from its cache (the slot's own prompt
    // went to the cache just before): only a state in the slot is a hit, and load() then finds the
    // slot's prompt the best match and keeps it
    if (!restore_into(sc, got)) {
        metrics_.preempt.n_prompt_cache_load_failures_total++;
        host_.release(held());
        host_.pages_freed();
        SRV_WRN("preemption: a cached prompt of %zu tokens read back from the disk tier could not be restored into slot %d "
                "(llama.cpp refused its state: no room for its cells?); its tokens are prefilled instead\n",
                got.tokens.size(), sc.seq);
        prompt.clear();
        return;
    }
    count_read(n_bytes, got.t_us);
    SRV_INF("preemption: a cached prompt of %zu tokens (%zu shared with this request%s) read back from the disk tier, "
            "%.2f MiB in %.2f ms%s\n", got.tokens.size(), n_common,
            checkpoints.empty() ? "" : string_format(", %zu context checkpoints", checkpoints.size()).c_str(),
            n_bytes / 1048576.0, got.t_us / 1000.0, was_ahead ? " (read ahead while the request waited for a slot)" : "");
    prompt.tokens      = server_tokens(got.tokens, false);
    prompt.checkpoints = std::move(checkpoints);
    got = {};
    host_.release(held());  // its bytes are in the slot now, no longer an extra: the limit goes back up
    host_.pages_freed();
}

// a prompt file's state read back, set into the slot's contexts in place of what it held; false
// (the slot left empty) when llama.cpp refuses it
bool cached_prompts::restore_into(const seq_contexts & sc, const prompt_read & got) {
    for (llama_context * ctx : { sc.tgt, sc.dft }) {
        if (ctx != nullptr) {
            llama_memory_seq_rm(llama_get_memory(ctx), sc.seq, -1, -1);
        }
    }
    bool ok = llama_state_seq_set_data_ext(sc.tgt, got.tgt.data(), got.tgt.size(), sc.seq, 0) == got.tgt.size();
    if (ok && !got.dft.empty()) {
        ok = sc.dft != nullptr && llama_state_seq_set_data_ext(sc.dft, got.dft.data(), got.dft.size(), sc.seq, 0) == got.dft.size();
    }
    if (!ok) {
        for (llama_context * ctx : { sc.tgt, sc.dft }) {
            if (ctx != nullptr) {
                llama_memory_seq_rm(llama_get_memory(ctx), sc.seq, -1, -1);
            }
        }
    }
    return ok;
}

// A file larger than what the host budget leaves cached prompts: streamed straight into the slot,
// one chunk at a time, in place of what it held (upstream's load() replaces it the same way; its
// prompt went to the cache just before). A read that fails leaves the slot empty.
void cached_prompts::stream_back(int32_t i, size_t n_common, server_prompt & prompt, const seq_contexts & sc) {
    const auto file = disk_->handle(i);
    if (disk_->ahead() >= 0 && disk_->ahead() != i) {
        forget_ahead(false);  // a read ahead that failed is dropped: the indices may move
        i = disk_->find(file);
    }
    // the idle slots' prompts go to the cache now if its cells need their room (upstream clears
    // them right after the load); what that spills may make older files give way
    if (i >= 0) {
        near_.room_cells(sc.seq, disk_->views()[i].n_tokens);
        i = disk_->find(file);
    }
    if (i < 0) {
        return;
    }
    const size_t n_bytes = file->total();
    const size_t n_tail  = disk_->tail_bytes(i);
    for (llama_context * ctx : { sc.tgt, sc.dft }) {
        if (ctx != nullptr) {
            llama_memory_seq_rm(llama_get_memory(ctx), sc.seq, -1, -1);
        }
    }
    prompt.clear();
    state_stream into(sc, { file->n_bytes[0], file->n_bytes[1] - n_tail });
    into.expect_tail(n_tail);
    into.use_layout(disk_->layout_of(i));
    std::vector<llama_token> tokens;
    int64_t t_us = 0;
    std::string why;
    disk_error error = disk_error::none;
    std::list<common_prompt_checkpoint> checkpoints;
    const bool ok = preempt_checkpoints_of(disk_->take_streamed(i, into, tokens, t_us, why, error), into.tail(), checkpoints,
                                           why, error);
    host_.pages_freed();  // a read ahead let go
    if (!ok) {
        into.undo();
        count_failure(error);
        SRV_WRN("preemption: a cached prompt's file failed to stream back (%s): %s; its tokens are prefilled instead\n",
                disk_error_name(error), why.c_str());
        return;
    }
    count_read(n_bytes, t_us);
    metrics_.preempt.n_prompt_cache_streamed_back_total++;
    SRV_INF("preemption: a cached prompt of %zu tokens (%zu shared with this request%s) streamed back from the disk tier "
            "into slot %d, %.2f MiB in %.2f ms through %zu KiB of host RAM (larger than the RAM cache has room for)\n",
            tokens.size(), n_common,
            checkpoints.empty() ? "" : string_format(", %zu context checkpoints", checkpoints.size()).c_str(), sc.seq,
            n_bytes / 1048576.0, t_us / 1000.0, disk_store::CHUNK >> 10);
    prompt.tokens      = server_tokens(tokens, false);
    prompt.checkpoints = std::move(checkpoints);
}

// the file read ahead lets its host copy go (the waiting request went another way); one whose read
// failed is dropped and counted
void cached_prompts::forget_ahead(bool say) {
    const bool failed = disk_->forget_ahead();
    host_.pages_freed();
    if (failed) {
        metrics_.preempt.n_prompt_cache_disk_failures_total++;
        if (say) {
            SRV_WRN("%s", "preemption: a cached prompt's file failed to read ahead; it is dropped\n");
        }
    }
}

} // namespace llama_preempt
