"""NaFlex inference at a 256-patch budget on mixed-aspect photos, against the same model at a fixed 256 px.

    KERAS_BACKEND=jax python benchmarks/naflex_inference.py [--rounds 5] [--batch 8] [--model B16]

One ViT (ViT-B/16 by default, built from scratch: no download) runs two ways
on the same weights:

- NaFlex: `keras_vit.ViT(naflex=True)`; each photo keeps its aspect ratio
  and gets as many 16-pixel patches as fit 256 (`naflex_batch`, SigLIP 2's
  rule, Pillow's bilinear), padded to the 256 bucket with a mask;
- fixed: `keras_vit.ViT(image_size=256)`; each photo squashed to 256x256
  (16x16 = 256 patches) by `keras_vit.eval_transform` (keras_vit's own).

The photos are generated uint8 arrays of camera sizes and aspect ratios
(4:3, 3:4, 16:9, 9:16, 1:1, 3:1; decoding, the same for both, is left
out). Each round times one batch of each, end to end (resize, patches,
`predict_on_batch`) and the model alone, after a warm-up batch that
compiles; the contenders alternate within each round, each first in every
other round. A row gives the
median img/s of the rounds with their min and max, and NaFlex's ratio to
fixed, of the medians and the range of the per-round ratios.
"""

import argparse
import statistics
import sys
import time

import numpy as np

SIZES = {"S16": (384, 12, 6, 1536), "B16": (768, 12, 12, 3072)}  # hidden, layers, heads, mlp; patch 16
PHOTOS = ((1500, 2000), (2000, 1500), (1080, 1920), (1920, 1080), (1200, 1200), (1000, 3000), (3024, 4032),
          (640, 480))
PATCH, BUDGET, FIXED = 16, 256, 256


def photos(count):
    rng = np.random.default_rng(0)
    return [rng.integers(0, 256, (*PHOTOS[i % len(PHOTOS)], 3), dtype=np.uint8) for i in range(count)]


def models(name):
    import keras_vit

    hidden, layers, heads, mlp = SIZES[name]
    sizes = dict(patch_size=PATCH, hidden_size=hidden, num_layers=layers, num_heads=heads, mlp_dim=mlp)
    naflex = keras_vit.ViT(naflex=True, image_size=FIXED, **sizes, classes=1000)
    fixed = keras_vit.ViT(image_size=FIXED, **sizes, classes=1000)
    fixed.set_weights(naflex.get_weights())  # the same model: one 16x16 position table, resized per image by NaFlex
    return naflex, fixed


def timed(function):
    start = time.perf_counter()
    result = function()
    return result, time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=SIZES, default="B16")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batch", type=int, default=8)
    args = parser.parse_args()
    import keras

    import keras_vit
    from keras_vit.data import naflex_batch

    naflex, fixed = models(args.model)
    transform = keras_vit.eval_transform(fixed)
    images = photos(args.batch)
    prepare = {"naflex": lambda: naflex_batch(images, PATCH, BUDGET),
               "fixed": lambda: np.stack([transform(image) for image in images])}
    network = {"naflex": naflex, "fixed": fixed}
    for name in prepare:  # warm-up: compile each model's step
        network[name].predict_on_batch(prepare[name]())
    rates = {(name, part): [] for name in prepare for part in ("end to end", "model")}
    for round_ in range(args.rounds):
        for name in list(prepare)[::1 if round_ % 2 else -1]:  # each goes first in every other round
            inputs, preparing = timed(prepare[name])
            _, running = timed(lambda: keras.ops.convert_to_numpy(network[name].predict_on_batch(inputs)))
            rates[name, "end to end"].append(args.batch / (preparing + running))
            rates[name, "model"].append(args.batch / running)
    grids = naflex_batch(images, PATCH, BUDGET)["patch_grid"]
    print(f"{keras.backend.backend()}, ViT-{args.model[0]}/16 from scratch, {args.batch} photos "
          f"({', '.join(f'{h}x{w}' for h, w in PHOTOS[:args.batch])}), {args.rounds} rounds; NaFlex grids "
          f"{', '.join(f'{r}x{c}' for r, c in grids.tolist())} (bucket {BUDGET}), fixed 16x16:")
    print("| img/s | NaFlex, 256-patch budget | fixed 256 px | NaFlex / fixed (per-round range) |")
    print("|---|---|---|---|")
    for part in ("end to end", "model"):
        ours, theirs = rates["naflex", part], rates["fixed", part]
        ratios = [a / b for a, b in zip(ours, theirs)]
        cells = [f"{statistics.median(v):.2f} ({min(v):.2f}-{max(v):.2f})" for v in (ours, theirs)]
        print(f"| {part} | {cells[0]} | {cells[1]} | {statistics.median(ours) / statistics.median(theirs):.2f}x "
              f"({min(ratios):.2f}-{max(ratios):.2f}) |")


if __name__ == "__main__":
    sys.exit(main())
