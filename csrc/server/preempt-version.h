// llama-preempt identity: the version string compiled into llama-server and llama_preempt._core.
#pragma once

namespace llama_preempt {

// the package version, from src/llama_preempt/__init__.py (passed in by CMake)
const char * version();

// one line for `llama-server --version` and the start-up log, e.g. "llama-preempt 0.1.0 (...)"
const char * version_line();

// whether this build embeds the web UI (vendor/ui.py provides it where npm, or a cached build, is there)
bool ui_embedded();

} // namespace llama_preempt
