# Include after add_subdirectory(llama.cpp). With GGML_NATIVE, -march=native turns on ggml's AMX
# matmul on CPUs that have AMX (Sapphire Rapids and later), and at our upstream commit that path
# segfaults at the first decode of a Q4_0/Q4_1 model on some of them (ggml_backend_amx_mul_mat, an
# open upstream issue; seen here on a Xeon VM with amx_int8: `llama-preempt demo` died with SIGSEGV).
# The flags below come after -march=native on the command line, so they win: the CPU backend uses
# its AVX-512 kernels instead. -DLLAMA_PREEMPT_AMX=ON keeps AMX. Our build and the bench's stock
# build both include this, so the two stay comparable.
option(LLAMA_PREEMPT_AMX "use ggml's AMX matmul where -march=native enables it" OFF)
if (NOT LLAMA_PREEMPT_AMX AND TARGET ggml-cpu AND GGML_NATIVE AND CMAKE_SYSTEM_PROCESSOR MATCHES "x86_64|AMD64|amd64"
    AND CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
    include(CheckCXXCompilerFlag)
    check_cxx_compiler_flag(-mno-amx-int8 LLAMA_PREEMPT_HAS_MNO_AMX)
    if (LLAMA_PREEMPT_HAS_MNO_AMX)
        target_compile_options(ggml-cpu PRIVATE -mno-amx-tile -mno-amx-int8 -mno-amx-bf16)
        message(STATUS "llama-preempt: ggml's AMX matmul is off (-DLLAMA_PREEMPT_AMX=ON keeps it)")
    endif()
endif()
