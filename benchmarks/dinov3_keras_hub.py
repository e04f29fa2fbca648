"""keras_vit against keras-hub and transformers on DINOv3: the same outputs from the same folder, and how fast.

    KERAS_BACKEND=jax python benchmarks/dinov3_keras_hub.py --transformers-python /path/to/venv/bin/python \\
        [--size S16] [--batch 8] [--rounds 5] [--iterations 3]

keras-hub's DINOv3 loads from transformers' folders only; so does this
comparison. In --transformers-python (it needs torch and transformers), a
`DINOv3ViTModel` of the published sizes (`--size`: dinov3-vits16 or -vitb16,
4 registers, no k bias, layer scale 1) gets random weights and is written by
`save_pretrained` to a temporary folder, with its `last_hidden_state` on
fixed 224-pixel images. keras_vit (`from_pretrained(folder, pooling=None)`)
and keras-hub (`DINOV3Backbone.from_preset(folder)`, its transformers
converter) each load that folder in a fresh process; each gives the largest
difference of its tokens from transformers', and the median img/s of its
batch inference. The contenders run interleaved, round by round, each in a
fresh process; each row gives the median of the rounds with their min and
max, the ratio of medians against keras_vit, and whether the order holds
beyond the spread (the two min-max ranges apart) or not ("inside spread").
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import numpy as np
from throughput import result_of  # benchmarks/, this script's folder, is on sys.path

# The published DINOv3 ViTs' sizes (hidden, layers, heads, MLP), patch 16, 4 registers, RoPE theta 100.
SIZES = {"S16": (384, 12, 6, 1536), "B16": (768, 12, 12, 3072)}
MEAN, STD = np.array([0.485, 0.456, 0.406]), np.array([0.229, 0.224, 0.225])

TRANSFORMERS_RUN = """
import json, os, sys, time
import numpy as np, torch
from transformers import DINOv3ViTConfig, DINOv3ViTModel

folder, hidden, layers, heads, mlp, iterations = sys.argv[1], *map(int, sys.argv[2:])
if not os.path.exists(os.path.join(folder, "tokens.npy")):  # The first run writes the folder; later ones time it.
    torch.manual_seed(0)
    config = DINOv3ViTConfig(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                             intermediate_size=mlp, patch_size=16, image_size=224, num_register_tokens=4,
                             hidden_act="gelu", use_gated_mlp=False, layerscale_value=1.0, query_bias=True,
                             key_bias=False, value_bias=True, rope_theta=100.0)
    model = DINOv3ViTModel(config).eval()
    with torch.no_grad():  # Random values in every tensor: the norms' and layer scales' around 1.
        for name, parameter in model.named_parameters():
            around_one = "layer_scale" in name or ("norm" in name and name.endswith("weight"))
            parameter.copy_(1 + 0.1 * torch.randn_like(parameter) if around_one
                            else 0.02 * torch.randn_like(parameter))
    model.save_pretrained(folder)
again = DINOv3ViTModel.from_pretrained(folder).eval()
pixels = torch.from_numpy(np.load(os.path.join(folder, "pixels.npy"))).permute(0, 3, 1, 2).contiguous()
with torch.inference_mode():
    tokens = again(pixel_values=pixels).last_hidden_state.numpy()  # Also the warm-up call.
    if not os.path.exists(os.path.join(folder, "tokens.npy")):
        np.save(os.path.join(folder, "tokens.npy"), tokens)
    times = []
    for _ in range(iterations):
        start = time.perf_counter()
        again(pixel_values=pixels)
        times.append(time.perf_counter() - start)
