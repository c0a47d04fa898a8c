// llama-preempt: the self-test of every park route (preempt-selftest.h): running the routes.
#include "preempt-selftest.h"

#include "preempt-disk-park.h"
#include "preempt-q8.h"

#include "common.h"

#include "ggml.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>

namespace llama_preempt {

bool selftest_result::ok() const {
    return std::all_of(rows.begin(), rows.end(), [](const selftest_row & r) { return r.ok(); });
}

namespace {

constexpr llama_seq_id SEQ    = 0;  // the sequence parked
constexpr llama_seq_id FILL_A = 1;  // its neighbour in the pool, so its cells are scattered
constexpr llama_seq_id FILL_B = 2;  // decoded while it is parked, so it comes back into other cells

struct route_case {
    const char * name;
    copy_route   route;
    bool         ahead     = false;
    bool         disk      = false;
    bool         recompute = false;
    bool         q8        = false;  // held packed to q8_0 while parked (the compressed tier; not byte-exact)
};

// the pool, the sizes and the prompts every case shares
struct bench_seq {
    llama_context *            ctx;
    const llama_vocab *        vocab;
    std::vector<llama_token>   prompt, fill_a, fill_b;
    int32_t                    n_gen  = 16;
    int32_t                    n_park = 6;  // tokens generated before the park
    bool                       scatter = false;
    size_t                     chunk   = 16;     // the prompt's tokens decoded at a time (between the neighbour's when scattered)
    bool                       beside  = false;  // each generated token decoded in one batch with a token of the neighbour's
};

using step_logits = std::vector<std::vector<float>>;  // one row of logits per generated token

bool decode(llama_context * ctx, llama_seq_id seq, const std::vector<llama_token> & toks, size_t from, size_t to, llama_pos pos0,
            bool logits_last) {
    const size_t n_batch = std::max<uint32_t>(1, llama_n_batch(ctx));
    for (size_t i = from; i < to; i += n_batch) {
        const size_t n = std::min(n_batch, to - i);
        llama_batch b = llama_batch_init((int32_t) n, 0, 1);
        for (size_t j = 0; j < n; ++j) {
            b.token[j]     = toks[i + j];
            b.pos[j]       = pos0 + (llama_pos) (i - from + j);
            b.n_seq_id[j]  = 1;
            b.seq_id[j][0] = seq;
            b.logits[j]    = logits_last && i + j == to - 1;
        }
        b.n_tokens = (int32_t) n;
        const int rc = llama_decode(ctx, b);
        llama_batch_free(b);
        if (rc != 0) {
            return false;
        }
    }
    return true;
}

// the next greedy token from the last decode's logits (the sequence's token is always the batch's last)
llama_token greedy(const bench_seq & bs, step_logits * rows = nullptr) {
    const float * logits = llama_get_logits_ith(bs.ctx, -1);
    const int32_t n_vocab = llama_vocab_n_tokens(bs.vocab);
    if (rows) {
        rows->emplace_back(logits, logits + n_vocab);
    }
    return (llama_token) (std::max_element(logits, logits + n_vocab) - logits);
}

// one generated token of the sequence in a batch with the neighbour's next token (its logits not wanted)
bool decode_beside(const bench_seq & bs, llama_token tok, llama_pos pos) {
    const llama_pos pos_a = llama_memory_seq_pos_max(llama_get_memory(bs.ctx), FILL_A) + 1;
    llama_batch b = llama_batch_init(2, 0, 1);
    b.token[0] = bs.fill_a[(size_t) pos_a % bs.fill_a.size()], b.pos[0] = pos_a, b.n_seq_id[0] = 1, b.seq_id[0][0] = FILL_A;
    b.logits[0] = false;
    b.token[1] = tok, b.pos[1] = pos, b.n_seq_id[1] = 1, b.seq_id[1][0] = SEQ, b.logits[1] = true;
    b.n_tokens = 2;
    const int rc = llama_decode(bs.ctx, b);
    llama_batch_free(b);
    return rc == 0;
}

// the prompt in the pool, its cells between a neighbour's when there is room for one
bool fill(const bench_seq & bs) {
    llama_memory_clear(llama_get_memory(bs.ctx), true);
    const size_t chunk = bs.scatter || bs.chunk < bs.prompt.size() ? bs.chunk : bs.prompt.size();
    for (size_t i = 0; i < bs.prompt.size(); i += chunk) {
        const size_t to = std::min(bs.prompt.size(), i + chunk);
        if (bs.scatter && i < bs.fill_a.size() &&
            !decode(bs.ctx, FILL_A, bs.fill_a, i, std::min(bs.fill_a.size(), i + chunk), (llama_pos) i, false)) {
            return false;
        }
        // the prompt's chunk last: its last token's logits are the first answer's
        if (!decode(bs.ctx, SEQ, bs.prompt, i, to, (llama_pos) i, to == bs.prompt.size())) {
            return false;
        }
    }
    return true;
}

// while the sequence is parked, another takes cells (its own may go to it)
bool disturb(const bench_seq & bs) {
    return !bs.scatter || decode(bs.ctx, FILL_B, bs.fill_b, 0, bs.fill_b.size(), 0, false);
}

// greedy tokens [from, to) of the answer; `answer` holds the ones before (each token's logits into `rows`)
bool generate(const bench_seq & bs, std::vector<llama_token> & answer, int32_t to, step_logits * rows = nullptr) {
    while ((int32_t) answer.size() < to) {
        if (!answer.empty()) {
            const std::vector<llama_token> last = { answer.back() };
            const llama_pos pos = (llama_pos) (bs.prompt.size() + answer.size() - 1);
            const bool ok = bs.beside && bs.scatter ? decode_beside(bs, last[0], pos) : decode(bs.ctx, SEQ, last, 0, 1, pos, true);
            if (!ok) {
                return false;
            }
        }
        answer.push_back(greedy(bs, rows));
    }
    return true;
}

// the unparked answer from a fresh pool (its logits too)
bool unparked_answer(const bench_seq & bs, std::vector<llama_token> & answer, step_logits * rows) {
    answer.clear();
    return fill(bs) && generate(bs, answer, bs.n_park, rows) && disturb(bs) && generate(bs, answer, bs.n_gen, rows);
}

template <typename T> int32_t first_difference(const std::vector<T> & a, const std::vector<T> & b) {
    for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
        if (a[i] != b[i]) {
            return (int32_t) i;
        }
    }
    return a.size() == b.size() ? -1 : (int32_t) std::min(a.size(), b.size());
}

// The control (selftest_control): the unparked run again in another layout and other batches; its
// logits compared with the first's bit for bit
selftest_control run_control(const bench_seq & bs, const std::vector<llama_token> & want, const step_logits & want_logits) {
    selftest_control c;
    bench_seq other = bs;
    other.chunk  = bs.scatter ? bs.chunk / 2 : 7;  // the cells elsewhere, the prompt in other batches
    other.beside = true;                           // and each token beside the neighbour's (when there is one)
    std::vector<llama_token> answer;
    step_logits rows;
    if (!unparked_answer(other, answer, &rows)) {
        return c;
    }
    c.tried = true;
    c.first_token_diff = first_difference(answer, want);
    for (size_t i = 0; i < std::min(rows.size(), want_logits.size()) && c.first_logits_diff < 0; ++i) {
        if (rows[i].size() != want_logits[i].size() ||
            memcmp(rows[i].data(), want_logits[i].data(), rows[i].size() * sizeof(float)) != 0) {
            c.first_logits_diff = (int32_t) i;
        }
    }
    c.batch_invariant = c.first_logits_diff < 0 && c.first_token_diff < 0;
    return c;
}

void note_devices(selftest_row & row, const copy_report & rep) {
    for (const auto & d : rep.devices) {
        auto it = std::find_if(row.devices.begin(), row.devices.end(), [&](const selftest_device & x) { return x.device == d.device; });
        if (it == row.devices.end()) {
            row.devices.push_back({ d.device, 0, "", 0 });
            it = row.devices.end() - 1;
        }
        it->how    |= d.how;
        it->n_bytes  = std::max(it->n_bytes, d.n_bytes);
        if (it->why.empty() && d.why_slices) {
            it->why = d.why_slices;
        }
    }
}

selftest_row run_case(const selftest_input & in, const bench_seq & bs, const route_case & rc, const std::vector<llama_token> & want) {
    selftest_row row;
    row.route = rc.name;
    row.tried = true;
    row.answer_must_match = !rc.recompute && !rc.q8;

    swap_host host = *in.host;  // the server's pool, rates and knobs; a copier of this route's own
    host.copier = std::make_shared<seq_copier>(rc.route);
    host.copier->set_faults(in.faults);
    std::string err;
    if (rc.disk && !host.disk) {
        host.disk = disk_store::open(std::filesystem::temp_directory_path().string(), SIZE_MAX, in.disk, err);
        if (!host.disk) {
            row.tried   = false;
            row.why_not = "no --preempt-disk, and no temporary directory to write to (" + err + ")";
            return row;
        }
        row.note = "in a temporary directory (no --preempt-disk given)";
    }

    std::vector<llama_token> answer;
    if (!fill(bs) || !generate(bs, answer, bs.n_park)) {
        row.tried = false, row.why_not = "the model could not decode the test prompt";
        return row;
    }
    const seq_contexts sc { bs.ctx, nullptr, SEQ };
    if (rc.recompute) {
        llama_memory_seq_rm(llama_get_memory(bs.ctx), SEQ, -1, -1);
        if (!disturb(bs)) {
            row.tried = false, row.why_not = "the model could not decode the test prompt";
            return row;
        }
        std::vector<llama_token> all = bs.prompt;
        all.insert(all.end(), answer.begin(), answer.end() - 1);  // the last one is decoded by generate()
        const int64_t t0 = ggml_time_us();
        if (!decode(bs.ctx, SEQ, all, 0, all.size(), 0, true)) {
            row.verified = copy_check::wrong, row.mismatch = "the re-prefill failed";
            return row;
        }
        row.note = string_format("%zu tokens prefilled again in %.1f ms", all.size(), (ggml_time_us() - t0) / 1000.0);
        answer.pop_back();  // sampled again from the re-prefilled cells
        answer.push_back(greedy(bs));
    } else {
        swap_state st;
        const state_sizes n = size_state(sc);
        auto out = swap_out(st, sc, n, host, true);
        note_devices(row, out.report);
        row.n_bytes   = n.total();
        row.park_gbps = out.t_us > 0 ? n.total() / (out.t_us * 1e3) : 0;
        settle_copy(st, *host.copier);  // a device's transfer landed: its check decided (st.verified)
        if (!out.ok || st.verified == copy_check::wrong) {
            const auto & m = out.ok ? st.mismatch : out.mismatch;
            row.mismatch = out.verified == copy_check::wrong || st.verified == copy_check::wrong ? "park: " + m.describe() : std::string("park failed: ") + out.why;
            row.verified = copy_check::wrong;
            return row;
        }
        q8_form form;
        if (rc.q8) {
            // packed while the cells are still in place, as the compressed tier does; unpacked below,
            // before the restore (whose copies are checked against the unpacked bytes)
            std::string why;
            const size_t full = st.bytes();
            if (!compress_state(st, sc, host, form, why)) {
                row.tried = false, row.why_not = "the state could not be packed to q8_0: " + why;
                return row;
            }
            row.note = string_format("%.2f MiB held as %.2f MiB", full / 1048576.0, st.bytes() / 1048576.0);
        }
        if (rc.disk) {
            const auto dr = disk_park(st, host, false, std::move(out.ref));
            if (!dr.ok()) {
                row.verified = copy_check::wrong, row.mismatch = "disk write failed: " + dr.why;
                return row;
            }
        }
        llama_memory_seq_rm(llama_get_memory(bs.ctx), SEQ, -1, -1);
        if (!disturb(bs)) {
            row.tried = false, row.why_not = "the model could not decode the test prompt";
            return row;
        }
        if (rc.disk) {
            const auto dr = disk_read_back(st, host);
            if (!dr.ok() || dr.verified == copy_check::wrong) {
                row.verified = copy_check::wrong;
                row.mismatch = dr.ok() ? "disk: the bytes read back differ from upstream's at the park" : "disk read back failed: " + dr.why;
                return row;
            }
        }
        if (rc.q8) {
            std::string why;
            if (!expand_state(st, form, host, why)) {
                row.verified = copy_check::wrong, row.mismatch = "unpacking failed: " + why;
                return row;
            }
        }
        if (rc.ahead) {
            settle_copy(st, *host.copier);
            if (!host.copier->can_prefetch()) {
                row.tried   = false;
                row.why_not = "every KV tensor is in host memory: there is no device to upload to ahead";
                row.devices.clear();
                return row;
            }
            restore_ahead(st, *host.copier);
        }
        auto back = swap_in(st, sc, host, true);
        note_devices(row, back.report);
        row.restore_gbps = back.t_us > 0 ? st.bytes() / (back.t_us * 1e3) : 0;
        if (!back.ok) {
            row.verified = copy_check::wrong;
            row.mismatch = back.verified == copy_check::wrong ? "restore: " + back.mismatch.describe() : std::string("restore failed: ") + back.why;
            return row;
        }
        if (rc.ahead && !back.report.prefetched) {
            row.note = "the restore did not find its bytes uploaded ahead";
        }
        row.verified = copy_check::right;
    }
    if (!generate(bs, answer, bs.n_gen)) {
        row.verified = copy_check::wrong, row.mismatch = "decoding after the resume failed";
        return row;
    }
    row.same_answer = answer == want;
    row.first_diff  = first_difference(answer, want);
    return row;
}

std::vector<llama_token> tokenize(const llama_vocab * vocab, const std::string & text, bool bos) {
    std::vector<llama_token> toks(text.size() + 8);
    const int n = llama_tokenize(vocab, text.c_str(), (int32_t) text.size(), toks.data(), (int32_t) toks.size(), bos, false);
    toks.resize(std::max(0, n));
    return toks;
}

// `n` tokens of the text, repeated as needed
std::vector<llama_token> tokens_of(const llama_vocab * vocab, const std::string & text, size_t n, bool bos) {
    std::vector<llama_token> base = tokenize(vocab, text, bos);
    const std::vector<llama_token> more = tokenize(vocab, " " + text, false);
    while (!more.empty() && base.size() < n) {
        base.insert(base.end(), more.begin(), more.end());
    }
    base.resize(std::min(base.size(), n));
    return base;
}

} // namespace

