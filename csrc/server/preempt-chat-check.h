// llama-preempt: a chat request's `messages` checked as the caller's mistake before upstream reads
// them. Upstream renders an empty list and any role ("wizard") without a word, and reports a
// message without a role as a server error (a 500 from common_chat_msgs_parse_oaicompat's
// runtime_error). The server answers what this returns with a 400 (server-common.cpp,
// oaicompat_chat_params_parse), and the Python library raises it as a ValueError before it submits
// (llama_preempt._core.chat_messages_error), so the rule is written once. Header-only; Json is
// upstream's common json (anything with its few members).
#pragma once

#include <string>

namespace llama_preempt {

// the roles of OpenAI's chat API, and "ipython", which Llama 3's chat template gives tool results
inline const char * const k_chat_roles[] = { "system", "developer", "user", "assistant", "tool", "function", "ipython" };

inline std::string chat_roles_list() {
    std::string s;
    for (const char * r : k_chat_roles) {
        s += (s.empty() ? "" : ", ") + std::string(r);
    }
    return s;
}

// why these messages cannot be rendered, "" when they can. The server takes an empty list
// (allow_empty: upstream renders its defaults, and its own Anthropic tests ask for that); the
// library, which always has something to say, calls an empty list a mistake.
template <typename Json>
std::string chat_messages_error(const Json & messages, bool allow_empty) {
    if (!messages.is_array()) {
        return "'messages' must be a list of {\"role\": ..., \"content\": ...} objects";
    }
    if (messages.empty() && !allow_empty) {
        return "'messages' is empty: give at least one message";
    }
    for (size_t i = 0; i < messages.size(); i++) {
        const auto & m = messages[i];
        const std::string at = "messages[" + std::to_string(i) + "]";
        if (!m.is_object()) {
            return at + " must be an object with 'role' and 'content'";
        }
        if (!m.contains("role")) {
            return at + " has no 'role' (one of " + chat_roles_list() + ")";
        }
        if (!m.at("role").is_string()) {
            return at + ".role must be a string (one of " + chat_roles_list() + ")";
        }
        const std::string role = m.at("role").template get<std::string>();
        bool known = false;
        for (const char * r : k_chat_roles) {
            known = known || role == r;
        }
        if (!known) {
            return at + ".role '" + role + "' is not one of " + chat_roles_list();
        }
        // as upstream: "content": null counts as given (an assistant turn that only called tools)
        const bool has_content = m.contains("content");
        if (has_content && !m.at("content").is_null() && !m.at("content").is_string() && !m.at("content").is_array()) {
            return at + ".content must be a string, a list of content parts, or null";
        }
        if (!has_content && !(role == "assistant" && m.contains("tool_calls"))) {
            return at + " has no 'content'" + (role == "assistant" ? " (nor 'tool_calls')" : "");
        }
    }
    return "";
}

} // namespace llama_preempt
