// llama_preempt._core: the loaded model's facts and the request fields a call may set (py-model.cpp).
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>

struct common_params;
struct llama_context;

pybind11::list request_fields(const common_params & params);  // upstream's request schema, described
pybind11::dict model_info(const llama_context * lctx);          // n_ctx, n_vocab, token_bos, metadata, ...
#include <string>
#include <vector>

using llama_token_id = int32_t;
std::vector<llama_token_id> tokenize(const llama_context * lctx, const std::string & text, bool add_special, bool parse_special);
pybind11::bytes detokenize(const llama_context * lctx, const std::vector<llama_token_id> & tokens, bool special);
void register_model(pybind11::module_ & m);                     // request_fields(), chat_messages_error()
