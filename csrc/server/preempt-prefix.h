// llama-preempt: a prefix stored once. A new request's prompt links the longest prefix another
// slot holds in the pool to its own sequence (llama_memory_seq_cp within the one stream of a unified
// pool: the cells gain a sequence, no data moves) instead of evaluating it again. The cells stay
// while any holder keeps them (llama.cpp frees a cell when its last sequence leaves), so a park or a
// purge of one holder frees only what no one else holds (slot_view::n_linked).
#pragma once

#include "preempt-port.h"

#include <cstdint>
#include <string>

struct common_params;
struct llama_model;
struct llama_context;

namespace llama_preempt {

// a prefix shorter than this many tokens beyond what the slot's own cells hold is evaluated, not
// linked (a block, as vLLM's default block size: below it the walk is worth more than the saving)
constexpr int32_t PREFIX_LINK_MIN = 16;

struct prefix_link {
    int32_t donor = -1;  // the slot whose cells are linked (-1: none worth it)
    int32_t n     = 0;   // the prompt's first n tokens, at positions 0 .. n-1
};

// Why this server's prompts never link a prefix ("": they may): the model's memory cannot share a
// prefix by linking cells (a recurrent or hybrid model's state is one cell per sequence, an SWA
// cache drops cells per sequence), a draft or MTP context holds its own copy of each sequence, the
// flag turned it off, or preemption (and so the unified pool) is off.
std::string prefix_share_off(const common_params & params, const llama_model * model, bool preempt_on);

// The longest prefix of `want` that a slot other than `id` holds in the pool, if it is at least
// PREFIX_LINK_MIN tokens longer than `n_own` (what `id`'s own cells keep), and never the whole of
// `want` (its last token is evaluated for its logits). A holder counts up to the cells it has
// decoded: the tokens it put in the batch being built are not cells yet.
prefix_link find_prefix(const slot_port & port, llama_context * ctx, int32_t id, const server_tokens & want, int32_t n_own);

} // namespace llama_preempt
