#pragma once
// llama-preempt: a prompt that cannot fit a slot's context is refused before it is tokenized. No
// token is longer than the vocabulary's longest, so a prompt of B bytes is at least B / longest
// tokens: a 20 MB body is then refused at once instead of after seconds of tokenizing it.

#include "llama.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <string>

namespace llama_preempt {

// the most bytes one token of this vocabulary spells (its pieces, special tokens included), found
// once per vocabulary: scanning a vocabulary takes milliseconds, a request only microseconds
inline size_t longest_token_bytes(const llama_vocab * vocab) {
    static std::mutex mtx;
    static std::map<const llama_vocab *, size_t> known;
    std::lock_guard<std::mutex> lock(mtx);
    auto it = known.find(vocab);
    if (it != known.end()) {
        return it->second;
    }
    size_t longest = 1;
    char buf[512];
    const int32_t n_vocab = llama_vocab_n_tokens(vocab);
    for (llama_token t = 0; t < n_vocab; ++t) {
        const int32_t n = llama_token_to_piece(vocab, t, buf, sizeof(buf), 0, true);
        longest = std::max(longest, (size_t) (n < 0 ? -n : n));
    }
    return known[vocab] = longest;
}

// what the early check found: at_least == 0 when the prompt (a string, an array of strings or of
// token ids, or an array of those) may fit n_ctx tokens; else at least that many tokens and the
// 400's message. Only prompts longer in bytes than n_ctx are looked at
struct prompt_bound {
    size_t      at_least = 0;
    std::string why;
};

template <typename Json>
prompt_bound prompt_beyond_context(const Json & prompt, int n_ctx, const llama_vocab * vocab) {
    if (n_ctx <= 0) {
        return {};
    }
    auto check_one = [&](const Json & p) -> prompt_bound {
        size_t at_least = 0;
        size_t bytes    = 0;
        if (p.is_string()) {
            bytes = p.template get<std::string>().size();
            if (bytes <= (size_t) n_ctx) {
                return {};
            }
            at_least = bytes / longest_token_bytes(vocab);
        } else if (p.is_array() && !p.empty() && p.front().is_number_integer()) {
            at_least = p.size();
        }
        if (at_least < (size_t) n_ctx) {
            return {};
        }
        return { at_least,
                 "the prompt is at least " + std::to_string(at_least) + " tokens" +
                 (bytes > 0 ? " (" + std::to_string(bytes) + " bytes, at most " + std::to_string(longest_token_bytes(vocab)) +
                              " a token)" : "") +
                 ", more than the context holds (" + std::to_string(n_ctx) + " tokens): refused before tokenizing it; "
                 "send a shorter prompt" };
    };
    if (prompt.is_array() && !prompt.empty() && !prompt.front().is_number_integer()) {
        for (size_t i = 0; i < prompt.size(); ++i) {
            prompt_bound found = check_one(prompt.at(i));
            if (found.at_least > 0) {
                return found;
            }
        }
        return {};
    }
    return check_one(prompt);
}

} // namespace llama_preempt
