#!/usr/bin/env bash
# One accelerator call (under 10 minutes): ViT-B/16 on one NVIDIA H100/H200-class GPU, keras_vit on the jax and
# torch backends against timm (timm 1.0.x on the same torch), in the order that matters most:
#   1. exactness: keras_vit's float32 logits against timm's on the device, to 1e-5, on both backends;
#   2. throughput.py on each backend: inference (the "bfloat16" policy; timm under autocast) and training
#      (mixed_bfloat16 and AdamW; timm's AMP step), each in both modes (device-resident, and end-to-end numpy in
#      and out), 5 rounds after one compile per contender and task, model-FLOP utilisation against the bf16 peak;
#   3. the training input beside it: input_pipeline.py's numpy path (and tf.data where TensorFlow is installed)
#      with RandAugment from a folder of real-size JPEGs on 1, 4 and all cores, against timm's loader;
#   4. keras_vit under torch.compile (jit_compile=True) beside eager, inference and training;
#   5. ../shared/gpu_probe (PROBE_DIR), which splits each backend's step into compute and copies.
# Every step has a time cap, and a step that could end past the call's budget (BUDGET seconds, 540) is skipped
# with a line that says so. benchmarks/README.md ("On the GPU") reads the tables this prints.
#
#     DRY_RUN=1 bash benchmarks/gpu_h200.sh      # the rehearsal on a CPU: every step, a tiny model
#     bash benchmarks/gpu_h200.sh                # on the GPU machine, from the repository's root
#
# Needs python with jax[cuda], torch (CUDA) and timm. Keras is taken from the environment, else installed for this
# run from KERAS_WHEELHOUSE (default .device/wheelhouse; make it with ../shared/gpu_probe/make_wheelhouse.sh) into a
# temporary folder on PYTHONPATH: the GPU machine reaches no registry.
set -uo pipefail
cd "$(dirname "$0")/.."
export TF_CPP_MIN_LOG_LEVEL=3 XLA_PYTHON_CLIENT_MEM_FRACTION=0.9 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
python=${PYTHON:-$(command -v python || command -v python3)}
budget=${BUDGET:-540}
start=$SECONDS
dry=${DRY_RUN:-0}

# Runs "$@" under a cap of $1 seconds, unless that could end past the budget.
step() {
    local cap=$1 name=$2
    shift 2
    if [ $((SECONDS - start + cap)) -gt "$budget" ]; then
        echo "=== $name: skipped (needs up to $cap s; $((budget - SECONDS + start)) s of the budget left)"
        return
    fi
    echo "=== $name (cap $cap s, at $((SECONDS - start)) s)"
    timeout "$cap" "$@"
    echo "=== $name: exit $?, at $((SECONDS - start)) s"
}

if ! KERAS_BACKEND=jax "$python" -c "import keras" 2>/dev/null; then
    wheelhouse=${KERAS_WHEELHOUSE:-.device/wheelhouse}
    site=$(mktemp -d "${TMPDIR:-/tmp}/keras_site.XXXXXX")
    for wheel in "$wheelhouse"/*.whl; do
        [ -e "$wheel" ] || { echo "no keras, and no wheels in $wheelhouse"; exit 2; }
        name=$(basename "$wheel" | cut -d- -f1)
        module=$(case "$name" in absl_py) echo absl;; markdown_it_py) echo markdown_it;; *) echo "$name";; esac)
        # Never shadow what jax or torch brought (numpy, ml_dtypes, typing_extensions, packaging...).
        if [ "$module" != keras ] && "$python" -c "import $module" 2>/dev/null; then continue; fi
        "$python" -m pip install --quiet --no-index --no-deps --target "$site" "$wheel" 2>/dev/null \
            || echo "skipped $(basename "$wheel") (not for this Python)"
    done
    export PYTHONPATH="$PYTHONPATH:$site"
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
peak=989  # dense bf16 TFLOP/s of an H100 or H200 SXM; a PCIe H100's is 756
case "$gpu" in *PCIe*) peak=756;; esac
KERAS_BACKEND=jax "$python" -c "import jax, torch, timm, keras; print('jax', jax.__version__, jax.devices()[0].platform, '| torch',
torch.__version__, torch.cuda.is_available(), '| timm', timm.__version__, '| keras', keras.__version__)"

if [ "$dry" = 1 ]; then
    sizes=(--dry-run)
    exactness=(--tiny)
    pipeline=(--dry-run)
else
    sizes=(--models B16 --batch 256 --iterations 10 --rounds 1 --rounds-in-process 5 --peak-tflops "$peak")
    exactness=()
    pipeline=(--images 512 --rounds 5 --seconds 1.5 --cores "1,4,$(nproc)" --randaugment-only)
fi
common=(--tasks infer,train --dtype bfloat16 --timm-python "$python" "${sizes[@]}")

for backend in jax torch; do
    step 60 "exactness on $backend" env KERAS_BACKEND=$backend "$python" benchmarks/gpu_exactness.py "${exactness[@]}"
done
for backend in jax torch; do
    step 170 "throughput on $backend" env KERAS_BACKEND=$backend "$python" benchmarks/throughput.py "${common[@]}"
done
paths=numpy
"$python" -c "import tensorflow" 2>/dev/null && paths=tf.data,numpy
step 100 "training input ($paths) with RandAugment" env KERAS_BACKEND=jax "$python" benchmarks/input_pipeline.py \
    --paths "$paths" --timm-python "$python" "${pipeline[@]}"
step 200 "torch.compile beside eager on torch" env KERAS_BACKEND=torch "$python" benchmarks/throughput.py \
    "${common[@]}" --jit-compile
probe=${PROBE_DIR:-.device/gpu_probe}
if [ -f "$probe/gpu_probe.sh" ]; then
    step 180 "gpu_probe" env OUT="${OUT:-/tmp}/gpu_probe" PYTHON="$python" DRY_RUN="$dry" KERAS_WHEELHOUSE="${KERAS_WHEELHOUSE:-.device/wheelhouse}" \
        bash "$probe/gpu_probe.sh"
else
    echo "=== gpu_probe: not here ($probe); copy ../shared/gpu_probe there to include it"
fi
echo "=== done in $((SECONDS - start)) s"
