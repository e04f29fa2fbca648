"""Check that the folders `checkpoints.save_timm` writes load in timm itself from their config.json alone, strictly,
with keras_vit's outputs.

keras_vit and timm live in separate venvs, so this runs in two steps:

    KERAS_BACKEND=jax .venv/bin/python tools/check_save_timm.py write /tmp/save_timm
    /tmp/timm-venv/bin/python tools/check_save_timm.py check /tmp/save_timm

`write` loads timm-written fixture folders of several families (plain ViTs, DeiT distilled,
AIMv2's SwiGLU in two layers, DINOv2 giant's packed one, differential
attention, EVA-02, DINOv3, the hybrids) and models built by keras_vit with one
switch each (a class token with `gap`, `pool_include_prefix`, QuickGELU, tanh
GELU, ImageNet's pixel statistics), saves each with `save_timm` under its
architecture name into a folder of its own (`model.safetensors` and the
`config.json` save_timm writes beside it), and keeps keras_vit's outputs and
the images in [-1, 1]. `check` builds each with `timm.create_model("local-dir:"
+ folder, pretrained=True)`, which reads nothing but the folder and loads the
file strictly, and compares timm's outputs on the images normalised with the
config.json's own mean and std with keras_vit's. One line per case; exit
status 1 if any fails. Nothing is downloaded.
"""

import json
import os
import sys

import numpy as np

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "tests", "fixtures")
CASES = ("timm_family/deit", "timm_deit_distilled", "timm_family/siglip_remainder", "timm_family/aimv2", "timm_family/dinov2_giant_swiglu",
         "timm_family/differential", "timm_eva/eva02_axial", "timm_eva/eva02_separate_qkv", "timm_eva/dinov3",
         "timm_hybrid/stem_only", "built/vit_base_patch16_224", "built/class_token_gap",
         "built/pool_include_prefix", "built/quick_gelu", "built/gelu_tanh", "built/imagenet_statistics")
# The models built by keras_vit: one switch each over timm's defaults (exact GELU), so a config.json that drops it
# gives timm another model.
IMAGENET = dict(input_mean=(0.485, 0.456, 0.406), input_std=(0.229, 0.224, 0.225))
BUILT = {"vit_base_patch16_224": dict(register_tokens=1, mlp_activation="gelu_tanh"),
         "class_token_gap": dict(classifier="gap"), "pool_include_prefix": dict(classifier="gap", pool_include_prefix=True),
         "quick_gelu": dict(mlp_activation="quick_gelu"), "gelu_tanh": dict(mlp_activation="gelu_tanh"),
         "imagenet_statistics": IMAGENET}


def write(out):
    import keras

    import keras_vit
    from keras_vit import checkpoints

    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(0)
    for case in CASES:
        if case.startswith("built/"):
            architecture = None
            switches = dict(dict(mlp_activation="gelu"), **BUILT[case.split("/")[1]])
            model = keras_vit.ViT(image_size=32, patch_size=8, hidden_size=24, num_layers=2, num_heads=3, mlp_dim=40,
                                  classes=4, classifier_activation=None, architecture=keras_vit.Architecture(**switches))
            for variable in model.weights:  # random values everywhere, so every tensor matters
                variable.assign(rng.normal(0, 0.2, variable.shape).astype("float32"))
        else:
            folder = os.path.join(FIXTURES, case)
            with open(os.path.join(folder, "config.json")) as f:
                architecture = json.load(f)["architecture"]
            model = keras_vit.from_pretrained(folder, classifier_activation=None)
        folder = os.path.join(out, case.replace("/", "-"))
        checkpoints.save_timm(model, os.path.join(folder, "model.safetensors"), architecture=architecture)
        height, width = model.input_shape[1:3]
        images = rng.uniform(-1, 1, (2, height, width, 3)).astype("float32")
        np.savez(os.path.join(folder, "outputs.npz"), images=images, outputs=keras.ops.convert_to_numpy(model(images)))
    print(f"wrote {len(CASES)} cases to {out}")


def check(out):
    import timm
    import torch

    failures = 0
    for case in CASES:
        folder = os.path.join(out, case.replace("/", "-"))
        with open(os.path.join(folder, "config.json")) as f:
            pretrained = json.load(f)["pretrained_cfg"]
        data = np.load(os.path.join(folder, "outputs.npz"))

        def outputs(folder=folder, data=data, pretrained=pretrained):
            model = timm.create_model("local-dir:" + folder, pretrained=True).eval()  # strict: timm's default
            pixels = ((data["images"] + 1) / 2 - np.array(pretrained["mean"])) / np.array(pretrained["std"])
            with torch.no_grad():
                return model(torch.from_numpy(pixels.astype("float32")).permute(0, 3, 1, 2)).numpy()

        with open(os.path.join(folder, "config.json")) as f:
            architecture = json.load(f)["architecture"]
        failures += not report(case, architecture, outputs, data["outputs"], 1e-4)
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
