"""keras_vit against keras-hub's ViTBackbone and timm: throughput in two modes, compile time, memory.

    KERAS_BACKEND=jax python benchmarks/throughput.py --models S16,B16 --tasks infer,train \\
        [--timm-python /path/to/venv-with-timm/bin/python] [--dtype float32,bfloat16,int8] [--dry-run]

Every contender does the same work per timed step, in two modes measured in
the same process, one after the other:

- device: the batch is made once on the device; inference leaves its
  output there and the step ends synchronised (keras_vit: the model's
  jitted `stateless_call` on JAX, `model(x)` under `no_grad` on torch;
  timm: `forward_features`); training is one optimizer step (Keras'
  `train_on_batch` on device tensors; timm's AMP step), its loss back as a
  number.
- end_to_end: numpy in, numpy out: a host float32 batch copied in every
  step and the output brought back as numpy (`predict_on_batch`; timm:
  `.float().cpu().numpy()`), or the loss for training. This is what
  `model.predict` and `fit` users pay.

Training is AdamW with softmax cross-entropy; the `finetune` task is the
fine-tuning recipes' step instead: AdamW with weight decay 0.05 and
layer-wise rate decay 0.65 on timm's parameter groups (keras_vit's
`recipes.finetuning_optimizer(opt="adamw", ...)`, timm's `create_optimizer_v2`;
keras-hub, which has no layer decay, sits it out); `finetune_lamb` is DeiT
III's LAMB in its place (keras_vit's `opt="lamb"`, timm's `"lamb"`, both
clipping to global norm 1). `--models` also takes
`dir=PATH`, a timm folder (timm's own writer) both contenders build
from: a BEiT v2 B/16 for the recipe's own family. Training is bfloat16 through Keras'
`mixed_bfloat16` (timm: `torch.autocast`), inference bfloat16 through
the `"bfloat16"` policy. Each row gives the median img/s of the rounds with
their min and max, the ratios of medians against keras_vit and timm (same
mode and dtype), the range of the per-round ratios against keras_vit,
whether that ranking holds beyond the spread ("inside spread" when the
min-max ranges overlap), the megabytes crossing between host and device per
step, the roofline (the median's FLOP/s as a fraction of the device's peak,
`--peak-tflops`, or of this machine's measured dense-matmul peak), and on
JAX which attention kernel the compiled program runs. Lines keras_vit logs
in a worker (a kernel fallback) are printed after the table.

Rounds: each contender runs in a fresh process per round, interleaved round
by round (`--rounds`), so that drift hits all alike; `--rounds-in-process`
times several rounds after one start-up and compile, where those cost more
than the steps (an accelerator). rounds x rounds-in-process >= 5.
keras-hub is used when importable; timm runs in the interpreter given by
--timm-python (it needs torchvision). int8 is Keras' `quantize("int8")`
(inference only; timm sits it out). --jit-compile adds keras_vit compiled
with `model.compile(jit_compile=True)` (`keras_vit_jit`): torch.compile on
PyTorch and XLA on TensorFlow, neither of which Keras uses by default on a
CPU; on JAX it is the default. keras_vit computes the tanh-approximated
GELU of the original checkpoints; timm's ViT computes the exact GELU, whose
CPU kernel in torch is 4-5x faster: --exact-gelu gives keras_vit timm's
function. `--dry-run` rehearses every code path with a tiny model.
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
    "tiny": (48, 2, 2, 96, 16),  # --dry-run's: every code path at negligible cost
    "Ti16": (192, 12, 3, 768, 16),
    "S16": (384, 12, 6, 1536, 16),
    "B16": (768, 12, 12, 3072, 16),
    "L16": (1024, 24, 16, 4096, 16),
}


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
            if not isinstance(result, np.ndarray):
                synchronize(result)
            times.append(time.perf_counter() - start)
        best = max(best, 2 * size**3 / min(times))
    return best


# --------------------------------------------------------------------------- workers

MODES = ("device", "end_to_end")


def keras_model(contender, model, task, dtype, exact_gelu=False, image_size=224):
    import keras

    # bfloat16 through each model's own dtype=: bfloat16 weights for inference, float32 ones for training.
    policy = None
    if dtype == "bfloat16":
        policy = "bfloat16" if task == "infer" else "mixed_bfloat16"
    if model.startswith("dir="):  # a timm folder: keras_vit reads it as timm built it
        import keras_vit

        if task == "infer":
            return keras_vit.from_pretrained(model[len("dir="):], include_top=False, dtype=policy)
        return keras_vit.from_pretrained(model[len("dir="):], classes=1000, classifier_activation=None, dtype=policy)
    hidden, layers, heads, mlp, patch = SIZES[model]
    if contender in ("keras_vit", "keras_vit_jit"):
        import keras_vit

        sizes = dict(image_size=image_size, patch_size=patch, hidden_size=hidden, num_layers=layers, num_heads=heads,
                     mlp_dim=mlp, dtype=policy, **({"approximate_gelu": False} if exact_gelu else {}))
        if task == "infer":
            return keras_vit.ViT(include_top=False, **sizes)
        return keras_vit.ViT(classes=1000, classifier_activation=None, **sizes)
    import keras_hub

    backbone = keras_hub.models.ViTBackbone(image_shape=(image_size, image_size, 3), patch_size=patch,
                                            num_layers=layers, num_heads=heads, hidden_dim=hidden, mlp_dim=mlp,
                                            dtype=policy)
    if task == "infer":
        return backbone
    logits = keras.layers.Dense(1000, dtype="float32")(backbone.output[:, 0])
    return keras.Model(backbone.input, logits)


def on_device(array):
    """`array` as the Keras backend's tensor on its accelerator (or CPU): made once, outside the timed steps."""
    import keras

    backend = keras.backend.backend()
    if backend == "jax":
        import jax

        return jax.device_put(array)
    if backend == "torch":
        from keras.src.backend.torch.core import get_device

        import torch

        return torch.as_tensor(array, device=get_device())
    return keras.ops.convert_to_tensor(array)


