# How llama.cpp is configured, for our build and for the bench's stock build (bench/stock), so that
# "stock" and "ours" differ only by the patches, and ccache reuses every object the patches do not
# touch.
set(CMAKE_POSITION_INDEPENDENT_CODE ON)   # server-context goes into a Python extension too
set(BUILD_SHARED_LIBS      OFF CACHE BOOL "" FORCE)
set(LLAMA_BUILD_COMMON     ON  CACHE BOOL "" FORCE)
set(LLAMA_BUILD_TOOLS      ON  CACHE BOOL "" FORCE)
set(LLAMA_BUILD_SERVER     ON  CACHE BOOL "" FORCE)
set(LLAMA_BUILD_TESTS      OFF CACHE BOOL "" FORCE)
set(LLAMA_BUILD_EXAMPLES   OFF CACHE BOOL "" FORCE)
set(LLAMA_BUILD_APP        OFF CACHE BOOL "" FORCE)
set(LLAMA_BUILD_UI         OFF CACHE BOOL "" FORCE)
set(LLAMA_USE_PREBUILT_UI  OFF CACHE BOOL "" FORCE)   # nothing is downloaded at build time
set(LLAMA_OPENSSL          OFF CACHE BOOL "" FORCE)
set(LLAMA_TOOLS_INSTALL    OFF CACHE BOOL "" FORCE)
set(LLAMA_TESTS_INSTALL    OFF CACHE BOOL "" FORCE)
set(LLAMA_FATAL_WARNINGS   OFF CACHE BOOL "" FORCE)

# Name the upstream commit rather than whatever git finds above the tree (our own repository). It
# is written once, in vendor/fetch.py (UPSTREAM_COMMIT), which pins the tree.
file(STRINGS "${CMAKE_CURRENT_LIST_DIR}/../vendor/fetch.py" _upstream REGEX "^UPSTREAM_COMMIT = ")
string(REGEX REPLACE "^UPSTREAM_COMMIT = \"([0-9a-f]+)\".*" "\\1" LLAMA_BUILD_COMMIT "${_upstream}")
if (NOT LLAMA_BUILD_COMMIT MATCHES "^[0-9a-f]+$")
    message(FATAL_ERROR "cannot read UPSTREAM_COMMIT from vendor/fetch.py")
endif()
set(LLAMA_BUILD_NUMBER 0)


# llama.cpp's RPC backend (--rpc HOST:PORT, and its rpc-server tool): a full device backend that
# also runs without a GPU, and upstream's way to split one model over several machines.
set(GGML_RPC               ON  CACHE BOOL "" FORCE)
