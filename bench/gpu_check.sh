#!/usr/bin/env bash
# The device check: one prepared command on a GPU machine (CUDA, no network), from a copy of the
# working tree that carries our sdist and the test models in .device/ (git-ignored):
#
#   here:     bash bench/gpu_check.sh --prepare          # python -m build --sdist, models -> .device/
#   device:   bash bench/gpu_check.sh OUTDIR WAIT_S      # start, wait up to WAIT_S, collect
#             bash bench/gpu_check.sh OUTDIR WAIT_S      # again on the same machine: wait, collect
#
# The first call starts the phases in the background in their own process group (setsid), so they
# outlive the command that started them; every call waits up to WAIT_S seconds (or until they are
# done), then writes what there is so far to OUTDIR/gpu_check.tgz and prints the summary. The phases,
# in order of value, each bounded, the whole at most GPU_CHECK_DEADLINE_S (default 600) seconds:
#   build      pip install --no-build-isolation --no-deps --no-index of the sdist with the machine's
#              Python, CUDA for one architecture (GPU_CHECK_ARCH, default 90-real: H100/H200); the
#              Llama-3.2-1B-shaped model (random weights, f16) is generated beside it
#   sharedpool issue 56: bench/shared_pool.py on the 1B shape, flash attention on: the static split of
#              18 slots, unified and auto 64 slots attending their own cells (gathered per sequence on
#              a GPU), and the same two over every cell (--no-attn-own-cells, the before)
#   torch      llama_preempt._core imported beside PyTorch in both orders, the export list, and on a
#              crash the backtrace and the cross-library symbol bindings
#   mixed      bench/mixed.py on the 1B shape (480 chats at 200/s into 32,768 cells): the static
#              split and the cells that separate the causes (GPU_CHECK_MIXED_CELLS), each cell's
#              server log, /metrics and /slots kept
#   owncells   issue 56: upstream's op test of flash attention's runs case on this device, and the
#              op's cost with and without runs (test-backend-ops, built in the wheel's build folder)
#   doctor     llama-preempt doctor on the 1B shape and on stories260K, flash attention on and off
#   rpc        the doctor over a local ggml-rpc-server on this build (fa on and off), both logs
#   suite      the GPU suite (LLAMA_PREEMPT_TEST_GPU_LAYERS=99) on the copy, swap, doctor and RPC tests
#   bandwidth  bench/swap_bandwidth.py on states of 64, 256 and ~1,024 MiB (parked through the slot API)
# GPU_CHECK_PHASES="torch doctor ..." runs only those (the build always runs on a GPU machine).
#
# Without a GPU (GPU_CHECK_CPU=1, or no nvidia-smi) the same phases run on the installed build from
# this tree, smaller (a stories260K-shaped model, 64 chats into 2,048 cells, 8 slots): a check of
# the script itself (tests/test_gpu_check.py runs some of its phases).
# Read the results with: tar -xzf OUTDIR/gpu_check.tgz; cat gpu_check/summary.txt
set -u
HERE=$(cd "$(dirname "$0")/.." && pwd)

if [ "${1:-}" = "--prepare" ]; then  # on the development machine, before the device call
    set -e
    cd "$HERE"
    rm -rf .device && mkdir -p .device/models
    python -m build --sdist --outdir .device > .device/sdist.log 2>&1 || { tail -20 .device/sdist.log; exit 1; }
    for m in stories260K.gguf tiny-qwen35-mtp.gguf; do
        if [ -f "../shared/models/$m" ]; then cp "../shared/models/$m" .device/models/; fi
    done
    du -sh .device
    exit 0
fi

W=${GPU_CHECK_WORK:-/tmp/gpu_check}
R=$W/gpu_check

if [ "${1:-}" != "--phases" ]; then  # start once, then wait and collect what there is
    OUTDIR=${1:?usage: gpu_check.sh OUTDIR WAIT_S | --prepare}
    WAIT_S=${2:-570}
    if [ ! -f "$W/started" ]; then
        mkdir -p "$R"; date +%s > "$W/started"
        setsid nohup bash "$HERE/bench/gpu_check.sh" --phases "$HERE" > "$R/runner.log" 2>&1 < /dev/null &
    fi
    end=$(( $(date +%s) + WAIT_S ))
    while [ ! -f "$R/DONE" ] && [ "$(date +%s)" -lt "$end" ]; do sleep 2; done
    mkdir -p "$OUTDIR"
    tar -czf "$OUTDIR/gpu_check.tgz" -C "$W" gpu_check 2>/dev/null
    cat "$R/summary.txt" 2>/dev/null
    if [ -f "$R/DONE" ]; then echo "gpu_check: done"; else echo "gpu_check: still running (call again to collect)"; fi
    exit 0
fi

