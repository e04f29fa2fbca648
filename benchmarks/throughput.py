"""keras_vit against keras-hub's ViTBackbone and timm: throughput, compile time, memory.

    KERAS_BACKEND=jax python benchmarks/throughput.py --models S16,B16 --tasks infer,train \\
        [--timm-python /path/to/venv-with-timm/bin/python] [--dtype float32,bfloat16,int8]

Every measurement runs in a fresh process (so peak memory and first-call
compile time are each contender's own); the contenders are interleaved round
by round (at least 5 rounds). Each row gives the median img/s of the rounds
with their min and max, the ratio of medians against keras_vit, the range of
the per-round ratios (each round's contenders ran back to back), and whether
the ranking against keras_vit holds beyond the spread: "inside spread" when
the two contenders' min-max ranges overlap, so that the order of their
medians is not established. The roofline is the median's FLOP/s as a
fraction of this machine's measured dense-matmul peak. keras-hub is used when importable; timm
runs in the interpreter given by --timm-python (it needs torchvision).
Each --dtype is measured in the same run: bfloat16 is Keras' mixed_bfloat16
policy (timm: torch.autocast), int8 is Keras' `quantize("int8")` after the
model is built (inference only; timm has no Keras-quantize counterpart and
sits it out). Ratios are against keras_vit in float32; each roofline is against the
measured matmul peak of its own dtype on the backend. --jit-compile adds
keras_vit compiled with `model.compile(jit_compile=True)` as a contender
(`keras_vit_jit`): on PyTorch that is torch.compile and on TensorFlow XLA,
neither of which Keras uses by default on a CPU; on JAX it is the default.
keras_vit computes the tanh-approximated GELU of the original checkpoints;
timm's ViT-B/16 computes the exact GELU, whose CPU kernel in torch is 4-5x
faster. --exact-gelu gives keras_vit timm's function (`approximate_gelu=False`).
"""

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time

import numpy as np

SIZES = {  # hidden, layers, heads, mlp, patch
    "Ti16": (192, 12, 3, 768, 16),
    "S16": (384, 12, 6, 1536, 16),
    "B16": (768, 12, 12, 3072, 16),
    "L16": (1024, 24, 16, 4096, 16),
}
TIMM_NAMES = {"Ti16": "vit_tiny_patch16_224", "S16": "vit_small_patch16_224", "B16": "vit_base_patch16_224",
              "L16": "vit_large_patch16_224"}


