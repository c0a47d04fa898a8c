#pragma once
// llama-preempt: OpenAI's shapes where upstream's OpenAI routes answer in shapes of their own.
//
// - Legacy completions (/v1/completions): `echo` puts the prompt before the completion's text
//   (upstream accepted it and left it out), and `logprobs` come as OpenAI's lists, `tokens`,
//   `token_logprobs`, `top_logprobs` ({token: logprob} per position) and `text_offset` (characters
//   from the prompt's start), beside upstream's chat-style `content` entries, kept for its clients.
//   The server computes no logprobs for prompt tokens (it keeps only the last prompt position's
//   logits), so an echoed prompt's tokens are listed with null `token_logprobs` and `top_logprobs`.
// - Usage with several choices (n > 1, or an array of prompts): every choice's completion tokens,
//   each prompt's tokens once, as OpenAI counts them; upstream reported the first choice's alone.
// - The Responses API: a response cut short by max_output_tokens is `incomplete` with
//   `incomplete_details.reason` "max_output_tokens", and its stream ends with
//   `response.incomplete`; upstream said `completed`.

#include "llama.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace llama_preempt {

// the characters of UTF-8 text (code points: bytes that do not continue a sequence), as a
// client's string counts them
inline size_t utf8_chars(const std::string & s) {
    size_t n = 0;
    for (unsigned char c : s) {
        n += (c & 0xC0) != 0x80;
    }
    return n;
}

// the length of the longest prefix of s that does not end inside a UTF-8 sequence
inline size_t utf8_whole(const std::string & s) {
    size_t i = s.size();
    for (size_t back = 1; back <= 4 && back <= s.size(); ++back) {
        const unsigned char c = s[s.size() - back];
        if ((c & 0xC0) == 0x80) {
            continue; // a continuation byte: look further back for its lead
        }
        const size_t len = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 1;
        i = back < len ? s.size() - back : s.size();
        break;
    }
    return i;
}

// a legacy completion's prompt as the answer needs it, set for /v1/completions when echo or
// logprobs is asked for: its text (as sent, or its tokens' text), its length in characters (the
// first completion token's text_offset) and, for echo with logprobs, its tokens' text
struct legacy_prompt {
    bool                     echo  = false;
    std::string              text;
    size_t                   chars = 0;
    std::vector<std::string> pieces;
};

// the part of one choice's text an answer or a stream's chunk carries: the echoed prompt it starts
// with (the first chunk's; its tokens' text where logprobs were asked for) and the text_offset of
// its first completion token
struct legacy_chunk {
    bool                     echo = false;
    std::string              text;
    std::vector<std::string> pieces;
    size_t                   offset = 0;
};

// one choice's chunks in order (the HTTP side's state of a task): the echo goes to the first
// chunk, and each chunk's offset follows the text before it
struct legacy_stream {
    legacy_prompt prompt;
    bool          started = false;
    size_t        chars   = 0; // the completion's characters before the next chunk

    legacy_chunk next(const std::string & content) {
        legacy_chunk out;
        if (!started && prompt.echo) {
            out.echo   = true;
            out.text   = std::move(prompt.text);
            out.pieces = std::move(prompt.pieces);
        }
        out.offset = prompt.chars + chars;
        started    = true;
        chars     += utf8_chars(content);
        return out;
    }
};

inline std::string token_text(const llama_vocab * vocab, llama_token t, bool first) {
    std::string s(32, '\0');
    for (int attempt = 0; attempt < 2; ++attempt) {
        // the first token through the detokenizer, which drops the space a SentencePiece vocabulary
        // puts before a text's first word (as it does for the whole prompt)
        const int32_t n = first ? llama_detokenize(vocab, &t, 1, s.data(), (int32_t) s.size(), false, true)
                                : llama_token_to_piece(vocab, t, s.data(), (int32_t) s.size(), 0, true);
        if (n >= 0) {
            s.resize(n);
            return s;
        }
        s.resize(-n);
    }
    return "";
}

