#pragma once
// llama-preempt: tool_choice as OpenAI defines it. Upstream reads it as a string only, so the
// named-function object ({"type": "function", "function": {"name": X}}) became "auto" with a log
// line the client never sees. Here each form is honoured or refused: a named function is a
// required call among the tools narrowed to X (the template, the grammar and the parser then see
// one tool), and anything else is the client's mistake, a 400 that names the field.

#include <stdexcept>
#include <string>

namespace llama_preempt {

inline std::invalid_argument tool_choice_error(const std::string & why) {
    return std::invalid_argument("Invalid value for 'tool_choice': " + why +
                                 " (expected \"none\", \"auto\", \"required\" or "
                                 "{\"type\": \"function\", \"function\": {\"name\": \"...\"}})");
}

// the name a tool of `tools` (OpenAI's {"type": "function", "function": {"name": ...}}) goes by, or ""
template <typename Json>
std::string tool_name_of(const Json & tool) {
    if (!tool.is_object() || !tool.contains("function") || !tool.at("function").is_object()) {
        return "";
    }
    const Json & fn = tool.at("function");
    return fn.contains("name") && fn.at("name").is_string() ? fn.at("name").template get<std::string>() : "";
}

// the named function of a tool_choice object: Chat Completions' {"type": "function", "function":
// {"name": X}} or the Responses API's {"type": "function", "name": X}
template <typename Json>
std::string named_function_of(const Json & choice) {
    const std::string type = choice.contains("type") && choice.at("type").is_string()
        ? choice.at("type").template get<std::string>() : "";
    if (type != "function") {
        throw tool_choice_error("an object's \"type\" must be \"function\", got " +
                                (choice.contains("type") ? choice.at("type").dump() : std::string("none")));
    }
    const Json * holder = &choice;
    if (choice.contains("function")) {
        if (!choice.at("function").is_object()) {
            throw tool_choice_error("\"function\" must be an object with a \"name\"");
        }
        holder = &choice.at("function");
    }
    if (!holder->contains("name") || !holder->at("name").is_string() || holder->at("name").template get<std::string>().empty()) {
        throw tool_choice_error("the function to call needs a \"name\"");
    }
    return holder->at("name").template get<std::string>();
}

// the mode upstream's parser takes ("none", "auto" or "required") for a request's tool_choice;
// a named function narrows `tools` to that one tool and is "required". Absent or null is "auto"
template <typename Json>
std::string tool_choice_of(const Json & body, Json & tools) {
    if (!body.contains("tool_choice") || body.at("tool_choice").is_null()) {
        return "auto";
    }
    const Json & choice   = body.at("tool_choice");
    const bool   has_tools = tools.is_array() && !tools.empty();
    if (choice.is_string()) {
        const std::string mode = choice.template get<std::string>();
        if (mode != "none" && mode != "auto" && mode != "required") {
            throw tool_choice_error("\"" + mode + "\" is not a choice");
        }
        if (mode == "required" && !has_tools) {
            throw tool_choice_error("\"required\" needs at least one tool in 'tools'");
        }
        return mode;
    }
    if (!choice.is_object()) {
        throw tool_choice_error("must be a string or an object, got " + choice.dump());
    }
    const std::string name = named_function_of(choice);
    if (!has_tools) {
        throw tool_choice_error("names the function \"" + name + "\" but the request has no 'tools'");
    }
    std::string known;
    for (const auto & tool : tools) {
        if (tool_name_of(tool) == name) {
            tools = Json::array({ tool });
            return "required";
        }
        known += (known.empty() ? "" : ", ") + tool_name_of(tool);
    }
    throw tool_choice_error("names the function \"" + name + "\", which is not among 'tools' (" + known + ")");
}

} // namespace llama_preempt
