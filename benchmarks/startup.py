"""Start-up of `keras-vit predict`: seconds from launch to a tiny model's classes for one photo, per backend.

    python benchmarks/startup.py [--rounds 5] [--backends jax torch tensorflow] [--code OLD_CHECKOUT]
                                 [--timm-python /path/to/python]

Each run is a fresh `python -m keras_vit predict photo.png --weights
tiny.keras` (a 15k-parameter ViT at 32 px) as a new user's install runs it:
KERAS_BACKEND set, and the packages its extra does not install hidden
(Keras imports them where they are): the other backends, and scikit-learn,
which only the `tests` extra installs. `--code DIR` adds the
keras_vit of another checkout (the code before a change) to the same rounds,
interleaved; `--timm-python` adds timm's equivalent in that interpreter:
`create_model` of the same sizes, its state dict loaded from a file, the
photo through timm's eval transform, the top classes. Prints the median
wall and CPU seconds of the rounds with their min-max.

Where the seconds go, for one backend:

    KERAS_BACKEND=jax python -X importtime -m keras_vit predict photo.png --weights tiny.keras 2> imports.txt
    KERAS_BACKEND=jax python -m cProfile -s cumulative -m keras_vit predict photo.png --weights tiny.keras
"""

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
backends_of_keras_vit = ("jax", "torch", "tensorflow")
# Makes the modules named in $HIDDEN unimportable, as if not installed (`importlib.util.find_spec` finds none).
SITECUSTOMIZE = """import os, sys
for name in filter(None, os.environ.get("HIDDEN", "").split(",")):
    sys.modules[name] = None
"""
TIMM = """import sys, torch, timm
from PIL import Image
model = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=8, embed_dim=32, depth=1,
                          num_heads=2, mlp_ratio=2, num_classes=3)
model.load_state_dict(torch.load(sys.argv[2]))
model.eval()
config = timm.data.resolve_data_config({"input_size": (3, 32, 32)}, model=model)
image = timm.data.create_transform(**config)(Image.open(sys.argv[1]).convert("RGB"))[None]
with torch.no_grad():
    probabilities, classes = model(image).softmax(-1).topk(3)
print(sys.argv[1])
for p, c in zip(probabilities[0].tolist(), classes[0].tolist()):
    print(f"  {c:>24d}  {p:.4f}")
"""


def setup(folder, timm_python):
    """Write the photo, the tiny model (with this checkout's keras_vit) and timm's state dict into `folder`."""
    script = ("import numpy as np, keras_vit\nfrom PIL import Image\n"
              "Image.fromarray(np.random.default_rng(0).integers(0, 256, (240, 320, 3), np.uint8)).save('photo.png')\n"
              "keras_vit.ViT(image_size=32, patch_size=8, hidden_size=32, num_layers=1, num_heads=2, mlp_dim=64,"
              " classes=3, classifier_activation=None).save('tiny.keras')\n")
    subprocess.run([sys.executable, "-c", script], cwd=folder, check=True, capture_output=True,
                   env=dict(os.environ, PYTHONPATH=ROOT, KERAS_BACKEND="jax"))
    if timm_python:
        subprocess.run([timm_python, "-c", "import torch, timm; torch.save(timm.create_model('vit_tiny_patch16_224', "
                        "img_size=32, patch_size=8, embed_dim=32, depth=1, num_heads=2, mlp_ratio=2, num_classes=3)"
                        ".state_dict(), 'timm.pth')"], cwd=folder, check=True, capture_output=True)


def run_once(command, env, folder):
    """Wall and CPU seconds of `command` in a fresh process; raises if it fails or prints to stderr."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode or "photo.png" not in done.stdout:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr}")
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return wall, cpu, done.stderr


def contenders(backends, code, timm_python, folder):
    """`{name: (command, environment)}`: keras_vit per backend (and `code`'s), timm's."""
    site = os.path.join(folder, "site")
    os.makedirs(site, exist_ok=True)
    with open(os.path.join(site, "sitecustomize.py"), "w") as f:
        f.write(SITECUSTOMIZE)
    found = {}
    for backend in backends:
        hidden = ",".join(["sklearn", *(other for other in backends_of_keras_vit if other != backend)])
        for label, checkout in (("", ROOT), (" (--code)", code)):
            if checkout:
                env = dict(os.environ, KERAS_BACKEND=backend, HIDDEN=hidden,
                           PYTHONPATH=os.pathsep.join([site, os.path.abspath(checkout)]))
                found[f"keras_vit {backend}{label}"] = (
                    [sys.executable, "-m", "keras_vit", "predict", "photo.png", "--weights", "tiny.keras"], env)
    if timm_python:
        found["timm"] = ([timm_python, "-c", TIMM, "photo.png", "timm.pth"], dict(os.environ))
    return found


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--backends", nargs="+", default=["jax", "torch", "tensorflow"])
    parser.add_argument("--code", help="another checkout of keras_vit to time in the same rounds")
    parser.add_argument("--timm-python", help="an interpreter with timm and torch")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        setup(folder, args.timm_python)
        runs = contenders(args.backends, args.code, args.timm_python, folder)
        times = {name: [] for name in runs}
        stderr = {}
        for _ in range(args.rounds):
            for name, (command, env) in runs.items():
                wall, cpu, stderr[name] = run_once(command, env, folder)
                times[name].append((wall, cpu))
    print(f"{'':28s} {'wall s (min-max)':>22s} {'CPU s (min-max)':>22s}   stderr lines")
    for name, rounds in times.items():
        walls, cpus = [w for w, _ in rounds], [c for _, c in rounds]
        print(f"{name:28s} {statistics.median(walls):6.2f} ({min(walls):5.2f}-{max(walls):5.2f})     "
              f"{statistics.median(cpus):6.2f} ({min(cpus):5.2f}-{max(cpus):5.2f})   {len(stderr[name].splitlines())}")


if __name__ == "__main__":
    main()
