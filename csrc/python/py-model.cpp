// llama_preempt._core: what the library's llama-cpp-python and vLLM calls ask that no route
// answers: the loaded model's facts (token_bos(), n_vocab(), metadata), the request fields a call
// may set (upstream's own request schema, tools/server/server-schema.cpp: the names, types and
// hard limits behind the server's 400s, so that the library checks a call's keywords by the same
// rule before it submits), and the chat messages check the server's chat routes run.
#include "py-model.h"

#include <pybind11/stl.h>

#include "common.h"
#include "llama.h"
#include "preempt-chat-check.h"
#include "server-schema.h"

#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

namespace py = pybind11;
using namespace server_schema;

namespace {

// one numeric field: its kind and, when the server refuses values outside them (a 400, not a clamp),
// its limits
template <typename T>
bool describe_num(const field & f, const char * kind, py::dict & d) {
    const auto * n = dynamic_cast<const field_num<T> *>(&f);
    if (n == nullptr) {
        return false;
    }
    d["kind"] = kind;
    d["hard"] = n->is_hard_limit;
    d["min"]  = n->min == std::numeric_limits<T>::lowest() ? py::object(py::none()) : py::object(py::float_((double) n->min));
    d["max"]  = n->max == std::numeric_limits<T>::max()    ? py::object(py::none()) : py::object(py::float_((double) n->max));
    d["bool_alias"] = n->bool_alias ? py::object(py::str(n->bool_alias)) : py::object(py::none());
    // what the field's type holds: beyond it the server refuses any value (checked_number; an
    // unsigned field takes -1 as "the default")
    d["repr_min"] = std::is_unsigned<T>::value ? -1.0 : (double) std::numeric_limits<T>::lowest();
    d["repr_max"] = (double) std::numeric_limits<T>::max();
    return true;
}

py::dict describe(const field & f) {
    py::dict d;
    py::list names;
    for (const char * n : f.name) {
        names.append(py::str(n));
    }
    d["names"] = names;
    d["desc"]  = py::str(f.desc);
    if (describe_num<int32_t>(f, "int", d) || describe_num<uint32_t>(f, "int", d) || describe_num<int64_t>(f, "int", d) ||
        describe_num<uint64_t>(f, "int", d) || describe_num<float>(f, "float", d) || describe_num<double>(f, "float", d)) {
        return d;
    }
    if (dynamic_cast<const field_bool *>(&f) != nullptr) {
        d["kind"] = "bool";
    } else if (dynamic_cast<const field_str *>(&f) != nullptr) {
        d["kind"] = "str";
    } else if (const auto * nested = dynamic_cast<const field_nested *>(&f)) {
        d["kind"] = "object";
        py::list sub;
        for (const auto & s : nested->subfields) {
            sub.append(describe(*s));
        }
        d["fields"] = sub;
    } else {
        d["kind"] = "json";  // a handler reads it: its shape is told by the caller's own rule
    }
    return d;
}

} // namespace

py::list request_fields(const common_params & params) {
    task_params scratch;  // the schema binds each field to a member; nothing is evaluated here
    py::list out;
    for (const auto & f : make_llama_cmpl_schema(params, scratch)) {
        out.append(describe(*f));
    }
    return out;
}

py::dict model_info(const llama_context * lctx) {
    const llama_model * model = llama_get_model(lctx);
    const llama_vocab * vocab = llama_model_get_vocab(model);
    py::dict d;
    d["n_ctx"]       = llama_n_ctx(lctx);
    d["n_ctx_train"] = llama_model_n_ctx_train(model);
    d["n_embd"]      = llama_model_n_embd(model);
    d["n_vocab"]     = llama_vocab_n_tokens(vocab);
    d["token_bos"]   = llama_vocab_bos(vocab);
    d["token_eos"]   = llama_vocab_eos(vocab);
    d["token_nl"]    = llama_vocab_nl(vocab);
    d["add_bos"]     = llama_vocab_get_add_bos(vocab);
    d["pooling"]     = (int) llama_pooling_type(lctx);  // 0: none (one embedding per token)
    const char * tmpl = llama_model_chat_template(model, nullptr);
    d["chat_template"] = tmpl ? py::object(py::str(tmpl)) : py::object(py::none());
    py::dict meta;
    std::vector<char> buf(256);
    auto read = [&](auto fn, int32_t i) {
        int32_t n = fn(model, i, buf.data(), buf.size());
        if (n >= (int32_t) buf.size()) {
            buf.resize(n + 1);
            n = fn(model, i, buf.data(), buf.size());
        }
        return n < 0 ? std::string() : std::string(buf.data(), n);
    };
    for (int32_t i = 0; i < llama_model_meta_count(model); i++) {
        meta[py::str(read(llama_model_meta_key_by_index, i))] = py::str(read(llama_model_meta_val_str_by_index, i));
    }
    d["metadata"] = meta;
    return d;
}

std::vector<llama_token> tokenize(const llama_context * lctx, const std::string & text, bool add_special, bool parse_special) {
    const llama_vocab * vocab = llama_model_get_vocab(llama_get_model(lctx));
    // the GIL stays held: close() frees the model with it released, and must not free it under us
    return common_tokenize(vocab, text, add_special, parse_special);
}

py::bytes detokenize(const llama_context * lctx, const std::vector<llama_token> & tokens, bool special) {
    const llama_vocab * vocab = llama_model_get_vocab(llama_get_model(lctx));
    const int32_t n_vocab = llama_vocab_n_tokens(vocab);
    std::string out;
    for (size_t i = 0; i < tokens.size(); i++) {
        if (tokens[i] < 0 || tokens[i] >= n_vocab) {
            throw std::invalid_argument("tokens[" + std::to_string(i) + "] = " + std::to_string(tokens[i]) +
                                        " is not a token id of this model (0 to " + std::to_string(n_vocab - 1) + ")");
        }
        // the bytes of each piece, as llama-cpp-python's detokenize returns them (a piece may hold
        // part of a UTF-8 character; the caller joins and decodes)
        out += common_token_to_piece(vocab, tokens[i], special);
    }
    return py::bytes(out);
}

void register_model(py::module_ & m) {
    m.def("request_fields", []() {
        common_params defaults;
        return request_fields(defaults);
    }, "the request fields of upstream's completion schema under default server parameters: a list of "
       "{'names', 'kind', 'min', 'max', 'hard', 'bool_alias', 'desc'} (an Engine's own: EngineCore.request_fields())");
    m.def("chat_messages_error", [](const std::string & messages_json) {
        try {
            return llama_preempt::chat_messages_error(json::parse(messages_json), /* allow_empty = */ false);
        } catch (const common_json_error &) {
            return std::string("'messages' is not JSON");
        }
    }, py::arg("messages_json"), "why a chat request's messages cannot be rendered (a 400 from the server), '' when they can");
}
