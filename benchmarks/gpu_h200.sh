#!/usr/bin/env bash
# ViT-B/16 bf16 throughput (keras_vit through its dtype=: bfloat16 for inference, mixed_bfloat16 for training;
# timm under torch.autocast) and model-FLOP utilisation on one NVIDIA H100/H200-class GPU: keras_vit on the jax
# and torch backends against timm, 5 interleaved rounds each (throughput.py's minimum for a spread).
# Sized for one 10-minute device call (a fresh process per measurement, 5 rounds): inference on both backends;
# training did not fit beside it (benchmarks/README.md, "One H200"). keras-hub is measured where it is importable. Usage, on the GPU machine, from the repo root:
#     bash benchmarks/gpu_h200.sh            # needs jax[cuda], torch (CUDA) and timm installed
set -uo pipefail
cd "$(dirname "$0")/.."
export TF_CPP_MIN_LOG_LEVEL=3 XLA_PYTHON_CLIENT_MEM_FRACTION=0.9
python=${PYTHON:-$(command -v python || command -v python3)}
common=(--models B16 --dtype bfloat16 --rounds 5 --iterations 10 --batch 256 --timm-python "$python"
        --peak-tflops 989)  # H200 dense bf16 peak (SXM), for model-FLOP utilisation
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
# Exactness first: keras_vit's float32 logits against timm's on this GPU, for one fixed input, on both backends.
for backend in jax torch; do KERAS_BACKEND=$backend timeout 100 "$python" benchmarks/gpu_exactness.py; done
echo "=== keras backend: jax (batch 256, inference)"
KERAS_BACKEND=jax timeout 230 "$python" benchmarks/throughput.py "${common[@]}" --tasks infer
echo "=== keras backend: torch (batch 256, inference)"
KERAS_BACKEND=torch timeout 250 "$python" benchmarks/throughput.py "${common[@]}" --tasks infer
