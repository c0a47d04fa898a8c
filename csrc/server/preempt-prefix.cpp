// A prefix stored once: where a new prompt's prefix already is in the pool (preempt-prefix.h).
#include "preempt-prefix.h"

#include "common.h"
#include "llama.h"

#include <algorithm>

namespace llama_preempt {

std::string prefix_share_off(const common_params & params, const llama_model * model, bool preempt_on) {
    if (!params.preempt_share_prefix) {
        return "--no-prefix-share";
    }
    if (!preempt_on) {
        return "preemption is off (a prefix is linked only within the one unified pool it manages)";
    }
    if (model && llama_model_is_recurrent(model)) {
        return "a recurrent model's state is one cell per sequence, not a prefix of cells";
    }
    if (model && llama_model_is_hybrid(model)) {
        return "a hybrid model's recurrent state is one cell per sequence, not a prefix of cells";
    }
    if (model && llama_model_n_swa(model) > 0 && !params.swa_full) {
        return "a sliding-window cache drops each sequence's old cells on its own (--swa-full keeps them)";
    }
    for (const auto type : params.speculative.types) {
        switch (type) {
            case COMMON_SPECULATIVE_TYPE_NONE:
            case COMMON_SPECULATIVE_TYPE_NGRAM_SIMPLE:
            case COMMON_SPECULATIVE_TYPE_NGRAM_MAP_K:
            case COMMON_SPECULATIVE_TYPE_NGRAM_MAP_K4V:
            case COMMON_SPECULATIVE_TYPE_NGRAM_MOD:
            case COMMON_SPECULATIVE_TYPE_NGRAM_CACHE:
                break;  // the n-gram speculators hold no cells
            default:
                return "a draft or MTP context holds its own cells of each sequence";
        }
    }
    return "";
}

prefix_link find_prefix(const slot_port & port, llama_context * ctx, int32_t id, const server_tokens & want, int32_t n_own) {
    prefix_link best;
    llama_memory_t mem = ctx ? llama_get_memory(ctx) : nullptr;
    if (!mem || want.size() < 2 || want.has_mtmd) {
        return best;
    }
    for (int32_t other = 0; other < port.n_slots(); ++other) {
        if (other == id || port.facts(other).phase == upstream_phase::parked) {
            continue;
        }
        const server_tokens & held = port.cached_tokens(other);
        if (held.has_mtmd || (int32_t) held.size() <= std::max(best.n, n_own)) {
            continue;  // cannot beat what is found (a prompt's positions are its token indices only without media)
        }
        // its cells hold positions 0 .. pos_max; tokens beyond that are in the batch being built
        if (llama_memory_seq_pos_min(mem, other) != 0) {
            continue;
        }
        const int32_t n_cells = llama_memory_seq_pos_max(mem, other) + 1;
        const int32_t n = std::min({ (int32_t) held.get_common_prefix(want), n_cells, (int32_t) want.size() - 1 });
        if (n > best.n) {
            best = { other, n };
        }
    }
    if (best.n < n_own + PREFIX_LINK_MIN) {
        return {};
    }
    return best;
}

} // namespace llama_preempt
