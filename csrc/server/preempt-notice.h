// What a client sees of preemption in its own stream, and the slot actions park / unpark.
//
// A streamed request that is parked gets the SSE comment ": preempted", then ": preempt-keepalive"
// every --preempt-keepalive seconds while it waits, then ": resumed". Comments are legal SSE that
// clients ignore, so the data lines of the stream are unchanged; the keepalives keep idle-timeout
// proxies and clients from giving up on an answer that is only waiting.
#pragma once

#include "ggml.h"
#include "server-task.h"

#include <algorithm>
#include <string>

namespace llama_preempt {

// sent by the main loop to a streamed request's reader when it is parked or resumed
struct stream_notice_result : server_task_result {
    std::string kind;  // "preempted" or "resumed"

    bool is_stop() override {
        return false;  // not a result of the task: the reader keeps waiting for those
    }

    json to_json() override {
        return json{ { "preempt_notice", kind } };
    }
};

// per stream, on its HTTP thread: is the request parked, and when did it last hear from us
struct stream_notices {
    int64_t keepalive_us = 0;
    bool    parked       = false;
    int64_t t_last_us    = 0;

    explicit stream_notices(int32_t keepalive_s) : keepalive_us(int64_t(keepalive_s) * 1000000) {}

    // a notice becomes its SSE comment; false for any other result
    bool take(server_task_result * result, std::string & output) {
        auto * partial = dynamic_cast<server_task_result_cmpl_partial *>(result);
        if (partial != nullptr && partial->is_begin) {
            // a request parked before it started: its notice opened the stream, and the begin
            // marker (headers only) that follows its resume has nothing left to send
            output.clear();
            return true;
        }
        auto * n = dynamic_cast<stream_notice_result *>(result);
        if (n == nullptr) {
            return false;
        }
        parked    = n->kind == "preempted";
        t_last_us = ggml_time_us();
        output    = ": " + n->kind + "\n\n";
        return true;
    }

    bool keepalive_due() const {
        return parked && keepalive_us > 0 && ggml_time_us() - t_last_us >= keepalive_us;
    }

    std::string keepalive() {
        t_last_us = ggml_time_us();
        return ": preempt-keepalive\n\n";
    }
};

inline bool is_slot_action(const std::string & action) {
    return action == "park" || action == "unpark";
}

// A request body that is not JSON, or a field of the wrong JSON type, is the client's mistake: a 400
// with the parser's point in short, not a 500 with its raw text ("[json.exception.parse_error.101]
// parse error at line 1, column 15: syntax error while parsing object key - invalid literal; last
// read: ...")
inline std::string client_json_error(const std::string & what) {
    std::string msg = what;
    const size_t tag = msg.find("] ");
    if (msg.rfind("[json.exception.", 0) == 0 && tag != std::string::npos) {
        msg = msg.substr(tag + 2);
    }
    // bytes that are not UTF-8: say so, and where (the parser's point), not a bare "syntax error"
    if (what.find("ill-formed UTF-8") != std::string::npos) {
        const size_t at = msg.find("at line ");
        const size_t end = at == std::string::npos ? std::string::npos : msg.find(':', at);
        const std::string where = at == std::string::npos ? std::string("") : " " + msg.substr(at, end - at);
        return "the request body is not valid UTF-8: a byte" + where + " is not UTF-8 (JSON text, and so a prompt, "
               "must be UTF-8: send the text encoded as UTF-8, or escape it as \\uXXXX)";
    }
    const size_t detail = msg.find(" - ");  // the parser's "- invalid literal; last read: ..." tail
    if (detail != std::string::npos) {
        msg = msg.substr(0, detail);
    }
    const bool parse = what.find("parse_error") != std::string::npos;
    return (parse ? "the request body is not valid JSON: " : "invalid request: ") + msg;
}

// a body over the HTTP server's limit (cpp-httplib answers 413 before any handler runs): the error
// in upstream's JSON shape, with the limit in words
inline std::string payload_too_large_error(size_t limit) {
    return "the request body is larger than this server takes (" + std::to_string(limit >> 20) + " MiB, its "
           "--max-body-mib): send a shorter prompt, or split the work into several requests";
}

// POST /slots/{id}?action=...: the actions there are, ours and upstream's; "" for one of them, else
// the 400 message (an unknown action is the client's mistake, not a missing --slot-save-path)
inline std::string unknown_slot_action(const std::string & action) {
    if (is_slot_action(action) || action == "save" || action == "restore" || action == "erase") {
        return "";
    }
    return "unknown slot action '" + action + "': use park or unpark, or save, restore or erase (these three need "
           "--slot-save-path)";
}

// The slot API's id (POST /slots/{id}): digits only, a whole number. Anything else ("1.5", "0x1",
// "0%00", "-1", " 1") is the 400 message naming the id, where std::stoi took a prefix of it; "" when
// `id` is set. Its range is the slots' count, checked where the slots are.
inline std::string parse_slot_id(const std::string & text, int & id) {
    const bool digits = !text.empty() && text.size() <= 9 &&
                        std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; });
    if (digits) {
        id = std::stoi(text);
        return "";
    }
    std::string shown;  // the id as sent, its control bytes written out
    for (char c : text.substr(0, 32)) {
        const auto u = (unsigned char) c;
        shown += u < 0x20 || u >= 0x7f ? string_format("\\x%02x", u) : std::string(1, c);
    }
    return "Invalid slot ID '" + shown + "': a slot id is a whole number (0, 1, 2, ...)";
}

// the answer to POST /slots/{id}?action=park|unpark
struct slot_action_result : server_task_result {
    json data;

    json to_json() override {
        return data;
    }
};

} // namespace llama_preempt
