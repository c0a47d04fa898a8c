// llama-preempt: the types of server_context's entry points for a host that owns the main loop
// (the Python Engine; declared in upstream's server-context.h by patches/0005-engine.patch):
// what a step did (preempt-events.h) and what the slots and counters are between steps
// (preempt-stats.h).
#pragma once

#include "preempt-events.h"
#include "preempt-stats.h"
