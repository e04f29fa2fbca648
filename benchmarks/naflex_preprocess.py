"""NaFlex preprocessing on one CPU core: keras_vit's `naflex_batch` against transformers' Siglip2ImageProcessor.

    python benchmarks/naflex_preprocess.py --reference-python /path/to/venv-with-transformers/bin/python

32 generated photo-sized uint8 images of mixed aspect ratios (333-1024 px a
side, seeded) go to a 256-patch budget of 16-pixel patches, as one batch:

- keras_vit: `keras_vit.data.naflex_batch(images, 16, 256)` (Pillow's bilinear);
- transformers: `Siglip2ImageProcessor` (its default, torchvision backend)
  and `Siglip2ImageProcessorPil` (its Pillow backend), `return_tensors="np"`,
  in this process where transformers is installed, else in
  `--reference-python` (`--impl transformers`, a process of its own).

Every process is pinned to one core (`os.sched_setaffinity`, one torch
thread). The contenders are interleaved round by round; each round times
`--repeats` batches after one warm-up batch. A row gives the median img/s of
the rounds with their min and max, and the ratio of medians to keras_vit.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

PATCH, BUDGET, COUNT = 16, 256, 32


def images():
    rng = np.random.default_rng(0)
    sides = rng.integers(333, 1025, size=(COUNT, 2))
    return [rng.integers(0, 256, (int(h), int(w), 3), dtype=np.uint8) for h, w in sides]


def pin_to_one_core():
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    os.environ["OMP_NUM_THREADS"] = "1"


def rate(run, batch, repeats):
    run(batch)  # warm-up
    start = time.perf_counter()
    for _ in range(repeats):
        run(batch)
    return repeats * len(batch) / (time.perf_counter() - start)


def keras_vit_runs():
    from keras_vit.data import naflex_batch

    return {"keras_vit": lambda batch: naflex_batch(batch, PATCH, BUDGET)}


def transformers_runs():
    import torch
    from transformers.models.siglip2.image_processing_pil_siglip2 import Siglip2ImageProcessorPil
    from transformers.models.siglip2.image_processing_siglip2 import Siglip2ImageProcessor

    torch.set_num_threads(1)
    processors = {"transformers (torchvision)": Siglip2ImageProcessor,
                  "transformers (Pillow)": Siglip2ImageProcessorPil}
    return {name: (lambda batch, p=cls(patch_size=PATCH, max_num_patches=BUDGET): p(images=batch, return_tensors="np"))
            for name, cls in processors.items()}


def transformers_importable():
    try:
        import transformers  # noqa: F401 (imported to see that it can be)
    except ImportError:
        return False
    return True


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--impl", choices=("all", "transformers"), default="all")
    parser.add_argument("--reference-python", help="a Python with transformers, where this one has none")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    pin_to_one_core()
    batch = images()
    if args.impl == "transformers":  # one round, asked for by the main process
        print(json.dumps({name: rate(run, batch, args.repeats) for name, run in transformers_runs().items()}))
        return
    runs = keras_vit_runs()
    in_process = transformers_importable()
    if in_process:
        runs.update(transformers_runs())
    elif not args.reference_python:
        print("transformers is not importable here and no --reference-python was given: keras_vit alone.")
    rates = {}
    for _ in range(args.rounds):
        for name, run in runs.items():
            rates.setdefault(name, []).append(rate(run, batch, args.repeats))
        if not in_process and args.reference_python:
            command = [args.reference_python, __file__, "--impl", "transformers", "--repeats", str(args.repeats)]
            result = subprocess.run(command, capture_output=True, text=True, check=True)
            for name, value in json.loads(result.stdout.strip().splitlines()[-1]).items():
                rates.setdefault(name, []).append(value)
    ours = statistics.median(rates["keras_vit"])
    print(f"{COUNT} images of {min(i.shape[0] for i in batch)}-{max(i.shape[0] for i in batch)} x "
          f"{min(i.shape[1] for i in batch)}-{max(i.shape[1] for i in batch)} px, {BUDGET} patches of {PATCH} px, "
          f"one core, {args.rounds} rounds of {args.repeats} batches:")
    for name, values in rates.items():
        median = statistics.median(values)
        spread = f"{min(values):.1f}-{max(values):.1f}"
        print(f"| {name} | {median:.1f} ({spread}) img/s | x{median / ours:.2f} of keras_vit |")


if __name__ == "__main__":
    sys.exit(main())
