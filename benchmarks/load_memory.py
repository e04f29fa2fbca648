"""Peak memory and time to load a full-size timm Hub folder: keras_vit (per backend) against timm.

Writes the folder with timm's own `save_for_hf` (random weights, needs
`--timm-python`, an interpreter with timm) unless it exists, then loads it
in a fresh process per contender and run under `/usr/bin/time -v`: the peak
RSS of the whole process, and the seconds the load itself took (after the
imports). keras_vit runs `from_pretrained(folder)`; timm
`create_model(pretrained=False)` then `load_state_dict(load_file(...))`.
`--dtype bfloat16` writes the folder in bfloat16 and loads it into bfloat16
models (`from_pretrained(folder, dtype="bfloat16")`, timm's `.to(dtype)`).

    python benchmarks/load_memory.py --timm-python /path/to/timm/venv/bin/python \
        --folder /tmp/fullsize/vit_l16 --model vit_large_patch16_224 --runs 2
"""

import argparse
import os
import re
import subprocess
import sys

_KERAS_VIT = """
import time, keras_vit
start = time.perf_counter()
model = keras_vit.from_pretrained({folder!r}{options})
print("LOAD_SECONDS", time.perf_counter() - start)
"""
_TIMM = """
import time, timm, torch, safetensors.torch
start = time.perf_counter()
model = timm.create_model({model!r}, pretrained=False).to(getattr(torch, {dtype!r}))
model.load_state_dict(safetensors.torch.load_file({folder!r} + "/model.safetensors"))
print("LOAD_SECONDS", time.perf_counter() - start)
"""
_WRITE = """
import timm, torch
from timm.models._hub import save_for_hf
model = timm.create_model({model!r}, pretrained=False).to(getattr(torch, {dtype!r}))
save_for_hf(model, {folder!r}, safe_serialization=True)
"""


def measure(python, code, env):
    """`(peak RSS in GB, load seconds)` of `code` run by `python` in a fresh process."""
    result = subprocess.run(["/usr/bin/time", "-v", python, "-c", code], env=env, capture_output=True, text=True)
    if result.returncode:
        raise SystemExit(f"{python} failed:\n{result.stderr[-3000:]}")
    peak_kb = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", result.stderr).group(1))
    seconds = float(re.search(r"LOAD_SECONDS (\S+)", result.stdout).group(1))
    return peak_kb * 1024 / 1e9, seconds


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--folder", required=True, help="the timm Hub folder (written here if absent)")
    parser.add_argument("--model", default="vit_large_patch16_224", help="timm's model name")
    parser.add_argument("--timm-python", help="an interpreter with timm: writes the folder and runs timm's load")
    parser.add_argument("--backends", nargs="*", default=["jax", "torch"], help="keras_vit's (none: timm alone)")
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--dtype", default="float32", help="the file's and the models' precision (float32, bfloat16)")
    args = parser.parse_args()
    weights = os.path.join(args.folder, "model.safetensors")
    if not os.path.exists(weights):
        if not args.timm_python:
            raise SystemExit(f"{weights} does not exist; pass --timm-python to write it with timm.")
        subprocess.run([args.timm_python, "-c", _WRITE.format(model=args.model, folder=args.folder,
                                                                 dtype=args.dtype)], check=True)
    size = os.path.getsize(weights) / 1e9
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    options = "" if args.dtype == "float32" else f", dtype={args.dtype!r}"
    contenders = [(f"keras_vit {backend}", sys.executable, _KERAS_VIT.format(folder=args.folder, options=options),
                   dict(os.environ, KERAS_BACKEND=backend, PYTHONPATH=root)) for backend in args.backends]
    if args.timm_python:
        timm = _TIMM.format(model=args.model, folder=args.folder, dtype=args.dtype)
        contenders.append(("timm", args.timm_python, timm, dict(os.environ)))
    print(f"{args.model}: {weights}, {size:.2f} GB, {args.dtype}")
    print("| contender | peak RSS (GB) | x file | load s |")
    print("|---|---|---|---|")
    for name, python, code, env in contenders:
        runs = [measure(python, code, env) for _ in range(args.runs)]
        peaks, seconds = [peak for peak, _ in runs], [s for _, s in runs]
        print(f"| {name} | {min(peaks):.2f}-{max(peaks):.2f} | {max(peaks) / size:.1f} | "
              f"{min(seconds):.1f}-{max(seconds):.1f} |", flush=True)


if __name__ == "__main__":
    main()
