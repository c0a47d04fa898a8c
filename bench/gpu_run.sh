#!/usr/bin/env bash
# One prepared GPU run of the cells (for a machine with an NVIDIA GPU and CUDA; nothing is fetched).
#
#   python -m build --sdist            # here: the sdist carries the patched llama.cpp tree
#   bash bench/gpu_run.sh dist/llama_preempt-*.tar.gz OUTDIR [CUDA_ARCH]
#
# Builds the sdist with CUDA for one architecture (default 90-real: H100/H200), generates a
# Llama-3.2-1B-shaped model (random weights, 32 KiB of KV per token: the KV geometry, not the text,
# decides the costs), and runs `python -m bench` with every layer on the GPU, flash attention both
# on and off, after bench/swap_bandwidth.py (SWAP GB/s against the pinned link). Results land in
# OUTDIR (swap_bandwidth_gpu, cells_gpu_fa_on/off .json/.md and plots).
set -euo pipefail
sdist=$1; out=$2; arch=${3:-90-real}
work=$(mktemp -d)
tar -xzf "$sdist" -C "$work"
src=$(echo "$work"/llama_preempt-*)
python3 -m venv "$work/venv"
. "$work/venv/bin/activate"
pip install -q --no-index --find-links "${WHEELS:-/nonexistent}" matplotlib 2>/dev/null || pip install -q matplotlib || true
export CMAKE_ARGS="-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=$arch"   # ours, and the stock build of the bench
pip install -q "$src"
python -m llama_preempt.testmodel "$work/llama-1b.gguf" --shape llama-3.2-1b --f16 --n-ctx-train 16384
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$out/gpu.txt" || true
# The doctor first: every park route on the GPU, checked byte for byte (issue 32), fa on and off
for fa in on off; do
    llama-preempt doctor -m "$work/llama-1b.gguf" -ngl 99 -fa "$fa" -c 4096 > "$out/doctor_fa_$fa.txt" 2>&1 || true
done
cd "$src"
# The SWAP tests with every layer on the GPU: the device copy path (gather/scatter graphs, async
# transfers, restore ahead), byte-verified against upstream's serializer (needs pytest and the test model)
if python -c "import pytest" 2>/dev/null; then
    LLAMA_PREEMPT_TEST_GPU_LAYERS=99 python -m pytest -q tests/test_swap_copy.py tests/test_swap.py tests/test_rpc.py tests/test_doctor.py \
        > "$out/gpu_swap_tests.txt" 2>&1 || true
fi
# SWAP bandwidth first (short): parks and restores against pinned device<->host transfers, fa on and off
python bench/swap_bandwidth.py --model "$work/llama-1b.gguf" --gpu-layers 99 --threads "$(nproc)" --out "$out" \
    --name swap_bandwidth_gpu --ctx 16384 --prompt-words 400 1200 2400 3600
for fa in on off; do
    python -m bench --model "$work/llama-1b.gguf" --gpu-layers 99 --threads "$(nproc)" --out "$out" \
        --name "cells_gpu_fa_$fa" --server-args "-fa $fa"
done