selftest_result run_selftest(const selftest_input & in) {
    selftest_result res;
    bench_seq bs { in.ctx, llama_model_get_vocab(llama_get_model(in.ctx)), {}, {}, {} };
    const uint32_t n_ctx = llama_n_ctx(in.ctx);
    const size_t n_prompt = std::clamp<size_t>(n_ctx / 4, 8, 128);
    bs.n_gen   = std::clamp<int32_t>((int32_t) (n_ctx / 8), 4, 16);
    bs.n_park  = bs.n_gen / 3 + 1;
    bs.scatter = llama_n_seq_max(in.ctx) > (uint32_t) FILL_B;
    bs.prompt = tokens_of(bs.vocab, "Once upon a time, there was a little girl named Lily. She loved to play outside in the park with her dog.", n_prompt, true);
    bs.fill_a = tokens_of(bs.vocab, "The sun was warm and the sky was blue. Tom saw a big red ball under the tree.", n_prompt, true);
    bs.fill_b = tokens_of(bs.vocab, "One day, a little bird flew down to the garden and sang a happy song.", n_prompt / 2, true);
    res.n_prompt = (int32_t) bs.prompt.size();
    res.n_gen    = bs.n_gen;
    res.n_seqs   = bs.scatter ? 3 : 1;
    if (!bs.scatter) {
        res.not_tried.push_back(string_format("scattered cells: the context holds %u sequence(s), the test needs 3 to place the parked "
                                              "sequence between others (start with -np 3 or more)", llama_n_seq_max(in.ctx)));
    }
    if (in.has_draft) {
        res.not_tried.push_back("the draft/MTP context: the test parks the target context only (the draft's state moves by the same "
                                "copier, and the serving guard checks it)");
    }

    // the unparked answer, and the control: the same without a park in another layout and other batches
    std::vector<llama_token> want;
    step_logits want_logits;
    if (!unparked_answer(bs, want, &want_logits)) {
        res.not_tried.push_back("everything: the model could not decode the test prompt");
        return res;
    }
    res.control = run_control(bs, want, want_logits);
    if (!res.control.tried) {
        res.not_tried.push_back("the control (the unparked answer in other batches): the model could not decode it");
    }

    const route_case cases[] = {
        { "bulk",          copy_route::bulk },
        { "graphs",        copy_route::graph },
        { "slices",        copy_route::per_slice },
        { "restore ahead", copy_route::bulk, true },
        { "disk",          copy_route::bulk, false, true },
        { "ram_q8",        copy_route::bulk, false, false, false, true },
        { "recompute",     copy_route::bulk, false, false, true },
    };
    for (const auto & rc : cases) {
        // restore ahead uploads to a device: with every KV tensor in host memory there is none
        const bool on_device = !res.rows.empty() && std::any_of(res.rows[0].devices.begin(), res.rows[0].devices.end(),
                                                                [](const selftest_device & d) { return d.device != "CPU"; });
        if (rc.ahead && !res.rows.empty() && res.rows[0].tried && !on_device) {
            selftest_row row;
            row.route   = rc.name;
            row.why_not = "every KV tensor is in host memory: there is no device to upload to ahead";
            res.rows.push_back(row);
            continue;
        }
        selftest_row row = run_case(in, bs, rc, want);
        // every copy exact, yet another answer: a wrong copy only where the backend's answers do not follow the batch
        if (row.tried && row.verified == copy_check::right && !row.same_answer && row.answer_must_match &&
            res.control.tried && !res.control.batch_invariant) {
            row.answer_explained = true;
        }
        res.rows.push_back(row);
    }
    llama_memory_clear(llama_get_memory(in.ctx), true);

    size_t n_bytes = 1 << 20;
    for (const auto & r : res.rows) {
        n_bytes = std::max(n_bytes, r.n_bytes);
    }
    res.links = measure_link_speeds(n_bytes, 3);

    // what each device the copies moved lacks: none is an error, each has a next route
    std::vector<std::string> seen;
    for (const auto & r : res.rows) {
        for (const auto & d : r.devices) {
            ggml_backend_dev_t dev = ggml_backend_dev_by_name(d.device.c_str());
            if (dev == nullptr || ggml_backend_dev_type(dev) == GGML_BACKEND_DEVICE_TYPE_CPU ||
                std::find(seen.begin(), seen.end(), d.device) != seen.end()) {
                continue;
            }
            seen.push_back(d.device);
            ggml_backend_dev_props p;
            ggml_backend_dev_get_props(dev, &p);
            if (!p.caps.async || !p.caps.events) {
                res.device_notes.push_back(d.device + ": no " + (!p.caps.async ? "asynchronous copies" : "events") +
                                           ": each park waits for its transfer to host RAM (right, without the overlap with the next decode)");
            }
            if (!p.caps.host_buffer) {
                res.device_notes.push_back(d.device + ": no pinned host memory: swap buffers are ordinary host memory "
                                           "(transfers may be slower)");
            }
        }
    }
    return res;
}

} // namespace llama_preempt
