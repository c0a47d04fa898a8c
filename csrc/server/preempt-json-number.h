// llama-preempt: a number a client sent, checked where upstream's server reads it (its request
// schema's numeric fields and json_value(), server-schema.cpp and server-common.h, patched), so
// that no value is ever wrapped or truncated on its way into a field: 1e30 read as an int32 was
// INT_MIN, 2147483648 was -2147483648, 2.7 was 2 and true was 1. Out of range, a fraction where a
// whole number is meant, or not a number at all is std::invalid_argument quoting the value
// received, which the server answers with a 400. Header-only; no llama types (Json is
// upstream's common_json, or anything with its few members).
#pragma once

#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>

namespace llama_preempt {

// what a client sent, for an error message (cut short: a field may hold a whole document)
template <typename Json>
std::string quoted_value(const Json & v) {
    std::string s = v.dump();
    return s.size() > 80 ? s.substr(0, 77) + "..." : s;
}

// what T accepts, for the error message
template <typename T>
std::string number_expected() {
    if constexpr (std::is_floating_point<T>::value) {
        return "a number";
    } else if constexpr (std::is_unsigned<T>::value) {
        return "-1 or a whole number from 0 to " + std::to_string(std::numeric_limits<T>::max());
    } else {
        return "a whole number from " + std::to_string(std::numeric_limits<T>::min()) + " to " +
               std::to_string(std::numeric_limits<T>::max());
    }
}

// The JSON value `v` as T, or std::invalid_argument("must be ..., got <v>"). An unsigned T takes
// -1 as its largest value, llama.cpp's "-1 = random" seed. `bool_as_number`: false and true are
// 0 and 1 (OpenAI's chat API sends "logprobs": false where its completions API sends a count).
template <typename T, typename Json>
T checked_number(const Json & v, bool bool_as_number = false) {
    static_assert(std::is_arithmetic<T>::value && !std::is_same<T, bool>::value, "a number type");
    using lim = std::numeric_limits<T>;
    auto refuse = [&](const std::string & why) {
        return std::invalid_argument("must be " + why + ", got " + quoted_value(v));
    };
    if (v.is_boolean() && bool_as_number) {
        return v.template get<bool>() ? T(1) : T(0);
    }
    if (!v.is_number()) {
        throw refuse(number_expected<T>());
    }
    if constexpr (std::is_floating_point<T>::value) {
        const double d = v.template get<double>();
        if (!std::isfinite(d) || std::fabs(d) > (double) lim::max()) {
            char max[32];
            snprintf(max, sizeof(max), "%g", (double) lim::max());
            throw refuse(std::string("a number from -") + max + " to " + max);
        }
        return (T) d;
    } else {
        if (v.is_number_integer()) {
            // read from its text: the backing library keeps values beyond int64 as unsigned, and
            // its conversions to T would wrap them
            const std::string text = v.dump();
            char * end = nullptr;
            errno = 0;
            if (text[0] == '-') {
                const long long x = strtoll(text.c_str(), &end, 10);
                if (std::is_unsigned<T>::value && x == -1 && errno == 0) {
                    return lim::max();
                }
                if (errno == 0 && *end == '\0' && x >= (long long) lim::min()) {
                    return (T) x;
                }
            } else {
                const unsigned long long x = strtoull(text.c_str(), &end, 10);
                if (errno == 0 && *end == '\0' && x <= (unsigned long long) lim::max()) {
                    return (T) x;
                }
            }
            throw refuse(number_expected<T>());
        }
        const double d = v.template get<double>();  // a number with a fraction or an exponent
        if (!std::isfinite(d) || d != std::floor(d)) {
            throw refuse(number_expected<T>() + " (no fraction)");
        }
        if (std::is_unsigned<T>::value && d == -1.0) {
            return lim::max();
        }
        // the bounds as doubles: min is exact (-2^(n-1) or 0), max + 1 rounds to 2^n exactly
        if (d < (double) lim::min() || d >= (double) lim::max() + 1.0) {
            throw refuse(number_expected<T>());
        }
        return (T) d;
    }
}

// a token id a client named (logit_bias): one of the vocabulary's, else std::invalid_argument
// (upstream skipped it without a word)
inline int32_t checked_token_id(long long id, int32_t n_vocab) {
    if (id < 0 || id >= n_vocab) {
        throw std::invalid_argument("token id " + std::to_string(id) + " is not in the model's vocabulary (ids 0 to " +
                                    std::to_string(n_vocab - 1) + ")");
    }
    return (int32_t) id;
}

} // namespace llama_preempt
