// llama-preempt: what preemption needs from the server's parameters, decided in one place for the
// binary (tools/server/server.cpp) and the in-process Engine (py-engine.cpp), and told in /props.
#pragma once

#include "common.h"
#include "preempt-choice.h"
#include "preempt-config.h"
#include "preempt-disk.h"  // disk_store::RESERVE, HEADER_BYTES
#include "preempt-disk-dir.h"
#include "preempt-drain.h"
#include "preempt-version.h"
#include "server-common.h"
#include "server-http.h"
#include "speculative.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

namespace llama_preempt {

// Upstream makes the KV pool unified only when -np is not given: `-np 4` splits it into four fixed
// shares, where no slot can grow into another's cells and parking one frees nothing for the others.
// That is the most common launch, so with preemption on, `-np N` shares one pool unless the user
// asked for the split (--no-kv-unified). True when this made the pool unified.
inline bool unify_pool_for_preemption(common_params & params) {
    if (!params.kv_preempt || params.kv_unified || params.kv_unified_explicit || params.n_parallel < 2) {
        return false;
    }
    params.kv_unified = true;
    return true;
}

// why preemption cannot work with these parameters, "" when it can (the model's own KV memory is
// checked once it is loaded)
inline std::string preempt_inactive_reason(const common_params & params) {
    if (!params.kv_preempt) {
        return "disabled by --no-preempt";
    }
    if (params.embedding) {
        return "embedding and rerank servers do not generate";
    }
    if (params.n_parallel >= 0 && params.n_parallel < 2) {
        return "needs more than one slot (-np 2 or more)";
    }
    if (!params.kv_unified) {
        return "needs one unified KV pool, and --no-kv-unified splits it per slot: parking one slot frees nothing "
               "for another";
    }
    return "";
}

// Sizes llama.cpp asserts on (GGML_ASSERT: the process aborts with a backtrace) instead of refusing:
// checked before the model loads, for the binary (an error line and exit status 1) and the Engine
// (EngineArgumentError). "" when they are fine; else one message naming the flag. Call it after
// -np's default is settled.
inline std::string invalid_sizes(const common_params & params) {
    // the warm-up decodes two tokens (BOS and EOS) in one batch, in the context
    const int32_t n_min = params.warmup ? 2 : 1;
    if (params.n_ctx < 0 || (params.n_ctx > 0 && params.n_ctx < n_min)) {
        return "-c/--ctx-size must be 0 (the model's own context length) or at least " + std::to_string(n_min) +
               " cells, got " + std::to_string(params.n_ctx);
    }
    if (params.n_batch < n_min) {
        return "-b/--batch-size must be at least " + std::to_string(n_min) + " tokens, got " + std::to_string(params.n_batch);
    }
    if (params.n_parallel > 0 && params.n_batch < params.n_parallel) {
        return "-b/--batch-size (" + std::to_string(params.n_batch) + ") must be at least -np/--parallel (" +
               std::to_string(params.n_parallel) + "): every step decodes one token of each slot in one batch";
    }
    if (params.n_ubatch < 0) {
        return "-ub/--ubatch-size must not be negative, got " + std::to_string(params.n_ubatch);
    }
    // with speculative decoding a step puts each slot's sampled token and its drafts in one batch, and
    // llama.cpp asserts when they do not fit ("batch must be large enough to hold the sampled and draft tokens")
    const int32_t n_draft = common_speculative_n_max(&params.speculative);
    if (n_draft > 0 && params.n_parallel > 0 && params.n_batch < params.n_parallel * (1 + n_draft)) {
        return "-b/--batch-size (" + std::to_string(params.n_batch) + ") must be at least -np/--parallel (" +
               std::to_string(params.n_parallel) + ") x (1 + " + std::to_string(n_draft) + " drafted tokens) = " +
               std::to_string(params.n_parallel * (1 + n_draft)) +
               " with speculative decoding: every step decodes each slot's token and its drafts in one batch";
    }
    return "";
}

// --deterministic needs flash attention (only it visits a sequence's cells in a given order); with
// -fa auto it is turned on, -fa off is refused. "" when fine.
inline std::string deterministic_conflict(common_params & params) {
    if (!params.batch_invariant) {
        return "";
    }
    if (params.flash_attn_type == LLAMA_FLASH_ATTN_TYPE_DISABLED) {
        return "--deterministic needs flash attention: drop -fa/--flash-attn off (--deterministic turns it on)";
    }
    params.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_ENABLED;
    return "";
}

// a -m path that is not a file (and nothing to download it from): one line, before llama.cpp's
// sixteen of model-loading log; "" otherwise
inline std::string missing_model_file(const common_params & params) {
    const auto & m = params.model;
    if (m.path.empty() || !m.hf_repo.empty() || !m.url.empty() || !m.docker_repo.empty()) {
        return "";
    }
    FILE * f = fopen(m.path.c_str(), "rb");
    if (f == nullptr) {
        return "-m/--model: no model file at '" + m.path + "'";
    }
    fclose(f);
    return "";
}

// DIR's filesystem as the disk tier sees it: its size, and what it can ever give the tier, its size
// less the reserve the tier keeps free for everything else (disk_store::RESERVE); `known` false when
// it does not say its size
struct disk_fs_size {
    bool     known    = false;
    uint64_t total    = 0;
    uint64_t capacity = 0;
};

inline disk_fs_size disk_fs_size_of(const std::string & dir) {
    disk_fs_size fs;
    struct statvfs vfs;
    fs.known    = statvfs(dir.c_str(), &vfs) == 0 && vfs.f_blocks > 0;
    fs.total    = fs.known ? (uint64_t) vfs.f_blocks * vfs.f_frsize : 0;
    fs.capacity = fs.total > disk_store::RESERVE ? fs.total - disk_store::RESERVE : 0;
    return fs;
}

// "" when the disk tier can ever hold a file on DIR's filesystem; else why it cannot (a filesystem
// within the reserve: every park would go elsewhere, counted as no room): a warning at the start
// and /props' preempt_disk_warning
inline std::string disk_tier_never_holds(const common_params & params) {
    if (params.preempt_disk_dir.empty()) {
        return "";
    }
    const disk_fs_size fs = disk_fs_size_of(params.preempt_disk_dir);
    if (!fs.known || fs.capacity > disk_store::HEADER_BYTES) {
        return "";
    }
    return string_format("the filesystem of --preempt-disk %s is %.1f MiB in all, within the %zu MiB the disk tier keeps free "
                         "for everything else: it can never hold a parked slot or a prompt file (use a larger filesystem)",
                         params.preempt_disk_dir.c_str(), (double) fs.total / 1048576.0, disk_store::RESERVE >> 20);
}

// --preempt-disk DIR must be a directory this server can write in, that others cannot turn against
// it (preempt-disk-dir.h): checked before the model loads (the server's own subdirectory in it is
// made once the slots exist, preempt-disk.h); an explicit --preempt-disk-mib must fit what its
// filesystem can ever hold. "" otherwise
inline std::string preempt_disk_error(const common_params & params) {
    const std::string & dir = params.preempt_disk_dir;
    if (dir.empty()) {
        return "";
    }
    if (std::string why = disk_dir_unsafe(dir); !why.empty()) {
        return why;
    }
    if (access(dir.c_str(), W_OK | X_OK) != 0) {
        return "--preempt-disk: cannot write to '" + dir + "': " + std::string(strerror(errno));
    }
    const disk_fs_size fs = disk_fs_size_of(dir);
    if (fs.known && params.preempt_disk_mib > 0 && ((uint64_t) params.preempt_disk_mib << 20) > fs.capacity) {
        // a budget the disk can never give: the operator asked for room that is not there
        return string_format("--preempt-disk-mib %d asks for more than the filesystem of --preempt-disk %s can ever hold: "
                             "%llu MiB, its size less the %zu MiB the disk tier keeps free (lower --preempt-disk-mib, or "
                             "use a larger filesystem)", params.preempt_disk_mib, dir.c_str(),
                             (unsigned long long) (fs.capacity >> 20), disk_store::RESERVE >> 20);
    }
    return "";
}

// --preempt-disk-mib left at its default: the MiB its rule gives for DIR's filesystem now (once,
// before the model loads: /props, the log and the disk tier all read this one figure)
inline void resolve_disk_default(common_params & params) {
    if (params.preempt_disk_dir.empty() || params.preempt_disk_mib != -2) {
        return;
    }
    struct statvfs vfs;
    if (statvfs(params.preempt_disk_dir.c_str(), &vfs) != 0 || vfs.f_blocks == 0) {
        // a filesystem that does not say its size (some network and FUSE mounts): its free space, as -1
        SRV_WRN("preemption: the filesystem of --preempt-disk %s does not say its size: the disk tier may take its free "
                "space (set --preempt-disk-mib)\n", params.preempt_disk_dir.c_str());
        params.preempt_disk_mib = -1;
        return;
    }
    // --cache-persist: what the kept cache holds is this tier's own (taken back or removed at the
    // start), so it counts as free: the limit does not shrink by half of it at every restart
    const uint64_t kept = params.preempt_cache_persist ? llama_preempt::kept_cache_bytes(params.preempt_disk_dir) : 0;
    const uint64_t bytes = default_disk_bytes((uint64_t) vfs.f_blocks * vfs.f_frsize, (uint64_t) vfs.f_bavail * vfs.f_frsize + kept);
    params.preempt_disk_mib = (int32_t) std::max<uint64_t>(1, bytes >> 20);
    params.preempt_disk_mib_default = true;
}

// what a server's parameters must pass once -np's default is settled: "" or one message naming the
// flag; each check runs only when the ones before it passed (the model file is not opened for a
// refused size)
inline std::string server_params_error(common_params & params) {
    std::string why = invalid_sizes(params);
    if (why.empty()) {
        why = deterministic_conflict(params);
    }
    if (why.empty()) {
        why = preempt_disk_error(params);
    }
    if (why.empty()) {
        why = missing_model_file(params);
    }
    if (why.empty() && params.preempt_cache_persist && params.preempt_disk_dir.empty()) {
        why = "--cache-persist needs --preempt-disk DIR: the cached prompts' files are kept there";
    }
    if (why.empty()) {
        resolve_disk_default(params);
        if (const std::string never = disk_tier_never_holds(params); !never.empty()) {
            SRV_WRN("preemption: %s; parks go to RAM or recompute (counted as over_budget)\n", never.c_str());
        }
    }
    return why;
}

// our part of the server's parameter finalisation (server_prepare_params() in server.cpp, patched):
// -np N shares one pool, and sizes llama.cpp would abort on are refused. "" or the error.
inline std::string prepare_server_params(common_params & params) {
    if (unify_pool_for_preemption(params)) {
        SRV_INF("preemption: the %d slots share one unified KV pool (--no-kv-unified splits it per slot, as upstream "
                "does without preemption)\n", params.n_parallel);
    }
    const std::string why = server_params_error(params);
    if (why.empty()) {
        SRV_INF("requests: bodies up to %d MiB (--max-body-mib; a larger one gets 413), prompts that cannot fit the "
                "context refused before they are tokenized\n", params.preempt_max_body_mib);
    }
    if (why.empty() && params.batch_invariant) {
        SRV_INF("%s", "deterministic: batch-invariant kernels and flash attention on; a request's tokens do not "
                "depend on what runs beside it or how it is parked (CPU kernels; no repacked weights)\n");
    }
    return why;
}

// --host-kv-ram as in effect, in MiB (-1: no limit)
inline int64_t host_kv_ram_mib(const common_params & params) {
    const size_t total = host_budget_from_mib(params.preempt_host_ram_mib, params.preempt_ram_mib, params.cache_ram_mib).total;
    return total == SIZE_MAX ? -1 : (int64_t) (total >> 20);
}

// the "llama_preempt" object of /props: configured, and active or why not
inline json props_json(const common_params & params) {
    const std::string why = preempt_inactive_reason(params);
    return {
        { "version",                 version() },
        { "preempt",                 params.kv_preempt },
        { "preempt_active",          why.empty() },
        { "preempt_inactive_reason", why.empty() ? json(nullptr) : json(why) },
        { "kv_unified",              params.kv_unified },
        { "preempt_ram_mib",         params.preempt_ram_mib },
        { "host_kv_ram_mib",         host_kv_ram_mib(params) },
        { "preempt_mode",            llama_preempt::preempt_mode_flag_name(params.preempt_mode) },
        { "preempt_compress",        params.preempt_compress_q8 ? "q8_0" : "none" },
        { "preempt_disk",            params.preempt_disk_dir.empty() ? json(nullptr) : json(params.preempt_disk_dir) },
        { "preempt_disk_mib",        params.preempt_disk_dir.empty() ? json(nullptr) : json(params.preempt_disk_mib) },
        { "preempt_disk_mib_from",   params.preempt_disk_dir.empty() ? json(nullptr)
                                     : json(llama_preempt::disk_limit_from(params.preempt_disk_mib_default, params.preempt_disk_mib)) },
        { "preempt_disk_warning",    params.preempt_disk_dir.empty() ? json(nullptr)
                                     : [&] { const std::string w = disk_tier_never_holds(params); return w.empty() ? json(nullptr) : json(w); }() },
        { "cache_persist",           params.preempt_cache_persist },
        { "prefix_share",            params.preempt_share_prefix },
        { "max_logprobs",            params.preempt_max_logprobs < 0 ? json(nullptr) : json(params.preempt_max_logprobs) },
        { "max_body_mib",            params.preempt_max_body_mib },
        { "read_deadline_s",         params.preempt_read_deadline_s },
        { "keep_alive_timeout_s",    params.preempt_keep_alive_s },
        { "max_connections",         params.preempt_max_connections },
        { "stall_timeout_s",         params.preempt_stall_timeout_s },
        { "deterministic",           params.batch_invariant },
        { "attn_own_cells",          attn_own_cells_active(params) },
        { "ui",                      ui_embedded() },            // built into this binary
        { "ui_served",               ui_embedded() && params.ui },  // and served at GET / (never by the Engine)
    };
}

} // namespace llama_preempt

// upstream's own, in tools/server/server.cpp (made callable by the patches), for the in-process
// Engine: the parameters' finalisation before the model loads (0, or 1 after printing the error,
// or with `refusal` set to it instead: the Engine raises it), and the wrapper that turns a route
// handler's exception into upstream's error response
int server_prepare_params(common_params & params, bool is_router_server, std::string * refusal = nullptr);
server_http_context::handler_t ex_wrapper(server_http_context::handler_t func);