// the prompt of input i (of n_inputs) for the answer: `prompt` is the request's (a string, token
// ids, or an array of those); the text is the prompt as sent where it was a string, else its
// tokens' text (a leading BOS left out, as llama-cpp-python does; media left out)
template <typename Json, typename Tokens>
legacy_prompt legacy_prompt_of(const Json & prompt, size_t i, size_t n_inputs, const Tokens & tokens,
                               const llama_vocab * vocab, bool echo, bool logprobs) {
    legacy_prompt out;
    if (!echo && !logprobs) {
        return out;
    }
    out.echo = echo;
    const Json * sent = nullptr;
    if (prompt.is_string() && n_inputs == 1) {
        sent = &prompt;
    } else if (prompt.is_array() && prompt.size() == n_inputs && i < prompt.size() && prompt.at(i).is_string()) {
        sent = &prompt.at(i);
    }
    if (sent == nullptr || (echo && logprobs)) {
        std::string pending; // a character split over tokens goes with the token that ends it
        bool first = true;
        for (size_t k = 0; k < tokens.size(); ++k) {
            const llama_token t = tokens[k];
            if (t == LLAMA_TOKEN_NULL || (k == 0 && t == llama_vocab_bos(vocab))) {
                continue;
            }
            pending += token_text(vocab, t, first);
            first = false;
            const size_t whole = utf8_whole(pending);
            out.pieces.push_back(pending.substr(0, whole));
            pending.erase(0, whole);
        }
    }
    if (sent != nullptr) {
        out.text = sent->template get<std::string>();
    } else {
        for (const auto & p : out.pieces) {
            out.text += p;
        }
    }
    if (!(echo && logprobs)) {
        out.pieces.clear();
    }
    out.chars = utf8_chars(out.text);
    return out;
}

inline double legacy_log(float p) {
    // as upstream's: JSON has no -inf
    return p == 0.0f ? std::numeric_limits<float>::lowest() : std::log(p);
}

// OpenAI's legacy logprobs for one choice's chunk: the echoed prompt's tokens (null logprobs: the
// server computes none for the prompt), then each completion token with its logprob, its top
// alternatives as {token: logprob} (the sampled token added where it is not among them, as OpenAI
// does) and its text_offset. `probs` are upstream's completion_token_output entries. Upstream's
// chat-style entries stay under `content`.
template <typename Json, typename Probs>
Json legacy_logprobs(const legacy_chunk & chunk, const Probs & probs, Json content) {
    Json tokens = Json::array(), token_logprobs = Json::array(), top_logprobs = Json::array(),
         text_offset = Json::array();
    if (chunk.echo) {
        size_t at = 0;
        for (const auto & piece : chunk.pieces) {
            tokens.push_back(piece);
            token_logprobs.push_back(nullptr);
            top_logprobs.push_back(nullptr);
            text_offset.push_back(at);
            at += utf8_chars(piece);
        }
    }
    size_t at = chunk.offset;
    for (const auto & p : probs) {
        std::string txt = p.text_to_send;
        txt.resize(utf8_whole(txt));
        Json top = Json::object();
        for (const auto & alt : p.probs) {
            std::string alt_txt = alt.txt;
            alt_txt.resize(utf8_whole(alt_txt));
            if (!top.contains(alt_txt)) {
                top[alt_txt] = legacy_log(alt.prob);
            }
        }
        if (!top.contains(txt)) {
            top[txt] = legacy_log(p.prob);
        }
        tokens.push_back(txt);
        token_logprobs.push_back(legacy_log(p.prob));
        top_logprobs.push_back(std::move(top));
        text_offset.push_back(at);
        at += utf8_chars(p.text_to_send);
    }
    Json out = Json::object();
    out["tokens"]         = std::move(tokens);
    out["token_logprobs"] = std::move(token_logprobs);
    out["top_logprobs"]   = std::move(top_logprobs);
    out["text_offset"]    = std::move(text_offset);
    out["content"]        = std::move(content);
    return out;
}

