#!/usr/bin/env bash
# ViT-B/16 bf16 training and inference throughput (keras_vit and keras-hub through their dtype=:
# bfloat16 for inference, mixed_bfloat16 for training; timm under torch.autocast) and model-FLOP utilisation on one
# NVIDIA H100/H200-class GPU: keras_vit on the jax and torch backends against timm.
# Prepared to finish in under 8 minutes including compilation; not yet run (no GPU
# was lent to the session that wrote it). Usage, on the GPU machine, from the repo root:
#     bash benchmarks/gpu_h200.sh            # needs jax[cuda], torch (CUDA) and timm installed
set -uo pipefail
cd "$(dirname "$0")/.."
export TF_CPP_MIN_LOG_LEVEL=3 XLA_PYTHON_CLIENT_MEM_FRACTION=0.9
common=(--models B16 --tasks infer,train --dtype bfloat16 --rounds 2 --iterations 20)
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
# Exactness first: keras_vit's float32 logits against timm's on this GPU, for one fixed input, on both backends.
for backend in jax torch; do KERAS_BACKEND=$backend timeout 120 python benchmarks/gpu_exactness.py; done
# H200 dense bf16 peak, for model-FLOP utilisation: about 989 TFLOP/s (SXM, dense).
for backend in jax torch; do
    echo "=== keras backend: $backend (batch 256)"
    KERAS_BACKEND=$backend timeout 200 python benchmarks/throughput.py "${common[@]}" --batch 256 \
        --timm-python "$(command -v python)" --peak-tflops 989
done