def forward_flops(model, image_size=224, classes=1000):
    """Multiply-adds x 2 of one image's forward pass (matrix products and attention)."""
    hidden, layers, _, mlp, patch = SIZES[model]
    patches = (image_size // patch) ** 2
    tokens = patches + 1
    embed = 2 * patches * patch * patch * 3 * hidden
    per_layer = 2 * tokens * hidden * 3 * hidden + 2 * 2 * tokens * tokens * hidden + 2 * tokens * hidden * hidden
    per_layer += 2 * 2 * tokens * hidden * mlp
    return embed + layers * per_layer + 2 * hidden * classes


def matmul_peak(dtype="float32", size=2048, repeats=5):
    """Dense matmul operations per second of this machine in `dtype` (the roofline): the best of numpy
    (float32 only) and the Keras backend. int8 multiplies int8 matrices into int32, as quantized Dense does."""
    import keras

    a = np.random.default_rng(0).standard_normal((size, size)).astype("float32")
    if dtype == "int8":
        a = np.clip(np.round(a * 30), -127, 127).astype("int8")
    tensor = keras.ops.convert_to_tensor(a, dtype)
    candidates = {keras.backend.backend(): lambda: keras.ops.matmul(tensor, tensor)}
    if dtype == "float32":
        candidates["numpy"] = lambda: a @ a
    if keras.backend.backend() == "jax":
        import jax
        import jax.numpy as jnp

        accumulate = jnp.int32 if dtype == "int8" else None
        product = jax.jit(lambda x: jnp.matmul(x, x, preferred_element_type=accumulate))
        candidates["jax"] = lambda: product(tensor).block_until_ready()
    best = 0.0
    for run in candidates.values():
        try:
            run()
        except Exception:  # a backend without this dtype's matmul on CPU
            continue
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            result = run()
            if hasattr(result, "numpy"):  # a TensorFlow tensor: wait for it (torch on a CPU and numpy are synchronous)
                result.numpy()
            times.append(time.perf_counter() - start)
        best = max(best, 2 * size**3 / min(times))
    return best


# --------------------------------------------------------------------------- workers


def keras_model(contender, model, task, dtype, exact_gelu=False):
    import keras

    # bfloat16 through each model's own dtype=: bfloat16 weights for inference, float32 ones for training.
    policy = None
    if dtype == "bfloat16":
        policy = "bfloat16" if task == "infer" else "mixed_bfloat16"
    hidden, layers, heads, mlp, patch = SIZES[model]
    if contender in ("keras_vit", "keras_vit_jit"):
        import keras_vit

        gelu = {"approximate_gelu": False} if exact_gelu else {}
        if task == "infer":
            return keras_vit.ViT(image_size=224, patch_size=patch, hidden_size=hidden, num_layers=layers,
                                 num_heads=heads, mlp_dim=mlp, include_top=False, dtype=policy, **gelu)
        return keras_vit.ViT(image_size=224, patch_size=patch, hidden_size=hidden, num_layers=layers,
                             num_heads=heads, mlp_dim=mlp, classes=1000, classifier_activation=None, dtype=policy,
                             **gelu)
    import keras_hub

    backbone = keras_hub.models.ViTBackbone(image_shape=(224, 224, 3), patch_size=patch, num_layers=layers,
                                            num_heads=heads, hidden_dim=hidden, mlp_dim=mlp, dtype=policy)
    if task == "infer":
        return backbone
    logits = keras.layers.Dense(1000, dtype="float32")(backbone.output[:, 0])
    return keras.Model(backbone.input, logits)


def run_keras(contender, model, task, batch, iterations, dtype, exact_gelu=False):
    import warnings

    import keras

    net = keras_model(contender, model, task, dtype, exact_gelu)
    if dtype == "int8":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            net.quantize("int8")
    rng = np.random.default_rng(0)
    images = rng.uniform(-1, 1, (batch, 224, 224, 3)).astype("float32")
    labels = rng.integers(0, 1000, batch)
    jit_compile = True if contender == "keras_vit_jit" else "auto"
    if task == "infer":
        if jit_compile is True:
            net.compile(jit_compile=True)
        step = lambda: net.predict_on_batch(images)  # noqa: E731
    else:
        net.compile(optimizer=keras.optimizers.SGD(1e-3, momentum=0.9), jit_compile=jit_compile,
                    loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        step = lambda: net.train_on_batch(images, labels)  # noqa: E731
    return measure(step, iterations)


def run_timm(model, task, batch, iterations, dtype):
    import timm
    import torch

    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    net = timm.create_model(TIMM_NAMES[model], pretrained=False, num_classes=1000 if task == "train" else 0)
    net = net.to(device)
    images = torch.randn(batch, 3, 224, 224, device=device)
    labels = torch.randint(0, 1000, (batch,), device=device)
    autocast = torch.autocast(device, dtype=torch.bfloat16, enabled=dtype == "bfloat16")
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    if task == "infer":
        net.eval()

        def step():
            with torch.inference_mode(), autocast:
                out = net.forward_features(images)
            sync()
            return out
    else:
        net.train()
        optimizer = torch.optim.SGD(net.parameters(), lr=1e-3, momentum=0.9)

        def step():
            optimizer.zero_grad(set_to_none=True)
            with autocast:
                loss = torch.nn.functional.cross_entropy(net(images), labels)
            loss.backward()
            optimizer.step()
            return loss.item()
    return measure(step, iterations)


def measure(step, iterations):
    start = time.perf_counter()
    step()
    first = time.perf_counter() - start
    times = []
    for _ in range(iterations):
        start = time.perf_counter()
        result = step()
        if hasattr(result, "block_until_ready"):
            result.block_until_ready()
        times.append(time.perf_counter() - start)
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"first_call_s": first, "step_s": statistics.median(times), "peak_rss_mb": peak_mb}


def worker(args):
    if args.worker == "timm":
        result = run_timm(args.model, args.task, args.batch, args.iterations, args.dtype)
    else:
        result = run_keras(args.worker, args.model, args.task, args.batch, args.iterations, args.dtype,
                           args.exact_gelu)
    print("RESULT " + json.dumps(result), flush=True)


# --------------------------------------------------------------------------- driver


def measure_in_process(python, contender, model, task, batch, iterations, dtype, backend, exact_gelu=False):
    command = [python, os.path.abspath(__file__), "--worker", contender, "--model", model, "--task", task,
               "--batch", str(batch), "--iterations", str(iterations), "--dtype", dtype]
    if exact_gelu and contender != "timm":
        command.append("--exact-gelu")
    return result_of(command, backend)


def result_of(command, backend):
    """Run `command` in a fresh process (with `KERAS_BACKEND=backend`) and read the JSON after its "RESULT "."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    if backend:
        env["KERAS_BACKEND"] = backend
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=3600)
    if done.returncode or "RESULT " not in done.stdout:
        return {"error": (done.stderr or done.stdout).strip().splitlines()[-1][:300]}
    return json.loads(done.stdout.split("RESULT ", 1)[1].splitlines()[0])


def available_contenders(timm_python, jit_compile=False):
    found = ["keras_vit", "keras_vit_jit"] if jit_compile else ["keras_vit"]
    try:
        import keras_hub  # noqa: F401

        found.append("keras_hub")
    except ImportError:
        print("keras-hub not installed: skipping it (pip install keras-hub)")
    if timm_python:
        found.append("timm")
    return found


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="S16,B16")
    parser.add_argument("--tasks", default="infer,train")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--iterations", type=int, default=5, help="timed steps per process (median)")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (median and spread; at least 5)")
    parser.add_argument("--dtype", default="float32", help="float32, bfloat16, int8, or several: float32,int8")
    parser.add_argument("--timm-python", help="a Python that has timm, to include it")
    parser.add_argument("--jit-compile", action="store_true",
                        help="also keras_vit under model.compile(jit_compile=True) (torch.compile on PyTorch)")
    parser.add_argument("--exact-gelu", action="store_true",
                        help="keras_vit (and keras-hub, which always does) computes the exact GELU, as timm does")
    parser.add_argument("--peak-tflops", type=float,
                        help="the accelerator's peak (e.g. 989 for an H200 in bf16) instead of the measured CPU matmul peak")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--task", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args)

    if args.rounds < 5:
        parser.error(f"--rounds {args.rounds}: the spread needs at least 5 interleaved rounds")
    import keras

    backend = keras.backend.backend()
    contenders = available_contenders(args.timm_python, args.jit_compile)
    dtypes = args.dtype.split(",")
    unknown = set(dtypes) - {"float32", "bfloat16", "int8"}
    if unknown:
        raise SystemExit(f"unknown --dtype {sorted(unknown)}; choose among float32, bfloat16, int8")
    # Each dtype's roofline: its own measured matmul peak on this backend (or the accelerator's given peak).
    peaks = {d: args.peak_tflops * 1e12 if args.peak_tflops else matmul_peak(d) for d in dtypes}
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores; backend {backend}; "
          f"batch {args.batch}; roofline peaks " + ", ".join(f"{d} {p / 1e9:.1f}" for d, p in peaks.items())
          + f" G(FL)OP/s ({'given' if args.peak_tflops else 'measured matmul'})")
    rows = []
    for model in args.models.split(","):
        for task in args.tasks.split(","):
            runs = [(c, d) for d in dtypes for c in contenders if not (d == "int8" and (c == "timm" or task == "train"))]
            results = {run: [] for run in runs}
            for round_index in range(args.rounds):
                # Interleaved, so drift hits every contender alike; the order rotates, so no one always goes first.
                shift = round_index % len(runs)
                for contender, dtype in runs[shift:] + runs[:shift]:
                    python = args.timm_python if contender == "timm" else sys.executable
                    results[contender, dtype].append(measure_in_process(
                        python, contender, model, task, args.batch, args.iterations, dtype,
                        None if contender == "timm" else backend, args.exact_gelu))
            flops = forward_flops(model) * (3 if task == "train" else 1) * args.batch
            rows += summarize(model, task, runs, results, args.batch, flops, peaks)
    print(report(rows))


def summarize(model, task, runs, results, batch, flops, peaks):
    """One row per (contender, dtype): the rounds' img/s (median, min, max) and how it ranks against keras_vit.

    The first run is the reference (keras_vit in the first dtype). Per-round ratios pair each round's
    measurements, which ran back to back; the ranking is "inside spread" when the min-max ranges overlap.
    """
    rows, base = [], None
    for contender, dtype in runs:
        rounds = results[contender, dtype]
        errors = [r for r in rounds if "error" in r]
        if errors:
            print(f"{model} {task} {contender} {dtype}: failed: {errors[0]['error']}")
            continue
        speeds = [batch / r["step_s"] for r in rounds]
        row = dict(model=model, task=task, contender=contender, dtype=dtype, speeds=speeds,
                   images_per_s=statistics.median(speeds), low=min(speeds), high=max(speeds),
                   first_call_s=statistics.median(r["first_call_s"] for r in rounds),
                   peak_rss_mb=statistics.median(r["peak_rss_mb"] for r in rounds))
        row["roofline"] = flops / (batch / row["images_per_s"]) / peaks[dtype] if peaks[dtype] else float("nan")
        base = base or row
        row["speed_vs_keras_vit"] = row["images_per_s"] / base["images_per_s"]
        paired = [mine / theirs for mine, theirs in zip(speeds, base["speeds"])]
        row["round_ratios"] = (min(paired), max(paired))
        if row is base:
            row["ranking"] = "reference"
        elif row["low"] > base["high"]:
            row["ranking"] = "ahead beyond spread"
        elif row["high"] < base["low"]:
            row["ranking"] = "behind beyond spread"
        else:
            row["ranking"] = "inside spread"
        rows.append(row)
    return rows


def report(rows):
    """The table of `summarize`'s rows, one line each."""
    lines = [f"{'model':6s} {'task':6s} {'contender':13s} {'dtype':8s} {'img/s median (min-max)':>23s} "
             f"{'x keras_vit':>11s} {'per round':>11s} {'ranking':20s} {'1st call s':>10s} {'peak MB':>8s} "
             f"{'roofline':>8s}"]
    for r in rows:
        spread = f"{r['images_per_s']:.2f} ({r['low']:.2f}-{r['high']:.2f})"
        per_round = f"{r['round_ratios'][0]:.2f}-{r['round_ratios'][1]:.2f}"
        lines.append(f"{r['model']:6s} {r['task']:6s} {r['contender']:13s} {r['dtype']:8s} {spread:>23s} "
                     f"{r['speed_vs_keras_vit']:11.2f} {per_round:>11s} {r['ranking']:20s} {r['first_call_s']:10.1f} "
                     f"{r['peak_rss_mb']:8.0f} {r['roofline']:8.1%}")
    return "\n".join(lines)

if __name__ == "__main__":
    main()
