"""Where keras_vit's ViT-B/16 inference on the PyTorch backend spends its time, op by op, beside timm's.

    KERAS_BACKEND=torch python benchmarks/torch_profile.py [--rounds 3] [--batch 8]

Run it with a Python that has keras_vit, keras and timm on one torch build
(for example the timm venv with `pip install keras keras-hub && pip install
--no-deps -e .`), so that both models call the same torch kernels. Each model
runs its forward pass (keras_vit: `predict_on_batch`; timm:
`forward_features` under `inference_mode`) under `torch.profiler`, the two
interleaved round by round; the self time of every torch op is summed into
a few kinds (matrix products, additions, GELU, attention, LayerNorm,
copies, the patch convolution) and averaged over the rounds. A second table
times, on the MLP's hidden activations, each way of writing the tanh GELU in
`keras.ops` that equals `ops.gelu(approximate=True)` to 1e-6, beside the
exact GELU timm uses, and a Dense layer's product plus bias against torch's
fused `linear`.
"""

import argparse
import collections
import math
import os
import statistics
import time

os.environ.setdefault("KERAS_BACKEND", "torch")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from keras import ops  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

import keras_vit  # noqa: E402

KINDS = (  # (kind, substrings of the torch op names it holds), first match wins
    ("matrix products", ("aten::mm", "aten::addmm", "aten::bmm")),
    ("additions (bias, residual)", ("aten::add",)),
    ("GELU", ("aten::gelu",)),
    ("attention", ("scaled_dot_product", "_softmax")),
    ("LayerNorm", ("layer_norm",)),
    ("copies", ("aten::copy_", "aten::clone", "aten::contiguous")),
    ("patch convolution", ("convolution",)),
)


def kind_of(op_name):
    for kind, names in KINDS:
        if any(name in op_name for name in names):
            return kind
    return "other"


def profiled_ms(step):
    """Self CPU milliseconds of one call of `step`, per kind of op, and the wall time."""
    start = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU]) as trace:
        step()
    wall = (time.perf_counter() - start) * 1e3
    totals = collections.Counter()
    for event in trace.key_averages():
        totals[kind_of(event.key)] += event.self_cpu_time_total / 1e3
    totals["wall (profiled)"] = wall
    return totals


def median_ms(step, rounds):
    step()
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def gelu_formulas():
    """Ways of writing the tanh GELU in keras.ops; each equals `ops.gelu(approximate=True)` to 1e-6."""
    twice_root = 2.0 * math.sqrt(2.0 / math.pi)  # 0.5 (1 + tanh(z)) = sigmoid(2 z)
    cubic = twice_root * 0.044715

    def sigmoid_form(x):
        return x * ops.sigmoid(x * (twice_root + cubic * ops.square(x)))

    def silu_form(x):
        slope = twice_root + cubic * ops.square(x)
        return ops.silu(x * slope) / slope

    return {
        "ops.gelu(approximate=True)": lambda x: ops.gelu(x, approximate=True),
        "x * sigmoid(x (a + b x^2))": sigmoid_form,
        "silu(x s) / s, s = a + b x^2": silu_form,
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch", type=int, default=8)
    args = parser.parse_args()
    if keras.backend.backend() != "torch":
        raise SystemExit("run with KERAS_BACKEND=torch")
    try:
        import timm
    except ImportError:
        raise SystemExit("torch_profile.py needs timm beside keras_vit on one torch build: "
                         "run it with the timm venv's Python (see the docstring)") from None

    model = keras_vit.ViT(image_size=224, patch_size=16, hidden_size=768, num_layers=12, num_heads=12, mlp_dim=3072,
                          include_top=False)
    reference = timm.create_model("vit_base_patch16_224", pretrained=False, num_classes=0).eval()
    images = np.random.default_rng(0).uniform(-1, 1, (args.batch, 224, 224, 3)).astype("float32")
    images_nchw = torch.from_numpy(images.transpose(0, 3, 1, 2).copy())

    def timm_forward():
        with torch.inference_mode():
            reference.forward_features(images_nchw)

    steps = {"keras_vit": lambda: model.predict_on_batch(images), "timm": timm_forward}
    for step in steps.values():
        step()
    rounds = {name: [] for name in steps}
    for _ in range(args.rounds):
        for name, step in steps.items():
            rounds[name].append(profiled_ms(step))
    kinds = [kind for kind, _ in KINDS] + ["other", "wall (profiled)"]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; ViT-B/16 inference, batch {args.batch}, "
          f"float32; self CPU ms per forward pass, mean of {args.rounds} interleaved rounds")
    print(f"{'kind of op':28s} {'keras_vit':>10s} {'timm':>10s} {'difference':>10s}")
    for kind in kinds:
        ours, theirs = (statistics.mean(r[kind] for r in rounds[name]) for name in steps)
        print(f"{kind:28s} {ours:10.1f} {theirs:10.1f} {ours - theirs:+10.1f}")

    hidden = torch.randn(args.batch, 197, 3072)
    exact = ops.gelu(hidden, approximate=True)
    print(f"\nGELU on the MLP's hidden activations {tuple(hidden.shape)}, median ms of {5 * args.rounds} calls")
    for name, formula in gelu_formulas().items():
        error = float(ops.max(ops.abs(formula(hidden) - exact)))
        print(f"{name:34s} {median_ms(lambda f=formula: f(hidden), 5 * args.rounds):7.2f}  (max |diff| {error:.1e})")
    print(f"{'exact GELU (timm), for reference':34s} {median_ms(lambda: ops.gelu(hidden, approximate=False), 5 * args.rounds):7.2f}")

    tokens = torch.randn(args.batch, 197, 768)
    dense = keras.layers.Dense(3072)
    dense.build(tokens.shape)
    weight = dense.kernel.value.detach().t().contiguous()
    bias = dense.bias.value.detach()
    with torch.no_grad():
        print(f"\nDense 768 -> 3072 on {tuple(tokens.shape)}, median ms of {5 * args.rounds} calls")
        print(f"{'keras Dense (matmul, then add)':34s} {median_ms(lambda: dense(tokens), 5 * args.rounds):7.2f}")
        print(f"{'torch linear (bias fused, timm)':34s} "
              f"{median_ms(lambda: torch.nn.functional.linear(tokens, weight, bias), 5 * args.rounds):7.2f}")


if __name__ == "__main__":
    main()
