// llama-preempt: our flags (--preempt*, --drain-timeout, --deterministic), added by upstream's
// common_params_parser_init() (common/arg.cpp calls preempt_add_args() where its own server flags
// are added), so that --help lists them beside theirs and every front end (llama-server, the
// Engine) parses them with upstream's parser. The checks are preempt-flags.h's.
#pragma once

#include "arg.h"
#include "common.h"

#include <functional>

namespace llama_preempt {

// our flags, each handed to upstream's add_opt (`params`: the defaults their help texts show)
void preempt_add_args(common_params & params, const std::function<void(common_arg)> & add_opt);

} // namespace llama_preempt
