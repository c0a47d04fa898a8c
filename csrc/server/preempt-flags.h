// llama-preempt: the checks of our flags, in one place for llama-server's argument parser
// (preempt-args.cpp), the in-process Engine and Python (llama_preempt._core), so that every front
// end refuses the same values with the same words. Header-only: upstream's common library includes
// it without linking anything of ours.
#pragma once

#include "preempt-choice.h"  // preempt_mode (its types only: llama-common links preempt-args.cpp, no policy code)

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace llama_preempt {

// the --preempt-mode names, in the order of preempt_mode (preempt-policy.h)
inline const char * const PREEMPT_MODE_NAMES[] = { "auto", "swap", "recompute" };

// a whole number in `value` and nothing else; false for anything else
inline bool parse_whole(const std::string & value, long long & out) {
    size_t n_read = 0;
    try {
        out = std::stoll(value, &n_read);
    } catch (const std::exception &) {
        return false;
    }
    return n_read > 0 && n_read == value.size();
}

// an integer flag's value (upstream's parser, for every flag that takes an int): a whole number
// within int, else std::invalid_argument quoting it (std::stoi read "2.7" as 2 and "12abc" as 12,
// and said only "stoi" for "abc")
inline int parse_int_flag(const std::string & value) {
    // surrounding blanks are no part of it (an env file written on Windows ends its lines in \r)
    const size_t b = value.find_first_not_of(" \t\r\n");
    const size_t e = value.find_last_not_of(" \t\r\n");
    const std::string v_text = b == std::string::npos ? "" : value.substr(b, e - b + 1);
    long long v = 0;
    if (!parse_whole(v_text, v)) {
        throw std::invalid_argument("expected a whole number, got '" + value + "'");
    }
    if (v < INT_MIN || v > INT_MAX) {
        throw std::invalid_argument("'" + value + "' is out of range (" + std::to_string(INT_MIN) + " to " +
                                    std::to_string(INT_MAX) + ")");
    }
    return (int) v;
}

// what a flag's handler threw, in words: std::stoi and its kin name only themselves ("stoi")
inline std::string flag_error_text(const std::exception & e, const std::string & value) {
    static const char * const converters[] = { "stoi", "stol", "stoll", "stoul", "stoull", "stof", "stod", "stold" };
    for (const char * name : converters) {
        if (name == std::string(e.what())) {
            return dynamic_cast<const std::out_of_range *>(&e) != nullptr
                       ? "'" + value + "' is out of range"
                       : "expected a number, got '" + value + "'";
        }
    }
    return e.what();
}

// a flag's whole number from lo to hi, else std::invalid_argument: `expects`, quoting the value
inline int32_t parse_in_range(const std::string & value, long long lo, long long hi, const std::string & expects) {
    long long n = 0;
    if (!parse_whole(value, n) || n < lo || n > hi) {
        throw std::invalid_argument(expects + ", got '" + value + "'");
    }
    return (int32_t) n;
}

// a flag's whole number from -1 (no limit) up, else std::invalid_argument: `expects`, quoting the value
inline int32_t parse_from_minus_one(const std::string & value, const std::string & expects) {
    return parse_in_range(value, -1, INT32_MAX, expects);
}

// --preempt-ram N: -1 (no limit), 0 (always recompute) or a size in MiB; throws std::invalid_argument
inline int32_t parse_preempt_ram_mib(const std::string & value) {
    return parse_from_minus_one(value, "--preempt-ram expects -1 (no limit), 0 (always recompute) or a size in MiB");
}

// --host-kv-ram N: -1 (no limit), 0 (nothing off the device: no RAM parks, no prompt cache) or a
// size in MiB; throws std::invalid_argument
inline int32_t parse_host_kv_ram_mib(const std::string & value) {
    return parse_from_minus_one(value, "--host-kv-ram expects -1 (no limit) or a size in MiB >= 0");
}

// --preempt-disk-mib's default: a tenth of the filesystem DIR is on, at most half of what is free there
// when the server starts and at most 64 GiB, so that a disk tier left at its default never fills a
// disk (a shared disk keeps nine tenths, a nearly full one half its free space; 64 GiB holds many
// long conversations of a small model, or one 128k-token state of a 70B one: raise it for those)
constexpr uint64_t DISK_DEFAULT_MAX = 64ull << 30;
inline uint64_t default_disk_bytes(uint64_t fs_bytes, uint64_t free_bytes) {
    return std::min({ fs_bytes / 10, free_bytes / 2, DISK_DEFAULT_MAX });
}
constexpr const char * DISK_DEFAULT_RULE = "a tenth of the filesystem, at most half its free space at start and 64 GiB";

// where the disk tier's limit came from, in the words /props (preempt_disk_mib_from) and the start
// log give: its default rule, the flag's -1 (the disk's free space), or the flag
inline std::string disk_limit_from(bool is_default, int64_t disk_mib) {
    return is_default ? std::string("default: ") + DISK_DEFAULT_RULE
         : disk_mib < 0 ? std::string("--preempt-disk-mib -1: the disk's free space")
         : std::string("--preempt-disk-mib");
}

// --preempt-disk-mib N: -1 (the disk's free space) or a size in MiB of at least 1; throws std::invalid_argument
inline int32_t parse_preempt_disk_mib(const std::string & value) {
    long long mib = 0;
    if (!parse_whole(value, mib) || mib < -1 || mib == 0 || mib > INT32_MAX) {
        throw std::invalid_argument("--preempt-disk-mib expects -1 (the disk's free space) or a size in MiB of at least 1, got '" +
                                    value + "' (leave out --preempt-disk for no disk tier)");
    }
    return (int32_t) mib;
}

// --max-logprobs N: -1 (no limit) or a count of at least 0; throws std::invalid_argument
inline int32_t parse_max_logprobs(const std::string & value) {
    return parse_from_minus_one(value, "--max-logprobs expects -1 (no limit) or a count of at least 0");
}

// --max-queue N: -1 (no limit) or a count of at least 0; throws std::invalid_argument
inline int32_t parse_max_queue(const std::string & value) {
    return parse_from_minus_one(value, "--max-queue expects -1 (no limit) or a count of at least 0");
}

// --max-body-mib N: the largest request body, in MiB, from 1 to 1024 (cpp-httplib's own limit was a
// fixed 100); throws std::invalid_argument
inline int32_t parse_max_body_mib(const std::string & value) {
    return parse_in_range(value, 1, 1024, "--max-body-mib expects a size in MiB from 1 to 1024");
}

// --read-deadline, --keep-alive-timeout, --stall-timeout N (seconds) and --max-connections N: a whole
// number from `lo` to 1,000,000; throws std::invalid_argument naming the flag
inline int32_t parse_http_limit(const std::string & value, const char * flag, long lo, const char * what) {
    return parse_in_range(value, lo, 1000000, std::string(flag) + " expects " + what);
}

// the most n_probs a request may ask for under --max-logprobs, and what the 400 says of it
inline int32_t max_logprobs(int32_t flag) {
    return flag < 0 ? INT32_MAX : flag;
}
inline std::string max_logprobs_note(int32_t flag) {
    return flag < 0 ? "" : " (the server's --max-logprobs; top_logprobs and logprobs are read as n_probs)";
}

// --preempt-disk DIR: a path (that it is a writable directory is checked before the model loads,
// preempt-params.h); throws std::invalid_argument
inline std::string check_preempt_disk_dir(const std::string & value) {
    if (value.empty()) {
        throw std::invalid_argument("--preempt-disk expects a directory, got an empty path");
    }
    return value;
}

// --preempt-mode NAME, read once into its value; throws std::invalid_argument
inline preempt_mode parse_preempt_mode_flag(const std::string & value) {
    for (size_t i = 0; i < sizeof(PREEMPT_MODE_NAMES) / sizeof(PREEMPT_MODE_NAMES[0]); ++i) {
        if (value == PREEMPT_MODE_NAMES[i]) {
            return static_cast<preempt_mode>(i);
        }
    }
    throw std::invalid_argument("--preempt-mode expects auto, swap or recompute, got '" + value + "'");
}

// --preempt-compress NAME: whether the compressed tier (q8_0) is on; throws std::invalid_argument
inline bool parse_preempt_compress(const std::string & value) {
    if (value != "none" && value != "q8_0") {
        throw std::invalid_argument("--preempt-compress expects none or q8_0, got '" + value + "'");
    }
    return value == "q8_0";
}

// its name again (/props, the log)
inline const char * preempt_mode_flag_name(preempt_mode mode) {
    return PREEMPT_MODE_NAMES[static_cast<size_t>(mode)];
}

// --preempt-keepalive SEC; throws std::invalid_argument
inline int32_t check_preempt_keepalive(int value) {
    if (value < 0) {
        throw std::invalid_argument("--preempt-keepalive expects seconds >= 0 (0 turns the keepalive off)");
    }
    return value;
}

// --preempt-sched KEY=N[,KEY=N...]: how the planner shares an overloaded pool; a key left out keeps
// its default (-1 here). Throws std::invalid_argument naming the key or the part it cannot read.
struct preempt_sched_flag {
    long long prompt_budget    = -1;  // prompt tokens a step adds while slots generate (0: n_batch)
    long long restore_headroom = -1;  // cells per running slot a resume leaves free (0: none)
    long long near_finish      = -1;  // tokens left at or below which a slot is spared as a victim (0: none)
    long long starved          = -1;  // parks after which a slot is spared as a victim (at least 1)
    long long age_step_ms      = -1;  // aging: one priority level per this much waiting (0: no aging)
    long long pass_limit_ms    = -1;  // a new request that does not fit may be passed this long (0: never)
    long long width_loss       = -1;  // percent of the best width's throughput the decode width may give up (0: all decode)
    long long width            = -1;  // slots that decode at once, fixed (0: chosen by the measured step cost)
    long long max_gap_ms       = -1;  // a paused slot decodes a token at least this often (0: no bound)
};

inline preempt_sched_flag parse_preempt_sched(const std::string & value) {
    static const char * const usage = "--preempt-sched expects KEY=N[,KEY=N...] with KEY one of prompt-budget, "
                                      "restore-headroom, near-finish, starved, age-step-ms, pass-limit-ms, "
                                      "width-loss, width, max-gap-ms";
    preempt_sched_flag out;
    size_t pos = 0;
    while (pos <= value.size()) {
        const size_t end  = std::min(value.find(',', pos), value.size());
        const std::string part = value.substr(pos, end - pos);
        const size_t eq = part.find('=');
        long long v = 0;
        if (eq == std::string::npos || !parse_whole(part.substr(eq + 1), v) || v < 0 || v > INT32_MAX) {
            throw std::invalid_argument(std::string(usage) + " and N a whole number >= 0, got '" + part + "'");
        }
        const std::string key = part.substr(0, eq);
        long long * slot = key == "prompt-budget"    ? &out.prompt_budget
                         : key == "restore-headroom" ? &out.restore_headroom
                         : key == "near-finish"      ? &out.near_finish
                         : key == "starved"          ? &out.starved
                         : key == "age-step-ms"      ? &out.age_step_ms
                         : key == "pass-limit-ms"    ? &out.pass_limit_ms
                         : key == "width-loss"       ? &out.width_loss
                         : key == "width"            ? &out.width
                         : key == "max-gap-ms"       ? &out.max_gap_ms
                         :                             nullptr;
        if (!slot) {
            throw std::invalid_argument(std::string(usage) + ", got the key '" + key + "'");
        }
        if (key == "starved" && v < 1) {
            throw std::invalid_argument("--preempt-sched starved expects at least 1 park, got '" + part + "'");
        }
        if (key == "width-loss" && v > 100) {
            throw std::invalid_argument("--preempt-sched width-loss expects a percent from 0 (every slot decodes) to 100, got '" + part + "'");
        }
        *slot = v;
        pos = end + 1;
    }
    return out;
}

// --preempt-verify N|always|never: swap copies the guard checks per device (-1 every one, 0 none);
// throws std::invalid_argument
inline int32_t parse_preempt_verify(const std::string & value) {
    if (value == "always") {
        return -1;
    }
    if (value == "never") {
        return 0;
    }
    long long v = 0;
    if (!parse_whole(value, v) || v < 0 || v > INT32_MAX) {
        throw std::invalid_argument("--preempt-verify expects a count of copies >= 0, 'always' or 'never', got '" + value + "'");
    }
    return (int32_t) v;
}

// --drain-timeout SEC; throws std::invalid_argument
inline int32_t check_drain_timeout(int value) {
    if (value < 0) {
        throw std::invalid_argument("--drain-timeout expects seconds >= 0 (0 ends the requests in flight at once)");
    }
    return value;
}

} // namespace llama_preempt