# ---- the phases (in the background, in their own process group) ----
REPO=$2
T0=$(date +%s); DEADLINE=$((T0 + ${GPU_CHECK_DEADLINE_S:-600}))
PHASES=${GPU_CHECK_PHASES:-sharedpool torch mixed owncells doctor rpc suite bandwidth}
log() { echo "[$(( $(date +%s) - T0 ))s] $*" >> "$R/summary.txt"; }
left() { echo $(( DEADLINE - $(date +%s) )); }
phase() {  # phase NAME MAX_S CMD: CMD with at most MAX_S seconds (less if the deadline is nearer)
    local name=$1 max=$2; shift 2
    case " $PHASES build " in *" $name "*) ;; *) return ;; esac
    local l; l=$(left); [ "$l" -lt "$max" ] && max=$l
    if [ "$max" -lt 15 ]; then log "$name: skipped (no time left)"; return; fi
    log "$name: start (max ${max}s)"
    local t; t=$(date +%s)
    timeout -k 5 "$max" bash -c "$*" > "$R/$name.txt" 2>&1
    log "$name: rc=$? in $(( $(date +%s) - t ))s"
}
export PYTHONUNBUFFERED=1 PYTEST_DISABLE_PLUGIN_AUTOLOAD=1
CPU=${GPU_CHECK_CPU:-0}
command -v nvidia-smi > /dev/null || CPU=1
{ nvidia-smi; nvcc --version; python3 --version; nproc; free -g; python3 -m pip list 2>/dev/null | grep -i -E "torch|numpy|pytest|requests|rich|gguf"; } > "$R/machine.txt" 2>&1
NPROC=$(nproc)

if [ "$CPU" = 1 ]; then
    log "no GPU (GPU_CHECK_CPU=1 or no nvidia-smi): the installed build, from $REPO, smaller"
    SRC=$REPO
    PY=python
    M=$W/stories-shaped.gguf
    MODELS=$REPO/../shared/models
    [ -f "$MODELS/stories260K.gguf" ] || MODELS=$REPO/.device/models
    STORIES=$MODELS/stories260K.gguf
    $PY -m llama_preempt.testmodel "$M" > "$R/model.txt" 2>&1
    log "model: rc=$? (a stories260K-shaped stand-in)"
    [ -f "$STORIES" ] || STORIES=$M
    MIXED="--ctx 2048 --requests 64 --rate 100 --prompt-median 32 --gen-median 24 --parallel 8 --width-off 8 --threads 2"
    CELLS=${GPU_CHECK_MIXED_CELLS:---cell unified:8}
    SHARED="--ctx 2048 --requests 64 --rate 100 --slots 8 --split 4 --threads 2"
    DOCTOR_C="-c 512"
else
    PY=python3
    M=$W/llama-1b.gguf
    cd "$W" && rm -rf src && mkdir src && tar -xzf "$REPO"/.device/llama_preempt-*.tar.gz -C src \
        || { log "extract failed"; touch "$R/DONE"; exit 1; }
    SRC=$(echo "$W"/src/llama_preempt-*)
    MODELS=$REPO/.device/models
    STORIES=$MODELS/stories260K.gguf
    mkdir -p "$W/src/shared" && ln -sfn "$MODELS" "$W/src/shared/models"   # the tests look in ../shared/models
    export CMAKE_ARGS="-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=${GPU_CHECK_ARCH:-90-real}"
    export CMAKE_BUILD_PARALLEL_LEVEL=$NPROC
    export PYTHONPATH=$SRC/vendor/llama.cpp/gguf-py  # gguf for the model and the suite's stand-ins (no network here)
    # the model (random weights, Llama-3.2-1B's KV geometry) is written while the build runs
    (cd "$SRC" && PYTHONPATH=$SRC/src:$PYTHONPATH python3 -m llama_preempt.testmodel "$M" \
        --shape llama-3.2-1b --f16 --n-ctx-train 32768 > "$R/model.txt" 2>&1; echo "rc=$?" >> "$R/model.txt") &
    MODEL_PID=$!
    phase build 480 "cd $SRC && python3 -m pip install --no-build-isolation --no-deps --no-index -v ."
    wait $MODEL_PID; log "model: $(tail -1 "$R/model.txt")"
    MIXED="--ctx 32768 --requests 480 --rate 200 --prompt-median 64 --gen-median 48 --parallel 64 --width-off 64 --threads 8"
    SHARED="--ctx 32768 --requests 480 --rate 200 --slots 64 --split 18 --threads 8"
    CELLS=${GPU_CHECK_MIXED_CELLS:---cell unified:64 --cell auto:32 --cell auto:64+bsample}
    DOCTOR_C="-c 4096"
fi
command -v llama-server > /dev/null || { log "no llama-server: the build failed (build.txt)"; touch "$R/DONE"; exit 1; }
llama-server --list-devices > "$R/devices.txt" 2>&1
cd "$SRC"
NGL=99