def synchronize(result):
    """Wait until the device has computed `result` (a backend tensor, or a structure of them)."""
    import keras

    backend = keras.backend.backend()
    for leaf in keras.tree.flatten(result):
        if backend == "jax":
            leaf.block_until_ready()
        elif backend == "tensorflow":  # one element back to the host waits for the whole tensor
            leaf[(0,) * len(leaf.shape)].numpy()
    if backend == "torch":
        import torch

        if torch.cuda.is_available():
            torch.cuda.synchronize()


def attention_kernel(compiled_text):
    """Which attention an XLA program runs: cuDNN's fused kernel (its custom call) or XLA's own."""
    calls = compiled_text.count("__cudnn$fmha")
    return f"cuDNN fused ({calls} calls)" if calls else "XLA's"


def keras_device_forward(net, jit_compile):
    """A forward pass on a device-resident batch whose output stays on the device, and what it reveals.

    JAX: the model's `stateless_call` under `jax.jit` (what Keras' predict step compiles), with the attention
    kernel read from the compiled program; torch: `net(x)` under `no_grad` (torch.compile for `jit_compile`,
    as Keras compiles its steps); TensorFlow: a `tf.function`.
    """
    import keras

    backend = keras.backend.backend()
    if backend == "jax":
        import jax

        forward = jax.jit(lambda trainable, other, x: net.stateless_call(trainable, other, x, training=False)[0])
        info, compiled = {}, []

        def step(x):
            # Read at each step: Keras' own predict step donates the variables' buffers and replaces them.
            variables = ([v.value for v in net.trainable_variables], [v.value for v in net.non_trainable_variables])
            if not compiled:  # compiled once, and read for its attention kernel
                compiled.append(forward.lower(*variables, x).compile())
                info["attention"] = attention_kernel(compiled[0].as_text())
            return compiled[0](*variables, x)

        return step, info
    if backend == "torch":
        import torch

        call = (lambda x: net(x, training=False))  # noqa: E731
        if jit_compile:
            call = torch.compile(call, dynamic=False)

        def step(x):
            with torch.no_grad():
                return call(x)

        return step, {}
    import tensorflow as tf

    return tf.function(lambda x: net(x, training=False), jit_compile=bool(jit_compile)), {}


