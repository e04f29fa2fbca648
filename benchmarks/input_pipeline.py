"""Training input at 224 px from a folder of real-size JPEGs: keras_vit's two pipelines against timm's loader.

    python benchmarks/input_pipeline.py --timm-python /path/to/venv-with-timm/bin/python [--folder DIR]

Writes (once) a folder of photos at ImageNet's sizes (each side 333-640 px):
scikit-learn's two sample photographs, cropped, rescaled and re-encoded at
jittered JPEG qualities into `--images` distinct files in 8 classes. Then it
reads it the way training does, with the Inception crop and a flip, to
(32, 224, 224, 3) batches:

- tf.data: `keras_vit.data.training_stream` with TensorFlow (the crop window
  decoded from each file's bytes);
- numpy: the same where TensorFlow is not installed (`keras_vit.data.array_batches`),
  decoding in the calling process on one core and in `workers=cores` worker
  processes otherwise, as timm's loader is given (keras_vit's default, for a
  process that also trains, is every core but one: `--numpy-workers default`);
- timm: `create_transform(224, is_training=True)` (its defaults add
  ColorJitter 0.4) under a torch `DataLoader`, `num_workers=0` on one core,
  one worker a core otherwise;

each plain and with RandAugment (keras_vit: `data.make_augmenters(randaugment=(2, 9))`
as it stands; timm: `rand-m9-mstd0.5-inc1`), on one core and on all the cores.
Each measurement runs in a fresh process pinned to its cores
(`os.sched_setaffinity`, `OMP_NUM_THREADS`, tf.data's private thread pool,
`torch.set_num_threads`); after two warm-up batches it times batches for
`--seconds`. The contenders are interleaved round by round (at least 5
rounds); each row gives the median img/s with the rounds' min and max, the
ratio of medians against timm at the same augmentation and cores, the range
of per-round ratios, and whether the order holds beyond the spread. On one
core, where each contender is one process, it adds the images per second of
that process's CPU time (median, and its ratio to timm's): on a machine that
other jobs share, the rate of a core of its own.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

BATCH = 32
SIZE = 224
CLASSES = 8
TIMM_RANDAUGMENT = "rand-m9-mstd0.5-inc1"
KERAS_VIT_RANDAUGMENT = (2, 9)


def sample_photos():
    """scikit-learn's two sample photographs (427x640), or where scikit-learn is missing (an accelerator machine)
    two made ones of that size with a photo's mix of smooth regions, edges and texture, which JPEG codes alike."""
    try:
        from sklearn.datasets import load_sample_image
    except ImportError:
        rng = np.random.default_rng(1)
        rows, columns = np.mgrid[0:427, 0:640] / 640.0
        photos = []
        for frequency in (3.0, 7.0):
            smooth = np.stack([np.sin(frequency * rows + phase) * np.cos(frequency * columns - phase)
                               for phase in (0.0, 1.0, 2.0)], axis=-1)
            edges = (np.sin(40 * frequency * rows * columns) > 0.6)[..., None] * 0.5
            texture = rng.normal(0.0, 0.08, (427, 640, 3))
            photos.append(np.clip((smooth * 0.4 + 0.5 + edges * 0.3 + texture) * 255, 0, 255).astype("uint8"))
        return photos
    return [load_sample_image(name) for name in ("china.jpg", "flower.jpg")]


