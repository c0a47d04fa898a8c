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

# Unity batches: the control plane's files share their heavy headers (the server's, chat's, the
# STL's), so compiling them a batch at a time parses those once a batch instead of once a file (the
# server's 22 files: 82.5 s of CPU one by one, 30.4 s as one). Upstream's libllama does this for its
# models already (src/CMakeLists.txt, batches of 16). Files that do not compile beside others are
# named and kept out. -DLLAMA_PREEMPT_UNITY=OFF compiles file by file (a one-file change then
# recompiles one file instead of its batch).
option(LLAMA_PREEMPT_UNITY "compile the control plane's files in unity batches" ON)
set(LLAMA_PREEMPT_UNITY_BATCH 16 CACHE STRING "files per unity batch")
function(llama_preempt_unity target)  # ARGN: the target's files (relative to its folder) kept out
    if (NOT LLAMA_PREEMPT_UNITY OR NOT TARGET ${target})
        return()
    endif()
    set_target_properties(${target} PROPERTIES UNITY_BUILD ON UNITY_BUILD_BATCH_SIZE ${LLAMA_PREEMPT_UNITY_BATCH})
    get_target_property(_dir ${target} SOURCE_DIR)
    foreach (_file ${ARGN})
        set_source_files_properties(${_dir}/${_file} TARGET_DIRECTORY ${target} PROPERTIES SKIP_UNITY_BUILD_INCLUSION ON)
    endforeach()
endfunction()
llama_preempt_unity(llama-common json.cpp)  # json.cpp names nlohmann's ordered_json, which others alias to common_json
llama_preempt_unity(server-context)
llama_preempt_unity(llama-server-impl)
llama_preempt_unity(mtmd mtmd-helper.cpp mtmd-helper-gen.cpp)  # the public helper library checks that it includes no internal header