def run_keras(contender, model, task, batch, iterations, dtype, exact_gelu=False, modes=MODES, rounds=1,
              image_size=224):
    """Seconds per step of a Keras model in each of `modes`, `rounds` inner rounds of `iterations` steps each.

    device: the batch (and labels) made once on the device; inference leaves its output there and ends
    synchronised, training is `train_on_batch` (its loss comes back as a number). end_to_end: a host numpy
    batch in and numpy out each step (`predict_on_batch`, `train_on_batch`), what `predict` and `fit` users pay.
    """
    import warnings

    import keras

    net = keras_model(contender, model, task, dtype, exact_gelu, image_size)
    if dtype == "int8":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            net.quantize("int8")
    rng = np.random.default_rng(0)
    images = rng.uniform(-1, 1, (batch, image_size, image_size, 3)).astype("float32")
    labels = rng.integers(0, 1000, batch)
    jit_compile = True if contender == "keras_vit_jit" else "auto"
    steps, info = {}, {}
    if task == "infer":
        if jit_compile is True:
            net.compile(jit_compile=True)
        if "device" in modes:
            forward, info = keras_device_forward(net, jit_compile is True)
            device_images = on_device(images)
            steps["device"] = lambda: synchronize(forward(device_images))  # noqa: E731
        steps["end_to_end"] = lambda: net.predict_on_batch(images)  # noqa: E731
        crossing = {"device": (0, 0), "end_to_end": (images.nbytes, None)}  # out: the numpy output's size
    else:
        if task.startswith("finetune"):
            from keras_vit import recipes

            lamb = task == "finetune_lamb"  # LAMB clips to global norm 1, as timm's Lamb (max_grad_norm) does
            optimizer = recipes.finetuning_optimizer(1e-3, opt="lamb" if lamb else "adamw", weight_decay=0.05,
                                                     layer_decay=0.65, model=net, global_clipnorm=1.0 if lamb else None)
        else:
            optimizer = keras.optimizers.AdamW(1e-3)
        net.compile(optimizer=optimizer, jit_compile=jit_compile,
                    loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        if "device" in modes:
            device_images, device_labels = on_device(images), on_device(labels)
            steps["device"] = lambda: net.train_on_batch(device_images, device_labels)  # noqa: E731
        steps["end_to_end"] = lambda: net.train_on_batch(images, labels)  # noqa: E731
        crossing = {"device": (0, 4), "end_to_end": (images.nbytes + labels.nbytes, 4)}
    return measure({mode: steps[mode] for mode in modes}, iterations, rounds, crossing, info)


def run_timm(model, task, batch, iterations, dtype, modes=MODES, rounds=1, image_size=224):
    """timm's counterpart of `run_keras`: eager PyTorch, bfloat16 through `torch.autocast`, AdamW for training.

    device: `forward_features` (inference) or an AMP step (training) on a batch made once on the GPU;
    end_to_end: a host numpy batch copied in each step, and the output brought back as numpy (`.float()`, as a
    bfloat16 tensor has no numpy dtype) or the loss as a number.
    """
    import timm
    import torch

    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if model.startswith("dir="):
        net = timm.create_model("local-dir:" + model[len("dir="):], pretrained=True,
                                num_classes=0 if task == "infer" else 1000).to(device)
    else:
        hidden, layers, heads, mlp, patch = SIZES[model]
        net = timm.models.vision_transformer.VisionTransformer(
            img_size=image_size, patch_size=patch, embed_dim=hidden, depth=layers, num_heads=heads,
            mlp_ratio=mlp / hidden, num_classes=0 if task == "infer" else 1000).to(device)
    rng = np.random.default_rng(0)
    host_images = rng.uniform(-1, 1, (batch, 3, image_size, image_size)).astype("float32")
    host_labels = rng.integers(0, 1000, batch)
    images = torch.from_numpy(host_images).to(device)
    labels = torch.from_numpy(host_labels).to(device)
    autocast = torch.autocast(device, dtype=torch.bfloat16, enabled=dtype == "bfloat16")
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    if task == "infer":
        net.eval()

        def forward(x):
            with torch.inference_mode(), autocast:
                return net.forward_features(x)

        def device_step():
            out = forward(images)
            sync()
            return out

        def end_to_end_step():
            return forward(torch.from_numpy(host_images).to(device)).float().cpu().numpy()

        crossing = {"device": (0, 0), "end_to_end": (host_images.nbytes, None)}
    else:
        net.train()
        if task.startswith("finetune"):  # the recipe's groups, each at its layer's rate, as timm's schedulers apply
            from timm.optim import create_optimizer_v2

            optimizer = create_optimizer_v2(net, "lamb" if task == "finetune_lamb" else "adamw", lr=1e-3, weight_decay=0.05, layer_decay=0.65)
            for group in optimizer.param_groups:
                group["lr"] = 1e-3 * group.get("lr_scale", 1.0)
        else:
            optimizer = torch.optim.AdamW(net.parameters(), lr=1e-3)

        def train_step(x, y):
            optimizer.zero_grad(set_to_none=True)
            with autocast:
                loss = torch.nn.functional.cross_entropy(net(x), y)
            loss.backward()
            optimizer.step()
            return loss.item()

        def device_step():
            return train_step(images, labels)

        def end_to_end_step():
            return train_step(torch.from_numpy(host_images).to(device), torch.from_numpy(host_labels).to(device))

        crossing = {"device": (0, 4), "end_to_end": (host_images.nbytes + host_labels.nbytes, 4)}
    steps = {"device": device_step, "end_to_end": end_to_end_step}
    return measure({mode: steps[mode] for mode in modes}, iterations, rounds, crossing, {})


def measure(steps, iterations, rounds, crossing, info):
    """Seconds per step of each mode (`steps`: {mode: step}): a first (compiling) call each, then `rounds` rounds
    that time `iterations` calls of each mode in turn. Returns {mode: {...}} with the rounds' seconds per step,
    their median, the first call's seconds, the host bytes in and out per step, and the process's peak RSS;
    `info` (what the device forward revealed) goes with the device mode."""
    first, crossing = {}, dict(crossing)
    for mode, step in steps.items():
        start = time.perf_counter()
        out = step()
        first[mode] = time.perf_counter() - start
        if crossing[mode][1] is None:  # what the step hands back to the host: its numpy output
            crossing[mode] = (crossing[mode][0], sum(np.asarray(leaf).nbytes for leaf in
                                                     (out.values() if isinstance(out, dict) else [out])))
    per_round = {mode: [] for mode in steps}
    for _ in range(rounds):
        for mode, step in steps.items():
            start = time.perf_counter()
            for _ in range(iterations):
                step()
            per_round[mode].append((time.perf_counter() - start) / iterations)
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {mode: {"first_call_s": first[mode], "step_s": statistics.median(times), "round_step_s": times,
                   "bytes_in": int(crossing[mode][0]), "bytes_out": int(crossing[mode][1]), "peak_rss_mb": peak_mb,
                   **(info if mode == "device" else {})}
            for mode, times in per_round.items()}


def worker(args):
    modes = tuple(args.modes.split(","))
    if args.worker == "timm":
        result = run_timm(args.model, args.task, args.batch, args.iterations, args.dtype, modes,
                          args.rounds_in_process, args.image_size)
    else:
        result = run_keras(args.worker, args.model, args.task, args.batch, args.iterations, args.dtype,
                           args.exact_gelu, modes, args.rounds_in_process, args.image_size)
    print("RESULT " + json.dumps(result), flush=True)


# --------------------------------------------------------------------------- driver


def measure_in_process(python, contender, model, task, dtype, backend, args):
    command = [python, os.path.abspath(__file__), "--worker", contender, "--model", model, "--task", task,
               "--batch", str(args.batch), "--iterations", str(args.iterations), "--dtype", dtype,
               "--modes", args.modes, "--rounds-in-process", str(args.rounds_in_process),
               "--image-size", str(args.image_size)]
    if args.exact_gelu and contender != "timm":
        command.append("--exact-gelu")
    return result_of(command, backend)


def result_of(command, backend):
    """Run `command` in a fresh process (with `KERAS_BACKEND=backend`) and read the JSON after its "RESULT "."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    if backend:
        env["KERAS_BACKEND"] = backend
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=3600)
    # What the worker said on stderr (keras_vit's log: a kernel fallback, say) is kept, not thrown away.
    notes = [line for line in done.stderr.splitlines() if line.startswith("keras_vit:")]
    if done.returncode or "RESULT " not in done.stdout:
        return {"error": (done.stderr or done.stdout).strip().splitlines()[-1][:300]}
    result = json.loads(done.stdout.split("RESULT ", 1)[1].splitlines()[0])
    for mode in result.values():
        mode["notes"] = notes
    return result


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
    parser.add_argument("--modes", default=",".join(MODES),
                        help="device (batch made on the device, output left there) and/or end_to_end (numpy in, "
                             "numpy out)")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--iterations", type=int, default=5, help="timed steps per round (their mean is the round's)")
    parser.add_argument("--rounds", type=int, default=5,
                        help="interleaved rounds, a fresh process per contender each (rounds x rounds-in-process: "
                             "at least 5)")
    parser.add_argument("--rounds-in-process", type=int, default=1,
                        help="rounds each process times after its compile: fewer processes where start-up and "
                             "compile cost more than the steps (an accelerator)")
    parser.add_argument("--dtype", default="float32", help="float32, bfloat16, int8, or several: float32,int8")
    parser.add_argument("--timm-python", help="a Python that has timm, to include it")
    parser.add_argument("--jit-compile", action="store_true",
                        help="also keras_vit under model.compile(jit_compile=True) (torch.compile on PyTorch)")
    parser.add_argument("--exact-gelu", action="store_true",
                        help="keras_vit (and keras-hub, which always does) computes the exact GELU, as timm does")
    parser.add_argument("--peak-tflops", type=float,
                        help="the accelerator's peak (e.g. 989 for an H200 in bf16) instead of the measured CPU matmul peak")
    parser.add_argument("--dry-run", action="store_true",
                        help="a rehearsal of every code path: a tiny model at 32 px, batch 2, one round of one step")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--task", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args)
    if args.dry_run:
        args.models, args.image_size, args.batch, args.iterations, args.rounds = "tiny", 32, 2, 1, 1
        args.rounds_in_process = 1
    unknown = set(args.modes.split(",")) - set(MODES)
    if unknown:
        parser.error(f"unknown --modes {sorted(unknown)}; choose among {', '.join(MODES)}")
    if args.rounds * args.rounds_in_process < 5 and not args.dry_run:
        parser.error(f"--rounds {args.rounds} x --rounds-in-process {args.rounds_in_process}: the spread needs at "
                     "least 5 rounds")
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
          + f" G(FL)OP/s ({'given' if args.peak_tflops else 'measured matmul'})", flush=True)
    rows = []
    for model in args.models.split(","):
        for task in args.tasks.split(","):
            training = task in ("train", "finetune", "finetune_lamb")
            runs = [(c, d) for d in dtypes for c in contenders if not (d == "int8" and (c == "timm" or training))
                    and not (c == "keras_hub" and (task.startswith("finetune") or model.startswith("dir=")))]
            results = {run: [] for run in runs}
            for round_index in range(args.rounds):
                # Interleaved, so drift hits every contender alike; the order rotates, so no one always goes first.
                shift = round_index % len(runs)
                for contender, dtype in runs[shift:] + runs[:shift]:
                    python = args.timm_python if contender == "timm" else sys.executable
                    results[contender, dtype].append(measure_in_process(
                        python, contender, model, task, dtype, None if contender == "timm" else backend, args))
            flops = (float("nan") if model.startswith("dir=") else  # a folder's model: no roofline
                     forward_flops(model, args.image_size) * (3 if training else 1) * args.batch)
            task_rows = summarize(model, task, runs, results, args.batch, flops, peaks, args.modes.split(","))
            print(report(task_rows), flush=True)  # each task's table as soon as it is measured
            rows += task_rows
    notes = sorted({note for row in rows for note in row["notes"]})
    if notes:
        print("\n".join(["what keras_vit logged:"] + notes))
    return rows


def summarize(model, task, runs, results, batch, flops, peaks, modes):
    """One row per (contender, dtype, mode): the rounds' img/s (median, min, max) and how it ranks.

    Within each (mode, dtype), keras_vit is the reference (`x keras_vit`) and timm, where it ran, the peer
    (`x timm`). Per-round ratios pair rounds that ran back to back; the ranking is "inside spread" when the
    min-max ranges overlap.
    """
    rows = []
    for mode in modes:
        for contender, dtype in runs:
            processes = results[contender, dtype]
            errors = [r for r in processes if "error" in r]
            if errors:
                print(f"{model} {task} {contender} {dtype}: failed: {errors[0]['error']}")
                continue
            measured = [r[mode] for r in processes]
            speeds = [batch / step for r in measured for step in r["round_step_s"]]
            row = dict(model=model, task=task, contender=contender, dtype=dtype, mode=mode, speeds=speeds,
                       images_per_s=statistics.median(speeds), low=min(speeds), high=max(speeds),
                       first_call_s=statistics.median(r["first_call_s"] for r in measured),
                       peak_rss_mb=statistics.median(r["peak_rss_mb"] for r in measured),
                       mb_in=measured[0]["bytes_in"] / 1e6, mb_out=measured[0]["bytes_out"] / 1e6,
                       attention=measured[0].get("attention", ""),
                       notes=sorted({n for r in measured for n in r.get("notes", [])}))
            row["roofline"] = flops / (batch / row["images_per_s"]) / peaks[dtype] if peaks[dtype] else float("nan")
            rows.append(row)
    for row in rows:
        group = [r for r in rows if r["mode"] == row["mode"] and r["dtype"] == row["dtype"]]
        base = next((r for r in group if r["contender"] == "keras_vit"), group[0])
        peer = next((r for r in group if r["contender"] == "timm"), None)
        row["speed_vs_keras_vit"] = row["images_per_s"] / base["images_per_s"]
        row["speed_vs_timm"] = row["images_per_s"] / peer["images_per_s"] if peer else float("nan")
        paired = [mine / theirs for mine, theirs in zip(row["speeds"], base["speeds"])]
        row["round_ratios"] = (min(paired), max(paired))
        if row is base:
            row["ranking"] = "reference"
        elif row["low"] > base["high"]:
            row["ranking"] = "ahead beyond spread"
        elif row["high"] < base["low"]:
            row["ranking"] = "behind beyond spread"
        else:
            row["ranking"] = "inside spread"
    return rows


def report(rows):
    """The table of `summarize`'s rows, one line each."""
    lines = [f"{'model':6s} {'task':6s} {'mode':10s} {'contender':13s} {'dtype':8s} {'img/s median (min-max)':>25s} "
             f"{'x keras_vit':>11s} {'x timm':>7s} {'per round':>11s} {'ranking':20s} {'1st call s':>10s} "
             f"{'peak MB':>8s} {'MB in/out':>13s} {'roofline':>8s} attention"]
    for r in rows:
        spread = f"{r['images_per_s']:.2f} ({r['low']:.2f}-{r['high']:.2f})"
        per_round = f"{r['round_ratios'][0]:.2f}-{r['round_ratios'][1]:.2f}"
        crossing = f"{r['mb_in']:.3g}/{r['mb_out']:.3g}"
        lines.append(f"{r['model']:6s} {r['task']:6s} {r['mode']:10s} {r['contender']:13s} {r['dtype']:8s} "
                     f"{spread:>25s} {r['speed_vs_keras_vit']:11.2f} {r['speed_vs_timm']:7.2f} {per_round:>11s} "
                     f"{r['ranking']:20s} {r['first_call_s']:10.1f} {r['peak_rss_mb']:8.0f} {crossing:>13s} "
                     f"{r['roofline']:8.1%} {r['attention']}")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