// one choice's text as the legacy answer or chunk gives it
inline std::string legacy_text(const legacy_chunk & chunk, const std::string & content) {
    return chunk.echo ? chunk.text + content : content;
}

// usage over an answer's choices: the results of one request are indexed prompt by prompt, each
// prompt's first choice, then its other n - 1; a prompt's tokens are counted once, with its first
// choice, and every choice's completion tokens
struct usage_sum {
    int     n_cmpl     = 1;
    int64_t completion = 0;
    int64_t prompt     = 0;
    int64_t cached     = 0;

    template <typename Json>
    void add(const Json & usage, size_t index) {
        completion += usage.value("completion_tokens", (int64_t) 0);
        if (n_cmpl <= 1 || index % (size_t) n_cmpl == 0) {
            prompt += usage.value("prompt_tokens", (int64_t) 0);
            if (usage.contains("prompt_tokens_details")) {
                cached += usage.at("prompt_tokens_details").value("cached_tokens", (int64_t) 0);
            }
        }
    }

    template <typename Json>
    void put(Json & usage) const {
        usage["completion_tokens"] = completion;
        usage["prompt_tokens"]     = prompt;
        usage["total_tokens"]      = completion + prompt;
        if (usage.contains("prompt_tokens_details")) {
            usage["prompt_tokens_details"]["cached_tokens"] = cached;
        }
    }

    // a streamed result (an object, or an array of chunks) of choice `index`: its usage is added,
    // and kept only on the request's last result, with the sum; `last`: no result is left to come
    template <typename Json>
    void fold(Json & res, size_t index, bool last) {
        auto one = [&](Json & chunk) -> bool { // true: drop this chunk, it carried the usage alone
            if (!chunk.is_object() || !chunk.contains("usage") || !chunk.at("usage").is_object()) {
                return false;
            }
            add(chunk.at("usage"), index);
            if (last) {
                put(chunk["usage"]);
                return false;
            }
            if (chunk.contains("choices") && chunk.at("choices").is_array() && chunk.at("choices").empty()) {
                return true;
            }
            chunk.erase("usage");
            return false;
        };
        if (res.is_array()) {
            for (size_t k = res.size(); k-- > 0;) {
                if (one(res[k])) {
                    res.erase(k);
                }
            }
        } else {
            one(res);
        }
    }
};

// the Responses API: a response cut short by its output limit is incomplete, and so is its last
// output item (the one cut); `res` is the response object
template <typename Json>
void response_incomplete(Json & res) {
    res["status"] = "incomplete";
    Json details  = Json::object();
    details["reason"] = "max_output_tokens";
    res["incomplete_details"] = std::move(details);
    if (res.contains("output") && res.at("output").is_array() && !res.at("output").empty()) {
        Json & last = res["output"].back();
        if (last.is_object() && last.contains("status")) {
            last["status"] = "incomplete";
        }
    }
}

// the same for a stream's closing events: `response.completed` becomes `response.incomplete`, and
// the last output item's `response.output_item.done` says incomplete
template <typename Events>
void response_incomplete_events(Events & events) {
    std::string cut_id;
    for (auto & ev : events) {
        if (ev.value("event", "") != "response.completed") {
            continue;
        }
        ev["event"]         = "response.incomplete";
        ev["data"]["type"]  = "response.incomplete";
        response_incomplete(ev["data"]["response"]);
        const auto & output = ev.at("data").at("response").at("output");
        if (!output.empty() && output.back().contains("id")) {
            cut_id = output.back().at("id").template get<std::string>();
        }
    }
    for (auto & ev : events) {
        if (ev.value("event", "") == "response.output_item.done" && ev.at("data").contains("item")
            && ev.at("data").at("item").value("id", "") == cut_id && !cut_id.empty()) {
            ev["data"]["item"]["status"] = "incomplete";
        }
    }
}

} // namespace llama_preempt
