#include "preempt-version.h"

#ifndef LLAMA_PREEMPT_VERSION
#error "LLAMA_PREEMPT_VERSION must be defined by the build (CMakeLists.txt reads it from __init__.py)"
#endif

namespace llama_preempt {

const char * version() {
    return LLAMA_PREEMPT_VERSION;
}

bool ui_embedded() {
#if defined(LLAMA_PREEMPT_UI) && LLAMA_PREEMPT_UI
    return true;
#else
    return false;
#endif
}

const char * version_line() {
    return "llama-preempt " LLAMA_PREEMPT_VERSION " (KV preemption for llama-server, upstream llama.cpp " LLAMA_PREEMPT_UPSTREAM ")";
}

} // namespace llama_preempt