def write_folder(folder, count):
    """`count` distinct JPEGs of 333-640 px a side, from `sample_photos`, in `CLASSES` class folders."""
    from PIL import Image

    if os.path.isdir(folder) and sum(len(files) for _, _, files in os.walk(folder)) == count:
        return
    photos = sample_photos()
    rng = np.random.default_rng(0)
    for index in range(count):
        photo = photos[index % 2]
        height, width = photo.shape[:2]
        crop_height, crop_width = int(rng.integers(height // 2, height + 1)), int(rng.integers(width // 2, width + 1))
        top, left = int(rng.integers(0, height - crop_height + 1)), int(rng.integers(0, width - crop_width + 1))
        image = Image.fromarray(photo[top:top + crop_height, left:left + crop_width])
        if rng.uniform() < 0.5:
            image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        long_side = int(rng.integers(400, 641))
        short_side = int(rng.integers(333, min(long_side, 500) + 1))
        landscape = rng.uniform() < 0.75  # ImageNet is mostly 500x375 / 500x333 landscapes
        image = image.resize((long_side, short_side) if landscape else (short_side, long_side), Image.BICUBIC)
        class_folder = os.path.join(folder, f"class_{index % CLASSES}")
        os.makedirs(class_folder, exist_ok=True)
        image.save(os.path.join(class_folder, f"{index:05d}.jpg"), quality=int(rng.integers(75, 96)))


# --------------------------------------------------------------------------- workers (one per process)


def keras_vit_batches(path, folder, cores, randaugment, numpy_workers="cores"):
    from keras_vit import data

    if path == "numpy":
        data.tensorflow_installed = lambda: False  # read as a [jax] or [torch] install reads it
    source = data.from_folder(folder)
    augmenters = ()
    if randaugment:
        try:
            augmenters = data.make_augmenters(randaugment=KERAS_VIT_RANDAUGMENT)
        except ValueError as error:  # Keras' own layer takes a factor in [0, 1]: 9 of 10 is its m9
            print(f"note: make_augmenters(randaugment={KERAS_VIT_RANDAUGMENT}) refused ({error}); "
                  "measuring randaugment=(2, 0.9)", file=sys.stderr)
            augmenters = data.make_augmenters(randaugment=(2, 0.9))
    workers = (0 if cores == 1 else cores) if numpy_workers == "cores" else None  # None: data.default_workers
    stream = data.training_stream(source, SIZE, BATCH, epochs=50, seed=0, augmenters=augmenters, one_hot=True,
                                  workers=workers)
    if path == "tf.data":
        import tensorflow as tf

        options = tf.data.Options()
        options.threading.private_threadpool_size = cores
        stream = stream.with_options(options)
    return (np.asarray(images) for images, _ in stream)


def timm_batches(folder, cores, randaugment):
    import torch
    import torchvision
    from timm.data import create_transform

    torch.set_num_threads(1)
    from PIL import ImageOps

    posterize = ImageOps.posterize
    # timm's m9-mstd0.5-inc1 can draw 0 bits (all black), which Pillow before 12 gave and Pillow 13 refuses.
    ImageOps.posterize = lambda image, bits: image.point(lambda _: 0) if bits == 0 else posterize(image, bits)
    transform = create_transform(SIZE, is_training=True, auto_augment=TIMM_RANDAUGMENT if randaugment else None)
    dataset = torchvision.datasets.ImageFolder(folder, transform)
    workers = 0 if cores == 1 else cores
    loader = torch.utils.data.DataLoader(dataset, batch_size=BATCH, shuffle=True, drop_last=True, num_workers=workers,
                                         persistent_workers=workers > 0)

    def forever():
        while True:
            for images, _ in loader:
                yield images.numpy()

    return forever()


def worker(args):
    """Time one contender in this process: img/s over `--seconds` after two warm-up batches."""
    batches = (timm_batches(args.folder, args.cores, args.randaugment) if args.path == "timm"
               else keras_vit_batches(args.path, args.folder, args.cores, args.randaugment, args.numpy_workers))
    for _ in range(2):
        first = next(batches)
    assert first.shape[0] == BATCH and first.shape[1:3] in ((SIZE, SIZE), (3, SIZE)), first.shape
    count, start, cpu = 0, time.perf_counter(), time.process_time()
    while time.perf_counter() - start < args.seconds or count < 2:
        next(batches)
        count += 1
    result = {"images_per_s": count * BATCH / (time.perf_counter() - start)}
    if args.cores == 1:  # every contender runs in this one process: its CPU time is all the work
        result["images_per_cpu_s"] = count * BATCH / (time.process_time() - cpu)
    print(json.dumps(result))
    os._exit(0)  # no waiting on loader workers or tf.data threads


def measure(python, path, folder, cores, randaugment, seconds, timeout, numpy_workers):
    """One measurement in a fresh process pinned to the first `cores` cores this process may use."""
    allowed = sorted(os.sched_getaffinity(0))[:cores]
    threads = str(cores)
    env = dict(os.environ, OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads, OPENBLAS_NUM_THREADS=threads,
               TF_NUM_INTRAOP_THREADS=threads, TF_NUM_INTEROP_THREADS=threads, TF_CPP_MIN_LOG_LEVEL="3")
    command = ["taskset", "-c", ",".join(map(str, allowed)), python, os.path.abspath(__file__), "--worker",
               "--path", path, "--folder", folder, "--cores", str(cores), "--seconds", str(seconds)]
    command += ["--numpy-workers", numpy_workers] if path == "numpy" else []
    command += ["--randaugment"] if randaugment else []
    try:
        done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout} s"}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode or not lines:
        return {"error": (done.stderr.strip().splitlines() or ["no output"])[-1]}
    return json.loads(lines[-1])


def summarize(runs, results):
    """Rows of median img/s (min, max) and the ratio against timm at the same augmentation and cores."""
    rows = []
    for run in runs:
        path, randaugment, cores = run
        rounds = results[run]
        errors = [r["error"] for r in rounds if "error" in r]
        if errors:
            rows.append(dict(path=path, randaugment=randaugment, cores=cores, error=errors[0]))
            continue
        speeds = [r["images_per_s"] for r in rounds]
        row = dict(path=path, randaugment=randaugment, cores=cores, speeds=speeds, median=statistics.median(speeds),
                   low=min(speeds), high=max(speeds))
        reference = results.get(("timm", randaugment, cores))
        if reference and not any("error" in r for r in reference):
            theirs = [r["images_per_s"] for r in reference]
            row["ratio"] = row["median"] / statistics.median(theirs)
            paired = [mine / other for mine, other in zip(speeds, theirs)]
            row["round_ratios"] = (min(paired), max(paired))
            row["ranking"] = ("reference" if path == "timm" else "ahead beyond spread" if row["low"] > max(theirs)
                              else "behind beyond spread" if row["high"] < min(theirs) else "inside spread")
            if all("images_per_cpu_s" in r for r in rounds + reference):
                row["cpu"] = statistics.median(r["images_per_cpu_s"] for r in rounds)
                row["cpu_ratio"] = row["cpu"] / statistics.median(r["images_per_cpu_s"] for r in reference)
        rows.append(row)
    return rows


def report(rows):
    lines = [f"{'path':8s} {'augmentation':13s} {'cores':>5s} {'img/s median (min-max)':>24s} {'x timm':>7s} "
             f"{'per round':>11s} {'ranking':20s} img/CPU-s (x timm)"]
    for r in rows:
        augmentation = "RandAugment" if r["randaugment"] else "crop+flip"
        if "error" in r:
            lines.append(f"{r['path']:8s} {augmentation:13s} {r['cores']:5d} failed: {r['error']}")
            continue
        spread = f"{r['median']:.1f} ({r['low']:.1f}-{r['high']:.1f})"
        ratio = f"{r['ratio']:.2f}" if "ratio" in r else "-"
        per_round = f"{r['round_ratios'][0]:.2f}-{r['round_ratios'][1]:.2f}" if "round_ratios" in r else "-"
        cpu = f"{r['cpu']:.1f} ({r['cpu_ratio']:.2f})" if "cpu" in r else "-"
        lines.append(f"{r['path']:8s} {augmentation:13s} {r['cores']:5d} {spread:>24s} {ratio:>7s} {per_round:>11s} "
                     f"{r.get('ranking', '-'):20s} {cpu}")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timm-python", help="a Python that has timm and torchvision, to include timm's loader")
    parser.add_argument("--folder", help="where the JPEGs are written (default: a folder under the temp directory)")
    parser.add_argument("--images", type=int, default=512)
    parser.add_argument("--paths", default="tf.data,numpy", help="keras_vit's pipelines to measure")
    parser.add_argument("--cores", help="core counts, e.g. 1,16 (default: 1 and all this process may use)")
    parser.add_argument("--no-randaugment", action="store_true", help="crop and flip only")
    parser.add_argument("--randaugment-only", action="store_true", help="with RandAugment only")
    parser.add_argument("--dry-run", action="store_true",
                        help="a rehearsal of every code path: 64 images, one round of half a second on one core")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (median and spread; at least 5)")
    parser.add_argument("--seconds", type=float, default=4.0, help="timed seconds per measurement")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds before a measurement counts as failed")
    parser.add_argument("--numpy-workers", choices=("cores", "default"), default="cores",
                        help="the numpy path's decoding processes: one a core as timm's loader (none on one core), "
                             "or keras_vit's default (every core but one)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--path", help=argparse.SUPPRESS)
    parser.add_argument("--randaugment", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        args.cores = int(args.cores)
        return worker(args)
    if args.dry_run:
        args.images, args.rounds, args.seconds, args.cores = 64, 1, 0.5, "1"
    elif args.rounds < 5:
        parser.error(f"--rounds {args.rounds}: the spread needs at least 5 interleaved rounds")

    folder = args.folder or os.path.join(tempfile.gettempdir(), f"keras_vit_input_pipeline_{args.images}")
    write_folder(folder, args.images)
    available = len(os.sched_getaffinity(0))
    cores = [int(c) for c in args.cores.split(",")] if args.cores else sorted({1, available})
    paths = args.paths.split(",") + (["timm"] if args.timm_python else [])
    runs = [(path, randaugment, count) for count in cores for randaugment in
            ((False,) if args.no_randaugment else (True,) if args.randaugment_only else (False, True))
            for path in paths]
    print(f"{args.images} JPEGs in {folder}; batches of {BATCH} at {SIZE} px; {available} cores; "
          f"KERAS_BACKEND={os.environ.get('KERAS_BACKEND', 'tensorflow')}; {args.rounds} rounds of {args.seconds:g} s",
          flush=True)
    results = {run: [] for run in runs}
    for round_index in range(args.rounds):
        shift = round_index % len(runs)  # interleaved, the order rotating: drift hits every contender alike
        for run in runs[shift:] + runs[:shift]:
            path, randaugment, count = run
            python = args.timm_python if path == "timm" else sys.executable
            results[run].append(measure(python, path, folder, count, randaugment, args.seconds, args.timeout,
                                        args.numpy_workers))
        print(f"round {round_index + 1} of {args.rounds} done", flush=True)
    print(report(summarize(runs, results)))


if __name__ == "__main__":
    main()
