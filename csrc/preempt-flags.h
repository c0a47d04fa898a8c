// llama-preempt: the checks of our flags, in one place for llama-server's argument parser
// (preempt-args.inc), the in-process Engine and Python (llama_preempt._core), so that every front
// end refuses the same values with the same words. Header-only: upstream's common library includes
// it without linking anything of ours.
#pragma once

#include <climits>
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

// --preempt-ram N: -1 (no limit), 0 (always recompute) or a size in MiB; throws std::invalid_argument
inline int32_t parse_preempt_ram_mib(const std::string & value) {
    long long mib = 0;
    if (!parse_whole(value, mib) || mib < -1 || mib > INT32_MAX) {
        throw std::invalid_argument("--preempt-ram expects -1 (no limit), 0 (always recompute) or a size in MiB, got '" + value + "'");
    }
    return (int32_t) mib;
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

// --preempt-disk DIR: a path (that it is a writable directory is checked before the model loads,
// preempt-params.h); throws std::invalid_argument
inline std::string check_preempt_disk_dir(const std::string & value) {
    if (value.empty()) {
        throw std::invalid_argument("--preempt-disk expects a directory, got an empty path");
    }
    return value;
}

// --preempt-mode NAME; throws std::invalid_argument
inline std::string parse_preempt_mode_name(const std::string & value) {
    for (const char * name : PREEMPT_MODE_NAMES) {
        if (value == name) {
            return value;
        }
    }
    throw std::invalid_argument("--preempt-mode expects auto, swap or recompute, got '" + value + "'");
}

// --preempt-keepalive SEC; throws std::invalid_argument
inline int32_t check_preempt_keepalive(int value) {
    if (value < 0) {
        throw std::invalid_argument("--preempt-keepalive expects seconds >= 0 (0 turns the keepalive off)");
    }
    return value;
}

// --drain-timeout SEC; throws std::invalid_argument
inline int32_t check_drain_timeout(int value) {
    if (value < 0) {
        throw std::invalid_argument("--drain-timeout expects seconds >= 0 (0 ends the requests in flight at once)");
    }
    return value;
}

} // namespace llama_preempt
