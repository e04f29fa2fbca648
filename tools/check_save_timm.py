"""Check that the files `checkpoints.save_timm` writes load strictly in timm itself, with keras_vit's outputs.

keras_vit and timm live in separate venvs, so this runs in two steps:

    KERAS_BACKEND=jax .venv/bin/python tools/check_save_timm.py write /tmp/save_timm
    /tmp/timm-venv/bin/python tools/check_save_timm.py check /tmp/save_timm

`write` loads timm-written fixture folders of several families (plain ViTs, DeiT distilled,
AIMv2's SwiGLU in two layers, DINOv2 giant's packed one, differential
attention, EVA-02, DINOv3) and one model built by keras_vit, saves each with
`save_timm` under its architecture name, and keeps the keywords of
`timm_arguments`, keras_vit's outputs and the images. `check` builds each
with `timm.create_model(architecture, pretrained=False, **keywords)`, loads
the file with `timm.models.load_checkpoint(..., strict=True)` and compares
timm's outputs with keras_vit's. One line per case; exit status 1 if any
fails. Nothing is downloaded.
"""

import json
import os
import sys

import numpy as np

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "tests", "fixtures")
CASES = ("timm_family/deit", "timm_deit_distilled", "timm_family/siglip_remainder", "timm_family/aimv2", "timm_family/dinov2_giant_swiglu",
         "timm_family/differential", "timm_eva/eva02_axial", "timm_eva/eva02_separate_qkv", "timm_eva/dinov3",
         "built/vit_base_patch16_224")


def write(out):
    import keras

    import keras_vit
    from keras_vit import checkpoints

    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(0)
    for case in CASES:
        if case.startswith("built/"):
            architecture = None
            model = keras_vit.ViT(image_size=32, patch_size=8, hidden_size=24, num_layers=2, num_heads=3, mlp_dim=40,
                                  classes=4, register_tokens=1, classifier_activation=None)
            for variable in model.weights:  # random values everywhere, so every tensor matters
                variable.assign(rng.normal(0, 0.2, variable.shape).astype("float32"))
        else:
            folder = os.path.join(FIXTURES, case)
            with open(os.path.join(folder, "config.json")) as f:
                architecture = json.load(f)["architecture"]
            model = keras_vit.from_pretrained(folder, classifier_activation=None)
        name = case.replace("/", "-")
        checkpoints.save_timm(model, os.path.join(out, f"{name}.safetensors"), architecture=architecture)
        height, width = model.input_shape[1:3]
        images = rng.uniform(-1, 1, (2, height, width, 3)).astype("float32")
        found = checkpoints.architecture_of(model)
        np.savez(os.path.join(out, f"{name}.npz"), images=images,
                 outputs=keras.ops.convert_to_numpy(model(images)), mean=found.input_mean, std=found.input_std)
        with open(os.path.join(out, f"{name}.json"), "w") as f:
            json.dump({"architecture": architecture or "vit_base_patch16_224",
                       "keywords": checkpoints.timm_arguments(model, architecture)}, f)
    print(f"wrote {len(CASES)} cases to {out}")


def check(out):
    import timm
    import torch

    failures = 0
    for case in CASES:
        name = case.replace("/", "-")
        with open(os.path.join(out, f"{name}.json")) as f:
            spec = json.load(f)
        data = np.load(os.path.join(out, f"{name}.npz"))
        def outputs(spec=spec, data=data, name=name):
            model = timm.create_model(spec["architecture"], pretrained=False, **spec["keywords"]).eval()
            timm.models.load_checkpoint(model, os.path.join(out, f"{name}.safetensors"), strict=True)
            pixels = ((data["images"] + 1) / 2 - data["mean"]) / data["std"]  # keras_vit's [-1, 1] as timm takes it
            with torch.no_grad():
                return model(torch.from_numpy(pixels.astype("float32")).permute(0, 3, 1, 2)).numpy()

        failures += not report(case, spec["architecture"], outputs, data["outputs"], 1e-4)
    return failures


def report(case, architecture, outputs, expected, tolerance):
    """Print one line for a case: timm's `outputs()` against keras_vit's `expected`; whether they agree."""
    try:
        found = outputs()
        difference = float(np.abs(found - expected).max())
        ok = found.shape == expected.shape and difference < tolerance
        print(f"{'ok  ' if ok else 'FAIL'} {case}: {architecture} strict load, outputs {tuple(found.shape)}, "
              f"max difference {difference:.1e}")
    except Exception as error:  # noqa: BLE001 (each case reports its own failure)
        ok = False
        print(f"FAIL {case}: {architecture}: {type(error).__name__}: {str(error).splitlines()[0]}")
    return ok


def main(doc, write, check):
    if len(sys.argv) != 3 or sys.argv[1] not in ("write", "check"):
        sys.exit(doc)
    if sys.argv[1] == "write":
        write(sys.argv[2])
    else:
        sys.exit(1 if check(sys.argv[2]) else 0)


if __name__ == "__main__":
    main(__doc__, write, check)
