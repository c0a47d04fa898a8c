# Where the first build's time goes (bench/README.md, "The first build"), and what is done about it.
# Include after add_subdirectory(llama.cpp); our build and the bench's stock build both include it, so
# the two stay comparable (they differ only by the patches).
#
# The compute that decides a request's speed is ggml's kernels and libllama (the graph, the KV cache,
# the samplers): they stay at the build type's -O3. The server's control plane -- argument parsing,
# HTTP, JSON, chat templates and parsers, the multimodal loader, the Python bindings -- is most of
# the C++ (nlohmann::json and cpp-httplib instantiated in every file) and runs per request or per
# streamed chunk, not per cell: at -O1 it compiles in about 60 % of the time (arg.cpp 20.6 s -> 12.7 s,
# clip.cpp 29.0 -> 9.8 on this 2-core machine). mtmd gets -O2: its image preprocessing loops over
# pixels. LLAMA_PREEMPT_CONTROL_OPT= sets the level (e.g. -O3 for everything as before).
set(LLAMA_PREEMPT_CONTROL_OPT "-O1" CACHE STRING "optimisation of the server's control-plane targets (-O1, -O2, -O3)")
if (CMAKE_BUILD_TYPE STREQUAL "Release" AND CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
    # appended after the build type's -O3, so the last -O wins
    foreach (_target llama-common server-context llama-server-impl cpp-httplib)
        if (TARGET ${_target})
            target_compile_options(${_target} PRIVATE ${LLAMA_PREEMPT_CONTROL_OPT})
        endif()
    endforeach()
    if (TARGET mtmd AND NOT LLAMA_PREEMPT_CONTROL_OPT STREQUAL "-O3")
        target_compile_options(mtmd PRIVATE -O2)
    endif()
endif()