# issue 56 on this device: many slots in one pool against the static split, own cells and every cell
mkdir -p "$R/sharedpool"
phase sharedpool 150 "LLAMA_ARG_N_GPU_LAYERS=$NGL $PY bench/shared_pool.py --model $M $SHARED --fa on --runs 1 --seed 4 \
    --name shared_pool_gpu --log-dir $R/sharedpool; mv bench/results/shared_pool_gpu.* $R/sharedpool/"

# importing _core beside PyTorch: both orders, the export list, and on a crash what binds across
phase torch 40 "
$PY -c 'import torch; print(\"torch\", torch.__version__, \"cuda\", torch.cuda.is_available())' || echo 'no torch here'
CORE=\$($PY -c 'import importlib.util as u; print(u.find_spec(\"llama_preempt._core\").origin)')
echo \"exports: \$(nm -D --defined-only \$CORE | wc -l) defined dynamic symbols in \$CORE:\"
nm -D --defined-only \$CORE | awk '{print \$3}' | head -20
for order in 'import llama_preempt._core, torch' 'import torch; import llama_preempt._core' 'import numpy, llama_preempt._core, torch; import llama_preempt; print(llama_preempt.__version__)'; do
    $PY -X faulthandler -c \"\$order; print('ok')\"; echo \"[\$order] rc=\$?\"
done
LD_DEBUG=bindings $PY -c 'import llama_preempt._core, torch' 2>&1 | grep 'binding file' | grep ' to [^ ]*_core' | grep -v 'file [^ ]*_core' | head -40
"

# the overload cells: the static split and what separates the causes, each cell's log and /metrics kept
mkdir -p "$R/mixed"
phase mixed 240 "LLAMA_ARG_N_GPU_LAYERS=$NGL $PY bench/mixed.py --model $M $MIXED --no-stock --seed 4 --name mixed_gpu \
    $CELLS --log-dir $R/mixed; mv bench/results/mixed_gpu.* bench/results/mixed_gpu_workload.jsonl $R/mixed/"

# issue 56, the shared pool's attention on this device: upstream's op test of the runs case
# (patches/0011; a device that ignores the runs must still give the CPU's values), then the op's cost
# with and without runs (64 sequences decoding in 16,384 cells; a prompt beside 7 others)
phase owncells 60 "B=\$(dirname \$(ls -d build/*/CMakeCache.txt | head -1)); cmake --build \$B --target test-backend-ops > $R/owncells_build.txt 2>&1 || { tail -20 $R/owncells_build.txt; exit 1; }
\$B/test-backend-ops test -o FLASH_ATTN_EXT -p n_seq 2>&1 | tail -8
\$B/test-backend-ops perf -o FLASH_ATTN_EXT -p n_seq -b CUDA0 2>&1 | grep -E 'FLASH|Backend'"

# the doctor: the 1B shape (on a GPU) and stories260K, flash attention on and off
phase doctor 90 "for fa in on off; do
    if [ $CPU = 0 ]; then echo \"== 1B fa \$fa\"; llama-preempt doctor -m $M -ngl $NGL -fa \$fa $DOCTOR_C; echo rc=\$?; fi
    echo \"== stories260K fa \$fa\"; llama-preempt doctor -m $STORIES -ngl $NGL -fa \$fa -c 512; echo rc=\$?; done"

# RPC on this build: one local ggml-rpc-server (serving this machine's first device), the doctor through it
phase rpc 60 "
P=\$($PY -c 'from llama_preempt.server import free_port; print(free_port())')
GGML_RPC_DEBUG=1 llama-preempt rpc-server -H 127.0.0.1 -p \$P > $R/rpc_server.log 2>&1 &
RP=\$!
for i in \$(seq 100); do (echo > /dev/tcp/127.0.0.1/\$P) 2>/dev/null && break; sleep 0.1; done
for fa in on off; do echo \"== RPC fa \$fa\"; llama-preempt doctor -m $STORIES --rpc 127.0.0.1:\$P -dev RPC0 -ngl $NGL -fa \$fa -c 512; echo rc=\$?; done
kill \$RP; wait \$RP
grep -c 'supports_op.*supported: 0' $R/rpc_server.log | sed 's/^/ops the RPC device declined: /'
"

# the GPU suite
phase suite 240 "LLAMA_PREEMPT_TEST_GPU_LAYERS=$NGL $PY -m pytest -q -p no:cacheprovider -rf tests/test_swap_copy.py tests/test_swap.py tests/test_doctor.py tests/test_rpc.py tests/test_rpc_ops.py tests/test_neighbours.py tests/test_loop_clock.py"

# SWAP bandwidth on large states
# (one held request per size, parked and unparked through the slot API; the slice route up to 256 MiB)
mkdir -p "$R/bandwidth"
phase bandwidth 120 "$PY bench/swap_bandwidth.py --model $M --gpu-layers $NGL --threads $NPROC --out $R --name swap_bandwidth_gpu \
    --ctx 32768 --state-mib 64 256 1024 --slice-max-mib 256 --cell-s 5 --log-dir $R/bandwidth"

log "all phases done"
touch "$R/DONE"
