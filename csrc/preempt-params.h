// llama-preempt: what preemption needs from the server's parameters, decided in one place for the
// binary (tools/server/server.cpp) and the in-process Engine (py-engine.cpp), and told in /props.
#pragma once

#include "common.h"
#include "preempt-version.h"
#include "server-common.h"

#include <string>

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
        { "preempt_mode",            params.preempt_mode },
        { "ui",                      ui_embedded() },
    };
}

} // namespace llama_preempt
