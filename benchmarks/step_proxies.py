"""What an accelerator step pays besides compute, measured on a CPU: conversions, casts and Python dispatch.

    KERAS_BACKEND=torch python benchmarks/step_proxies.py [--batch 256] [--rounds 7]

Run it with a Python that has keras_vit, keras and timm on one torch build
(as `torch_profile.py`). It prints, for ViT-B/16 in bfloat16 (keras_vit in
the `"bfloat16"` policy, timm under `torch.autocast`):

- host milliseconds to turn one batch's bfloat16 token output `(batch, 197,
  768)` into numpy: Keras' `convert_to_numpy` (what `predict` paid before
  keras_vit converted its outputs itself) against
  `keras_vit.utils.keras_internals.outputs_to_numpy`, and a plain copy of
  the same bytes for scale;
- bytes written by dtype casts in one forward pass at `--batch`, every
  aten op seen through a `TorchDispatchMode`: measured at 1 and 2 images
  and extended linearly (the weights' casts, which timm's autocast makes
  at every call, do not grow with the batch): keras_vit's against timm's;
- Python dispatch per forward pass: ViT-B/16's 12 blocks and 12 heads at
  width 48 and 32 px (the op sequence of B/16 at negligible compute), so
  the time is the host's work to issue the ops: keras_vit's `model(x)` and
  `predict_on_batch` against timm's `forward_features`, on one thread
  (as a GPU step's host side; torch's thread pool only adds waits here).

The byte counts are exact; the milliseconds are medians of `--rounds`
interleaved rounds with their min and max.
"""

import argparse
import os
import statistics
import time

os.environ.setdefault("KERAS_BACKEND", "torch")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

import keras_vit  # noqa: E402
from keras_vit.utils.keras_internals import outputs_to_numpy  # noqa: E402

B16 = dict(patch_size=16, hidden_size=768, num_layers=12, num_heads=12, mlp_dim=3072)
TINY = dict(B16, hidden_size=48, mlp_dim=192)


class CastBytes(TorchDispatchMode):
    """Counts the bytes each dtype-changing op writes while active."""

    def __init__(self):
        super().__init__()
        self.bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        source = next((a for a in args if isinstance(a, torch.Tensor)), None)
        if (isinstance(result, torch.Tensor) and source is not None and result.dtype != source.dtype
                and func.__name__.split(".")[0] in ("_to_copy", "to", "copy_", "type_as")):
            self.bytes += result.numel() * result.element_size()
        return result


def spread(times_ms):
    return f"{statistics.median(times_ms):8.2f} ({min(times_ms):.2f}-{max(times_ms):.2f})"


def timed_rounds(steps, rounds, calls=1):
    """`{name: [ms per call, one per round]}`, the steps interleaved round by round after one warm-up call each."""
    for step in steps.values():
        step()
    found = {name: [] for name in steps}
    for _ in range(rounds):
        for name, step in steps.items():
            start = time.perf_counter()
            for _ in range(calls):
                step()
            found[name].append((time.perf_counter() - start) * 1e3 / calls)
    return found


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    if keras.backend.backend() != "torch":
        raise SystemExit("run with KERAS_BACKEND=torch")
    import timm

    print(f"torch {torch.__version__}, keras {keras.__version__}, {torch.get_num_threads()} threads")

    # 1. One batch's bfloat16 tokens to numpy.
    tokens = torch.randn(args.batch, 197, 768).to(torch.bfloat16)
    plain = torch.empty_like(tokens)
    conversions = timed_rounds({
        "keras convert_to_numpy": lambda: keras.ops.convert_to_numpy(tokens),
        "keras_vit outputs_to_numpy": lambda: outputs_to_numpy(tokens),
        "plain copy of the bytes": lambda: plain.copy_(tokens),
    }, args.rounds)
    assert np.array_equal(keras.ops.convert_to_numpy(tokens).view("uint16"), outputs_to_numpy(tokens).view("uint16"))
    print(f"\n1. bfloat16 tokens {tuple(tokens.shape)} ({tokens.numel() * 2 / 1e6:.1f} MB) to numpy, host ms, "
          "median (min-max):")
    for name, times in conversions.items():
        print(f"   {name:28s} {spread(times)}")

    # 2. Cast bytes per forward.
    model = keras_vit.ViT(image_size=224, include_top=False, dtype="bfloat16", **B16)
    reference = timm.create_model("vit_base_patch16_224", pretrained=False, num_classes=0).eval()

    def keras_vit_casts(images):
        with torch.no_grad():
            model(images, training=False)

    def timm_casts(images):
        with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
            reference.forward_features(torch.from_numpy(images.transpose(0, 3, 1, 2).copy()))

    print(f"\n2. bytes written by dtype casts in one ViT-B/16 forward of {args.batch} images "
          "(from 1 and 2 images, linearly):")
    for name, forward in (("keras_vit (bfloat16 policy)", keras_vit_casts), ("timm (autocast bfloat16)", timm_casts)):
        counts = []
        for batch in (1, 2):
            with CastBytes() as counter:
                forward(np.zeros((batch, 224, 224, 3), "float32"))
            counts.append(counter.bytes)
        per_image = counts[1] - counts[0]
        total = counts[0] - per_image + per_image * args.batch
        print(f"   {name:28s} {total / 1e9:8.2f} GB ({per_image / 1e6:.1f} MB an image, "
              f"{(counts[0] - per_image) / 1e6:.1f} MB a call)")

    # 3. Python dispatch per forward.
    small = keras_vit.ViT(image_size=32, include_top=False, **TINY)
    reference_small = timm.models.vision_transformer.VisionTransformer(
        img_size=32, patch_size=16, embed_dim=48, depth=12, num_heads=12, mlp_ratio=4, num_classes=0).eval()
    one = np.zeros((1, 32, 32, 3), "float32")
    one_tensor, one_nchw = torch.from_numpy(one), torch.zeros(1, 3, 32, 32)

    def keras_vit_call():
        with torch.no_grad():
            small(one_tensor, training=False)

    def timm_call():
        with torch.inference_mode():
            reference_small.forward_features(one_nchw)

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    dispatch = timed_rounds({"keras_vit model(x)": keras_vit_call,
                             "keras_vit predict_on_batch": lambda: small.predict_on_batch(one),
                             "timm forward_features": timm_call}, args.rounds, calls=20)
    torch.set_num_threads(threads)
    base = statistics.median(dispatch["timm forward_features"])
    print("\n3. host ms per forward of ViT-B/16's 12 blocks at width 48 (dispatch), median (min-max):")
    for name, times in dispatch.items():
        print(f"   {name:28s} {spread(times)}   {statistics.median(times) / base:5.2f}x timm")


if __name__ == "__main__":
    main()
