// llama-preempt: the self-test of every park route (preempt-selftest.h): its table, its report for
// bug reports, and its JSON.
#include "preempt-selftest.h"

#include "common.h"

#include <algorithm>
#include <cstring>

namespace llama_preempt {

namespace {

// the link a device's copies go over: memcpy for the CPU, the transfers for a device
std::string link_of(const std::vector<link_speed> & links, const std::string & device) {
    double d2h = 0, h2d = 0, mem = 0;
    for (const auto & l : links) {
        if (l.what == "memcpy") {
            mem = l.gbps;
        } else if (l.device == device) {
            (l.what == "device_to_host" ? d2h : h2d) = l.gbps;
        }
    }
    if (d2h > 0 || h2d > 0) {
        return string_format("%.2f / %.2f", d2h, h2d);
    }
    return mem > 0 ? string_format("%.2f memcpy", mem) : std::string("-");
}

std::string result_of(const selftest_row & r) {
    if (!r.tried) {
        return "not tried: " + r.why_not;
    }
    if (r.verified == copy_check::wrong) {
        return "MISMATCH at " + r.mismatch;
    }
    std::string s = r.verified == copy_check::right ? "verified" : "nothing to check byte for byte";
    if (r.same_answer) {
        s += ", same answer as unparked";
    } else if (r.answer_explained) {
        s += string_format(", answer differs at token %d (copies exact; this backend's answers depend on the batch)", r.first_diff);
    } else if (r.answer_must_match) {
        s += string_format(", ANSWER DIFFERS from the unparked one at token %d", r.first_diff);
    } else {
        s += string_format(", answer differs from token %d (recompute may: it prefills in other batch shapes)", r.first_diff);
    }
    return s;
}

std::string json_str(const std::string & s) {
    std::string o = "\"";
    for (char c : s) {
        if (c == '"' || c == '\\') {
            o += '\\';
            o += c;
        } else if ((unsigned char) c < 0x20) {
            o += string_format("\\u%04x", c);
        } else {
            o += c;
        }
    }
    return o + "\"";
}

// what the control found (selftest_control), for the table's foot and the report
std::string control_of(const selftest_control & c) {
    if (!c.tried) {
        return "not run";
    }
    if (c.batch_invariant) {
        return "batch-invariant: the unparked answer recomputed in another layout and other batches has the same logits, bit for bit";
    }
    return string_format("this backend's answers depend on the batch: the unparked answer recomputed in another layout and other "
                         "batches, no park, %s (logits first differ at token %d)",
                         c.first_token_diff >= 0 ? string_format("differs at token %d", c.first_token_diff).c_str()
                                                 : "has the same tokens but other logits",
                         c.first_logits_diff);
}

} // namespace

void print_selftest(FILE * out, const selftest_input & in, const selftest_result & res) {
    char desc[256] = "";
    llama_model_desc(llama_get_model(in.ctx), desc, sizeof(desc));
    fprintf(out, "\nllama-preempt self-test: every park route on %s, %u cells, a %d-token prompt and %d generated tokens, "
                 "%s\n\n", desc, llama_n_ctx(in.ctx), res.n_prompt, res.n_gen,
            res.n_seqs > 1 ? "its cells scattered among two other sequences'" : "alone in the pool");
    fprintf(out, "%-14s %-22s %-32s %9s %10s %12s %-17s %s\n", "route", "device", "moved by", "MiB", "park GB/s", "restore GB/s",
            "link GB/s", "result");
    for (const auto & r : res.rows) {
        if (!r.tried || r.devices.empty()) {
            fprintf(out, "%-14s %-22s %-32s %9s %10s %12s %-17s %s\n", r.route.c_str(), "-", "-", "-", "-", "-", "-", result_of(r).c_str());
            continue;
        }
        for (size_t i = 0; i < r.devices.size(); ++i) {
            const auto & d = r.devices[i];
            const std::string how = std::string(copy_how_name(d.how)) + (d.why.empty() ? "" : " *");
            const bool first = i == 0;
            fprintf(out, "%-14s %-22s %-32s %9.2f %10s %12s %-17s %s\n", first ? r.route.c_str() : "", d.device.c_str(), how.c_str(),
                    d.n_bytes / 1048576.0, first ? string_format("%.2f", r.park_gbps).c_str() : "",
                    first ? string_format("%.2f", r.restore_gbps).c_str() : "", link_of(res.links, d.device).c_str(),
                    first ? result_of(r).c_str() : "");
        }
        for (const auto & d : r.devices) {
            if (!d.why.empty()) {
                fprintf(out, "%-14s * %s: slices one at a time because of %s\n", "", d.device.c_str(), d.why.c_str());
            }
        }
        if (!r.note.empty()) {
            fprintf(out, "%-14s %s\n", "", r.note.c_str());
        }
    }
    fprintf(out, "\nlink GB/s: host memcpy, or a device's device-to-host / host-to-device transfers (pinned where it offers it); "
                 "a park or restore of many MiB far below its link is worth a bug report (a state of a few MiB or less measures "
                 "the copy's latency, not the link).\n");
    fprintf(out, "numerics: %s\n", control_of(res.control).c_str());
    for (const auto & w : res.device_notes) {
        fprintf(out, "device: %s\n", w.c_str());
    }
    for (const auto & w : res.not_tried) {
        fprintf(out, "not tried: %s\n", w.c_str());
    }
    const size_t n_bad = std::count_if(res.rows.begin(), res.rows.end(), [](const selftest_row & r) { return !r.ok(); });
    const size_t n_ran = std::count_if(res.rows.begin(), res.rows.end(), [](const selftest_row & r) { return r.tried; });
    const size_t n_explained = std::count_if(res.rows.begin(), res.rows.end(), [](const selftest_row & r) {
        return r.tried && !r.same_answer && r.answer_explained;
    });
    if (n_bad == 0 && n_explained > 0) {
        fprintf(out, "\nresult: OK, %zu routes tried, every copy verified byte for byte. Copies exact; this backend's answers depend "
                     "on the batch, so %zu SWAP answer(s) differ from the unparked one as an unparked answer in other batches does "
                     "(see numerics); use --deterministic where it is supported (the CPU) for equal answers\n", n_ran, n_explained);
    } else if (n_bad == 0) {
        fprintf(out, "\nresult: OK, %zu routes tried, every copy verified byte for byte%s\n", n_ran,
                res.rows.empty() ? " (none ran)" : ", SWAP answers equal to the unparked one");
    } else {
        fprintf(out, "\nresult: FAILED, %zu of %zu routes wrong. The serving server's copy guard (--preempt-verify) moves a device "
                     "whose copies go wrong to single slices, or turns SWAP off; --preempt-mode recompute avoids SWAP altogether. "
                     "Please report it with the lines below.\n", n_bad, n_ran);
    }

    fprintf(out, "\n--- report (paste this into a bug report) ---\n");
    fprintf(out, "build: %s\n", in.build.c_str());
    fprintf(out, "system: %s\n", llama_print_system_info());
    fprintf(out, "model: %s, %d layers, %.1f MiB\n", desc, llama_model_n_layer(llama_get_model(in.ctx)),
            llama_model_size(llama_get_model(in.ctx)) / 1048576.0);
    std::string flags;
    for (const auto & f : in.flags) {
        flags += (flags.empty() ? "" : " ") + f;
    }
    fprintf(out, "flags: %s\n", flags.c_str());
    for (size_t i = 0; i < ggml_backend_reg_count(); ++i) {
        ggml_backend_reg_t reg = ggml_backend_reg_get(i);
        fprintf(out, "backend: %s (%zu device(s))\n", ggml_backend_reg_name(reg), ggml_backend_reg_dev_count(reg));
    }
    for (size_t i = 0; i < ggml_backend_dev_count(); ++i) {
        ggml_backend_dev_t dev = ggml_backend_dev_get(i);
        ggml_backend_dev_props p;
        ggml_backend_dev_get_props(dev, &p);
        fprintf(out, "device: %s - %s, %.0f MiB, id %s, async %s, events %s, pinned host memory %s\n", p.name, p.description,
                p.memory_total / 1048576.0, p.device_id ? p.device_id : "(none)", p.caps.async ? "yes" : "no",
                p.caps.events ? "yes" : "no", p.caps.host_buffer ? "yes" : "no");
    }
    fprintf(out, "driver: not reported by ggml (the device descriptions above are what it reports)\n");
    fprintf(out, "numerics: %s\n", control_of(res.control).c_str());
    for (const auto & r : res.rows) {
        fprintf(out, "route %s: %s\n", r.route.c_str(), result_of(r).c_str());
    }
    fprintf(out, "--- end of report ---\n");
}

std::string selftest_json(const selftest_input & in, const selftest_result & res) {
    std::string o = "{";
    o += "\"ok\": " + std::string(res.ok() ? "true" : "false");
    o += ", \"build\": " + json_str(in.build);
    o += string_format(", \"n_prompt\": %d, \"n_gen\": %d, \"n_seqs\": %d", res.n_prompt, res.n_gen, res.n_seqs);
    o += ", \"routes\": [";
    for (size_t i = 0; i < res.rows.size(); ++i) {
        const auto & r = res.rows[i];
        o += i ? ", " : "";
        o += "{\"route\": " + json_str(r.route) + string_format(", \"tried\": %s", r.tried ? "true" : "false");
        o += ", \"why_not\": " + json_str(r.why_not);
        o += string_format(", \"n_bytes\": %zu, \"park_gbps\": %.4f, \"restore_gbps\": %.4f, \"verified\": %d", r.n_bytes, r.park_gbps,
                           r.restore_gbps, copy_check_number(r.verified));
        o += ", \"mismatch\": " + json_str(r.mismatch);
        o += string_format(", \"same_answer\": %s, \"first_diff\": %d, \"answer_must_match\": %s, \"answer_explained\": %s, \"ok\": %s",
                           r.same_answer ? "true" : "false", r.first_diff, r.answer_must_match ? "true" : "false",
                           r.answer_explained ? "true" : "false", r.ok() ? "true" : "false");
        o += ", \"note\": " + json_str(r.note) + ", \"devices\": [";
        for (size_t j = 0; j < r.devices.size(); ++j) {
            const auto & d = r.devices[j];
            o += j ? ", " : "";
            o += "{\"device\": " + json_str(d.device) + ", \"moved_by\": " + json_str(copy_how_name(d.how)) + ", \"why\": " +
                 json_str(d.why) + string_format(", \"n_bytes\": %zu}", d.n_bytes);
        }
        o += "]}";
    }
    o += "], \"links\": [";
    for (size_t i = 0; i < res.links.size(); ++i) {
        const auto & l = res.links[i];
        o += (i ? ", " : "") + std::string("{\"device\": ") + json_str(l.device) + ", \"what\": " + json_str(l.what) +
             string_format(", \"gbps\": %.4f, \"pinned\": %s}", l.gbps, l.pinned ? "true" : "false");
    }
    o += string_format("], \"control\": {\"tried\": %s, \"batch_invariant\": %s, \"first_logits_diff\": %d, \"first_token_diff\": %d}",
                       res.control.tried ? "true" : "false", res.control.batch_invariant ? "true" : "false",
                       res.control.first_logits_diff, res.control.first_token_diff);
    o += ", \"device_notes\": [";
    for (size_t i = 0; i < res.device_notes.size(); ++i) {
        o += (i ? ", " : "") + json_str(res.device_notes[i]);
    }
    o += "], \"not_tried\": [";
    for (size_t i = 0; i < res.not_tried.size(); ++i) {
        o += (i ? ", " : "") + json_str(res.not_tried[i]);
    }
    o += "]}";
    return o;
}

} // namespace llama_preempt