print("RESULT " + json.dumps({"step_s": float(np.median(times))}), flush=True)
"""


def run_keras(contender, folder, iterations):
    import keras

    images = np.load(os.path.join(folder, "images.npy"))
    if contender == "keras_vit":
        import keras_vit

        model = keras_vit.from_pretrained(folder, pooling=None)
        inputs = images  # keras_vit takes [-1, 1] pixels and applies the folder's statistics itself.
    else:
        import keras_hub

        model = keras_hub.models.DINOV3Backbone.from_preset(folder, image_shape=images.shape[1:])
        inputs = np.load(os.path.join(folder, "pixels.npy"))  # A keras-hub backbone takes normalized pixels.
    tokens = keras.ops.convert_to_numpy(model.predict_on_batch(inputs))
    reference = np.load(os.path.join(folder, "tokens.npy"))
    difference = float(np.max(np.abs(tokens - reference))) if tokens.shape == reference.shape else None
    times = []
    for _ in range(iterations):
        start = time.perf_counter()
        model.predict_on_batch(inputs)
        times.append(time.perf_counter() - start)
    return {"step_s": statistics.median(times), "max_difference": difference, "shape": list(tokens.shape)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--transformers-python", required=True, help="an interpreter with torch and transformers")
    parser.add_argument("--size", choices=sorted(SIZES), default="S16")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--iterations", type=int, default=3)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print("RESULT " + json.dumps(run_keras(args.worker, args.folder, args.iterations)), flush=True)
        return
    if args.rounds < 5:
        parser.error(f"--rounds {args.rounds}: at least 5 rounds are needed for a spread")
    import keras

    backend = keras.backend.backend()
    contenders = ["keras_vit", "keras_hub", "transformers"]
    results = {name: [] for name in contenders}
    with tempfile.TemporaryDirectory() as folder:
        rng = np.random.default_rng(0)
        images = rng.uniform(-1, 1, (args.batch, 224, 224, 3)).astype("float32")
        np.save(os.path.join(folder, "images.npy"), images)
        np.save(os.path.join(folder, "pixels.npy"), (((images + 1) / 2 - MEAN) / STD).astype("float32"))
        transformers_run = [args.transformers_python, "-c", TRANSFORMERS_RUN, folder, *map(str, SIZES[args.size]),
                            str(args.iterations)]
        written = result_of(transformers_run, None)
        if "error" in written:
            sys.exit(f"transformers could not write the folder: {written['error']}")
        for round_index in range(args.rounds):
            order = contenders[round_index % 3:] + contenders[:round_index % 3]
            for name in order:
                if name == "transformers":
                    result = result_of(transformers_run, None)
                else:
                    result = result_of([sys.executable, os.path.abspath(__file__), "--transformers-python",
                                         args.transformers_python, "--worker", name, "--folder", folder,
                                         "--iterations", str(args.iterations)], backend)
                results[name].append(result)
    report(args, backend, results)


def report(args, backend, results):
    print(f"\nDINOv3 ViT-{args.size[0]}/{args.size[1:]}, 224 px, batch {args.batch}, {backend} backend, "
          f"{args.rounds} rounds (img/s: median, min-max)")
    print("| contender | img/s | ratio to keras_vit | against keras_vit | max |tokens - transformers'| |")
    print("|---|---|---|---|---|")
    rates, ranges = {}, {}
    for name, runs in results.items():
        errors = [run["error"] for run in runs if "error" in run]
        if errors:
            print(f"| {name} | failed: {errors[0]} | | | |")
            continue
        per_round = [args.batch / run["step_s"] for run in runs]
        rates[name], ranges[name] = statistics.median(per_round), (min(per_round), max(per_round))
        ratio = f"{rates[name] / rates['keras_vit']:.2f}x" if "keras_vit" in rates else ""
        ranking = ""
        if "keras_vit" in ranges and name != "keras_vit":
            low, high = ranges["keras_vit"]
            ranking = ("ahead beyond spread" if ranges[name][0] > high else
                       "behind beyond spread" if ranges[name][1] < low else "inside spread")
        difference = runs[0].get("max_difference", 0.0)
        shown = "the reference" if name == "transformers" else (
            f"{difference:.1e}" if difference is not None else f"tokens of shape {runs[0]['shape']}")
        print(f"| {name} | {rates[name]:.2f} ({min(per_round):.2f}-{max(per_round):.2f}) | {ratio} | {ranking} | "
              f"{shown} |")


if __name__ == "__main__":
    main()
